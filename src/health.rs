//! gRPC health (`grpc.health.v1.Health`) on `--grpc-health-port`, with upstream's service names:
//! `liveness` (always serving), and `readiness`, `""`, `inference-extension` (the Helm chart's
//! probe name) and the ext_proc service name, serving once epp can route.

use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

const READINESS_NAMES: &[&str] = &[
    "readiness",
    "",
    "inference-extension",
    envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::SERVICE_NAME,
];

/// The write side of the health service.
#[derive(Clone)]
pub struct Health {
    reporter: HealthReporter,
}

impl Health {
    /// Creates the reporter and the service to mount. Starts live and not ready.
    pub async fn new() -> (
        Self,
        tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
    ) {
        let (reporter, service) = tonic_health::server::health_reporter();
        reporter
            .set_service_status("liveness", ServingStatus::Serving)
            .await;
        let health = Self { reporter };
        health.set_ready(false).await;
        (health, service)
    }

    pub async fn set_ready(&self, ready: bool) {
        let status = if ready {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for name in READINESS_NAMES {
            self.reporter.set_service_status(*name, status).await;
        }
    }
}

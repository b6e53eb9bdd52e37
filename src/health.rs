//! gRPC health (`grpc.health.v1.Health`) on `--grpc-health-port`, with upstream's service names:
//! `liveness` (always serving), and `readiness`, `""`, `inference-extension` (the Helm chart's
//! probe name) and the ext_proc service name, serving once epp can route: when every readiness
//! signal [`Health::follow`] is given holds (Kubernetes discovery synced and its API server
//! reachable, leadership with leader election), until the drain starts.

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
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
pub(crate) struct Health {
    reporter: HealthReporter,
}

impl Health {
    /// Creates the reporter and the service to mount. Starts live and not ready.
    pub(crate) async fn new() -> (
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

    pub(crate) async fn set_ready(&self, ready: bool) {
        let status = if ready {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for name in READINESS_NAMES {
            self.reporter.set_service_status(*name, status).await;
        }
    }

    /// Readiness follows `signals`: SERVING while all of them are true (at once without any),
    /// until `stop` or `drain` (whose task turns NOT_SERVING itself).
    pub(crate) async fn follow(
        self,
        mut signals: Vec<watch::Receiver<bool>>,
        drain: CancellationToken,
        stop: CancellationToken,
    ) {
        if signals.is_empty() {
            self.set_ready(true).await;
            return;
        }
        loop {
            let ready = signals.iter_mut().all(|s| *s.borrow_and_update());
            self.set_ready(ready).await;
            let changed =
                futures::future::select_all(signals.iter_mut().map(|s| Box::pin(s.changed())));
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = drain.cancelled() => return,
                (r, _, _) = changed => if r.is_err() { return },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    type Client = HealthClient<tonic::transport::Channel>;

    /// Waits (bounded) until `readiness` answers `want`.
    async fn wait_serving(client: &mut Client, want: bool) {
        for _ in 0..2000 {
            let request = HealthCheckRequest {
                service: "readiness".into(),
            };
            let status = client.check(request).await.unwrap().into_inner().status;
            if (status == ServingStatus::Serving as i32) == want {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("readiness never became {want}");
    }

    #[tokio::test]
    async fn readiness_holds_only_while_every_signal_holds() {
        let (health, service) = Health::new().await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (drain, stop) = (CancellationToken::new(), CancellationToken::new());
        let tasks = tokio_util::task::TaskTracker::new();
        let server = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                stop.clone().cancelled_owned(),
            );
        tasks.spawn(server);
        let (synced, synced_rx) = watch::channel(false);
        let (leader, leader_rx) = watch::channel(true);
        tasks.spawn(health.follow(vec![synced_rx, leader_rx], drain, stop.clone()));
        let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = HealthClient::new(channel);
        wait_serving(&mut client, false).await;
        synced.send_replace(true);
        wait_serving(&mut client, true).await;
        leader.send_replace(false);
        wait_serving(&mut client, false).await;
        leader.send_replace(true);
        wait_serving(&mut client, true).await;
        synced.send_replace(false);
        wait_serving(&mut client, false).await;
        stop.cancel();
        tasks.close();
        tasks.wait().await;
    }
}

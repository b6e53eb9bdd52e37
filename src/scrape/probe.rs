//! Active health: an optional `GET /health` of every endpoint every `--health-check-interval`
//! (off by default), as upstream's GKE chart configures a `HealthCheckPolicy` (HTTP `/health`
//! on the serving port, 2 s interval and timeout).
//!
//! Why, next to passive health: passive health learns only from traffic, so a pod that dies
//! while idle, or a pod that is ejected and receives nothing, is noticed late. A probe answers
//! in one interval. Its failures (no connection, timeout, non-2xx) feed the same outlier state
//! as connection failures (`consecutiveLocalOriginFailure` of the `outlier-detection` plugin);
//! its successes reset that count but never restore an ejected endpoint: only a served request
//! does (a pod whose `/health` answers while its inference fails must stay out). Without the
//! `outlier-detection` plugin, probes are counted in `epp_health_probes` and logged, nothing
//! more. Metric scrape failures feed the same state (`scrape`).

use crate::datastore::{self, Datastore, EndpointState};
use crate::metrics::{Metrics, Outcome, OutcomeLabels};
use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[derive(Clone, Debug)]
pub struct ProbeOptions {
    pub interval: Duration,
    pub timeout: Duration,
    /// Path probed on every endpoint's serving port.
    pub path: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("request failed: {0}")]
    Request(#[source] hyper_util::client::legacy::Error),
    #[error("status {0}")]
    Status(http::StatusCode),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("bad uri: {0}")]
    Uri(#[from] http::uri::InvalidUri),
}

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

struct Shared {
    client: HttpClient,
    opts: ProbeOptions,
    metrics: Arc<Metrics>,
    datastore: Arc<Datastore>,
}

/// Follows the endpoint set until `shutdown`, one prober per endpoint on `tracker`.
pub async fn run(
    datastore: Arc<Datastore>,
    metrics: Arc<Metrics>,
    opts: ProbeOptions,
    tracker: TaskTracker,
    shutdown: CancellationToken,
) {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(opts.timeout));
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1)
        .build(connector);
    let shared = Arc::new(Shared {
        client,
        opts,
        metrics,
        datastore: Arc::clone(&datastore),
    });
    datastore
        .per_endpoint(&tracker, &shutdown, |tracker, state, token| {
            tracker.spawn(probe_loop(state, Arc::clone(&shared), token));
        })
        .await;
}

async fn probe_loop(state: Arc<EndpointState>, shared: Arc<Shared>, cancel: CancellationToken) {
    let uri = format!("http://{}{}", state.id(), shared.opts.path);
    let mut tick = tokio::time::interval(shared.opts.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let result =
            match tokio::time::timeout(shared.opts.timeout, probe_once(&shared.client, &uri)).await
            {
                Ok(r) => r,
                Err(_) => Err(ProbeError::Timeout(shared.opts.timeout)),
            };
        match &result {
            Ok(()) if std::mem::take(&mut failing) => {
                tracing::info!(endpoint = %state.id(), "health probe recovered")
            }
            Err(e) if !std::mem::replace(&mut failing, true) => {
                tracing::warn!(endpoint = %state.id(), error = %e, "health probe failing")
            }
            _ => {}
        }
        let outcome = if result.is_ok() {
            Outcome::success
        } else {
            Outcome::failure
        };
        shared
            .metrics
            .health_probes
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
        let transition = state.record_probe(
            datastore::health::Prober::Health,
            result.is_ok(),
            &shared.datastore.health_policy(),
            Instant::now(),
        );
        datastore::report(&shared.metrics, &state.endpoint, transition, "health probe");
    }
}

async fn probe_once(client: &HttpClient, uri: &str) -> Result<(), ProbeError> {
    let resp = client
        .get(uri.parse()?)
        .await
        .map_err(ProbeError::Request)?;
    if resp.status().is_success() {
        Ok(())
    } else {
        Err(ProbeError::Status(resp.status()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datastore::health::{HealthPolicy, OutlierParams};
    use crate::endpoint::{Endpoint, EndpointId};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-route HTTP server answering every request with `status` (bounded: `max` requests).
    async fn server(
        status: u16,
        max: usize,
        servers: &mut tokio::task::JoinSet<()>,
    ) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        servers.spawn(async move {
            for _ in 0..max {
                let Ok((mut sock, _)) = listener.accept().await else {
                    return;
                };
                let mut buf = [0u8; 1024];
                let _ = sock.read(&mut buf).await;
                let reply = format!(
                    "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
                let _ = sock.write_all(reply.as_bytes()).await;
            }
        });
        addr
    }

    async fn wait_for(deadline: Duration, mut cond: impl FnMut() -> bool) -> bool {
        let end = tokio::time::Instant::now() + deadline;
        while tokio::time::Instant::now() < end {
            if cond() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        cond()
    }

    #[tokio::test]
    async fn failing_probes_eject_and_passing_ones_do_not() {
        let tracker = TaskTracker::new();
        let mut servers = tokio::task::JoinSet::new();
        let good = server(200, 1000, &mut servers).await;
        let bad = server(503, 1000, &mut servers).await;
        let ds = Arc::new(Datastore::new());
        ds.set_endpoints(vec![
            Endpoint::from_id(EndpointId(good)),
            Endpoint::from_id(EndpointId(bad)),
        ]);
        ds.set_health_policy(HealthPolicy {
            outlier: Some(OutlierParams::default()),
            slow_start: None,
        });
        let metrics = Arc::new(Metrics::register(
            &mut prometheus_client::registry::Registry::default(),
        ));
        let opts = ProbeOptions {
            interval: Duration::from_millis(20),
            timeout: Duration::from_secs(1),
            path: "/health".into(),
        };
        let shutdown = CancellationToken::new();
        tracker.spawn(run(
            Arc::clone(&ds),
            Arc::clone(&metrics),
            opts,
            tracker.clone(),
            shutdown.clone(),
        ));
        let bad_state = Arc::clone(ds.snapshot().get(&EndpointId(bad)).unwrap());
        assert!(
            wait_for(Duration::from_secs(5), || bad_state.ejected()).await,
            "three failed probes eject"
        );
        let good_state = Arc::clone(ds.snapshot().get(&EndpointId(good)).unwrap());
        assert!(!good_state.ejected());
        assert!(
            metrics
                .health_probes
                .get_or_create(&OutcomeLabels {
                    outcome: Outcome::success
                })
                .get()
                >= 1
        );
        assert_eq!(
            metrics
                .outlier_ejections
                .get_or_create(&crate::metrics::EndpointLabels {
                    endpoint: bad.to_string()
                })
                .get(),
            1
        );
        shutdown.cancel();
        tracker.close();
        tokio::time::timeout(Duration::from_secs(5), tracker.wait())
            .await
            .unwrap();
        servers.abort_all();
    }
}

//! Active health: an optional `GET /health` of every endpoint every `--health-check-interval`
//! (off by default), as upstream's GKE chart configures a `HealthCheckPolicy` (HTTP `/health`
//! on the serving port, 2 s interval and timeout). The probes ride on the endpoint poller
//! ([`super`]): each endpoint's poller task runs its probe schedule beside its scrape schedule.
//!
//! Why, next to passive health: passive health learns only from traffic, so a pod that dies
//! while idle, or a pod that is ejected and receives nothing, is noticed late. A probe answers
//! in one interval. Its failures (no connection, timeout, non-2xx) feed the same outlier state
//! as connection failures (`consecutiveLocalOriginFailure` of the `outlier-detection` plugin);
//! its successes reset that count but never restore an ejected endpoint: only a served request
//! does (a pod whose `/health` answers while its inference fails must stay out). Without the
//! `outlier-detection` plugin, probes are counted in `epp_health_probes` and logged, nothing
//! more. Metric scrape failures feed the same state (as their own prober).

use super::client::{BadUrl, Conn, HttpError, Url};
use crate::datastore::{self, Datastore, EndpointState};
use crate::metrics::{Metrics, Outcome, OutcomeLabels};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

#[derive(Clone, Debug)]
pub struct ProbeOptions {
    pub(crate) interval: Duration,
    pub(crate) timeout: Duration,
    /// Path probed on every endpoint's serving port.
    pub(crate) path: String,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ProbeError {
    #[error("request failed: {0}")]
    Request(#[from] HttpError),
    #[error("status {0}")]
    Status(u16),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The configured path makes no URL.
    #[error(transparent)]
    BadUrl(BadUrl),
}

/// The probe options, shared by every endpoint's poller (each keeps its own connection).
pub(super) struct Probes {
    opts: ProbeOptions,
}

impl Probes {
    pub(super) fn new(opts: ProbeOptions) -> Self {
        Self { opts }
    }

    /// Probes `state` every interval (the first at once) until `cancel`; a late probe delays
    /// the next rather than bunching up.
    pub(super) async fn run(
        &self,
        state: &EndpointState,
        metrics: &Metrics,
        datastore: &Datastore,
        cancel: &CancellationToken,
    ) {
        let authority = state.id().to_string();
        let url = Url::parse(&format!("http://{authority}{}", self.opts.path));
        let mut conn = Conn::new(&authority);
        let mut tick = tokio::time::interval(self.opts.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            let ok = self.probe(&mut conn, &url, state, &mut failing).await;
            let outcome = if ok {
                Outcome::success
            } else {
                Outcome::failure
            };
            metrics
                .health_probes
                .get_or_create(&OutcomeLabels { outcome })
                .inc();
            let transition = state.record_probe(
                datastore::ejection::Prober::Health,
                ok,
                &datastore.health_policy(),
                Instant::now(),
            );
            datastore::report(metrics, &state.endpoint, transition, "health probe");
        }
    }

    /// One probe, bounded by the timeout; logs the first failure of a streak and the recovery.
    async fn probe(
        &self,
        conn: &mut Conn,
        url: &Result<Url, BadUrl>,
        state: &EndpointState,
        failing: &mut bool,
    ) -> bool {
        let timeout = self.opts.timeout;
        let result = match url {
            Ok(url) => match tokio::time::timeout(timeout, probe_once(conn, &url.target)).await {
                Ok(r) => r,
                Err(_) => Err(ProbeError::Timeout(timeout)),
            },
            Err(e) => Err(ProbeError::BadUrl(e.clone())),
        };
        match &result {
            Ok(()) if std::mem::take(failing) => {
                tracing::info!(endpoint = %state.id(), "health probe recovered")
            }
            Err(e) if !std::mem::replace(failing, true) => {
                tracing::warn!(endpoint = %state.id(), error = %e, "health probe failing")
            }
            _ => {}
        }
        result.is_ok()
    }
}

async fn probe_once(conn: &mut Conn, target: &str) -> Result<(), ProbeError> {
    match conn.status(target).await? {
        200..=299 => Ok(()),
        status => Err(ProbeError::Status(status)),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{run, ScrapeOptions};
    use super::*;
    use crate::datastore::ejection::{HealthPolicy, OutlierParams};
    use crate::endpoint::{Endpoint, EndpointId};
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_util::task::TaskTracker;

    /// The metrics page every test server serves, so that only the probes decide health.
    const PAGE: &str = "vllm:num_requests_running 0\n\
vllm:num_requests_waiting 0\n\
vllm:kv_cache_usage_perc 0.1\n";

    /// A loopback HTTP server answering `GET /metrics…` with [`PAGE`] and every other request
    /// with `status` (bounded: `max` requests).
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
                let n = sock.read(&mut buf).await.unwrap_or(0);
                let reply = if buf[..n].starts_with(b"GET /metrics") {
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{PAGE}",
                        PAGE.len()
                    )
                } else {
                    format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                };
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
        let opts = ScrapeOptions {
            probe: Some(ProbeOptions {
                interval: Duration::from_millis(20),
                timeout: Duration::from_secs(1),
                path: "/health".into(),
            }),
            ..ScrapeOptions::default()
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

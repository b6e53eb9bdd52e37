//! epp in this process: `app::run` with flags as on the command line, on loopback listeners,
//! owned by a [`TaskTracker`] and stopped through its cancellation token. The one way tests,
//! the demo and the benchmarks start epp in-process.

use std::net::SocketAddr;

use ::epp::app::{self, Listeners, Options};
use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What [`Epp::launch`] waits for before it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitFor {
    /// gRPC health reports `readiness` SERVING (bounded: 10 s); fails if epp exits first.
    Ready,
    /// Nothing: epp is starting (for tests of replicas that are not ready by design, such as a
    /// non-leader, or of what epp does before it is ready).
    Started,
}

/// epp running in this process.
pub struct Epp {
    pub grpc: SocketAddr,
    pub health: SocketAddr,
    pub metrics: SocketAddr,
    shutdown: CancellationToken,
    tracker: TaskTracker,
}

impl Epp {
    /// Starts epp with `args` (flags as on the command line, without the program name) on
    /// ephemeral ports chosen here, and waits until it is ready. Fails if epp exits during
    /// start-up.
    pub async fn start(args: &[String]) -> anyhow::Result<Self> {
        Self::launch(bind().await?, args, WaitFor::Ready).await
    }

    /// Starts epp serving ext_proc on `grpc` (health and metrics on ephemeral ports), waiting
    /// for `wait`.
    pub async fn launch(grpc: TcpListener, args: &[String], wait: WaitFor) -> anyhow::Result<Self> {
        let listeners = Listeners {
            grpc,
            health: bind().await?,
            metrics: bind().await?,
            peers: None,
        };
        let (grpc, health, metrics) = (
            listeners.grpc.local_addr()?,
            listeners.health.local_addr()?,
            listeners.metrics.local_addr()?,
        );
        let opts: Options = clap::Parser::try_parse_from(
            std::iter::once("epp".to_owned()).chain(args.iter().cloned()),
        )?;
        let shutdown = CancellationToken::new();
        let tracker = TaskTracker::new();
        let (done_tx, mut done_rx) = tokio::sync::oneshot::channel();
        let token = shutdown.clone();
        tracker.spawn(async move {
            let _ = done_tx.send(app::run(opts, listeners, token).await);
        });
        if wait == WaitFor::Ready {
            tokio::select! {
                ready = wait_ready(health) => ready?,
                done = &mut done_rx => {
                    let err = match done {
                        Ok(Err(e)) => e,
                        _ => anyhow::anyhow!("epp stopped"),
                    };
                    return Err(err.context("epp exited during start-up"));
                }
            }
        }
        Ok(Self {
            grpc,
            health,
            metrics,
            shutdown,
            tracker,
        })
    }

    /// `GET /metrics` from epp's metrics port.
    pub async fn metrics_text(&self) -> anyhow::Result<String> {
        Ok(crate::prometheus::scrape(self.metrics, "/metrics").await?)
    }

    /// The first sample of `series` (`name` or `name{key="value",...}`) epp exports now, if
    /// any ([`crate::prometheus::value`]).
    pub async fn metric(&self, series: &str) -> Option<f64> {
        crate::prometheus::value(&self.metrics_text().await.ok()?, series)
    }

    pub async fn stop(self) {
        self.shutdown.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}

async fn bind() -> anyhow::Result<TcpListener> {
    TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding an epp port")
}

/// Waits until the gRPC health service at `addr` (epp's `--grpc-health-port`, in this process
/// or not) says `readiness` is SERVING (bounded: 10 s).
pub async fn wait_ready(addr: SocketAddr) -> anyhow::Result<()> {
    use tonic_health::pb::{
        health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
    };
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))?.connect_lazy();
    let mut client = HealthClient::new(channel);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut watch = loop {
        match client
            .watch(HealthCheckRequest {
                service: "readiness".into(),
            })
            .await
        {
            Ok(w) => break w.into_inner(),
            Err(_) if tokio::time::Instant::now() < deadline => tokio::task::yield_now().await,
            Err(e) => return Err(e.into()),
        }
    };
    while let Some(update) = tokio::time::timeout_at(deadline, watch.message())
        .await
        .context("epp not ready within 10 s")??
    {
        if update.status == ServingStatus::Serving as i32 {
            return Ok(());
        }
    }
    anyhow::bail!("health watch ended before epp was ready")
}

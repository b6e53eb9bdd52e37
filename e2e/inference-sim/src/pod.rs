//! One simulated vLLM pod: its engine task, KV-event tasks and HTTP server,
//! owned together and stopped together.
//!
//! Why: a test or the cluster starts a pod on a listener it bound itself
//! (`127.0.0.1:0` in tests) and must be able to kill it the way a crashed pod
//! dies: listener closed, open connections reset, cache gone.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::config::{ConfigError, PodConfig};
use super::engine::Engine;
use super::faults::FaultSwitch;
use super::hook::{MetricValues, TestHook};
use super::http::{self, PodState};
use super::kv_events::{KvEventsError, KvPublisher, PublisherEndpoints};
use super::lora::LoraRegistry;
use super::metrics::{render, PodMetrics};
use super::runner::{Runner, SimClock};
use super::tokenizer::Tokenizer;

#[derive(Debug, Error)]
pub enum PodError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    KvEvents(#[from] KvEventsError),
    #[error("cannot read the listener's address")]
    Listener(#[source] std::io::Error),
}

/// What a test or the admin endpoint can do to a live pod.
#[derive(Clone)]
pub struct PodControl {
    state: Arc<PodState>,
    kv_endpoints: PublisherEndpoints,
}

impl PodControl {
    /// The pod's switchable faults.
    pub fn faults(&self) -> &FaultSwitch {
        &self.state.faults
    }

    /// The `/metrics` text as it would be served now (ignores `stall_metrics`).
    pub fn metrics_text(&self) -> String {
        let m = self.state.metrics.lock().unwrap_or_else(|e| e.into_inner());
        render(&m, &self.state.cfg)
    }

    /// The test hook: recorded requests, forced metric values, `/metrics` failure modes.
    pub fn hook(&self) -> &TestHook {
        &self.state.hook
    }

    /// The gauge values `/metrics` reports now (simulated, or forced through the hook).
    pub fn metric_values(&self) -> MetricValues {
        let m = self.state.metrics.lock().unwrap_or_else(|e| e.into_inner());
        self.state.hook.values(&m.gauges)
    }

    /// Resolved KV-event endpoints (bound sockets only).
    pub fn kv_endpoints(&self) -> &PublisherEndpoints {
        &self.kv_endpoints
    }
}

/// A running pod. Dropping it aborts its tasks; [`Pod::stop`] waits for them.
pub struct Pod {
    addr: SocketAddr,
    control: PodControl,
    cancel: CancellationToken,
    tasks: JoinSet<()>,
}

impl Pod {
    /// Starts a pod serving on `listener`; `faults` may be shared with a cluster.
    pub async fn start(
        listener: TcpListener,
        cfg: Arc<PodConfig>,
        faults: FaultSwitch,
    ) -> Result<Self, PodError> {
        cfg.validate()?;
        let addr = listener.local_addr().map_err(PodError::Listener)?;
        let cancel = CancellationToken::new();
        let mut tasks = JoinSet::new();
        let (publisher, kv_endpoints) = match &cfg.kv_events {
            Some(kv) => {
                let (p, e) = KvPublisher::start(kv, &mut tasks, cancel.clone()).await?;
                (Some(p), e)
            }
            None => (None, PublisherEndpoints::default()),
        };
        let tokenizer = Tokenizer::new(cfg.tokenizer);
        let clock = SimClock::system();
        let now = Instant::now();
        let metrics = Arc::new(Mutex::new(PodMetrics::new(
            cfg.engine.max_model_len,
            clock.unix(now),
        )));
        let (engine_tx, commands) = mpsc::unbounded_channel();
        let engine = Engine::new(
            cfg.engine.clone(),
            SmallRng::seed_from_u64(cfg.seed),
            tokenizer.output_vocabulary(),
        );
        let runner = Runner {
            engine,
            commands,
            metrics: metrics.clone(),
            publisher,
            clock,
            cfg: cfg.clone(),
        };
        tasks.spawn(runner.run(cancel.clone()));
        let state = Arc::new(PodState {
            port: addr.port(),
            tokenizer,
            engine: engine_tx,
            metrics,
            frozen: Mutex::new(None),
            faults,
            loras: Mutex::new(LoraRegistry::new(cfg.enable_lora, &cfg.lora_modules)),
            rng: Mutex::new(SmallRng::seed_from_u64(cfg.seed ^ 0x5eed)),
            ready_at: now + cfg.startup_delay.div_f64(cfg.engine.time_scale),
            clock,
            next_id: AtomicU64::new(0),
            hook: TestHook::new(cfg.record_requests),
            cfg,
        });
        tasks.spawn(serve(listener, state.clone(), cancel.clone()));
        let control = PodControl {
            state,
            kv_endpoints,
        };
        Ok(Self {
            addr,
            control,
            cancel,
            tasks,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn control(&self) -> PodControl {
        self.control.clone()
    }

    /// Stops accepting, resets open connections, stops the engine; waits for all tasks.
    pub async fn stop(mut self) {
        self.cancel.cancel();
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Runs one pod on `listener` until `shutdown` resolves.
pub async fn run_pod(
    listener: TcpListener,
    cfg: PodConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), PodError> {
    let faults = FaultSwitch::new(cfg.faults.clone());
    let pod = Pod::start(listener, Arc::new(cfg), faults).await?;
    shutdown.await;
    pod.stop().await;
    Ok(())
}

/// The accept loop; connections (and the WebSocket sessions they were upgraded to) live in a
/// `JoinSet` dropped (aborted) on exit.
async fn serve(listener: TcpListener, state: Arc<PodState>, cancel: CancellationToken) {
    let builder = auto::Builder::new(TokioExecutor::new());
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let state = state.clone();
                    let builder = builder.clone();
                    conns.spawn(async move {
                        // An upgraded request (`/v1/realtime`) leaves its session here; the
                        // connection's task runs it once hyper hands the socket over.
                        let slot = http::realtime::UpgradeSlot::default();
                        let upgrade = slot.clone();
                        let svc = service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                            req.extensions_mut().insert(upgrade.clone());
                            http::handle(state.clone(), req)
                        });
                        let served = builder
                            .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                            .await;
                        if let (Ok(()), Some(session)) = (served, slot.take()) {
                            session.await;
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            () = cancel.cancelled() => return,
        }
    }
}

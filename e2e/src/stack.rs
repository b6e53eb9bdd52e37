//! A whole stack on loopback: epp in-process, model-server stand-ins, and a real Envoy whose
//! ext_proc filter calls epp. Used by the e2e tests and the demo.

pub mod pd;

use crate::envoy::{Envoy, EnvoyConfig, Template};
use crate::standin::{StandIn, StandInOptions};
use anyhow::Context;
use epp::app::{self, Listeners, Options};
use std::net::SocketAddr;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// epp running in this process on ephemeral ports.
pub struct Epp {
    pub grpc: SocketAddr,
    pub health: SocketAddr,
    pub metrics: SocketAddr,
    shutdown: CancellationToken,
    tracker: TaskTracker,
}

impl Epp {
    /// Starts epp with `args` (flags as on the command line, without the program name); the
    /// ports are chosen here. Fails if epp exits during start-up.
    pub async fn start(args: &[String]) -> anyhow::Result<Self> {
        let bind = || async {
            TcpListener::bind("127.0.0.1:0")
                .await
                .context("binding epp port")
        };
        let listeners = Listeners {
            grpc: bind().await?,
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
        let r = crate::client::get(self.metrics, "/metrics").await?;
        Ok(r.text())
    }

    pub async fn stop(self) {
        self.shutdown.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}

/// Waits until epp's gRPC health says `readiness` is SERVING (bounded: 10 s).
async fn wait_ready(addr: SocketAddr) -> anyhow::Result<()> {
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

/// What to start.
pub struct StackOptions {
    pub pods: usize,
    pub template: Template,
    /// Extra epp flags; `--static-endpoints` is added with the pods' addresses.
    pub epp_args: Vec<String>,
    /// Serve ext_proc over TLS (epp's self-signed certificate) and have Envoy use TLS.
    pub tls: bool,
    pub pod_options: StandInOptions,
}

impl Default for StackOptions {
    fn default() -> Self {
        Self {
            pods: 3,
            template: Template::Duplex,
            epp_args: Vec::new(),
            tls: false,
            pod_options: StandInOptions::default(),
        }
    }
}

/// Stand-ins + epp + Envoy.
pub struct Stack {
    pub pods: Vec<StandIn>,
    pub epp: Epp,
    pub envoy: Envoy,
}

impl Stack {
    pub async fn start(opts: StackOptions) -> anyhow::Result<Self> {
        let mut pods = Vec::with_capacity(opts.pods);
        for i in 0..opts.pods {
            let pod_opts = StandInOptions {
                name: format!("pod-{i}"),
                ..opts.pod_options.clone()
            };
            pods.push(StandIn::bind(pod_opts).await?);
        }
        let endpoints: Vec<String> = pods.iter().map(StandIn::endpoint).collect();
        let mut args = vec![
            "--static-endpoints".to_owned(),
            endpoints.join(","),
            "--secure-serving".to_owned(),
            opts.tls.to_string(),
        ];
        args.extend(opts.epp_args.iter().cloned());
        let epp = Epp::start(&args).await?;
        let envoy = EnvoyConfig::new(opts.template)
            .epp(epp.grpc)
            .epp_tls(opts.tls)
            .pool(pods.iter().map(StandIn::addr))
            .start()
            .await?;
        Ok(Self { pods, epp, envoy })
    }

    /// The pod that served a response, from its `x-inference-pod` header.
    pub fn pod_index(&self, served_by: Option<&str>) -> Option<usize> {
        self.pods.iter().position(|p| Some(p.name()) == served_by)
    }

    pub async fn stop(self) {
        drop(self.envoy);
        self.epp.stop().await;
        for p in self.pods {
            p.shutdown().await;
        }
    }
}

/// inference-sim pods + epp + Envoy: the realistic stack (queueing, prefix caching, vLLM
/// metrics), for the demo and end-to-end tests of routing quality.
pub struct SimStack {
    pub cluster: crate::sim::Cluster,
    pub epp: Epp,
    pub envoy: Envoy,
}

impl SimStack {
    /// `pods` simulated pods named `sim-<i>` with `engine`, epp with `epp_args` (plus the
    /// pods as `--static-endpoints`), and Envoy from `template`.
    pub async fn start(
        pods: usize,
        engine: crate::sim::EngineConfig,
        template: Template,
        epp_args: &[String],
        tls: bool,
    ) -> anyhow::Result<Self> {
        let mut listeners = Vec::with_capacity(pods);
        let mut configs = Vec::with_capacity(pods);
        for i in 0..pods {
            listeners.push(TcpListener::bind("127.0.0.1:0").await?);
            let cfg = crate::sim::PodConfig {
                engine: engine.clone(),
                pod_name: format!("sim-{i}"),
                seed: i as u64,
                prompt_tokens_details: true,
                ..Default::default()
            };
            configs.push(cfg);
        }
        let cluster = crate::sim::Cluster::start_on(configs, listeners).await?;
        let endpoints: Vec<String> = cluster.addrs().iter().map(ToString::to_string).collect();
        let mut args = vec![
            "--static-endpoints".to_owned(),
            endpoints.join(","),
            "--secure-serving".to_owned(),
            tls.to_string(),
        ];
        args.extend(epp_args.iter().cloned());
        let epp = Epp::start(&args).await?;
        let envoy = EnvoyConfig::new(template)
            .epp(epp.grpc)
            .epp_tls(tls)
            .pool(cluster.addrs().iter().copied())
            .start()
            .await?;
        Ok(Self {
            cluster,
            epp,
            envoy,
        })
    }

    pub async fn stop(self) {
        drop(self.envoy);
        self.epp.stop().await;
        self.cluster.shutdown().await;
    }
}

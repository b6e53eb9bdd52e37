//! A whole stack on loopback: epp in-process, inference-sim pods, and a real Envoy whose
//! ext_proc filter calls epp. Used by the e2e tests and the demo.

pub mod pd;

use crate::envoy::{Envoy, EnvoyConfig, Template};
pub use crate::epp::{Epp, WaitFor};
use crate::sim_pod::{test_pod_config, SimPod};
use tokio::net::TcpListener;

/// What to start.
pub struct StackOptions {
    pub pods: usize,
    pub template: Template,
    /// Extra epp flags; `--static-endpoints` is added with the pods' addresses.
    pub epp_args: Vec<String>,
    /// Serve ext_proc over TLS (epp's self-signed certificate) and have Envoy use TLS.
    pub tls: bool,
    /// Every pod's configuration; the stack names pod `i` `pod-<i>` and seeds it with `i`.
    pub pod_config: inference_sim::PodConfig,
    /// Pods configured otherwise than `pod_config`, by index (a slow pod among fast ones).
    pub pod_overrides: Vec<(usize, inference_sim::PodConfig)>,
}

impl Default for StackOptions {
    fn default() -> Self {
        Self {
            pods: 3,
            template: Template::Duplex,
            epp_args: Vec::new(),
            tls: false,
            pod_config: test_pod_config("pod"),
            pod_overrides: Vec::new(),
        }
    }
}

/// Recording test pods ([`SimPod`]) + epp + Envoy.
pub struct Stack {
    pub pods: Vec<SimPod>,
    pub epp: Epp,
    pub envoy: Envoy,
}

impl Stack {
    pub async fn start(opts: StackOptions) -> anyhow::Result<Self> {
        let mut pods = Vec::with_capacity(opts.pods);
        for i in 0..opts.pods {
            let base = opts
                .pod_overrides
                .iter()
                .find(|(j, _)| *j == i)
                .map_or(&opts.pod_config, |(_, c)| c);
            let cfg = inference_sim::PodConfig {
                pod_name: format!("pod-{i}"),
                seed: i as u64,
                ..base.clone()
            };
            pods.push(SimPod::bind(cfg).await?);
        }
        let endpoints: Vec<String> = pods.iter().map(SimPod::endpoint).collect();
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
            .pool(pods.iter().map(SimPod::addr))
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
    pub cluster: inference_sim::Cluster,
    pub epp: Epp,
    pub envoy: Envoy,
}

impl SimStack {
    /// `pods` simulated pods named `sim-<i>` with `engine`, epp with `epp_args` (plus the
    /// pods as `--static-endpoints`), and Envoy from `template`.
    pub async fn start(
        pods: usize,
        engine: inference_sim::EngineConfig,
        template: Template,
        epp_args: &[String],
        tls: bool,
    ) -> anyhow::Result<Self> {
        let mut listeners = Vec::with_capacity(pods);
        let mut configs = Vec::with_capacity(pods);
        for i in 0..pods {
            listeners.push(TcpListener::bind("127.0.0.1:0").await?);
            let cfg = inference_sim::PodConfig {
                engine: engine.clone(),
                pod_name: format!("sim-{i}"),
                seed: i as u64,
                prompt_tokens_details: true,
                ..Default::default()
            };
            configs.push(cfg);
        }
        let cluster = inference_sim::Cluster::start_on(configs, listeners).await?;
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

//! A two- or three-region test bed on one machine (issue 36, item 4): each region is its own
//! simulated pods (in-process inference-sim pods on their own loopback ports), its own spoke epp
//! publishing the pool's gauges and its own Envoy (the region's gateway), all reached from the
//! hub through a [`DelayProxy`] per path that adds the region's round trip: one for the data path
//! (hub Envoy → region gateway) and one for the hub's scrapes of the spoke's metrics. The hub is
//! an Envoy in front of epp (with `network-cost-scorer`, or llm-d's `load` policy: the queue and
//! KV-utilisation scorers) or llm-d-router v0.10's EPP with that policy.
//!
//! Losing a region is a partition: both of its proxies close every connection and refuse new
//! ones ([`Region::cut`]). Every process (the Envoys, llm-d's EPP) stops by its own PID when its
//! handle is dropped; the pods and epps run in this process and stop with [`Bed::stop`].

mod scenario;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use harness::delay_proxy::DelayProxy;
use harness::envoy::{Envoy, EnvoyConfig, Template};
use harness::epp::Epp;
use harness::llmd_epp::LlmdEpp;
use harness::sim_pod::SimPod;
use inference_sim::{EngineConfig, PodConfig};

pub use scenario::{lose, phases, LossResult, Phase, PhaseStats, Traffic};

use super::BenchError;

/// One region: its name (the pods are `<name>-<i>`), its round trip from the hub and its pods.
#[derive(Clone, Debug)]
pub struct RegionSpec {
    pub name: String,
    pub rtt: Duration,
    pub pods: usize,
}

/// How the hub picks a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HubPolicy {
    /// epp with `network-cost-scorer` at these parameters (and `outlier-detection`, one
    /// connection failure ejects).
    EppNetworkCost(NetworkCost),
    /// epp with llm-d's `load` policy: `multicluster-queue-scorer` + `multicluster-kv-cache-
    /// utilization-scorer`.
    EppLoad,
    /// llm-d-router v0.10's EPP with its `load` policy.
    LlmdLoad,
}

impl HubPolicy {
    pub fn name(self) -> &'static str {
        match self {
            Self::EppNetworkCost(_) => "epp network-cost",
            Self::EppLoad => "epp load",
            Self::LlmdLoad => "llm-d load",
        }
    }

    /// Parses `epp` (`network-cost-scorer`'s default `queuedRequestMs`), `epp-load` or `llmd`.
    pub fn parse(text: &str) -> Result<Self, BenchError> {
        match text {
            "epp" => Ok(Self::EppNetworkCost(NetworkCost::default())),
            "epp-load" => Ok(Self::EppLoad),
            "llmd" => Ok(Self::LlmdLoad),
            _ => Err(BenchError::Setup(format!(
                "unknown hub {text:?}: expected epp, epp-load or llmd"
            ))),
        }
    }

    /// The hub's scorers: plugin lines and their profile references.
    fn scorers(self) -> (String, &'static str) {
        match self {
            Self::EppNetworkCost(cost) => (cost.plugins(), "{pluginRef: network-cost-scorer}"),
            Self::EppLoad | Self::LlmdLoad => (
                "- {type: multicluster-queue-scorer}\n- {type: multicluster-kv-cache-utilization-scorer}\n".into(),
                "{pluginRef: multicluster-queue-scorer}, {pluginRef: multicluster-kv-cache-utilization-scorer}",
            ),
        }
    }
}

/// `network-cost-scorer`'s parameters on epp's hub, and whether the hub tracks prompt prefixes
/// (`multicluster-approx-prefix-cache-producer`: a cluster that served a prompt's prefix is
/// cheaper for it by the prefill it saves).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetworkCost {
    pub queued_request_ms: u32,
    pub idle_ttft_ms: u32,
    pub prefix: bool,
}

impl Default for NetworkCost {
    /// The scorer's defaults, no prefix tracking.
    fn default() -> Self {
        Self {
            queued_request_ms: 100,
            idle_ttft_ms: 50,
            prefix: false,
        }
    }
}

impl NetworkCost {
    fn plugins(self) -> String {
        let producer = match self.prefix {
            true => "- {type: multicluster-approx-prefix-cache-producer}\n",
            false => "",
        };
        format!(
            "{producer}- {{type: network-cost-scorer, parameters: {{queuedRequestMs: {}, idleTtftMs: {}}}}}\n\
             - {{type: outlier-detection, parameters: {{consecutiveLocalOriginFailure: 1, baseEjectionTime: 5s}}}}\n",
            self.queued_request_ms, self.idle_ttft_ms
        )
    }
}

/// The hub's EndpointPickerConfig over the clusters file `clusters` (spokes scraped over http).
pub fn hub_config(policy: HubPolicy, clusters: &Path) -> String {
    let (plugins, refs) = policy.scorers();
    format!(
        "apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- {{name: clusters, type: multicluster-file-discovery, parameters: {{path: {clusters:?}}}}}
- {{name: spokes, type: multicluster-metrics-data-source, parameters: {{scheme: http}}}}
- {{name: pool, type: multicluster-metrics-extractor}}
{plugins}- {{type: max-score-picker}}
schedulingProfiles:
- name: default
  plugins: [{refs}, {{pluginRef: max-score-picker}}]
dataLayer:
  discovery: {{pluginRef: clusters}}
  sources: [{{pluginRef: spokes, extractors: [{{pluginRef: pool}}]}}]
"
    )
}

/// The pods' engine: `max_num_seqs` running sequences each (a small batch, so a region
/// saturates at a rate one machine can offer), the rest inference-sim's H100 8B profile.
pub fn engine(model: &str, max_num_seqs: usize) -> EngineConfig {
    EngineConfig {
        model: model.into(),
        max_num_seqs,
        num_gpu_blocks: 4096,
        ..EngineConfig::default()
    }
}

/// A running region.
pub struct Region {
    pub name: String,
    pods: Vec<SimPod>,
    spoke: Epp,
    gateway: Envoy,
    data: DelayProxy,
    metrics: DelayProxy,
}

impl Region {
    async fn start(spec: &RegionSpec, engine: &EngineConfig) -> Result<Self, BenchError> {
        let mut pods = Vec::new();
        for i in 0..spec.pods {
            let cfg = PodConfig {
                engine: engine.clone(),
                pod_name: format!("{}-{i}", spec.name),
                prompt_tokens_details: true,
                ..PodConfig::default()
            };
            pods.push(SimPod::bind(cfg).await.map_err(setup("a pod"))?);
        }
        let spoke = spoke_epp(&pods).await?;
        let gateway = EnvoyConfig::new(Template::Duplex)
            .epp(spoke.grpc)
            .epp_tls(false)
            .pool(pods.iter().map(SimPod::addr))
            .start()
            .await?;
        let one_way = spec.rtt / 2;
        let proxy = |to| DelayProxy::start(to, one_way);
        let data = proxy(gateway.listener_addr())
            .await
            .map_err(setup("a proxy"))?;
        let metrics = proxy(spoke.metrics).await.map_err(setup("a proxy"))?;
        Ok(Self {
            name: spec.name.clone(),
            pods,
            spoke,
            gateway,
            data,
            metrics,
        })
    }

    /// Loses the region: its data path and its metrics stop answering (a partition).
    pub fn cut(&self) {
        self.data.cut();
        self.metrics.cut();
    }

    /// Its pods (in-process: a test forces their gauges through their hooks).
    pub fn pods(&self) -> &[SimPod] {
        &self.pods
    }

    /// Whether pod `name` is one of this region's.
    pub fn owns(&self, pod: &str) -> bool {
        pod.strip_prefix(&self.name)
            .is_some_and(|rest| rest.starts_with('-'))
    }

    /// Its line in the clusters file: the gateway behind the data proxy, the spoke's metrics
    /// behind the metrics proxy.
    fn cluster_entry(&self) -> String {
        let (d, m) = (self.data.addr(), self.metrics.addr());
        format!(
            "- {{name: {}, address: {}, port: '{}', labels: {{metricsAddress: {}, metricsPort: '{}'}}}}\n",
            self.name,
            d.ip(),
            d.port(),
            m.ip(),
            m.port()
        )
    }

    async fn stop(self) {
        self.data.stop().await;
        self.metrics.stop().await;
        drop(self.gateway);
        self.spoke.stop().await;
        for p in self.pods {
            p.shutdown().await;
        }
    }
}

/// A spoke: epp over the region's pods, publishing the pool's gauges every 50 ms.
async fn spoke_epp(pods: &[SimPod]) -> Result<Epp, BenchError> {
    let endpoints: Vec<String> = pods.iter().map(SimPod::endpoint).collect();
    let flags = [
        "--static-endpoints",
        &endpoints.join(","),
        "--secure-serving",
        "false",
        "--refresh-metrics-interval",
        "50ms",
        "--refresh-prometheus-metrics-interval",
        "50ms",
    ];
    let flags: Vec<String> = flags.iter().map(|s| (*s).to_owned()).collect();
    Epp::start(&flags).await.map_err(setup("a spoke epp"))
}

fn setup<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> BenchError {
    move |e| BenchError::Setup(format!("starting {what}: {e:#}"))
}

/// The hub's picker.
enum Picker {
    Epp(Epp),
    Llmd(LlmdEpp),
}

/// The hub: its picker and the Envoy in front of it.
pub struct Hub {
    picker: Picker,
    envoy: Envoy,
}

impl Hub {
    async fn start(
        policy: HubPolicy,
        regions: &[Region],
        dir: &Path,
        llmd: Option<&Path>,
    ) -> Result<Self, BenchError> {
        let clusters = dir.join("clusters.yaml");
        let entries: String = regions.iter().map(Region::cluster_entry).collect();
        write(&clusters, &format!("endpoints:\n{entries}"))?;
        let config = dir.join("hub.yaml");
        write(&config, &hub_config(policy, &clusters))?;
        let (picker, grpc) = match policy {
            HubPolicy::LlmdLoad => {
                let bin = llmd.ok_or_else(|| {
                    BenchError::Setup("llm-d's hub needs EPP_LLMD_EPP (its EPP binary)".into())
                })?;
                let epp = LlmdEpp::start_file(bin, &config, dir)
                    .await
                    .map_err(setup("llm-d's hub EPP"))?;
                let grpc = epp.grpc;
                (Picker::Llmd(epp), grpc)
            }
            HubPolicy::EppNetworkCost(_) | HubPolicy::EppLoad => {
                let epp = hub_epp(&config).await?;
                let grpc = epp.grpc;
                (Picker::Epp(epp), grpc)
            }
        };
        let envoy = EnvoyConfig::new(Template::Duplex)
            .epp(grpc)
            .epp_tls(false)
            .pool(regions.iter().map(|r| r.data.addr()))
            .start()
            .await?;
        Ok(Self { picker, envoy })
    }

    /// Where clients send requests.
    pub fn listener(&self) -> SocketAddr {
        self.envoy.listener_addr()
    }

    async fn stop(self) {
        drop(self.envoy);
        match self.picker {
            Picker::Epp(e) => e.stop().await,
            Picker::Llmd(e) => drop(e),
        }
    }
}

/// epp as the hub: scrapes every 50 ms (a far spoke answers every round trip), a reading older
/// than 1 s leaves its cluster out.
async fn hub_epp(config: &Path) -> Result<Epp, BenchError> {
    let flags = [
        "--config-file",
        &config.display().to_string(),
        "--secure-serving",
        "false",
        "--refresh-metrics-interval",
        "50ms",
        "--metrics-staleness-threshold",
        "1s",
        "--allow-experimental-plugins",
        "true",
    ];
    let flags: Vec<String> = flags.iter().map(|s| (*s).to_owned()).collect();
    Epp::start(&flags).await.map_err(setup("the hub epp"))
}

fn write(path: &Path, text: &str) -> Result<(), BenchError> {
    std::fs::write(path, text).map_err(BenchError::io(format!("writing {}", path.display())))
}

/// The regions and the hub in front of them.
pub struct Bed {
    pub regions: Vec<Region>,
    pub hub: Hub,
    pub dir: PathBuf,
}

impl Bed {
    /// Starts every region, then the hub over them, and waits until a completion goes
    /// through (bounded: 30 s).
    pub async fn start(
        specs: &[RegionSpec],
        engine: &EngineConfig,
        policy: HubPolicy,
        llmd: Option<&Path>,
        dir: &Path,
    ) -> Result<Self, BenchError> {
        std::fs::create_dir_all(dir)
            .map_err(BenchError::io(format!("creating {}", dir.display())))?;
        let mut regions = Vec::new();
        for s in specs {
            regions.push(Region::start(s, engine).await?);
        }
        let hub = Hub::start(policy, &regions, dir, llmd).await?;
        super::routers::wait_routable(hub.listener(), &engine.model, Duration::from_secs(30))
            .await?;
        Ok(Self {
            regions,
            hub,
            dir: dir.to_owned(),
        })
    }

    /// The region that served pod `name`, by index.
    pub fn region_of(&self, pod: &str) -> Option<usize> {
        self.regions.iter().position(|r| r.owns(pod))
    }

    pub async fn stop(self) {
        self.hub.stop().await;
        for r in self.regions {
            r.stop().await;
        }
    }
}

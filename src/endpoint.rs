//! Vocabulary for model-server endpoints: who they are ([`EndpointId`], [`Endpoint`]) and what
//! their last scrape said ([`EndpointMetrics`]).
//!
//! An endpoint is one `ip:port` a gateway can route to. A pod with several data-parallel ranks
//! (target ports) is several endpoints. The address is the identity: the gateway routes on it,
//! the subset hint names it, and the prefix index keys on it.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::{Duration, Instant};

/// The `ip:port` of one endpoint. `Display` brackets IPv6 addresses (`[fd00::1]:8000`), as the
/// protocol requires and as Go's `net.JoinHostPort` does upstream.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct EndpointId(pub SocketAddr);

impl fmt::Display for EndpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for EndpointId {
    type Err = std::net::AddrParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.trim().parse().map(EndpointId)
    }
}

/// The serving engine behind an endpoint; it decides which metric names are scraped.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default, serde::Deserialize)]
pub enum EngineType {
    #[default]
    #[serde(rename = "vllm")]
    Vllm,
    #[serde(rename = "sglang")]
    Sglang,
    #[serde(rename = "trtllm-serve")]
    TrtllmServe,
    #[serde(rename = "triton-tensorrt-llm")]
    TritonTrtllm,
}

impl EngineType {
    /// Parses the value of the `inference.networking.k8s.io/engine-type` label.
    pub(crate) fn from_label(value: &str) -> Option<Self> {
        match value {
            "vllm" => Some(Self::Vllm),
            "sglang" => Some(Self::Sglang),
            "trtllm-serve" => Some(Self::TrtllmServe),
            "triton-tensorrt-llm" => Some(Self::TritonTrtllm),
            _ => None,
        }
    }

    /// Path of the Prometheus endpoint; trtllm-serve mounts it under `/prometheus`.
    pub(crate) fn metrics_path(self) -> &'static str {
        match self {
            Self::TrtllmServe => "/prometheus/metrics",
            _ => "/metrics",
        }
    }
}

/// A routable endpoint as discovery knows it. Immutable; a change is a new value.
#[derive(Clone, Debug, PartialEq)]
pub struct Endpoint {
    pub id: EndpointId,
    /// Human name for logs and metric labels: the pod name (with `-rank-N` for data-parallel
    /// ranks) or the address for static endpoints.
    pub name: String,
    pub(crate) engine: EngineType,
    pub labels: BTreeMap<String, String>,
    /// Relative capacity for weighted pickers; 1 unless configured.
    pub(crate) weight: u32,
    /// The pod-local data-parallel rank: the endpoint's position in the pool's `targetPorts`
    /// (upstream's `RankIndex`), 0 for a single-port pod or a static endpoint unless its file
    /// entry says `rank:`. vLLM offsets each rank's KV-event sockets by it, so subscribers do.
    pub rank: u16,
    /// Where this endpoint's metrics are, `host:port`, when not at its own address: a cluster
    /// of a multi-cluster hub (`multicluster-file-discovery`) publishes its EPP's metrics apart
    /// from its gateway, and keeps the host name it was given, which its certificate names.
    pub(crate) metrics_host: Option<String>,
}

impl Endpoint {
    /// An endpoint known only by its address (the `--static-endpoints` flag).
    pub fn from_id(id: EndpointId) -> Self {
        Self {
            id,
            name: id.to_string(),
            engine: EngineType::Vllm,
            labels: BTreeMap::new(),
            weight: 1,
            rank: 0,
            metrics_host: None,
        }
    }
}

/// LoRA adapter state from `vllm:lora_requests_info`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoraState {
    pub(crate) running: Vec<String>,
    pub(crate) waiting: Vec<String>,
    pub(crate) max_loras: u32,
}

impl LoraState {
    pub(crate) fn is_active(&self, adapter: &str) -> bool {
        self.running.iter().any(|a| a == adapter)
    }
    pub(crate) fn is_waiting(&self, adapter: &str) -> bool {
        self.waiting.iter().any(|a| a == adapter)
    }
}

/// KV-cache geometry from `vllm:cache_config_info` (or the engine's equivalent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheInfo {
    pub block_size: u32,
    pub num_blocks: u64,
}

/// GPU readings from the NVIDIA DCGM exporter (`DCGM_FI_DEV_*`), aggregated over the GPUs a
/// pod uses: a tensor-parallel pod is as constrained as its fullest GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpuMetrics {
    /// Mean `DCGM_FI_DEV_GPU_UTIL` as a fraction in 0..=1 (the exporter reports percent).
    pub(crate) utilization: Option<f64>,
    /// Sum of `DCGM_FI_DEV_FB_USED` over the GPUs, MiB.
    pub(crate) fb_used_mib: Option<f64>,
    /// Smallest `DCGM_FI_DEV_FB_FREE` over the GPUs, MiB: the headroom of the fullest GPU.
    pub(crate) fb_free_mib: Option<f64>,
    /// How many GPUs reported.
    pub devices: u32,
}

/// What a spoke EPP publishes about its whole pool (`llm_d_epp_average_kv_cache_utilization`,
/// `llm_d_epp_average_queue_size`), which a hub reads in place of a pod's gauges. Each is
/// `None` when the scrape did not carry it (upstream's multicluster scorers leave such a
/// cluster unscored).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PoolMetrics {
    /// The pool's average KV-cache utilization, a fraction in 0..=1.
    pub(crate) kv_usage: Option<f64>,
    /// The pool's average waiting-queue size.
    pub(crate) queue: Option<f64>,
    /// The hub's round trip to the spoke, ms: the smallest of its last scrapes' times
    /// (`crate::scrape::cluster`); `None` until one is timed.
    pub(crate) rtt_ms: Option<f64>,
}

/// One successful scrape of an endpoint's metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointMetrics {
    pub waiting: f64,
    pub running: f64,
    /// KV-cache usage as a fraction in 0..=1.
    pub kv_usage: f64,
    pub lora: Option<LoraState>,
    pub cache: Option<CacheInfo>,
    /// NVIDIA DCGM exporter readings, when the scrape carried them.
    pub gpu: Option<GpuMetrics>,
    /// A cluster's pool aggregates, when the endpoint is a cluster of a multi-cluster hub
    /// (`multicluster-metrics-extractor`); `None` for a model-server pod.
    pub pool: Option<PoolMetrics>,
    /// `core-metrics-extractor`'s `engineConfigs` `customMetrics` of the endpoint's engine:
    /// (attributeKey, value) for each configured series the scrape carried.
    pub attributes: Vec<(String, f64)>,
    /// When the scrape completed; staleness is measured from here.
    pub updated: Instant,
}

impl EndpointMetrics {
    pub(crate) fn age(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.updated)
    }

    /// The value of custom metric `key` (an endpoint attribute), if the scrape carried it.
    pub(crate) fn attribute(&self, key: &str) -> Option<f64> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| *v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_endpoints_are_bracketed() {
        let id: EndpointId = "[fd00::1]:8000".parse().unwrap();
        assert_eq!(id.to_string(), "[fd00::1]:8000");
        let v4: EndpointId = " 10.0.0.1:8000".parse().unwrap();
        assert_eq!(v4.to_string(), "10.0.0.1:8000");
    }

    #[test]
    fn engine_labels_parse_and_unknown_is_none() {
        assert_eq!(EngineType::from_label("sglang"), Some(EngineType::Sglang));
        assert_eq!(EngineType::from_label("tgi"), None);
        assert_eq!(
            EngineType::TrtllmServe.metrics_path(),
            "/prometheus/metrics"
        );
    }
}

//! One inference-sim pod as the router tests use it: recording every request byte for byte,
//! serving [`TEST_MODEL`], named by `x-inference-pod`, with its test hook at hand (forced metric
//! values, `/metrics` failing or hanging).
//!
//! [`test_pod_config`] is the starting point tests change: a small, fast pod (1,024 KV blocks,
//! at most 5 output tokens when a request sets no `max_tokens`, the H100 timing profile in real
//! time) whose answers report `prompt_tokens_details.cached_tokens`. What a test needs beyond
//! vLLM's own behaviour is a vLLM setting here too: other model names are LoRA adapters
//! (`enable_lora`, `lora_modules`), a slow pod is a slower timing profile or the
//! `added_latency_ms` fault.

use std::net::SocketAddr;
use std::sync::Arc;

use inference_sim::{
    EngineConfig, FaultSwitch, MetricValues, Pod, PodConfig, PodControl, PodError, RecordedRequest,
    TestHook,
};
use tokio::net::TcpListener;

/// The base model every test pod serves.
pub const TEST_MODEL: &str = "test-model";

/// A recording test pod named `name` (see the module docs).
pub fn test_pod_config(name: &str) -> PodConfig {
    PodConfig {
        engine: EngineConfig {
            model: TEST_MODEL.into(),
            num_gpu_blocks: 1024,
            default_max_output: 5,
            ..EngineConfig::default()
        },
        pod_name: name.into(),
        prompt_tokens_details: true,
        record_requests: true,
        ..PodConfig::default()
    }
}

/// `cfg` serving `adapters` as LoRA adapters too (vLLM `--enable-lora --lora-modules`): the
/// model names a test sends besides [`TEST_MODEL`], e.g. the target of a model rewrite.
pub fn with_adapters(mut cfg: PodConfig, adapters: &[&str]) -> PodConfig {
    cfg.enable_lora = true;
    cfg.lora_modules = adapters.iter().map(|a| (*a).to_owned()).collect();
    cfg
}

/// `cfg` with a 128k context, the KV blocks for it and ten times real time for its prefill, so
/// long prompts (tens of thousands of tokens) are served rather than refused.
pub fn with_long_context(mut cfg: PodConfig) -> PodConfig {
    cfg.engine.max_model_len = 131_072;
    cfg.engine.num_gpu_blocks = 8_192;
    cfg.engine.time_scale = 10.0;
    cfg
}

/// A running pod; [`SimPod::shutdown`] stops it (dropping it aborts its tasks).
pub struct SimPod {
    name: String,
    pod: Pod,
    control: PodControl,
}

impl std::fmt::Debug for SimPod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimPod")
            .field("name", &self.name)
            .field("addr", &self.pod.addr())
            .finish_non_exhaustive()
    }
}

impl SimPod {
    /// Serves `cfg` on `listener`.
    pub async fn start(listener: TcpListener, cfg: PodConfig) -> Result<Self, PodError> {
        let name = cfg.pod_name.clone();
        let faults = FaultSwitch::new(cfg.faults.clone());
        let pod = Pod::start(listener, Arc::new(cfg), faults).await?;
        let control = pod.control();
        Ok(Self { name, pod, control })
    }

    /// Binds 127.0.0.1:0 and starts.
    pub async fn bind(cfg: PodConfig) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        Ok(Self::start(listener, cfg).await?)
    }

    /// A [`test_pod_config`] pod named `name` on 127.0.0.1:0.
    pub async fn named(name: &str) -> anyhow::Result<Self> {
        Self::bind(test_pod_config(name)).await
    }

    pub fn addr(&self) -> SocketAddr {
        self.pod.addr()
    }

    /// `ip:port`, as an endpoint picker names it in `x-gateway-destination-endpoint`.
    pub fn endpoint(&self) -> String {
        self.addr().to_string()
    }

    /// The `x-inference-pod` value.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Recorded requests, forced metric values, `/metrics` failure modes.
    pub fn hook(&self) -> &TestHook {
        self.control.hook()
    }

    /// Every request received so far, in arrival order (epp's scrapes included).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.hook().requests()
    }

    /// The gauge values `/metrics` reports now.
    pub fn metric_values(&self) -> MetricValues {
        self.control.metric_values()
    }

    /// Faults, the KV-event endpoints, the `/metrics` text.
    pub fn control(&self) -> &PodControl {
        &self.control
    }

    /// Stops accepting, resets open connections, waits for the pod's tasks.
    pub async fn shutdown(self) {
        self.pod.stop().await;
    }
}

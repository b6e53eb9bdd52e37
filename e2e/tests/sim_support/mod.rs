//! Shared helpers of the inference-sim integration tests: small, fast pods on
//! 127.0.0.1:0 with a timing profile whose effects are large enough to assert
//! on a loaded 2-core machine.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use harness::client;
use inference_sim::{Cluster, EngineConfig, PodConfig, TimingProfile};
use serde_json::Value;

pub const MODEL: &str = "sim-model";

/// A pod with 8 sequence slots, a 2000-block cache and a slow prefill
/// (200 µs/token) so cached and uncached prompts differ by hundreds of ms.
pub fn pod_config(name: &str) -> PodConfig {
    PodConfig {
        engine: EngineConfig {
            model: MODEL.into(),
            max_num_seqs: 8,
            max_num_batched_tokens: 4096,
            max_model_len: 4096,
            num_gpu_blocks: 2001,
            timing: TimingProfile {
                step_overhead: Duration::from_millis(5),
                prefill_per_token: Duration::from_micros(200),
                decode_per_seq: Duration::from_micros(500),
                attention_per_context_token: Duration::ZERO,
            },
            ..EngineConfig::default()
        },
        pod_name: name.into(),
        enable_lora: true,
        lora_modules: vec!["food-review-1".into()],
        prompt_tokens_details: true,
        ..PodConfig::default()
    }
}

pub async fn start(configs: Vec<PodConfig>) -> Cluster {
    let addrs: Vec<SocketAddr> = configs
        .iter()
        .map(|_| SocketAddr::from(([127, 0, 0, 1], 0)))
        .collect();
    Cluster::start(configs, &addrs)
        .await
        .expect("cluster starts")
}

pub async fn post(addr: SocketAddr, path: &str, body: Value) -> client::HttpResponse {
    client::post_json(addr, path, body.to_string())
        .await
        .expect("request completes")
}

/// The first sample of a series (`name` or `name{labels}`), with epp's parser.
#[allow(unused_imports)] // sim_python reads no samples
pub use harness::prometheus::value as sample;

pub async fn metrics(addr: SocketAddr) -> String {
    harness::prometheus::scrape(addr, "/metrics")
        .await
        .expect("metrics")
}

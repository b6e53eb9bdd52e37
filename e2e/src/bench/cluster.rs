//! The simulated cluster of a benchmark: one `inference-sim` process holding every pod, started
//! fresh (cold caches) for each router, so no router inherits another's cache.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use super::procs::{free_port_range, wait_http_ok, Proc};
use super::BenchError;

/// The pods' engine settings (inference-sim flags).
#[derive(Clone, Debug, Serialize)]
pub struct SimOptions {
    pub pods: usize,
    /// KV blocks per pod (the null block included).
    pub num_gpu_blocks: usize,
    pub block_size: usize,
    pub max_model_len: usize,
    /// inference-sim `--profile`.
    pub profile: String,
    pub time_scale: f64,
    /// LoRA adapters every pod serves (empty = none).
    pub lora_adapters: Vec<String>,
    pub max_loras: usize,
}

impl SimOptions {
    fn args(&self, base_port: u16) -> Vec<String> {
        let mut a: Vec<String> = [
            "--pods", &self.pods.to_string(), "--base-port", &base_port.to_string(),
            "--num-gpu-blocks", &self.num_gpu_blocks.to_string(), "--block-size", &self.block_size.to_string(),
            "--max-model-len", &self.max_model_len.to_string(), "--profile", &self.profile,
            "--time-scale", &self.time_scale.to_string(), "--seed", "7",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        if !self.lora_adapters.is_empty() {
            a.extend(["--lora-modules".to_owned(), self.lora_adapters.join(","), "--max-loras".to_owned(), self.max_loras.to_string()]);
        }
        a
    }

    /// KV capacity of one pod in tokens.
    pub fn pod_kv_tokens(&self) -> usize {
        self.num_gpu_blocks.saturating_sub(1) * self.block_size
    }
}

/// A running simulator process and its pods' addresses.
pub struct SimCluster {
    pub proc_: Proc,
    pub pods: Vec<SocketAddr>,
}

impl SimCluster {
    pub async fn start(sim: &Path, opts: &SimOptions, dir: &Path) -> Result<Self, BenchError> {
        let base = free_port_range(opts.pods)?;
        let mut proc_ = Proc::spawn("inference-sim", sim, &opts.args(base), dir)?;
        let pods: Vec<SocketAddr> = (0..opts.pods as u16).map(|i| SocketAddr::from(([127, 0, 0, 1], base + i))).collect();
        for pod in &pods {
            wait_http_ok(&mut proc_, *pod, "/health", Duration::from_secs(20)).await?;
        }
        Ok(Self { proc_, pods })
    }
}

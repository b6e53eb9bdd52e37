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
    /// Publish KV-cache events (ZMQ PUB + replay ROUTER per pod, bound on 127.0.0.1), for
    /// epp's precise prefix scorer.
    pub kv_events: bool,
    /// One loopback IP per pod (127.0.0.1 + i), every pod on the same port, as in a cluster:
    /// what an EPP with Kubernetes discovery (one target port per pool) needs.
    pub host_per_pod: bool,
    /// Per-pod speed factors, cycled over the pods (inference-sim `--speeds`; empty: all 1.0).
    pub speeds: Vec<f64>,
}

impl SimOptions {
    fn args(&self, base_port: u16, kv: Option<(u16, u16)>) -> Vec<String> {
        let mut a: Vec<String> = [
            "--pods",
            &self.pods.to_string(),
            "--base-port",
            &base_port.to_string(),
            "--num-gpu-blocks",
            &self.num_gpu_blocks.to_string(),
            "--block-size",
            &self.block_size.to_string(),
            "--max-model-len",
            &self.max_model_len.to_string(),
            "--profile",
            &self.profile,
            "--time-scale",
            &self.time_scale.to_string(),
            "--seed",
            "7",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        if !self.lora_adapters.is_empty() {
            a.extend([
                "--lora-modules".to_owned(),
                self.lora_adapters.join(","),
                "--max-loras".to_owned(),
                self.max_loras.to_string(),
            ]);
        }
        if self.host_per_pod {
            a.push("--host-per-pod".to_owned());
        }
        if !self.speeds.is_empty() {
            let speeds: Vec<String> = self.speeds.iter().map(f64::to_string).collect();
            a.extend(["--speeds".to_owned(), speeds.join(",")]);
        }
        if let Some((publish, replay)) = kv {
            // Pod i binds port + i of each.
            a.extend([
                "--kv-events-endpoint".to_owned(),
                format!("tcp://127.0.0.1:{publish}"),
                "--kv-events-mode".to_owned(),
                "bind".to_owned(),
            ]);
            a.extend([
                "--kv-events-replay-endpoint".to_owned(),
                format!("tcp://127.0.0.1:{replay}"),
            ]);
        }
        a
    }

    /// Where pod `i` listens when pod 0 is on `base`.
    pub fn pod_addr(&self, base: u16, i: u16) -> SocketAddr {
        if self.host_per_pod {
            let ip =
                std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::LOCALHOST) + u32::from(i));
            SocketAddr::from((ip, base))
        } else {
            SocketAddr::from(([127, 0, 0, 1], base + i))
        }
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
    /// Per pod, its KV-event PUB and replay ports (empty without `kv_events`).
    pub kv_ports: Vec<(u16, u16)>,
}

impl SimCluster {
    pub async fn start(sim: &Path, opts: &SimOptions, dir: &Path) -> Result<Self, BenchError> {
        // One range: HTTP ports, then (with KV events) PUB ports, then replay ports.
        let n = opts.pods as u16;
        let base = free_port_range(opts.pods * if opts.kv_events { 3 } else { 1 })?;
        let kv = opts.kv_events.then_some((base + n, base + 2 * n));
        let mut proc_ = Proc::spawn("inference-sim", sim, &opts.args(base, kv), dir)?;
        let pods: Vec<SocketAddr> = (0..n).map(|i| opts.pod_addr(base, i)).collect();
        let kv_ports = kv
            .map(|(p, r)| (0..n).map(|i| (p + i, r + i)).collect())
            .unwrap_or_default();
        for pod in &pods {
            wait_http_ok(&mut proc_, *pod, "/health", Duration::from_secs(20)).await?;
        }
        Ok(Self {
            proc_,
            pods,
            kv_ports,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_events_bind_on_loopback_after_the_http_ports() {
        let opts = SimOptions {
            pods: 2,
            num_gpu_blocks: 11,
            block_size: 16,
            max_model_len: 1024,
            profile: "llmd-h100-8b".into(),
            time_scale: 1.0,
            lora_adapters: Vec::new(),
            max_loras: 1,
            kv_events: true,
            host_per_pod: false,
            speeds: Vec::new(),
        };
        let a = opts.args(9000, Some((9002, 9004))).join(" ");
        assert!(
            a.contains("--kv-events-endpoint tcp://127.0.0.1:9002 --kv-events-mode bind"),
            "{a}"
        );
        assert!(
            a.contains("--kv-events-replay-endpoint tcp://127.0.0.1:9004"),
            "{a}"
        );
        assert!(!opts.args(9000, None).join(" ").contains("kv-events"));
    }
}

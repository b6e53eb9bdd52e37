//! The simulated cluster of a benchmark: one `inference-sim` process holding every pod, started
//! fresh (cold caches) for each router, so no router inherits another's cache.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use super::procs::{free_port_range, wait_http_ok, Proc};
use super::BenchError;

/// Which simulator serves the pods.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Engine {
    /// Ours: `inference-sim`, every pod in one process.
    #[default]
    InferenceSim,
    /// llm-d-inference-sim v0.10.2 (`hack/install-peers.sh`), one process per pod, timing
    /// set to match inference-sim's `llmd-h100-8b` profile at the same time scale.
    LlmdSim,
}

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
    /// Which simulator serves the pods.
    pub engine: Engine,
    /// llm-d-inference-sim pods only: publish KV-cache events to the SUB socket an EPP binds on
    /// `tcp://127.0.0.1:<port>` (llm-d's "global socket" mode, `kvEventsConfig.zmqEndpoint`;
    /// epp's `--kv-events-bind`). Each pod's PUB connects there (`--zmq-endpoint`, no wildcard)
    /// and names itself in the topic `kv@127.0.0.1:<its HTTP port>@<model>` (`POD_IP`), the
    /// `<address>:<port>` both EPPs key their endpoints by.
    pub kv_events_sub: Option<u16>,
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
        if let Some(sub) = self.kv_events_sub {
            // Every pod's PUB dials the one SUB socket an EPP binds; the default topic
            // `kv@<ip>:<port>@<model>` names the pod.
            a.extend([
                "--kv-events-endpoint".to_owned(),
                format!("tcp://127.0.0.1:{sub}"),
                "--kv-events-mode".to_owned(),
                "connect".to_owned(),
            ]);
        } else if let Some((publish, replay)) = kv {
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

    /// llm-d-inference-sim flags of one pod on `port`: KV cache on (same blocks), the
    /// `llmd-h100-8b` timing (12 ms per step, 250 µs per prefill token) divided by the time scale.
    pub fn llmd_sim_args(&self, port: u16, model: &str) -> Vec<String> {
        let scale = self.time_scale.max(1e-3);
        let us = |v: f64| format!("{}us", (v / scale).round() as u64);
        [
            "--port",
            &port.to_string(),
            "--model",
            model,
            "--mode",
            "random",
            "--force-dummy-tokenizer",
            "--enable-kvcache",
            "--kv-cache-size",
            &self.num_gpu_blocks.saturating_sub(1).to_string(),
            "--block-size",
            &self.block_size.to_string(),
            "--max-model-len",
            &self.max_model_len.to_string(),
            "--max-num-seqs",
            "64",
            "--prefill-overhead",
            &us(12_000.0),
            "--prefill-time-per-token",
            &us(250.0),
            "--inter-token-latency",
            &us(12_000.0),
            "--time-factor-under-load",
            "2",
            "--seed",
            "7",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .chain(self.kv_events_sub.into_iter().flat_map(|sub| {
            [
                "--zmq-endpoint".to_owned(),
                format!("tcp://127.0.0.1:{sub}"),
            ]
        }))
        .collect()
    }

    /// The environment of the llm-d-inference-sim pod on `port`: `POD_IP`, which its KV cache
    /// needs and puts in its KV-event topic (`kv@<POD_IP>@<model>`). With `kv_events_sub` it is
    /// `127.0.0.1:<port>`, so that the topic names the endpoint as the EPPs know it (all pods
    /// share one IP here); without, plain `127.0.0.1` (nothing listens to the events).
    pub fn llmd_sim_env(&self, port: u16) -> Vec<(String, String)> {
        let ip = match self.kv_events_sub {
            Some(_) => format!("127.0.0.1:{port}"),
            None => "127.0.0.1".to_owned(),
        };
        vec![("POD_IP".to_owned(), ip)]
    }

    /// KV capacity of one pod in tokens.
    pub fn pod_kv_tokens(&self) -> usize {
        self.num_gpu_blocks.saturating_sub(1) * self.block_size
    }
}

/// A running simulator process and its pods' addresses.
pub struct SimCluster {
    pub proc_: Proc,
    /// The other processes (llm-d-inference-sim: one per pod).
    pub more: Vec<Proc>,
    pub pods: Vec<SocketAddr>,
    /// Per pod, its KV-event PUB and replay ports (empty without `kv_events`).
    pub kv_ports: Vec<(u16, u16)>,
    /// The port on 127.0.0.1 the pods publish their KV events to, which the EPP must bind
    /// (`SimOptions::kv_events_sub`).
    pub kv_sub: Option<u16>,
}

impl SimCluster {
    pub async fn start(sim: &Path, opts: &SimOptions, dir: &Path) -> Result<Self, BenchError> {
        if opts.engine == Engine::LlmdSim {
            return Self::start_llmd(opts, dir).await;
        }
        if opts.kv_events_sub.is_some() && opts.kv_events {
            return Err(BenchError::Setup(
                "inference-sim pods either bind their KV-event PUB sockets (kv_events) or \
                 connect to an EPP's SUB socket (kv_events_sub), not both"
                    .into(),
            ));
        }
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
            more: Vec::new(),
            pods,
            kv_ports,
            kv_sub: opts.kv_events_sub,
        })
    }

    /// One llm-d-inference-sim process per pod on 127.0.0.1 (it binds every interface, so one
    /// port per pod: no `host_per_pod`). KV events only as `kv_events_sub` (each PUB connects to
    /// the EPP's SUB), not as `kv_events` (epp subscribing to a PUB bound by each pod).
    async fn start_llmd(opts: &SimOptions, dir: &Path) -> Result<Self, BenchError> {
        let bin = super::upstream::peer_bin("llm-d-inference-sim");
        if !bin.is_file() {
            return Err(BenchError::Setup(format!(
                "{} is not installed (hack/install-peers.sh)",
                bin.display()
            )));
        }
        if opts.host_per_pod || opts.kv_events {
            return Err(BenchError::Setup(
                "llm-d-inference-sim pods here have one port each and publish KV events only to \
                 an EPP's SUB socket (kv_events_sub)"
                    .into(),
            ));
        }
        let base = free_port_range(opts.pods)?;
        let mut procs = Vec::new();
        let mut pods = Vec::new();
        for i in 0..opts.pods as u16 {
            let addr = SocketAddr::from(([127, 0, 0, 1], base + i));
            let args = opts.llmd_sim_args(addr.port(), super::plan::MODEL);
            let env = opts.llmd_sim_env(addr.port());
            let mut p =
                Proc::spawn_env(&format!("llm-d-inference-sim-{i}"), &bin, &args, &env, dir)?;
            wait_http_ok(&mut p, addr, "/health", Duration::from_secs(30)).await?;
            procs.push(p);
            pods.push(addr);
        }
        let proc_ = procs.remove(0);
        Ok(Self {
            proc_,
            more: procs,
            pods,
            kv_ports: Vec::new(),
            kv_sub: opts.kv_events_sub,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_events_bind_on_loopback_after_the_http_ports() {
        let mut opts = SimOptions {
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
            engine: Engine::InferenceSim,
            kv_events_sub: None,
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
        // Connecting to an EPP's SUB socket instead: no PUB or replay ports of their own.
        opts.kv_events_sub = Some(5600);
        let a = opts.args(9000, None).join(" ");
        assert!(
            a.contains("--kv-events-endpoint tcp://127.0.0.1:5600 --kv-events-mode connect"),
            "{a}"
        );
        assert!(!a.contains("replay"), "{a}");
    }

    #[test]
    fn llmd_sim_pods_publish_to_the_epps_sub_port_and_name_themselves_by_address_and_port() {
        let mut opts = SimOptions {
            pods: 2,
            num_gpu_blocks: 1001,
            block_size: 16,
            max_model_len: 16384,
            profile: "llmd-h100-8b".into(),
            time_scale: 0.5,
            lora_adapters: Vec::new(),
            max_loras: 1,
            kv_events: false,
            host_per_pod: false,
            speeds: Vec::new(),
            engine: Engine::LlmdSim,
            kv_events_sub: None,
        };
        let plain = opts.llmd_sim_args(9001, "m").join(" ");
        assert!(!plain.contains("zmq"), "{plain}");
        assert_eq!(
            opts.llmd_sim_env(9001),
            [("POD_IP".to_owned(), "127.0.0.1".to_owned())]
        );
        opts.kv_events_sub = Some(5600);
        let a = opts.llmd_sim_args(9001, "m");
        let at = a.iter().position(|x| x == "--zmq-endpoint").unwrap();
        assert_eq!(a[at + 1], "tcp://127.0.0.1:5600");
        assert!(a.join(" ").contains("--port 9001 --model m"));
        assert_eq!(
            opts.llmd_sim_env(9001),
            [("POD_IP".to_owned(), "127.0.0.1:9001".to_owned())]
        );
    }
}

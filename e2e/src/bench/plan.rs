//! What each mode runs. The cluster is llm-d's published shape scaled to this machine: 8 pods
//! whose KV cache (32,000 tokens each) is exceeded six times over by the shared prefixes of the
//! workload (64 system prompts × 3,000 tokens = 192,000 tokens, 75% of the cluster's cache;
//! llm-d's 73-capacity run: ≈ 6× one pod, 73%).
//!
//! - `smoke`: 2 pods, a few requests, epp and round robin only (what CI runs, in-process);
//! - `quick`: shared prefix at the target load and the no-sharing workload, every router;
//! - `full`: quick plus a shared-prefix load sweep (latency against offered load), multi-turn
//!   chat, the long/short mix and the LoRA mix.

use std::path::PathBuf;

use super::cluster::SimOptions;
use super::compare::Scenario;
use super::routers::Router;
use crate::envoy::repo_root;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Smoke,
    Quick,
    Full,
}

/// Knobs of a plan (flags of the `bench` binary).
#[derive(Clone, Debug)]
pub struct PlanOptions {
    pub mode: Mode,
    /// Offered load of the shared-prefix run (requests/s).
    pub shared_prefix_rate: f64,
    /// Offered load of the no-sharing run (requests/s).
    pub random_rate: f64,
    /// Seconds of load per run.
    pub duration_s: f64,
    /// Include vllm-router and sglang-router.
    pub peers: bool,
    pub profile: String,
    pub time_scale: f64,
}

pub const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

fn config(name: &str) -> PathBuf {
    repo_root().join("hack").join("bench").join(name)
}

/// The routers of a full comparison, in table order.
pub fn routers(peers: bool) -> Vec<Router> {
    let mut r = vec![
        Router::EnvoyRoundRobin,
        Router::EnvoyLeastRequest,
        Router::Epp { name: "default".into(), config: config("epp-default.yaml") },
        Router::Epp { name: "best".into(), config: config("epp-best.yaml") },
    ];
    if peers {
        r.push(Router::VllmRouter { policy: "cache_aware".into() });
        r.push(Router::VllmRouter { policy: "power_of_two".into() });
        r.push(Router::SglangRouter { policy: "cache_aware".into() });
    }
    r
}

pub fn sim(opts: &PlanOptions, pods: usize) -> SimOptions {
    SimOptions {
        pods,
        num_gpu_blocks: 2001,
        block_size: 16,
        max_model_len: 16384,
        profile: opts.profile.clone(),
        time_scale: opts.time_scale,
        lora_adapters: Vec::new(),
        max_loras: 4,
    }
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// `loadgen` flags of the shared-prefix workload (without the load).
pub fn shared_prefix_args() -> Vec<String> {
    args(&["--workload", "shared-prefix", "--groups", "64", "--prompts-per-group", "16", "--system-len", "3000", "--question-len", "300", "--output-len", "100"])
}

fn open(rate_stages: String, drain_s: f64) -> Vec<String> {
    vec!["--rate-stages".into(), rate_stages, "--drain-secs".into(), drain_s.to_string(), "--seed".into(), "1".into()]
}

fn scenario(name: &str, sim: SimOptions, mut workload: Vec<String>, load: Vec<String>, routers: Vec<Router>) -> Scenario {
    workload.extend(load);
    Scenario { name: name.into(), sim, loadgen_args: workload, routers, model: MODEL.into() }
}

/// The scenarios of a mode.
pub fn scenarios(o: &PlanOptions) -> Vec<Scenario> {
    let d = o.duration_s;
    let drain = (d / 2.0).max(10.0);
    if o.mode == Mode::Smoke {
        let routers = vec![Router::EnvoyRoundRobin, Router::Epp { name: "default".into(), config: config("epp-default.yaml") }];
        let w = args(&["--workload", "shared-prefix", "--groups", "4", "--prompts-per-group", "2", "--system-len", "200", "--question-len", "20", "--output-len", "4"]);
        return vec![scenario("smoke", sim(o, 2), w, open(format!("4:{d}"), 5.0), routers)];
    }
    let mut v = vec![
        scenario("shared-prefix", sim(o, 8), shared_prefix_args(), open(format!("{}:{d}", o.shared_prefix_rate), drain), routers(o.peers)),
        scenario(
            "no-sharing",
            sim(o, 8),
            args(&["--workload", "random", "--input-len", "1000", "--output-len", "100"]),
            open(format!("{}:{d}", o.random_rate), drain),
            routers(o.peers),
        ),
    ];
    if o.mode == Mode::Full {
        let r = o.shared_prefix_rate;
        let sweep = format!("{}:{d},{}:{d},{}:{d},{}:{d}", r * 0.25, r * 0.5, r * 0.75, r);
        v.push(scenario("shared-prefix-sweep", sim(o, 8), shared_prefix_args(), open(sweep, drain), routers(o.peers)));
        let chat = args(&["--workload", "multi-turn", "--sessions", "48", "--turns", "6", "--system-len", "1500", "--question-len", "200", "--output-len", "100"]);
        v.push(scenario("multi-turn", sim(o, 8), chat, open(format!("{}:{d}", o.shared_prefix_rate * 0.6), drain), routers(o.peers)));
        let mix = args(&["--workload", "mix", "--short-len", "200", "--long-fraction", "0.1", "--long-min", "2000", "--long-max", "12000", "--output-len", "100"]);
        v.push(scenario("long-short-mix", sim(o, 8), mix, open(format!("{}:{d}", o.random_rate), drain), routers(o.peers)));
        let mut lora_sim = sim(o, 8);
        lora_sim.lora_adapters = (0..8).map(crate::loadgen::workload::lora_name).collect();
        let lora = args(&["--workload", "lora", "--adapters", "8", "--input-len", "1000", "--output-len", "100"]);
        v.push(scenario("lora-mix", lora_sim, lora, open(format!("{}:{d}", o.random_rate), drain), routers(o.peers)));
    }
    v
}

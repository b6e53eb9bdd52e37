//! The workloads of issue 20 (a scheduler that estimates time to first token), full mode only;
//! run one with `--mode full --only <name>`:
//!
//! - `agentic`: multi-turn sessions whose turns reuse ≥ 90% of the previous context (a
//!   2,000-token system prompt, 100-token questions, 64-token answers, up to 16 turns: 2,100 →
//!   4,600 tokens); 6 sessions per req/s of load: at 8 req/s, 48 sessions of 3,300 tokens on
//!   average want 1.2× the cluster's KV;
//! - `short-prompts`: 100-token prompts, nothing shared (the queue, not the cache, decides);
//! - `heterogeneous`: no sharing on pods of speeds 1.0 and 0.5 alternately (the slow pods have
//!   a third of the capacity: a slow pod's fair share is 8.3%, a fast one's 16.7%);
//! - `rl-burst`: bursts of the same prompt (RL rollouts: 16 samples of 8 prompts at once);
//! - `cache-pressure`: shared prefixes several times the cluster's KV (192 × 2,000 tokens = 3×).
//!
//! `trace-replay` (a replayed multi-turn trace: sessions of varying length, one shared system
//! block) is in [`super::trace_replay`].

use super::compare::Scenario;
use super::plan::{sim, PlanOptions, MODEL};
use super::routers::Router;

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn load(stages: &str, drain_s: f64, warmup_s: f64) -> Vec<String> {
    let mut v = args(&["--rate-stages", stages, "--seed", "1"]);
    v.extend([
        "--drain-secs".into(),
        drain_s.to_string(),
        "--warmup-secs".into(),
        warmup_s.to_string(),
    ]);
    v
}

/// The scenarios, each through `routers`.
pub fn scenarios(o: &PlanOptions, routers: &[Router]) -> Vec<Scenario> {
    let (d, w) = (o.duration_s, o.warmup_s);
    let drain = (d / 2.0).clamp(5.0, 20.0);
    let make = |name: &str, pods_speeds: &[f64], workload: &[&str], stages: String| {
        let mut s = sim(o, 8);
        s.speeds = pods_speeds.to_vec();
        let mut loadgen_args = args(workload);
        loadgen_args.extend(load(&stages, drain, w));
        Scenario {
            name: name.into(),
            sim: s,
            loadgen_args,
            routers: routers.to_vec(),
            model: MODEL.into(),
        }
    };
    // `--random-rate` (5.5 by default) sets the scale of these loads; the agentic sessions grow
    // with it (6 per req/s: a session's turn every 6 s, a turn takes about 2 s).
    let r = o.random_rate;
    let sessions = ((r * 6.0).round() as usize).max(8).to_string();
    let agentic = [
        "--workload",
        "multi-turn",
        "--sessions",
        &sessions,
        "--turns",
        "16",
        "--system-len",
        "2000",
        "--question-len",
        "100",
        "--output-len",
        "64",
    ];
    let short = [
        "--workload",
        "random",
        "--input-len",
        "100",
        "--output-len",
        "50",
    ];
    let random = [
        "--workload",
        "random",
        "--input-len",
        "1000",
        "--output-len",
        "50",
    ];
    let burst = [
        "--workload",
        "shared-prefix",
        "--groups",
        "8",
        "--prompts-per-group",
        "1",
        "--system-len",
        "1500",
        "--question-len",
        "16",
        "--output-len",
        "100",
    ];
    let pressure = [
        "--workload",
        "shared-prefix",
        "--groups",
        "192",
        "--prompts-per-group",
        "16",
        "--system-len",
        "2000",
        "--question-len",
        "200",
        "--output-len",
        "50",
    ];
    let cycles = ((d / 5.0).round() as usize).max(1);
    let bursty: Vec<String> = (0..cycles).map(|_| "2:4,64:1".to_owned()).collect();
    vec![
        make("agentic", &[], &agentic, format!("{r}:{d}")),
        make("short-prompts", &[], &short, format!("{}:{d}", r * 3.0)),
        make(
            "heterogeneous",
            &[1.0, 0.5],
            &random,
            format!("{}:{d}", r * 0.75),
        ),
        make("rl-burst", &[], &burst, bursty.join(",")),
        make("cache-pressure", &[], &pressure, format!("{}:{d}", r * 2.0)),
    ]
}

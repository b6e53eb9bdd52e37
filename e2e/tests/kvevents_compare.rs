//! Precise vs approximate vs random vs round robin on the shared-prefix workload, with one epp
//! replica and with three (requests spread over the replicas as Envoy spreads ext_proc
//! streams), in-process: simulator pods publishing KV events, directors with their scrapers and
//! KV-event subscribers, requests sent straight to the chosen pod.
//!
//! Ignored by default (it runs for minutes); BENCHMARKS.md ("Precise prefix") has the command
//! and the numbers: `cargo nextest run -p epp-e2e --release --test e2e kvevents_compare::
//! --run-ignored only --no-capture`. Environment: `KV_COMPARE_SECS` (default 20),
//! `KV_COMPARE_RATE` (requests/s, default 24), `KV_COMPARE_ONLY` (rows, e.g. `Precise1,Precise3`),
//! `KV_COMPARE_CONTROL=1` (all replicas run, only the first routes).

use crate::kvevents_support;

use inference_sim::EngineConfig;
use kvevents_support::*;
use rand::{rngs::SmallRng, Rng, SeedableRng};
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::task::TaskTracker;

const PODS: usize = 4;
/// 700 blocks of 16 tokens: 11,200 tokens per pod.
const BLOCKS: usize = 700;
/// 24 groups × ~2,000-token system prompts ≈ 48K tokens: 4.3× one pod's cache.
const GROUPS: usize = 24;

const APPROX_CONFIG: &str = "apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 1}
  - {pluginRef: kv-cache-utilization-scorer, weight: 1}
  - {pluginRef: prefix-cache-scorer, weight: 2}
  - {pluginRef: max-score-picker}
";

const RANDOM_CONFIG: &str = "apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: random-picker
";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Precise,
    Approximate,
    Random,
    RoundRobin,
}

#[derive(Default)]
struct Samples {
    latency: Vec<f64>,
    prompt: u64,
    cached: u64,
    failed: usize,
}

fn system_prompt(group: usize) -> String {
    long_prompt(
        &format!("System prompt of tenant {group}: follow the policy."),
        1000,
    )
}

async fn run(mode: Mode, replicas: usize, secs: f64, rate: f64) -> String {
    let engine = EngineConfig {
        model: MODEL.into(),
        num_gpu_blocks: BLOCKS,
        max_num_seqs: 16,
        ..EngineConfig::default()
    };
    let sims = SimPods::start_with(PODS, engine).await;
    let config = match mode {
        Mode::Precise => PRECISE_CONFIG,
        Mode::Approximate => APPROX_CONFIG,
        Mode::Random | Mode::RoundRobin => RANDOM_CONFIG,
    };
    let reps: Vec<Arc<Replica>> = (0..replicas)
        .map(|_| {
            Arc::new(Replica::build(
                &sims.endpoints(),
                config,
                mode == Mode::Precise,
                true,
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await; // first scrapes and subscriptions
                                                          // KV_COMPARE_CONTROL=1: every replica runs (scrapers, subscribers) but only the first
                                                          // routes, which separates the cost of running replicas from their routing disagreements.
    let routing = if std::env::var("KV_COMPARE_CONTROL").is_ok_and(|v| v == "1") {
        1
    } else {
        replicas
    };
    let systems: Vec<String> = (0..GROUPS).map(system_prompt).collect();
    let samples = Arc::new(Mutex::new(Samples::default()));
    let waiting = Arc::new(Mutex::new(Vec::<f64>::new()));
    let rr = Arc::new(AtomicUsize::new(0));
    let tasks = TaskTracker::new();
    let mut rng = SmallRng::seed_from_u64(42);
    let start = Instant::now();
    let mut next = start;
    let mut n = 0usize;
    let mut last_sample = start;
    while start.elapsed().as_secs_f64() < secs {
        tokio::time::sleep_until(next.into()).await;
        next += Duration::from_secs_f64(-(1.0 - rng.random::<f64>()).ln() / rate);
        if last_sample.elapsed() >= Duration::from_millis(100) {
            last_sample = Instant::now();
            let total: f64 = reps[0]
                .datastore
                .snapshot()
                .iter()
                .filter_map(|s| s.metrics())
                .map(|m| m.waiting)
                .sum();
            waiting.lock().expect("lock").push(total / PODS as f64);
        }
        let group = rng.random_range(0..GROUPS);
        let prompt = format!(
            "{} Question {n}: {}",
            systems[group],
            long_prompt("why", 100)
        );
        let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 1}).to_string();
        let replica = Arc::clone(&reps[n % routing]);
        n += 1;
        let (sims_addrs, samples, rr) = (
            sims.cluster.addrs().to_vec(),
            Arc::clone(&samples),
            Arc::clone(&rr),
        );
        tasks.spawn(async move {
            let (pod, lease) = match mode {
                Mode::RoundRobin => (rr.fetch_add(1, Ordering::Relaxed) % PODS, None),
                _ => {
                    let (pod, routed) = replica.route_held("/v1/completions", &body);
                    (pod, Some(routed))
                }
            };
            let t = Instant::now();
            let r = harness::client::post_json(sims_addrs[pod], "/v1/completions", body).await;
            let elapsed = t.elapsed().as_secs_f64();
            drop(lease);
            let mut s = samples.lock().expect("lock");
            match r
                .ok()
                .filter(|r| r.status.is_success())
                .and_then(|r| r.json().ok())
            {
                Some(v) => {
                    s.latency.push(elapsed);
                    s.prompt += v["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
                    s.cached += v["usage"]["prompt_tokens_details"]["cached_tokens"]
                        .as_u64()
                        .unwrap_or(0);
                }
                None => s.failed += 1,
            }
        });
    }
    tasks.close();
    tasks.wait().await;
    for r in reps {
        if let Ok(r) = Arc::try_unwrap(r) {
            r.stop().await;
        }
    }
    sims.cluster.shutdown().await;
    let w = waiting.lock().expect("lock");
    let mean_wait = w.iter().sum::<f64>() / w.len().max(1) as f64;
    let row = samples.lock().expect("lock").row(mode, replicas, mean_wait);
    row
}

impl Samples {
    /// The table row: requests, TTFT p90 and mean, hit rate, mean queue, failures.
    fn row(&self, mode: Mode, replicas: usize, mean_wait: f64) -> String {
        let mut lat = self.latency.clone();
        lat.sort_by(f64::total_cmp);
        let p90 = lat.get(lat.len() * 9 / 10).copied().unwrap_or(f64::NAN);
        let mean = lat.iter().sum::<f64>() / lat.len().max(1) as f64;
        let hit = self.cached as f64 / self.prompt.max(1) as f64;
        format!(
            "| {mode:?} | {replicas} | {} | {:.0} | {:.0} | {:.1}% | {mean_wait:.2} | {} |",
            lat.len(),
            p90 * 1000.0,
            mean * 1000.0,
            hit * 100.0,
            self.failed
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes long; run on demand (BENCHMARKS.md)"]
async fn precise_vs_approximate_vs_random_with_one_and_three_replicas() {
    let secs: f64 = std::env::var("KV_COMPARE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20.0);
    let rate: f64 = std::env::var("KV_COMPARE_RATE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24.0);
    println!("shared prefix: {PODS} pods × {BLOCKS} blocks, {GROUPS} groups × ~2,000-token system prompts, ~200-token questions, {rate} req/s for {secs} s");
    println!("| router | epp replicas | requests | TTFT p90 (ms) | TTFT mean (ms) | prefix hit rate | mean queue per pod | failed |");
    println!("|---|---|---|---|---|---|---|---|");
    // KV_COMPARE_ONLY=Precise1,Precise3 (mode and replica count) runs a subset of the rows.
    let only = std::env::var("KV_COMPARE_ONLY").ok();
    for (mode, replicas) in [
        (Mode::Precise, 1),
        (Mode::Approximate, 1),
        (Mode::Random, 1),
        (Mode::RoundRobin, 1),
        (Mode::Precise, 3),
        (Mode::Approximate, 3),
    ] {
        if only.as_deref().is_some_and(|o| {
            !o.split(',')
                .any(|r| r.trim() == format!("{mode:?}{replicas}"))
        }) {
            continue;
        }
        println!("{}", run(mode, replicas, secs, rate).await);
    }
}

//! Decision scaling: how epp's routing decision (`Director::route`: parse, tokenize, hash, prefix
//! lookup, score, pick, record) scales with the number of endpoints and the prompt length, and
//! how much memory the approximate prefix index takes per million recorded blocks.
//! Plain timing loops (median and p99 of single decisions), release build:
//! `cargo bench -p epp-e2e --bench scale`.

mod support;

use std::hint::black_box;
use std::time::Instant;

use epp::director::Director;
use loadgen::workload::words;
use rand::rngs::SmallRng;
use rand::SeedableRng;

const CONFIG: &str = "apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
  parameters: {maxPrefixTokensToMatch: 32768, autoTune: false}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: prefix-cache-scorer, weight: 3}
";

fn body(system: &str, question: &str) -> Vec<u8> {
    serde_json::json!({"model": "m", "prompt": format!("{system}{question}")})
        .to_string()
        .into_bytes()
}

/// Median and p99 (µs) of `n` decisions on prompts sharing one of 16 system prompts of
/// `tokens - 64` tokens, each with a new 64-token question (the tokenizer's segment cache sees
/// the shared text, as in steady state).
fn measure(d: &Director, tokens: usize, n: usize) -> (f64, f64) {
    let mut rng = SmallRng::seed_from_u64(1);
    let systems: Vec<String> = (0..16)
        .map(|_| words(&mut rng, tokens.saturating_sub(64)))
        .collect();
    let mut times = Vec::with_capacity(n);
    for i in 0..n + 32 {
        let b = body(&systems[i % systems.len()], &words(&mut rng, 64));
        let start = Instant::now();
        let r = harness::fixtures::route(d, "/v1/completions", &b, &mut rng);
        let t = start.elapsed();
        black_box(r.map(|r| r.destinations.len()).ok());
        if i >= 32 {
            times.push(t.as_secs_f64() * 1e6);
        }
    }
    times.sort_by(f64::total_cmp);
    (
        times[times.len() / 2],
        times[(times.len() * 99 / 100).min(times.len() - 1)],
    )
}

fn rss() -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

fn index_memory(blocks: usize, endpoints: u16) -> anyhow::Result<f64> {
    let index = epp::prefix::index::PrefixIndex::new();
    let before = rss();
    let ids: Vec<epp::endpoint::EndpointId> = (0..endpoints)
        .map(|i| format!("10.0.{}.{}:8000", i / 250, i % 250 + 1).parse())
        .collect::<Result<_, _>>()?;
    let per_call = 256;
    for call in 0..blocks / per_call {
        let hashes: Vec<u64> = (0..per_call as u64)
            .map(|b| (call as u64) << 20 | b)
            .map(|x| x.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        index.record(ids[call % ids.len()], &hashes, blocks);
    }
    black_box(index.longest_prefix(&[1, 2, 3]).len());
    Ok((rss().saturating_sub(before)) as f64 / (blocks as f64 / 1e6))
}

fn main() -> anyhow::Result<()> {
    println!("| endpoints | prompt tokens | decision p50 (µs) | p99 (µs) |\n|---:|---:|---:|---:|");
    for endpoints in [10, 100, 1000] {
        let d = support::bench_director(endpoints, CONFIG)?;
        for tokens in [1_000, 8_000, 32_000] {
            let n = if tokens > 8_000 { 200 } else { 1_000 };
            let (p50, p99) = measure(&d, tokens, n);
            println!("| {endpoints} | {tokens} | {p50:.0} | {p99:.0} |");
        }
    }
    let per_million = index_memory(2_000_000, 100)?;
    println!(
        "\nprefix index: {:.0} MB RSS per million recorded blocks (2M blocks over 100 endpoints)",
        per_million / 1e6
    );
    Ok(())
}

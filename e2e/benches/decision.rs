//! The routing decision, measured: `Director::route` (parse, tokenize, hash, prefix lookup,
//! schedule, record) with 100 endpoints and an 8K-token prompt:
//! - `cold_text`: every prompt is new text (no segment of it was tokenized before);
//! - `shared_prefix_text`: 7.5K tokens shared with earlier prompts plus a new 0.5K-token tail,
//!   the shape of multi-turn chat and shared system prompts;
//! - `token_ids`: the prompt arrives as token ids, so nothing is tokenized.
//!
//! And the parts: `parse_token_ids` (request parsing alone) and `decide_given_tokens` (block
//! hashing, prefix lookup, scoring and picking over 100 candidates, recording the decision);
//! `tokenize_8k_tokens_cold`: epp's tokenizer against tiktoken-rs on the same new text.
//!
//! `cargo bench -p epp-e2e --bench decision`; results in BENCHMARKS.md. Allocation goes
//! through mimalloc, the epp binary's global allocator.

mod support;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use epp::director::Runtime;
use epp::scheduling::{Candidate, SchedulingRequest};
use harness::fixtures::route as route_body;
use rand::{rngs::SmallRng, SeedableRng};
use std::hint::black_box;
use std::time::Duration;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const CONFIG: &str = "apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
  parameters: {maxPrefixTokensToMatch: 8192, autoTune: false}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: prefix-cache-scorer, weight: 3}
";

const WORDS: [&str; 16] = [
    "model", "server", "routing", "cache", "prefix", "token", "latency", "queue", "gateway",
    "envoy", "kernel", "batch", "tensor", "shard", "replica", "stream",
];

/// About `tokens` cl100k tokens of English words drawn from `rng` (one token per word).
fn words(tokens: usize, rng: &mut SmallRng) -> String {
    use rand::Rng;
    let text: Vec<&str> = (0..tokens)
        .map(|_| WORDS[rng.random_range(0..WORDS.len())])
        .collect();
    text.join(" ")
}

/// Words that are several tokens or not ASCII (merges and the regex pre-tokenizer), one in
/// four among [`WORDS`].
const MIXED: [&str; 12] = [
    "Kubernetes",
    "disaggregated",
    "prefill",
    "données",
    "Straße",
    "日本語のテキスト",
    "中文字符",
    "🚀",
    "1234567",
    "(x)=>{x+1}",
    "naïve",
    "Ελληνικά",
];

/// About `words` words, three in four from [`WORDS`] and one from [`MIXED`].
fn mixed(words: usize, rng: &mut SmallRng) -> String {
    use rand::Rng;
    let text: Vec<&str> = (0..words)
        .map(|_| match rng.random_range(0..4 * WORDS.len()) {
            i if i < 3 * WORDS.len() => WORDS[i % WORDS.len()],
            i => MIXED[i % MIXED.len()],
        })
        .collect();
    text.join(" ")
}

fn chat(system: &str, user: &str) -> Vec<u8> {
    serde_json::json!({"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}).to_string().into_bytes()
}

fn token_body(tokens: usize, seed: u32) -> Vec<u8> {
    let ids: Vec<u32> = (0..tokens as u32)
        .map(|i| (i * 31 + seed) % 100_000)
        .collect();
    serde_json::json!({"model": "m", "prompt": ids})
        .to_string()
        .into_bytes()
}

fn bench(c: &mut Criterion) {
    let d = support::bench_director(100, CONFIG).expect("bench director");
    let mut rng = SmallRng::seed_from_u64(1);
    let mut text_rng = SmallRng::seed_from_u64(2);
    let ids = token_body(8192, 0);
    let shared: Vec<String> = (0..8).map(|_| words(7680, &mut text_rng)).collect();
    // Warm the index and the segment cache with the shared prefixes, as in steady state.
    for (i, system) in shared.iter().cycle().take(64).enumerate() {
        let b = chat(system, &format!("warm-up {i}"));
        let _ = route_body(&d, "/v1/chat/completions", &b, &mut rng);
    }
    let route = |body: &[u8], rng: &mut SmallRng| {
        route_body(&d, "/v1/chat/completions", body, rng).map(|r| r.destinations.len())
    };
    let mut g = c.benchmark_group("decision_100_endpoints_8k_tokens");
    g.bench_function("cold_text", |b| {
        b.iter_batched(
            || chat(&words(8192, &mut text_rng), "q"),
            |body| black_box(route(&body, &mut rng)),
            BatchSize::LargeInput,
        )
    });
    let mut n = 0usize;
    g.bench_function("shared_prefix_text", |b| {
        b.iter_batched(
            || {
                n += 1;
                chat(&shared[n % shared.len()], &words(512, &mut text_rng))
            },
            |body| black_box(route(&body, &mut rng)),
            BatchSize::LargeInput,
        )
    });
    g.bench_function("token_ids", |b| {
        b.iter(|| {
            black_box(
                route_body(&d, "/v1/completions", &ids, &mut rng).map(|r| r.destinations.len()),
            )
        })
    });
    let tokens: Vec<u32> = (0..8192u32).map(|i| (i * 31) % 100_000).collect();
    g.bench_function("parse_token_ids", |b| {
        b.iter(|| {
            black_box(
                epp::request::parse(epp::request::ApiKind::Completions, &ids, 1 << 20)
                    .map(|r| r.model.len()),
            )
        })
    });
    let runtime = Runtime::build(CONFIG, None).expect("config");
    let index = epp::prefix::index::PrefixIndex::new();
    let candidates: Vec<Candidate> = (0..100u16)
        .map(|i| Candidate {
            id: format!("10.0.0.{}:8000", i + 1).parse().expect("addr"),
            weight: 1,
            metrics: None,
            waiting: f64::from(i % 7),
            running: 4.0,
            inflight: 0.0,
            labels: Default::default(),
            kv_usage: 0.3,
            fresh: true,
            prefix_blocks: 0,
            latency: None,
            ramp: 1.0,
            prefill: Default::default(),
        })
        .collect();
    for c in candidates.iter().take(10) {
        index.record(
            c.id,
            &epp::prefix::block_hashes("m", None, &tokens, 16, 512),
            30_000,
        );
    }
    g.bench_function("decide_given_tokens", |b| {
        b.iter(|| {
            let hashes = epp::prefix::block_hashes("m", None, &tokens, 16, 512);
            let matches = index.longest_prefix(&hashes);
            let mut cands = candidates.clone();
            for (id, n) in &matches {
                if let Some(c) = cands.iter_mut().find(|c| c.id == *id) {
                    c.prefix_blocks = *n;
                }
            }
            let req = SchedulingRequest {
                target_model: "m",
                prefix_total_blocks: hashes.len(),
                block_size: 16,
                ..Default::default()
            };
            let d = runtime
                .scheduler
                .schedule(&req, &cands, &mut rng)
                .expect("decision");
            index.record(d.endpoints[0], &hashes, 30_000);
            black_box(d.endpoints.len())
        })
    });
    g.finish();
    tokenizers(c, &mut text_rng);
    estimate(c);
}

const TTFT_CONFIG: &str = "apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
  parameters: {maxPrefixTokensToMatch: 8192, autoTune: false}
- type: estimated-ttft-scorer
- type: max-score-picker
";

/// What the estimated-TTFT scorer costs: `Scheduler::schedule` over the same 100 candidates
/// (prefix matches, queues, pending prefill and learned rates varied) with the upstream
/// default's three scorers and with `estimated-ttft-scorer` alone; `_slo` adds a sheddable
/// request's SLO check (one more estimate per candidate).
fn estimate(c: &mut Criterion) {
    use epp::scheduling::scorer::{PrefillLoad, TtftRates};
    let mut g = c.benchmark_group("estimate_100_endpoints");
    g.measurement_time(Duration::from_secs(4));
    let candidates: Vec<Candidate> = (0..100u16)
        .map(|i| Candidate {
            id: format!("10.0.0.{}:8000", i + 1).parse().expect("addr"),
            weight: 1,
            metrics: None,
            waiting: f64::from(i % 7),
            running: f64::from(i % 13),
            inflight: 0.0,
            labels: Default::default(),
            kv_usage: 0.3 + f64::from(i % 5) / 10.0,
            fresh: true,
            prefix_blocks: usize::from(i % 9) * 40,
            latency: None,
            ramp: 1.0,
            prefill: PrefillLoad {
                pending_tokens: f64::from(i % 11) * 300.0,
                pending_requests: f64::from(i % 3),
                queued: None,
                learned: (i % 4 != 0).then_some(TtftRates {
                    base: 0.02,
                    per_token: 1.0 / (2000.0 + f64::from(i)),
                    per_running: 0.001,
                    per_waiting: 0.05,
                    mean_tokens: 600.0,
                }),
                held_past_cap: 0.0,
                cache_free_tokens: (i % 2 == 0).then_some(f64::from(i % 7) * 2_000.0),
            },
        })
        .collect();
    let req = SchedulingRequest {
        target_model: "m",
        prefix_total_blocks: 512,
        block_size: 16,
        prompt_tokens: 8192,
        ..Default::default()
    };
    let slo = SchedulingRequest {
        slo_ttft_s: Some(0.5),
        sheddable: true,
        ..req
    };
    let mut rng = SmallRng::seed_from_u64(9);
    for (name, config, r) in [
        ("upstream_default", CONFIG, &req),
        ("estimated_ttft", TTFT_CONFIG, &req),
        ("estimated_ttft_slo", TTFT_CONFIG, &slo),
    ] {
        let runtime = Runtime::build(config, None).expect("config");
        g.bench_function(name, |b| {
            b.iter(|| {
                let d = runtime.scheduler.schedule(r, &candidates, &mut rng);
                black_box(d.map(|d| d.endpoints.len()).unwrap_or(0))
            })
        });
    }
    g.finish();
}

/// Tokenizing 8K tokens of new text (what `cold_text` pays), epp's tokenizer (behind a segment
/// cache that never hits here) against tiktoken-rs's CoreBPE, which epp used before; then 8K
/// words of [`mixed`] text (merges, non-ASCII), and o200k_base on both.
fn tokenizers(c: &mut Criterion, text_rng: &mut SmallRng) {
    use epp::request::tokenize::{Tokenizer, Vocabulary};
    let ours = Tokenizer::new(Vocabulary::Cl100kBase).expect("tokenizer");
    let o200k = Tokenizer::new(Vocabulary::O200kBase).expect("tokenizer");
    let tiktoken = tiktoken_rs::cl100k_base().expect("tiktoken");
    let mut g = c.benchmark_group("tokenize_8k_tokens_cold");
    g.bench_function("epp", |b| {
        b.iter_batched(
            || words(8192, text_rng),
            |t| black_box(ours.encode_prefix(&t, 8192).len()),
            BatchSize::LargeInput,
        )
    });
    g.bench_function("tiktoken_rs", |b| {
        b.iter_batched(
            || words(8192, text_rng),
            |t| black_box(tiktoken.encode_ordinary(&t).len()),
            BatchSize::LargeInput,
        )
    });
    type Text = fn(usize, &mut SmallRng) -> String;
    type Tokenize<'a> = &'a dyn Fn(&str) -> usize;
    let cases: [(&str, Tokenize, Text); 4] = [
        (
            "epp_mixed",
            &|t| ours.encode_prefix(t, usize::MAX / 16).len(),
            mixed,
        ),
        (
            "tiktoken_rs_mixed",
            &|t| tiktoken.encode_ordinary(t).len(),
            mixed,
        ),
        (
            "epp_o200k",
            &|t| o200k.encode_prefix(t, usize::MAX / 16).len(),
            words,
        ),
        (
            "epp_o200k_mixed",
            &|t| o200k.encode_prefix(t, usize::MAX / 16).len(),
            mixed,
        ),
    ];
    for (name, tokenize, text) in cases {
        g.bench_function(name, |b| {
            b.iter_batched(
                || text(8192, text_rng),
                |t| black_box(tokenize(&t)),
                BatchSize::LargeInput,
            )
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(50).measurement_time(Duration::from_secs(5)).warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);

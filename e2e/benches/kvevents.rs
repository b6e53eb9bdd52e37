//! The precise prefix index, measured against the cost targets:
//! - `ingest/*`: decoding vLLM KV-event payloads (positional and map encodings) and applying
//!   them to the index, in block events per second on one core (target ≥ 1 M/s). Each batch holds
//!   one BlockStored of 16 blocks (16 tokens each) and, in steady state, the BlockRemoved of an
//!   older batch, so the index size stays constant;
//! - `lookup/*`: the longest cached prefix of a 4K-token prompt (256 blocks) over 100 endpoints
//!   (target ≤ 20 µs): `all_hold_all` is the worst case (every endpoint holds every block),
//!   `staggered` has endpoint i holding the first 2.56·i blocks, `cold` matches nothing.
//!
//! - `home/*`: what the home choice adds to a precise lookup over 100 endpoints (the endpoints'
//!   cache shapes, then [`home::home`]): `cold` (nobody holds the prompt, every endpoint is a
//!   candidate) and `staggered` (only the longest holder is).
//!
//! Memory per (endpoint, block) entry is printed once (target ≤ 64 bytes).
//!
//! `cargo bench -p epp-e2e --bench kvevents`; results in BENCHMARKS.md ("Precise prefix").

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use epp::endpoint::EndpointId;
use epp::kvevents::decode::{decode_batch, KvEvent as Decoded};
use epp::prefix::precise::home::{self, HomeCandidate};
use epp::prefix::precise::{PreciseIndex, Stored};
use inference_sim::kv_cache::KvEvent;
use inference_sim::kv_events::encode_batch;
use inference_sim::EventEncoding;
use std::hint::black_box;
use std::time::{Duration, Instant};

const BLOCKS_PER_EVENT: usize = 16;
const BS: usize = 16;
const MODEL: &str = "m";

fn ep(i: u16) -> EndpointId {
    EndpointId(std::net::SocketAddr::from((
        [10, 0, (i >> 8) as u8, i as u8],
        8000,
    )))
}

/// Batch `n`: a BlockStored of 16 new blocks chained from nothing, plus the BlockRemoved of
/// batch `n - window` once the window is full.
fn payloads(count: u64, window: u64, encoding: EventEncoding) -> Vec<Vec<u8>> {
    let hashes = |n: u64| {
        (0..BLOCKS_PER_EVENT as u64)
            .map(|b| n * 1000 + b + 1)
            .collect::<Vec<_>>()
    };
    (0..count)
        .map(|n| {
            let tokens: Vec<u32> = (0..(BLOCKS_PER_EVENT * BS) as u32)
                .map(|t| t ^ (n as u32).wrapping_mul(2654435761))
                .collect();
            let mut events = vec![KvEvent::BlockStored {
                block_hashes: hashes(n),
                parent_block_hash: None,
                token_ids: tokens,
                block_size: BS,
                lora_id: None,
                lora_name: None,
            }];
            if n >= window {
                events.push(KvEvent::BlockRemoved {
                    block_hashes: hashes(n - window),
                });
            }
            encode_batch(1.0, &events, encoding, 0)
        })
        .collect()
}

fn apply(index: &PreciseIndex, endpoint: EndpointId, payload: &[u8]) {
    let Ok(batch) = decode_batch(payload) else {
        return;
    };
    let mut w = index.writer(endpoint);
    for e in &batch.events {
        match e {
            Decoded::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                ..
            } => {
                w.store(&Stored {
                    model: MODEL,
                    parent: *parent_block_hash,
                    hashes: block_hashes,
                    tokens: token_ids,
                    block_size: *block_size,
                });
            }
            Decoded::BlockRemoved { block_hashes, .. } => w.remove(block_hashes),
            _ => {}
        }
    }
}

fn ingest(c: &mut Criterion) {
    let mut g = c.benchmark_group("ingest");
    for (name, encoding) in [
        ("positional", EventEncoding::Array),
        ("map", EventEncoding::Map),
    ] {
        let batches = payloads(4096, 1024, encoding);
        // Stored + removed blocks per pass over the batches.
        let events = (4096 * BLOCKS_PER_EVENT + (4096 - 1024) * BLOCKS_PER_EVENT) as u64;
        g.throughput(Throughput::Elements(events));
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let index = PreciseIndex::new();
                    let start = Instant::now();
                    for p in &batches {
                        apply(&index, ep(1), p);
                    }
                    total += start.elapsed();
                    black_box(index.entries());
                }
                total
            })
        });
    }
    g.finish();
}

fn prompt_keys() -> Vec<u64> {
    let tokens: Vec<u32> = (0..4096).map(|t| 7 + t * 3).collect();
    epp::prefix::block_hashes(MODEL, None, &tokens, BS, 256)
}

/// 100 endpoints; endpoint i holds the first `held(i)` blocks of the prompt.
fn index_with(held: impl Fn(u16) -> usize) -> PreciseIndex {
    let tokens: Vec<u32> = (0..4096).map(|t| 7 + t * 3).collect();
    let index = PreciseIndex::new();
    for i in 0..100u16 {
        let n = held(i);
        let hashes: Vec<u64> = (0..n as u64).map(|b| b + 1).collect();
        index.writer(ep(i)).store(&Stored {
            model: MODEL,
            parent: None,
            hashes: &hashes,
            tokens: &tokens[..n * BS],
            block_size: BS,
        });
    }
    index
}

fn lookup(c: &mut Criterion) {
    let keys = prompt_keys();
    let mut g = c.benchmark_group("lookup");
    let now = Instant::now();
    for (name, index) in [
        ("all_hold_all", index_with(|_| 256)),
        ("staggered", index_with(|i| usize::from(i) * 256 / 100)),
        ("cold", index_with(|_| 0)),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| black_box(index.longest_prefix(black_box(&keys), now)))
        });
    }
    g.finish();
}

fn home_choice(c: &mut Criterion) {
    let keys = prompt_keys();
    let ids: Vec<EndpointId> = (0..100).map(ep).collect();
    let mut g = c.benchmark_group("home");
    let now = Instant::now();
    for (name, index) in [
        ("staggered", index_with(|i| usize::from(i) * 256 / 100)),
        ("cold", index_with(|_| 0)),
    ] {
        let matches = index.longest_prefix(&keys, now);
        g.bench_function(name, |b| {
            b.iter(|| {
                let shapes = index.shapes(ids.iter().copied(), now);
                let candidates = ids.iter().zip(shapes).map(|(id, cache)| HomeCandidate {
                    id: *id,
                    load: 1.0,
                    cache,
                });
                black_box(home::home(black_box(&keys), &matches, candidates))
            })
        });
    }
    g.finish();
}

fn memory(_: &mut Criterion) {
    for (label, sharing) in [
        ("every block distinct", false),
        ("10 endpoints share each prefix", true),
    ] {
        let index = PreciseIndex::new();
        for e in 0..100u16 {
            for n in 0..100u32 {
                let salt = if sharing {
                    u32::from(e / 10)
                } else {
                    u32::from(e)
                };
                let tokens: Vec<u32> = (0..(BLOCKS_PER_EVENT * BS) as u32)
                    .map(|t| t ^ (n << 8) ^ (salt << 24))
                    .collect();
                let hashes: Vec<u64> = (0..BLOCKS_PER_EVENT as u64)
                    .map(|b| (u64::from(salt) << 40) | (u64::from(n) << 8) | b)
                    .collect();
                index.writer(ep(e)).store(&Stored {
                    model: MODEL,
                    parent: None,
                    hashes: &hashes,
                    tokens: &tokens,
                    block_size: BS,
                });
            }
        }
        let per = index.heap_bytes() as f64 / index.entries() as f64;
        println!(
            "memory ({label}): {} entries, {:.1} bytes per (endpoint, block) entry",
            index.entries(),
            per
        );
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(4)).warm_up_time(Duration::from_secs(1));
    targets = ingest, lookup, home_choice, memory
}
criterion_main!(benches);

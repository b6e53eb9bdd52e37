//! A director over synthetic endpoints, for the decision benchmarks (`decision`, `scale`): `n`
//! endpoints with fresh metrics (queues 0..6, KV 0.3, 30,000 blocks of 16 tokens) and the given
//! configuration.

use anyhow::Context;
use epp::director::Director;
use epp::endpoint::Endpoint;
use epp::fixtures;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The director; metrics stay fresh for an hour so long benchmark runs do not turn stale.
pub fn bench_director(endpoints: u32, config: &str) -> anyhow::Result<Arc<Director>> {
    let ids = (0..endpoints).map(|i| {
        format!("10.{}.{}.{}:8000", i / 62_500, (i / 250) % 250, i % 250 + 1)
            .parse()
            .map(Endpoint::from_id)
    });
    let endpoints = ids
        .collect::<Result<Vec<_>, _>>()
        .context("endpoint address")?;
    let graph = fixtures::graph(config)
        .endpoints(endpoints)
        .staleness(Duration::from_secs(7200))
        .try_build()?;
    for (i, s) in graph.datastore.snapshot().iter().enumerate() {
        let updated = Instant::now() + Duration::from_secs(3600);
        let metrics = fixtures::metrics()
            .waiting((i % 7) as f64)
            .running(4.0)
            .kv_usage(0.3)
            .cache(16, 30_000)
            .updated(updated);
        s.store_metrics(metrics.build());
    }
    Ok(graph.director)
}

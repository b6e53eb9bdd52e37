//! A director over synthetic endpoints, for the decision benchmarks: `n` endpoints with fresh
//! metrics (queues 0..6, KV 0.3, 30,000 blocks of 16 tokens) and the given configuration.

use anyhow::Context;
use epp::datastore::Datastore;
use epp::director::{
    Body, Director, DirectorError, DirectorOptions, Incoming, Routed, Runtime, Shared,
};
use epp::endpoint::{CacheInfo, Endpoint, EndpointMetrics};
use epp::metrics::Metrics;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The director; metrics stay fresh for an hour so long benchmark runs do not turn stale.
pub fn bench_director(endpoints: u32, config: &str) -> anyhow::Result<Director> {
    let ds = Arc::new(Datastore::new());
    let ids = (0..endpoints).map(|i| {
        format!("10.{}.{}.{}:8000", i / 62_500, (i / 250) % 250, i % 250 + 1)
            .parse()
            .map(Endpoint::from_id)
    });
    ds.set_endpoints(
        ids.collect::<Result<Vec<_>, _>>()
            .context("endpoint address")?,
    );
    for (i, s) in ds.snapshot().iter().enumerate() {
        let cache = Some(CacheInfo {
            block_size: 16,
            num_blocks: 30_000,
        });
        let updated = Instant::now() + Duration::from_secs(3600);
        s.store_metrics(EndpointMetrics {
            waiting: (i % 7) as f64,
            running: 4.0,
            kv_usage: 0.3,
            lora: None,
            cache,
            gpu: None,
            updated,
        });
    }
    let metrics = Arc::new(Metrics::register(
        &mut prometheus_client::registry::Registry::default(),
    ));
    let opts = DirectorOptions {
        staleness: Duration::from_secs(7200),
        subset_filter: true,
    };
    let shared = Shared::new(ds, Runtime::build(config, None)?, metrics);
    Ok(Director::new(shared, opts))
}

/// Parses `body` once as `path`'s API, as the ext_proc adapter does, and routes it.
pub fn route(
    d: &Director,
    path: &str,
    body: &[u8],
    rng: &mut impl rand::Rng,
) -> Result<Routed, DirectorError> {
    let api = epp::request::ApiKind::from_path(path);
    let request = epp::request::parse(api, body, d.prompt_cap())?;
    let inc = Incoming {
        body: Body::Parsed {
            request: &request,
            bytes: body,
        },
        ..Default::default()
    };
    d.route(&inc, rng)
}

//! Test fixtures shared by epp's unit tests and by the crates that test epp from outside
//! (`e2e/`): values that would otherwise be spelled out field by field in every test.
//!
//! Compiled for this crate's own tests and, for other crates, behind the `test-util` feature
//! (a dev-dependency: `epp = { path = "..", features = ["test-util"] }`); never part of the
//! production library.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::endpoint::{CacheInfo, EndpointMetrics, GpuMetrics, LoraState, PoolMetrics};

/// A scrape to build: idle (nothing waiting or running, KV cache empty), no LoRA, cache
/// geometry or GPU readings, taken when [`build`](Self::build) runs unless told otherwise.
/// `fixtures::metrics().waiting(3.0).kv_usage(0.5).build()`.
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct MetricsBuilder {
    waiting: f64,
    running: f64,
    kv_usage: f64,
    lora: Option<LoraState>,
    cache: Option<CacheInfo>,
    gpu: Option<GpuMetrics>,
    pool: Option<PoolMetrics>,
    updated: Option<Updated>,
}

#[derive(Clone, Copy, Debug)]
enum Updated {
    At(Instant),
    Ago(Duration),
}

/// An idle, fresh scrape; set what the test is about.
pub fn metrics() -> MetricsBuilder {
    MetricsBuilder::default()
}

impl MetricsBuilder {
    pub fn waiting(mut self, waiting: f64) -> Self {
        self.waiting = waiting;
        self
    }

    pub fn running(mut self, running: f64) -> Self {
        self.running = running;
        self
    }

    /// KV-cache usage, a fraction in 0..=1.
    pub fn kv_usage(mut self, kv_usage: f64) -> Self {
        self.kv_usage = kv_usage;
        self
    }

    pub fn lora(mut self, lora: LoraState) -> Self {
        self.lora = Some(lora);
        self
    }

    /// KV-cache geometry, as `vllm:cache_config_info` reports it.
    pub fn cache(mut self, block_size: u32, num_blocks: u64) -> Self {
        self.cache = Some(CacheInfo {
            block_size,
            num_blocks,
        });
        self
    }

    pub fn gpu(mut self, gpu: GpuMetrics) -> Self {
        self.gpu = Some(gpu);
        self
    }

    /// A cluster's pool aggregates (a multi-cluster hub's endpoint).
    pub fn pool(mut self, kv_usage: Option<f64>, queue: Option<f64>) -> Self {
        self.pool = Some(PoolMetrics { kv_usage, queue });
        self
    }

    /// The scrape completed at `at` (in the future keeps it fresh through a long benchmark).
    pub fn updated(mut self, at: Instant) -> Self {
        self.updated = Some(Updated::At(at));
        self
    }

    /// The scrape completed `age` before [`build`](Self::build) runs.
    pub fn age(mut self, age: Duration) -> Self {
        self.updated = Some(Updated::Ago(age));
        self
    }

    pub fn build(self) -> EndpointMetrics {
        let updated = match self.updated {
            Some(Updated::At(at)) => at,
            Some(Updated::Ago(age)) => Instant::now() - age,
            None => Instant::now(),
        };
        EndpointMetrics {
            waiting: self.waiting,
            running: self.running,
            kv_usage: self.kv_usage,
            lora: self.lora,
            cache: self.cache,
            gpu: self.gpu,
            pool: self.pool,
            updated,
        }
    }

    /// [`build`](Self::build), shared as candidates and snapshots hold it.
    pub fn arc(self) -> Arc<EndpointMetrics> {
        Arc::new(self.build())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_an_idle_fresh_scrape_unless_told_otherwise() {
        let before = Instant::now();
        let m = metrics().build();
        assert_eq!((m.waiting, m.running, m.kv_usage), (0.0, 0.0, 0.0));
        assert_eq!((m.lora, m.cache, m.gpu), (None, None, None));
        assert!(m.updated >= before && m.updated <= Instant::now());
    }

    #[test]
    fn every_field_can_be_set() {
        let at = Instant::now() + Duration::from_secs(60);
        let lora = LoraState {
            running: vec!["a".into()],
            waiting: Vec::new(),
            max_loras: 2,
        };
        let gpu = GpuMetrics {
            utilization: Some(0.5),
            ..GpuMetrics::default()
        };
        let m = metrics()
            .waiting(1.0)
            .running(2.0)
            .kv_usage(0.3)
            .lora(lora.clone())
            .cache(16, 1024)
            .gpu(gpu)
            .updated(at)
            .build();
        let expected = EndpointMetrics {
            waiting: 1.0,
            running: 2.0,
            kv_usage: 0.3,
            lora: Some(lora),
            cache: Some(CacheInfo {
                block_size: 16,
                num_blocks: 1024,
            }),
            gpu: Some(gpu),
            pool: None,
            updated: at,
        };
        assert_eq!(m, expected);
    }

    #[test]
    fn age_is_measured_back_from_build_time() {
        let m = metrics().age(Duration::from_secs(5)).build();
        let age = m.age(Instant::now());
        assert!(
            age >= Duration::from_secs(5) && age < Duration::from_secs(6),
            "{age:?}"
        );
    }
}

//! Test fixtures shared by epp's unit tests and by the crates that test epp from outside
//! (`e2e/`): values that would otherwise be spelled out field by field in every test.
//!
//! Compiled for this crate's own tests and, for other crates, behind the `test-util` feature
//! (a dev-dependency: `epp = { path = "..", features = ["test-util"] }`); never part of the
//! production library.
#![allow(
    dead_code,
    reason = "fixtures this crate's own tests use and the crates testing it from outside do not"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::config::{ConfigError, LoadOptions};
use crate::datastore::Datastore;
use crate::director::{Director, DirectorOptions, FlowSetup, PlacementSink, Runtime, Shared};
use crate::endpoint::{
    CacheInfo, Endpoint, EndpointId, EndpointMetrics, GpuMetrics, LoraState, PoolMetrics,
};
use crate::extproc::stream::Services;
use crate::metrics::Metrics;
use prometheus_client::registry::Registry;

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
    attributes: Vec<(String, f64)>,
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

    pub(crate) fn lora(mut self, lora: LoraState) -> Self {
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

    pub(crate) fn gpu(mut self, gpu: GpuMetrics) -> Self {
        self.gpu = Some(gpu);
        self
    }

    /// Custom metric `key` (an endpoint attribute) at `value`.
    pub(crate) fn attribute(mut self, key: &str, value: f64) -> Self {
        self.attributes.push((key.to_owned(), value));
        self
    }

    /// A cluster's pool aggregates (a multi-cluster hub's endpoint).
    pub(crate) fn pool(mut self, kv_usage: Option<f64>, queue: Option<f64>) -> Self {
        self.pool = Some(PoolMetrics {
            kv_usage,
            queue,
            rtt_ms: None,
        });
        self
    }

    /// The hub's measured round trip to a cluster (after [`pool`](Self::pool)), ms.
    pub(crate) fn pool_rtt(mut self, rtt_ms: Option<f64>) -> Self {
        if let Some(p) = self.pool.as_mut() {
            p.rtt_ms = rtt_ms;
        }
        self
    }

    /// The scrape completed at `at` (in the future keeps it fresh through a long benchmark).
    pub fn updated(mut self, at: Instant) -> Self {
        self.updated = Some(Updated::At(at));
        self
    }

    /// The scrape completed `age` before [`build`](Self::build) runs.
    pub(crate) fn age(mut self, age: Duration) -> Self {
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
            attributes: self.attributes,
            updated,
        }
    }

    /// [`build`](Self::build), shared as candidates and snapshots hold it.
    pub fn arc(self) -> Arc<EndpointMetrics> {
        Arc::new(self.build())
    }
}

/// A director graph to build the way `app` builds it (`Runtime::configure`, `Shared::build`,
/// `Director::new`, `Services::new`): the one place the tests and the benches wire epp's
/// decision path. `fixtures::graph(config).ports(&[1, 2]).build()`.
#[must_use]
pub struct GraphBuilder {
    config: String,
    endpoints: Vec<Endpoint>,
    staleness: Duration,
    load: LoadOptions,
    clock: Option<Arc<dyn Clock>>,
    placements: Option<Placements>,
}

/// Builds the replica-sharing sink from the graph's indexes, as `app` does when it serves.
type Placements = Box<dyn FnOnce(&Shared) -> Option<Arc<dyn PlacementSink>>>;

/// What [`GraphBuilder::build`] wired.
pub struct Graph {
    pub director: Arc<Director>,
    /// What the director was built from (configuration, indexes, datastore, metrics).
    pub shared: Shared,
    pub datastore: Arc<Datastore>,
    pub metrics: Arc<Metrics>,
    /// Where `metrics` are registered (what `/metrics` would serve).
    pub(crate) registry: Registry,
}

/// A graph of `config` (an EndpointPickerConfig), with no endpoints, metrics counted stale
/// after 2 s and no experimental plugins until told otherwise.
pub fn graph(config: &str) -> GraphBuilder {
    GraphBuilder {
        config: config.to_owned(),
        endpoints: Vec::new(),
        staleness: Duration::from_secs(2),
        load: LoadOptions::default(),
        clock: None,
        placements: None,
    }
}

impl GraphBuilder {
    /// One endpoint per port, at `127.0.0.1:<port>`.
    pub(crate) fn ports(mut self, ports: &[u16]) -> Self {
        let at = |p: &u16| EndpointId(std::net::SocketAddr::from(([127, 0, 0, 1], *p)));
        self.endpoints = ports.iter().map(|p| Endpoint::from_id(at(p))).collect();
        self
    }

    pub fn endpoints(mut self, endpoints: Vec<Endpoint>) -> Self {
        self.endpoints = endpoints;
        self
    }

    /// `--metrics-staleness-threshold`.
    pub fn staleness(mut self, staleness: Duration) -> Self {
        self.staleness = staleness;
        self
    }

    /// `--allow-experimental-plugins` (alpha plugins such as `session-affinity-scorer`).
    pub fn experimental(mut self) -> Self {
        self.load.allow_experimental = true;
        self
    }

    /// The time the decision path reads (a simulation's, a test's virtual clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Where speculative entries go besides this replica's index (replica sharing), made from
    /// what the graph holds (its precise index) once that is built.
    pub fn placements(
        mut self,
        sink: impl FnOnce(&Shared) -> Option<Arc<dyn PlacementSink>> + 'static,
    ) -> Self {
        self.placements = Some(Box::new(sink));
        self
    }

    /// The graph, or why its configuration is refused.
    pub fn try_build(self) -> Result<Graph, ConfigError> {
        let configured = Runtime::configure(&self.config, None, self.load)?;
        let datastore = Arc::new(Datastore::new());
        datastore.set_endpoints(self.endpoints);
        let mut registry = Registry::default();
        let metrics = Arc::new(Metrics::register(&mut registry));
        // The flow-control queue with default limits (its gate is the configuration's).
        let flow = FlowSetup::default();
        let mut shared = Shared::build(
            Arc::clone(&datastore),
            configured,
            Arc::clone(&metrics),
            flow,
        );
        if let Some(clock) = self.clock {
            shared.clock = clock;
        }
        shared.placements = self.placements.and_then(|sink| sink(&shared));
        let opts = DirectorOptions {
            staleness: self.staleness,
            subset_filter: true,
        };
        Ok(Graph {
            director: Arc::new(Director::new(shared.clone(), opts)),
            shared,
            datastore,
            metrics,
            registry,
        })
    }

    /// The graph; panics when the configuration is refused (a test's own mistake).
    pub fn build(self) -> Graph {
        self.try_build()
            .unwrap_or_else(|e| panic!("the fixture's configuration is refused: {e}"))
    }
}

impl Graph {
    /// The ext_proc streams' services over this graph, as `app` hands them to its server.
    pub(crate) fn services(&self) -> Arc<Services> {
        Arc::new(Services::new(&self.shared, Arc::clone(&self.director)))
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
            attributes: Vec::new(),
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

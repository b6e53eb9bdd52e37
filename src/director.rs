//! One request's control flow, free of transport: candidates → admission → prefix lookup →
//! schedule → record. The ext_proc adapter calls [`Director::route`] once per request (with the
//! body parsed, unread, or absent: [`Body`]) and [`Director::finish`] once when the exchange
//! ends, holding the returned [`Routed`] in between.
//!
//! The director owns no plugin's state: what a decision changes in a plugin (the no-hit LRU,
//! session bindings, a producer's records), the plugin records itself at the lifecycle's points
//! (`crate::scheduling::lifecycle`), which the director runs in order without knowing the
//! plugins. What it reads and records into (datastore, live configuration, prefix indexes,
//! metrics) is owned by `app` and handed over at construction; adapters get those from `app`,
//! not from here.
//!
//! - [`runtime`]: what a configuration becomes, and the live configuration;
//! - [`exchange`]: the types crossing the boundary;
//! - `route`: the routing steps; `finish`: what a finished response teaches.

mod candidates;
mod disagg;
mod exchange;
mod finish;
pub mod flowcontrol;
mod gather;
mod record;
mod route;
mod runtime;

pub use crate::prefix::source::PlacementSink;
pub use exchange::{Body, DirectorError, End, Incoming, Lease, ResponseSummary, Routed};
pub use runtime::{Configured, FlowSetup, LiveConfig, Runtime, Startup};

use crate::admission;
use crate::clock::{Clock, SystemClock};
use crate::datastore::objectives::Priority;
use crate::datastore::{Datastore, EndpointState};
use crate::metrics::Metrics;
use crate::prefix::source::{Indexes, PrefixSource, Source};
use crate::request::ApiKind;
use crate::scheduling::lifecycle::{Metadata, Usage};
use rand::Rng;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub(crate) struct DirectorOptions {
    /// Metrics older than this make an endpoint a last resort.
    pub(crate) staleness: Duration,
    /// Honour the gateway's subset hint (`--disable-endpoint-subset-filter` turns it off).
    pub subset_filter: bool,
}

/// What the director reads and records into, owned by `app`.
#[derive(Clone)]
pub struct Shared {
    pub datastore: Arc<Datastore>,
    pub(crate) config: Arc<LiveConfig>,
    pub indexes: Arc<Indexes>,
    pub metrics: Arc<Metrics>,
    /// Where speculative entries go besides this replica's own index: the other replicas
    /// (`--speculative-peers`, [`crate::replicas`]).
    pub(crate) placements: Option<Arc<dyn PlacementSink>>,
    /// The time the decision path reads (the system clock, or a simulation's).
    pub(crate) clock: Arc<dyn Clock>,
}

impl Shared {
    /// Fresh prefix indexes and a live configuration of `configured` over `datastore`, with the
    /// flow-control queue's limits, pool name and staleness. The one constructor: `app` builds
    /// through it, and so do the tests and benches (`crate::fixtures::graph`).
    pub(crate) fn build(
        datastore: Arc<Datastore>,
        configured: Configured,
        metrics: Arc<Metrics>,
        flow: FlowSetup,
    ) -> Self {
        let config = LiveConfig::new(
            configured,
            Arc::clone(&datastore),
            Arc::clone(&metrics),
            flow,
        );
        Self {
            config,
            datastore,
            indexes: Arc::new(Indexes::default()),
            metrics,
            placements: None,
            clock: Arc::new(SystemClock),
        }
    }
}

pub struct Director {
    datastore: Arc<Datastore>,
    config: Arc<LiveConfig>,
    indexes: Arc<Indexes>,
    metrics: Arc<Metrics>,
    opts: DirectorOptions,
    placements: Option<Arc<dyn PlacementSink>>,
    clock: Arc<dyn Clock>,
}

impl Director {
    pub(crate) fn new(shared: Shared, opts: DirectorOptions) -> Self {
        Self {
            datastore: shared.datastore,
            config: shared.config,
            indexes: shared.indexes,
            metrics: shared.metrics,
            opts,
            placements: shared.placements,
            clock: shared.clock,
        }
    }

    /// Routes a request: with its parsed body, with a body it does not read, or without one.
    pub fn route(&self, inc: &Incoming<'_>, rng: &mut impl Rng) -> Result<Routed, DirectorError> {
        route::route(self, inc, rng)
    }

    /// Records how a routed exchange ended: metrics, passive health, learned TTFT rates.
    pub fn finish(&self, routed: &Routed, end: End) {
        match end {
            End::Response(summary) => finish::response(self, routed, &summary),
            End::Abandoned => finish::abandoned(self, routed),
        }
    }

    /// The dynamic metadata the lifecycle plugins report at the response's end, from its usage
    /// (empty when none reports anything).
    pub fn response_metadata(&self, summary: &ResponseSummary) -> Metadata {
        let usage = Usage {
            prompt_tokens: summary.prompt_tokens.unwrap_or(0),
            completion_tokens: summary.completion_tokens.unwrap_or(0),
            total_tokens: summary.total_tokens.unwrap_or(0),
            cached_tokens: summary.cached_tokens,
        };
        self.config.load().scheduler.response_metadata(&usage)
    }

    /// A response body chunk arrived: the first one ends the prefill counted against the
    /// endpoint and runs the lifecycle's `first_token`.
    pub fn first_token(&self, routed: &mut Routed) {
        if routed.first_token() {
            let first = crate::scheduling::lifecycle::FirstToken {
                id: routed.id,
                served: routed.lease.inflight.endpoint().id(),
                stream: routed.stream,
                now: self.clock.now(),
            };
            self.config.load().scheduler.first_token(&first);
        }
    }

    /// The prompt text the prefix scorers read: what parsing keeps of it.
    pub fn prompt_cap(&self) -> usize {
        let runtime = self.config.load();
        prompt_cap(&runtime, self.source(&runtime).as_ref())
    }

    /// What an early decision (before the whole body) must have seen of the prompt: `Some(0)`
    /// when the model alone decides (no prefix scorer), `Some(n)` for the first `n` bytes of
    /// prompt text, `None` when only the whole body will do (the precise scorer renders the
    /// whole chat template; `token-load-scorer` and `context-length-aware` count the whole
    /// prompt, as upstream, which always reads the whole body; `token-producer`'s render
    /// endpoint tokenizes the whole prompt).
    pub(crate) fn early_prompt_bytes(&self, api: ApiKind) -> Option<usize> {
        let runtime = self.config.load();
        // A gathering plugin reads the whole prompt, and holds the request anyway.
        if runtime.scheduler.reads_prompt_length() || runtime.scheduler.gathers() {
            return None;
        }
        // The render endpoint tokenizes the whole prompt: no decision on a part of it.
        if runtime.render.is_some() && crate::request::render::RenderParams::renders(api) {
            return None;
        }
        match self.source(&runtime) {
            None => Some(0),
            Some(s) if s.reads_whole_body(api) => None,
            Some(s) => Some(prompt_cap(&runtime, Some(&s))),
        }
    }

    /// The priority of a request for `model` under the named objective.
    pub(crate) fn priority(&self, objective: Option<&str>, model: &str) -> Priority {
        self.datastore.objectives().priority(objective, model)
    }

    /// The pool's saturation as flow control sees it: the detector's formula over every
    /// endpoint, counting the requests epp sent since an endpoint's last scrape as waiting
    /// there (scrapes lag, and a queue released on stale figures would herd).
    /// With a disaggregating handler only the destinations count (the endpoints the decode
    /// profile keeps): a pool saturated in prefill but not in decode is not saturated.
    #[cfg(test)]
    pub(crate) fn pool_saturation(&self) -> f64 {
        let (runtime, now) = (self.config.load(), self.clock.now());
        pool_saturation(&self.datastore, &runtime, self.opts.staleness, now)
    }

    /// The configuration's prefix index, bound for one request.
    fn source<'a>(&'a self, runtime: &'a Runtime) -> Option<Source<'a>> {
        let config = runtime.prefix.as_ref()?;
        Some(config.bind(&self.indexes, self.placements.as_deref()))
    }
}

/// [`Director::pool_saturation`] of `datastore` under `runtime` (flow control's release reads
/// it too).
fn pool_saturation(
    datastore: &Datastore,
    runtime: &Runtime,
    staleness: Duration,
    now: Instant,
) -> f64 {
    let snapshot = datastore.snapshot();
    let all: Vec<&Arc<EndpointState>> = snapshot.iter().collect();
    let states = disagg::destinations(&runtime.scheduler, &all);
    if let Some(c) = &runtime.thresholds.concurrency {
        return c.saturation(states.iter().map(|s| candidates::inflight_load(s)));
    }
    let metrics: Vec<_> = states.iter().map(|s| disagg::adjusted_metrics(s)).collect();
    admission::saturation(
        metrics.iter().map(Option::as_ref),
        now,
        &runtime.thresholds,
        staleness,
    )
}

/// Bytes of prompt text parsing keeps: what the scorers read, at least 4 KiB.
fn prompt_cap(runtime: &Runtime, source: Option<&Source<'_>>) -> usize {
    source
        .map_or(0, PrefixSource::prompt_text_cap)
        .max(runtime.prompt_text_floor)
        .max(4096)
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_disagg;
#[cfg(test)]
mod tests_llmd;

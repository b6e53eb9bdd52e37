//! Flow control (upstream's feature-gated queue, `flowControl`): while the pool is saturated,
//! requests wait in epp instead of piling onto the model servers' queues, and are released in
//! order of importance as capacity frees.
//!
//! Why in epp: a model server's queue is first come, first served; held here, a Critical
//! request overtakes a Sheddable one, and with round-robin fairness one tenant's burst does not
//! starve another's.
//! Order: strict priority between bands (higher first); within a band, the band's fairness
//! policy between fairness keys (`x-gateway-inference-fairness-id`, default `default-flow`):
//! the band's first request (`global-strict-fairness-policy`, upstream's default), the keys in
//! turn (`round-robin-fairness-policy`, so one tenant's burst does not starve another) or the
//! least-served key (`program-aware-fairness`); within a key, the band's ordering policy
//! (arrival, or the SLO deadline). Capacity: a total request count and byte size, and a byte size per
//! band; a request that does not fit is refused at once (429). A request not released within
//! the TTL is answered 429 (`rejected-ttl-expired`, as llm-d-router v0.10), and one whose stream
//! ends (client gone) leaves the queue.
//!
//! [`Queues`] (`queues.rs`) is the ordering and accounting; [`FlowControl`] adds the waiting (a oneshot
//! per request) and the dispatcher, which releases one request per tick while the saturation
//! it is given is below 1.0 (the tick lets the released request's routing count before the
//! next look).
//!
//! Metrics (upstream's `inference_extension_flow_control_*`): queue size and bytes per fairness
//! key, priority and model; the time each request spent here with its outcome (`Dispatched`,
//! `RejectedCapacity`, `EvictedTTL`, `EvictedContextCancelled`, ...; a request that passes at
//! once counts as `Dispatched` with ~0 s); and the saturation last read (on each arrival and
//! each dispatcher tick). The model is the requested one: a rewrite is decided after admission,
//! so `target_model_name` repeats `model_name`.

use crate::config::{BandPolicy, Fairness, FlowSettings, Las, UsageLimit};

mod queues;
use crate::datastore::objectives::Priority;
use crate::metrics::{
    FlowDurationLabels, FlowOutcome, FlowPoolLabels, FlowQueueLabels, Metrics, ProgramLabels,
};
pub(crate) use queues::{Queues, Ticket};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The fairness key of a request that names none (upstream's default flow).
pub(crate) const DEFAULT_FLOW: &str = "default-flow";

/// Capacities, timing and fairness; names follow upstream's `flowControl` config.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct FlowConfig {
    /// Requests queued in all (`maxRequests`; 0 = unlimited).
    pub(crate) max_requests: usize,
    /// Bytes queued in all (`maxBytes`; 0 = unlimited).
    pub(crate) max_bytes: u64,
    /// Bytes queued per priority band (`defaultPriorityBand.maxBytes`; 0 = unlimited).
    pub(crate) band_max_bytes: u64,
    /// Time a request may wait (`defaultRequestTTL`).
    pub(crate) ttl: Duration,
    /// Dispatcher tick while requests wait.
    pub(crate) tick: Duration,
    /// The policies of bands not in `bands` (`defaultPriorityBand`).
    pub(crate) default_band: BandPolicy,
    /// The policies of the configured bands (`priorityBands`), by priority.
    pub(crate) bands: Vec<(Priority, BandPolicy)>,
    /// Each priority level's saturation ceiling (`usageLimitPolicyPluginRef`).
    pub(crate) usage_limit: UsageLimit,
}

impl Default for FlowConfig {
    fn default() -> Self {
        Self {
            max_requests: 0,
            max_bytes: 10 << 30,
            band_max_bytes: 1_000_000_000,
            ttl: Duration::from_secs(60),
            tick: Duration::from_millis(2),
            default_band: BandPolicy::default(),
            bands: Vec::new(),
            usage_limit: UsageLimit::Static,
        }
    }
}

impl FlowConfig {
    /// These limits (the command line's) with the ones a configuration document sets.
    pub(crate) fn with_settings(self, s: &FlowSettings) -> Self {
        Self {
            max_requests: s.max_requests.map_or(self.max_requests, |n| {
                usize::try_from(n).unwrap_or(usize::MAX)
            }),
            max_bytes: s.max_bytes.unwrap_or(self.max_bytes),
            band_max_bytes: s.band_max_bytes.unwrap_or(self.band_max_bytes),
            ttl: s.ttl.unwrap_or(self.ttl),
            tick: self.tick,
            default_band: s.default_band,
            bands: s
                .bands
                .iter()
                .filter_map(|&(p, b)| Some((Priority::try_from(p).ok()?, b)))
                .collect(),
            usage_limit: s.usage_limit,
        }
    }

    /// The first `program-aware-fairness` strategy, if a band has one.
    pub(crate) fn las(&self) -> Option<Las> {
        std::iter::once(&self.default_band)
            .chain(self.bands.iter().map(|(_, b)| b))
            .find_map(|b| match b.fairness {
                Fairness::ProgramAware(las) => Some(las),
                _ => None,
            })
    }

    /// The policies of the band of `priority`.
    pub(crate) fn policy_of(&self, priority: Priority) -> BandPolicy {
        self.bands
            .iter()
            .find(|(p, _)| *p == priority)
            .map_or(self.default_band, |(_, b)| *b)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FlowError {
    #[error("flow control queue is full: {limit} {value} reached")]
    Full { limit: &'static str, value: u64 },
    #[error("request timed out in queue after {0:?}")]
    Expired(Duration),
    #[error("flow control stopped")]
    Closed,
}

impl FlowError {
    /// A capacity refusal (a full queue) rather than an expiry or a shutdown.
    pub(crate) fn is_capacity(&self) -> bool {
        matches!(self, Self::Full { .. })
    }
}

type Saturation = Box<dyn Fn() -> f64 + Send + Sync>;

/// A queued request: its wake-up, and what its queue gauges count.
struct Waiter {
    tx: oneshot::Sender<()>,
    labels: FlowQueueLabels,
    bytes: u64,
}

/// The queue shared by every stream, and its dispatcher.
pub(crate) struct FlowControl {
    queues: Mutex<Queues<Waiter>>,
    /// A band is program-aware: finished requests' tokens are counted (read without the lock
    /// on every response end).
    program_aware: std::sync::atomic::AtomicBool,
    wake: Notify,
    saturation: Saturation,
    /// The soft-reflective usage limit's looks in its alternating regime.
    looks: std::sync::atomic::AtomicI64,
    metrics: Arc<Metrics>,
    pool: String,
}

impl FlowControl {
    /// `saturation` is the pool's (≥ 1.0: saturated); requests wait while it is. `pool` labels
    /// the metrics.
    pub(crate) fn new(
        config: FlowConfig,
        saturation: impl Fn() -> f64 + Send + Sync + 'static,
        metrics: Arc<Metrics>,
        pool: String,
    ) -> Arc<Self> {
        let program_aware = config.las().is_some().into();
        Arc::new(Self {
            queues: Mutex::new(Queues::new(config)),
            program_aware,
            wake: Notify::new(),
            saturation: Box::new(saturation),
            looks: std::sync::atomic::AtomicI64::new(0),
            metrics,
            pool,
        })
    }

    fn queues(&self) -> std::sync::MutexGuard<'_, Queues<Waiter>> {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The pool's saturation, recorded as the gauge.
    fn saturation(&self) -> f64 {
        let level = (self.saturation)();
        self.metrics
            .flow
            .pool_saturation
            .get_or_create(&FlowPoolLabels {
                inference_pool: self.pool.clone(),
            })
            .set(level);
        level
    }

    fn labels(&self, ticket: &Ticket) -> FlowQueueLabels {
        let model = self.metrics.model(&ticket.model_name);
        FlowQueueLabels {
            fairness_id: self.metrics.fairness_key(&ticket.fairness_id),
            priority: ticket.priority.to_string(),
            inference_pool: self.pool.clone(),
            model_name: model.clone(),
            target_model_name: model,
        }
    }

    /// Counts a request into (`sign` 1) or out of (-1) the queue gauges.
    fn count(&self, labels: &FlowQueueLabels, bytes: u64, sign: i64) {
        self.metrics
            .flow
            .queue_size
            .get_or_create(labels)
            .inc_by(sign);
        self.metrics
            .flow
            .queue_bytes
            .get_or_create(labels)
            .inc_by(sign.saturating_mul(i64::try_from(bytes).unwrap_or(i64::MAX)));
    }

    fn observe(&self, l: &FlowQueueLabels, outcome: FlowOutcome, waited: Duration) {
        let labels = FlowDurationLabels {
            fairness_id: l.fairness_id.clone(),
            priority: l.priority.clone(),
            outcome,
            inference_pool: l.inference_pool.clone(),
            model_name: l.model_name.clone(),
            target_model_name: l.target_model_name.clone(),
        };
        self.metrics
            .flow
            .queue_duration
            .get_or_create(&labels)
            .observe(waited.as_secs_f64());
    }

    /// New limits (a configuration reload): the next request queued and the next TTL started
    /// use them; requests already waiting keep their place and their TTL.
    pub(crate) fn reconfigure(&self, config: FlowConfig) {
        self.program_aware
            .store(config.las().is_some(), std::sync::atomic::Ordering::Relaxed);
        self.queues().set_config(config);
    }

    /// Requests waiting.
    pub(crate) fn len(&self) -> usize {
        self.queues().len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits for the request's turn. Passes at once when nothing waits and the pool is not
    /// saturated. Dropping the future (the stream ended) takes the request out of the queue.
    pub(crate) async fn admit(&self, ticket: Ticket) -> Result<(), FlowError> {
        let labels = self.labels(&ticket);
        let mut guard = Dequeue {
            flow: self,
            id: None,
            labels,
            started: Instant::now(),
            outcome: FlowOutcome::EvictedContextCancelled,
        };
        let (tx, rx) = oneshot::channel();
        let ttl = {
            let mut q = self.queues();
            if q.is_empty() && self.open_for(&q, ticket.priority, self.saturation()) {
                guard.outcome = FlowOutcome::Dispatched;
                return Ok(());
            }
            let waiter = Waiter {
                tx,
                labels: guard.labels.clone(),
                bytes: ticket.bytes,
            };
            match q.push(&ticket, waiter) {
                Ok(id) => guard.id = Some(id),
                Err(e) => {
                    guard.outcome = if e.is_capacity() {
                        FlowOutcome::RejectedCapacity
                    } else {
                        FlowOutcome::RejectedOther
                    };
                    return Err(e);
                }
            }
            self.count(&guard.labels, ticket.bytes, 1);
            q.config().ttl
        };
        self.wake.notify_one();
        let result = tokio::time::timeout(ttl, rx).await;
        let (outcome, result) = match result {
            Ok(Ok(())) => {
                guard.id = None;
                (FlowOutcome::Dispatched, Ok(()))
            }
            Ok(Err(_)) => (FlowOutcome::EvictedOther, Err(FlowError::Closed)),
            Err(_) => (FlowOutcome::EvictedTTL, Err(FlowError::Expired(ttl))),
        };
        guard.outcome = outcome;
        result
    }

    /// The dispatcher: until `shutdown`, releases one waiting request per tick while the pool
    /// is not saturated. Requests whose stream is gone are skipped without costing a tick.
    /// A finished request of fairness key `program` used these tokens: its attained service
    /// grows by prompt + 2 × completion (upstream's weights) when a band is program-aware.
    pub(crate) fn completed(&self, program: &str, prompt: Option<u64>, completion: Option<u64>) {
        if !self
            .program_aware
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return;
        }
        let cost = prompt.unwrap_or(0) as f64 + 2.0 * completion.unwrap_or(0) as f64;
        let service = self.queues().attained(program, cost, Instant::now());
        if let Some(service) = service {
            let labels = ProgramLabels {
                program_id: self.metrics.fairness_key(program),
            };
            self.metrics
                .flow
                .attained_service
                .get_or_create(&labels)
                .set(service);
        }
    }

    /// Forgets idle programs (and their gauges) once per the policy's sweep interval.
    fn sweep(&self, last: &mut Instant) {
        let now = Instant::now();
        let mut q = self.queues();
        let Some(las) = q.config().las() else {
            return;
        };
        if now.saturating_duration_since(*last) < las.eviction_sweep {
            return;
        }
        *last = now;
        for program_id in q.sweep_programs(now) {
            let labels = ProgramLabels {
                program_id: self.metrics.fairness_key(&program_id),
            };
            self.metrics.flow.attained_service.remove(&labels);
            self.metrics.flow.avg_wait.remove(&labels);
        }
    }

    pub(crate) async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut swept = Instant::now();
        loop {
            self.sweep(&mut swept);
            if self.is_empty() {
                tokio::select! {
                    () = self.wake.notified() => continue,
                    () = shutdown.cancelled() => return,
                }
            }
            let saturation = self.saturation();
            let open = {
                let q = self.queues();
                q.head().is_some_and(|p| self.open_for(&q, p, saturation))
            };
            if open {
                self.release_one();
            }
            let tick = self.queues().config().tick;
            tokio::select! {
                () = tokio::time::sleep(tick) => {}
                () = shutdown.cancelled() => return,
            }
        }
    }

    /// Whether a request of `priority` may be dispatched at `saturation`: the usage limit's
    /// ceiling of every level from the highest down to it is above the saturation (upstream's
    /// dispatch cycle stops at the first level it reaches: head-of-line blocking).
    fn open_for(&self, q: &Queues<Waiter>, priority: Priority, saturation: f64) -> bool {
        let levels = q.levels(priority);
        let ceilings = q
            .config()
            .usage_limit
            .ceilings(saturation, &levels, &self.looks);
        levels
            .iter()
            .zip(&ceilings)
            .take_while(|(p, _)| **p >= priority)
            .all(|(_, ceiling)| saturation < *ceiling)
    }

    fn release_one(&self) {
        let mut q = self.queues();
        while let Some((_, waiter)) = q.pop() {
            self.count(&waiter.labels, waiter.bytes, -1);
            if waiter.tx.send(()).is_ok() {
                break;
            }
        }
        if self
            .program_aware
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            let (waits, jain) = q.program_waits();
            let f = &self.metrics.flow;
            for (program_id, wait) in waits {
                f.avg_wait
                    .get_or_create(&ProgramLabels {
                        program_id: self.metrics.fairness_key(&program_id),
                    })
                    .set(wait);
            }
            f.jains_index.set(jain);
        }
    }
}

/// Removes a request from the queue unless it was released, and records how it left; the
/// outcome stays `EvictedContextCancelled` when the future is dropped (the stream ended).
struct Dequeue<'a> {
    flow: &'a FlowControl,
    id: Option<u64>,
    labels: FlowQueueLabels,
    started: Instant,
    outcome: FlowOutcome,
}

impl Drop for Dequeue<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            let removed = self.flow.queues().remove(id);
            if let Some(waiter) = removed {
                self.flow.count(&waiter.labels, waiter.bytes, -1);
            }
        }
        self.flow
            .observe(&self.labels, self.outcome, self.started.elapsed());
    }
}

#[cfg(test)]
mod tests;

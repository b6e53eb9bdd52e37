//! Flow control (upstream's feature-gated queue, `flowControl`): while the pool is saturated,
//! requests wait in epp instead of piling onto the model servers' queues, and are released in
//! order of importance as capacity frees.
//!
//! Why in epp: a model server's queue is first come, first served; held here, a Critical
//! request overtakes a Sheddable one, and with round-robin fairness one tenant's burst does not
//! starve another's.
//! Order: strict priority between bands (higher first); within a band, the band's fairness
//! policy between fairness keys (`x-gateway-inference-fairness-id`, default `default-flow`):
//! the band's oldest request (`global-strict-fairness-policy`, upstream's default) or the keys
//! in turn (`round-robin-fairness-policy`, so one tenant's burst does not starve another); first
//! come first served within a key. Capacity: a total request count and byte size, and a byte size per
//! band; a request that does not fit is refused at once (429). A request not released within
//! the TTL is answered 429 (`rejected-ttl-expired`, as llm-d-router v0.10), and one whose stream
//! ends (client gone) leaves the queue.
//!
//! [`Queues`] is the pure ordering and accounting; [`FlowControl`] adds the waiting (a oneshot
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

use crate::config::{BandPolicy, Fairness, FlowSettings, Las, QueueOrder};
use crate::datastore::objectives::Priority;
use crate::metrics::{
    FlowDurationLabels, FlowOutcome, FlowPoolLabels, FlowQueueLabels, Metrics, ProgramLabels,
};
use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Capacities, timing and fairness; names follow upstream's `flowControl` config.
#[derive(Clone, Debug, PartialEq)]
pub struct FlowConfig {
    /// Requests queued in all (`maxRequests`; 0 = unlimited).
    pub max_requests: usize,
    /// Bytes queued in all (`maxBytes`; 0 = unlimited).
    pub max_bytes: u64,
    /// Bytes queued per priority band (`defaultPriorityBand.maxBytes`; 0 = unlimited).
    pub band_max_bytes: u64,
    /// Time a request may wait (`defaultRequestTTL`).
    pub ttl: Duration,
    /// Dispatcher tick while requests wait.
    pub tick: Duration,
    /// The policies of bands not in `bands` (`defaultPriorityBand`).
    pub default_band: BandPolicy,
    /// The policies of the configured bands (`priorityBands`), by priority.
    pub bands: Vec<(Priority, BandPolicy)>,
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
        }
    }
}

impl FlowConfig {
    /// These limits (the command line's) with the ones a configuration document sets.
    pub fn with_settings(self, s: &FlowSettings) -> Self {
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
        }
    }

    /// The policies of the band of `priority`.
    pub fn policy_of(&self, priority: Priority) -> BandPolicy {
        self.bands
            .iter()
            .find(|(p, _)| *p == priority)
            .map_or(self.default_band, |(_, b)| *b)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FlowError {
    #[error("flow control queue is full: {limit} {value} reached")]
    Full { limit: &'static str, value: u64 },
    #[error("request timed out in queue after {0:?}")]
    Expired(Duration),
    #[error("flow control stopped")]
    Closed,
}

impl FlowError {
    /// A capacity refusal (a full queue) rather than an expiry or a shutdown.
    pub fn is_capacity(&self) -> bool {
        matches!(self, Self::Full { .. })
    }
}

/// What a request brings to the queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ticket {
    pub priority: Priority,
    pub fairness_id: String,
    pub bytes: u64,
    /// The requested model (metric label only).
    pub model_name: String,
    /// Arrival plus the request's `x-llm-d-slo-ttft-ms`, when it has one (the
    /// `slo-deadline-ordering-policy` orders by it).
    pub slo_deadline: Option<Instant>,
}

struct Entry<T> {
    id: u64,
    bytes: u64,
    enqueued: Instant,
    slo_deadline: Option<Instant>,
    payload: T,
}

/// Where an entry stands under an ordering (lower first): without a deadline, the deadline,
/// arrival.
type Rank = (bool, Option<Instant>, u64);

impl<T> Entry<T> {
    /// Where the entry stands in its key's queue under `order`.
    fn rank(&self, order: QueueOrder) -> Rank {
        match order {
            QueueOrder::Fcfs => (false, None, self.id),
            QueueOrder::SloDeadline => (self.slo_deadline.is_none(), self.slo_deadline, self.id),
        }
    }
}

/// The position of the first entry of `queue` under `order`, and its rank.
fn first<T>(queue: &VecDeque<Entry<T>>, order: QueueOrder) -> Option<(usize, Rank)> {
    match order {
        QueueOrder::Fcfs => queue.front().map(|e| (0, e.rank(order))),
        QueueOrder::SloDeadline => queue
            .iter()
            .enumerate()
            .map(|(i, e)| (i, e.rank(order)))
            .min_by_key(|(_, r)| *r),
    }
}

/// The position in `band.order` of the key `program-aware-fairness` serves next: the highest
/// `weightService × (1 − norm(service)) + weightHeadWait × norm(head wait)`, norm being the
/// range over the band's waiting keys (upstream's LAS pick); ties go to the earlier key.
fn least_attained<T>(
    band: &Band<T>,
    order: QueueOrder,
    programs: &HashMap<String, Program>,
    las: Las,
    now: Instant,
) -> Option<usize> {
    let keys: Vec<(usize, f64, f64)> = band
        .order
        .iter()
        .enumerate()
        .filter_map(|(i, k)| {
            let queue = band.flows.get(k)?;
            let (at, _) = first(queue, order)?;
            let wait_ms = now
                .saturating_duration_since(queue[at].enqueued)
                .as_secs_f64()
                * 1e3;
            let service = programs
                .get(k)
                .map_or(0.0, |p| p.service_at(now, las.half_life_s));
            Some((i, service, wait_ms))
        })
        .collect();
    let range = |f: fn(&(usize, f64, f64)) -> f64| {
        keys.iter()
            .map(f)
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            })
    };
    let (s_lo, s_hi) = range(|k| k.1);
    let (w_lo, w_hi) = range(|k| k.2);
    let mut best: Option<(usize, f64)> = None;
    for &(i, service, wait) in &keys {
        let score = las.weight_service * (1.0 - range_normalize(service, s_lo, s_hi))
            + las.weight_head_wait * range_normalize(wait, w_lo, w_hi);
        if best.is_none_or(|(_, b)| score > b) {
            best = Some((i, score));
        }
    }
    best.map(|(i, _)| i)
}

struct Band<T> {
    flows: HashMap<String, VecDeque<Entry<T>>>,
    /// Fairness keys with waiting requests, in round-robin order (global strict searches
    /// them for the oldest head).
    order: VecDeque<String>,
    bytes: u64,
}

impl<T> Default for Band<T> {
    fn default() -> Self {
        Self {
            flows: HashMap::new(),
            order: VecDeque::new(),
            bytes: 0,
        }
    }
}

/// One program's (fairness key's) attained service under `program-aware-fairness`.
#[derive(Clone, Copy, Debug)]
struct Program {
    /// Weighted tokens (prompt + 2 × completion), decayed to `anchor`.
    service: f64,
    anchor: Instant,
    /// Its last completion (the eviction sweep forgets programs idle past the TTL).
    last_done: Instant,
}

impl Program {
    /// The service decayed to `now` (half-life `half_life_s`; 0: no decay).
    fn service_at(&self, now: Instant, half_life_s: f64) -> f64 {
        let elapsed = now.saturating_duration_since(self.anchor).as_secs_f64();
        if half_life_s > 0.0 {
            self.service * (-elapsed / half_life_s).exp2()
        } else {
            self.service
        }
    }
}

/// `rangeNormalize` as upstream: 0.5 when every value is the same.
fn range_normalize(v: f64, lo: f64, hi: f64) -> f64 {
    if hi == lo {
        0.5
    } else {
        (v - lo) / (hi - lo)
    }
}

/// The queues: ordering and capacity accounting, no waiting; time only for the
/// `program-aware-fairness` scores (service decay, head wait).
pub struct Queues<T> {
    bands: BTreeMap<Reverse<Priority>, Band<T>>,
    len: usize,
    bytes: u64,
    next_id: u64,
    config: FlowConfig,
    /// Attained service by fairness key, kept only while a band is program-aware.
    programs: HashMap<String, Program>,
}

impl<T> Queues<T> {
    pub fn new(config: FlowConfig) -> Self {
        Self {
            bands: BTreeMap::new(),
            len: 0,
            bytes: 0,
            next_id: 0,
            config,
            programs: HashMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The limits in force.
    pub fn config(&self) -> FlowConfig {
        self.config.clone()
    }

    /// New limits: they apply to the next request queued; the waiting ones stay.
    pub fn set_config(&mut self, config: FlowConfig) {
        self.config = config;
    }

    /// Queues a request; refused when a capacity would be exceeded.
    pub fn push(&mut self, ticket: &Ticket, payload: T) -> Result<u64, FlowError> {
        let c = &self.config;
        if c.max_requests > 0 && self.len >= c.max_requests {
            return Err(FlowError::Full {
                limit: "maxRequests",
                value: c.max_requests as u64,
            });
        }
        if c.max_bytes > 0 && self.bytes + ticket.bytes > c.max_bytes {
            return Err(FlowError::Full {
                limit: "maxBytes",
                value: c.max_bytes,
            });
        }
        let band = self.bands.entry(Reverse(ticket.priority)).or_default();
        if c.band_max_bytes > 0 && band.bytes + ticket.bytes > c.band_max_bytes {
            return Err(FlowError::Full {
                limit: "priority band maxBytes",
                value: c.band_max_bytes,
            });
        }
        let id = self.next_id;
        self.next_id += 1;
        let flow = band.flows.entry(ticket.fairness_id.clone()).or_default();
        if flow.is_empty() {
            band.order.push_back(ticket.fairness_id.clone());
        }
        flow.push_back(Entry {
            id,
            bytes: ticket.bytes,
            enqueued: Instant::now(),
            slo_deadline: ticket.slo_deadline,
            payload,
        });
        band.bytes += ticket.bytes;
        self.len += 1;
        self.bytes += ticket.bytes;
        Ok(id)
    }

    /// The next request to release: highest band; in it, the band's first request by its
    /// ordering (global strict) or the next fairness key in turn (round robin); within a key,
    /// first by the ordering (arrival, or SLO deadline).
    pub fn pop(&mut self) -> Option<(u64, T)> {
        let (&key, band) = self.bands.iter_mut().next()?;
        let policy = self.config.policy_of(key.0);
        let order = policy.order;
        let flow_id = match policy.fairness {
            Fairness::RoundRobin => band.order.pop_front()?,
            Fairness::ProgramAware(las) => {
                let at = least_attained(band, order, &self.programs, las, Instant::now())?;
                band.order.remove(at)?
            }
            Fairness::GlobalStrict => {
                let flows = &band.flows;
                let head = |f: &String| flows.get(f).and_then(|q| first(q, order)).map(|(_, r)| r);
                let (at, _) = band
                    .order
                    .iter()
                    .enumerate()
                    .filter_map(|(i, f)| Some((i, head(f)?)))
                    .min_by_key(|(_, r)| *r)?;
                band.order.remove(at)?
            }
        };
        let flow = band.flows.get_mut(&flow_id)?;
        let (at, _) = first(flow, order)?;
        let entry = flow.remove(at)?;
        if flow.is_empty() {
            band.flows.remove(&flow_id);
        } else {
            band.order.push_back(flow_id);
        }
        self.account_removed(key, entry.bytes);
        Some((entry.id, entry.payload))
    }

    /// The first `program-aware-fairness` strategy of the configuration, if a band has one.
    fn las(&self) -> Option<Las> {
        std::iter::once(&self.config.default_band)
            .chain(self.config.bands.iter().map(|(_, b)| b))
            .find_map(|b| match b.fairness {
                Fairness::ProgramAware(las) => Some(las),
                _ => None,
            })
    }

    /// A request of `program` finished having used `cost` weighted tokens: its attained
    /// service grows (after decaying to `now`). Returns the new service, or `None` when no band
    /// is program-aware (nothing is kept then).
    pub fn attained(&mut self, program: &str, cost: f64, now: Instant) -> Option<f64> {
        let las = self.las()?;
        let p = self.programs.entry(program.to_owned()).or_insert(Program {
            service: 0.0,
            anchor: now,
            last_done: now,
        });
        p.service = p.service_at(now, las.half_life_s) + cost;
        p.anchor = now;
        p.last_done = now;
        Some(p.service)
    }

    /// Forgets the programs with no completion for the eviction TTL and no request waiting;
    /// returns them (their gauges go too).
    pub fn sweep_programs(&mut self, now: Instant) -> Vec<String> {
        let Some(las) = self.las() else {
            return std::mem::take(&mut self.programs).into_keys().collect();
        };
        let waiting: std::collections::HashSet<&String> =
            self.bands.values().flat_map(|b| b.flows.keys()).collect();
        let gone: Vec<String> = self
            .programs
            .iter()
            .filter(|(k, p)| {
                now.saturating_duration_since(p.last_done) > las.eviction_ttl
                    && !waiting.contains(k)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in &gone {
            self.programs.remove(k);
        }
        gone
    }

    /// Takes request `id` out of the queue (expired, or its stream ended).
    pub fn remove(&mut self, id: u64) -> Option<T> {
        let (key, flow_id, pos) = self.bands.iter().find_map(|(k, band)| {
            band.flows.iter().find_map(|(f, q)| {
                q.iter()
                    .position(|e| e.id == id)
                    .map(|p| (*k, f.clone(), p))
            })
        })?;
        let band = self.bands.get_mut(&key)?;
        let flow = band.flows.get_mut(&flow_id)?;
        let entry = flow.remove(pos)?;
        if flow.is_empty() {
            band.flows.remove(&flow_id);
            band.order.retain(|f| *f != flow_id);
        }
        self.account_removed(key, entry.bytes);
        Some(entry.payload)
    }

    fn account_removed(&mut self, key: Reverse<Priority>, bytes: u64) {
        self.len -= 1;
        self.bytes -= bytes;
        if let Some(band) = self.bands.get_mut(&key) {
            band.bytes -= bytes;
            if band.flows.is_empty() {
                self.bands.remove(&key);
            }
        }
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
pub struct FlowControl {
    queues: Mutex<Queues<Waiter>>,
    /// A band is program-aware: finished requests' tokens are counted (read without the lock
    /// on every response end).
    program_aware: std::sync::atomic::AtomicBool,
    wake: Notify,
    saturation: Saturation,
    metrics: Arc<Metrics>,
    pool: String,
}

impl FlowControl {
    /// `saturation` is the pool's (≥ 1.0: saturated); requests wait while it is. `pool` labels
    /// the metrics.
    pub fn new(
        config: FlowConfig,
        saturation: impl Fn() -> f64 + Send + Sync + 'static,
        metrics: Arc<Metrics>,
        pool: String,
    ) -> Arc<Self> {
        let queues = Mutex::new(Queues::new(config));
        let program_aware = queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .las()
            .is_some();
        Arc::new(Self {
            queues,
            program_aware: program_aware.into(),
            wake: Notify::new(),
            saturation: Box::new(saturation),
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
            fairness_id: ticket.fairness_id.clone(),
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
    pub fn reconfigure(&self, config: FlowConfig) {
        let mut q = self.queues();
        q.set_config(config);
        self.program_aware
            .store(q.las().is_some(), std::sync::atomic::Ordering::Relaxed);
    }

    /// The limits in force.
    pub fn config(&self) -> FlowConfig {
        self.queues().config()
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.queues().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits for the request's turn. Passes at once when nothing waits and the pool is not
    /// saturated. Dropping the future (the stream ended) takes the request out of the queue.
    pub async fn admit(&self, ticket: Ticket) -> Result<(), FlowError> {
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
            if q.is_empty() && self.saturation() < 1.0 {
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
    pub fn completed(&self, program: &str, prompt: Option<u64>, completion: Option<u64>) {
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
                program_id: program.to_owned(),
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
        let Some(las) = q.las() else {
            return;
        };
        if now.saturating_duration_since(*last) < las.eviction_sweep {
            return;
        }
        *last = now;
        for program_id in q.sweep_programs(now) {
            self.metrics
                .flow
                .attained_service
                .remove(&ProgramLabels { program_id });
        }
    }

    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut swept = Instant::now();
        loop {
            self.sweep(&mut swept);
            if self.is_empty() {
                tokio::select! {
                    () = self.wake.notified() => continue,
                    () = shutdown.cancelled() => return,
                }
            }
            if self.saturation() < 1.0 {
                self.release_one();
            }
            tokio::select! {
                () = tokio::time::sleep(self.config().tick) => {}
                () = shutdown.cancelled() => return,
            }
        }
    }

    fn release_one(&self) {
        let mut q = self.queues();
        while let Some((_, waiter)) = q.pop() {
            self.count(&waiter.labels, waiter.bytes, -1);
            if waiter.tx.send(()).is_ok() {
                return;
            }
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

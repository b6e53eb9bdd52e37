//! The queues of flow control: ordering and capacity accounting, no waiting ([`Queues`]).
//! Strict priority between bands; a band's fairness policy between its keys; its ordering policy
//! within a key. Time enters only for `program-aware-fairness` (service decay, head wait) and the
//! SLO deadline a [`Ticket`] carries.

use super::{FlowConfig, FlowError};
use crate::config::{Fairness, Las, QueueOrder};
use crate::datastore::objectives::Priority;
use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, VecDeque};
use tokio::time::Instant;

/// What a request brings to the queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Ticket {
    pub(crate) priority: Priority,
    pub(crate) fairness_id: String,
    pub(crate) bytes: u64,
    /// The requested model (metric label only).
    pub(crate) model_name: String,
    /// Arrival plus the request's `x-llm-d-slo-ttft-ms`, when it has one (the
    /// `slo-deadline-ordering-policy` orders by it).
    pub(crate) slo_deadline: Option<Instant>,
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
    /// Requests released, and their mean wait in the queue (ms).
    released: u64,
    mean_wait_ms: f64,
}

impl Program {
    fn new(now: Instant) -> Self {
        Self {
            service: 0.0,
            anchor: now,
            last_done: now,
            released: 0,
            mean_wait_ms: 0.0,
        }
    }
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
pub(crate) struct Queues<T> {
    bands: BTreeMap<Reverse<Priority>, Band<T>>,
    len: usize,
    bytes: u64,
    next_id: u64,
    config: FlowConfig,
    /// Attained service by fairness key, kept only while a band is program-aware.
    programs: HashMap<String, Program>,
}

impl<T> Queues<T> {
    pub(crate) fn new(config: FlowConfig) -> Self {
        Self {
            bands: BTreeMap::new(),
            len: 0,
            bytes: 0,
            next_id: 0,
            config,
            programs: HashMap::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[cfg(test)]
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The priority of the highest band with a request waiting.
    pub(crate) fn head(&self) -> Option<Priority> {
        self.bands.keys().next().map(|k| k.0)
    }

    /// The active priority levels, highest first: the configured bands, the bands with requests
    /// waiting, and `arriving` (upstream's registry provisions a band on a priority's first
    /// request).
    pub(crate) fn levels(&self, arriving: Priority) -> Vec<Priority> {
        let configured = self.config.bands.iter().map(|(p, _)| *p);
        let waiting = self.bands.keys().map(|k| k.0);
        let mut levels: Vec<Priority> = configured.chain(waiting).chain([arriving]).collect();
        levels.sort_unstable_by(|a, b| b.cmp(a));
        levels.dedup();
        levels
    }

    /// The limits in force.
    pub(crate) fn config(&self) -> &FlowConfig {
        &self.config
    }

    /// New limits: they apply to the next request queued; the waiting ones stay.
    pub(crate) fn set_config(&mut self, config: FlowConfig) {
        self.config = config;
    }

    /// Queues a request; refused when a capacity would be exceeded.
    pub(crate) fn push(&mut self, ticket: &Ticket, payload: T) -> Result<u64, FlowError> {
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
    pub(crate) fn pop(&mut self) -> Option<(u64, T)> {
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
        if matches!(policy.fairness, Fairness::ProgramAware(_)) {
            let now = Instant::now();
            let wait_ms = now.saturating_duration_since(entry.enqueued).as_secs_f64() * 1e3;
            let p = self
                .programs
                .entry(flow_id.clone())
                .or_insert_with(|| Program::new(now));
            p.released += 1;
            p.mean_wait_ms += (wait_ms - p.mean_wait_ms) / p.released as f64;
        }
        if flow.is_empty() {
            band.flows.remove(&flow_id);
        } else {
            band.order.push_back(flow_id);
        }
        self.account_removed(key, entry.bytes);
        Some((entry.id, entry.payload))
    }

    /// A request of `program` finished having used `cost` weighted tokens: its attained
    /// service grows (after decaying to `now`). Returns the new service, or `None` when no band
    /// is program-aware (nothing is kept then).
    pub(crate) fn attained(&mut self, program: &str, cost: f64, now: Instant) -> Option<f64> {
        let las = self.config.las()?;
        let p = self
            .programs
            .entry(program.to_owned())
            .or_insert_with(|| Program::new(now));
        p.service = p.service_at(now, las.half_life_s) + cost;
        p.anchor = now;
        p.last_done = now;
        Some(p.service)
    }

    /// Each program's mean wait in the queue (ms) over the requests released, and Jain's
    /// fairness index over those means (1: equal waits), as upstream's program-aware gauges.
    pub(crate) fn program_waits(&self) -> (Vec<(String, f64)>, f64) {
        let waits: Vec<(String, f64)> = self
            .programs
            .iter()
            .filter(|(_, p)| p.released > 0)
            .map(|(k, p)| (k.clone(), p.mean_wait_ms))
            .collect();
        let sum: f64 = waits.iter().map(|(_, w)| w).sum();
        let squares: f64 = waits.iter().map(|(_, w)| w * w).sum();
        let jain = if squares > 0.0 {
            sum * sum / (waits.len() as f64 * squares)
        } else {
            1.0
        };
        (waits, jain)
    }

    /// Forgets the programs with no completion for the eviction TTL and no request waiting;
    /// returns them (their gauges go too).
    pub(crate) fn sweep_programs(&mut self, now: Instant) -> Vec<String> {
        let Some(las) = self.config.las() else {
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
    pub(crate) fn remove(&mut self, id: u64) -> Option<T> {
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

//! Flow control (upstream's feature-gated queue, `flowControl`): while the pool is saturated,
//! requests wait in epp instead of piling onto the model servers' queues, and are released in
//! order of importance as capacity frees.
//!
//! Why in epp: a model server's queue is first come, first served; held here, a Critical
//! request overtakes a Sheddable one, and one tenant's burst does not starve another's.
//! Order: strict priority between bands (higher first); within a band, round robin between
//! fairness keys (`x-gateway-inference-fairness-id`, default `default-flow`); first come first
//! served within a key. Capacity: a total request count and byte size, and a byte size per
//! band; a request that does not fit is refused at once (429). A request not released within
//! the TTL is answered 503, and one whose stream ends (client gone) leaves the queue.
//!
//! [`Queues`] is the pure ordering and accounting; [`FlowControl`] adds the waiting (a oneshot
//! per request) and the dispatcher, which releases one request per tick while the saturation
//! it is given is below 1.0 (the tick lets the released request's routing count before the
//! next look).

use crate::objectives::Priority;
use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{oneshot, Notify};
use tokio_util::sync::CancellationToken;

/// Capacities and timing; names follow upstream's `flowControl` config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
}

impl Default for FlowConfig {
    fn default() -> Self {
        Self { max_requests: 0, max_bytes: 10 << 30, band_max_bytes: 1_000_000_000, ttl: Duration::from_secs(60), tick: Duration::from_millis(2) }
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
    /// A capacity refusal (429) rather than an expiry (503).
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
}

struct Entry<T> {
    id: u64,
    bytes: u64,
    payload: T,
}

struct Band<T> {
    flows: HashMap<String, VecDeque<Entry<T>>>,
    /// Fairness keys with waiting requests, in round-robin order.
    order: VecDeque<String>,
    bytes: u64,
}

impl<T> Default for Band<T> {
    fn default() -> Self {
        Self { flows: HashMap::new(), order: VecDeque::new(), bytes: 0 }
    }
}

/// The queues: ordering and capacity accounting, no time and no waiting.
pub struct Queues<T> {
    bands: BTreeMap<Reverse<Priority>, Band<T>>,
    len: usize,
    bytes: u64,
    next_id: u64,
    config: FlowConfig,
}

impl<T> Queues<T> {
    pub fn new(config: FlowConfig) -> Self {
        Self { bands: BTreeMap::new(), len: 0, bytes: 0, next_id: 0, config }
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

    /// Queues a request; refused when a capacity would be exceeded.
    pub fn push(&mut self, ticket: &Ticket, payload: T) -> Result<u64, FlowError> {
        let c = &self.config;
        if c.max_requests > 0 && self.len >= c.max_requests {
            return Err(FlowError::Full { limit: "maxRequests", value: c.max_requests as u64 });
        }
        if c.max_bytes > 0 && self.bytes + ticket.bytes > c.max_bytes {
            return Err(FlowError::Full { limit: "maxBytes", value: c.max_bytes });
        }
        let band = self.bands.entry(Reverse(ticket.priority)).or_default();
        if c.band_max_bytes > 0 && band.bytes + ticket.bytes > c.band_max_bytes {
            return Err(FlowError::Full { limit: "priority band maxBytes", value: c.band_max_bytes });
        }
        let id = self.next_id;
        self.next_id += 1;
        let flow = band.flows.entry(ticket.fairness_id.clone()).or_default();
        if flow.is_empty() {
            band.order.push_back(ticket.fairness_id.clone());
        }
        flow.push_back(Entry { id, bytes: ticket.bytes, payload });
        band.bytes += ticket.bytes;
        self.len += 1;
        self.bytes += ticket.bytes;
        Ok(id)
    }

    /// The next request to release: highest band, the next fairness key in turn, oldest first.
    pub fn pop(&mut self) -> Option<(u64, T)> {
        let (&key, band) = self.bands.iter_mut().next()?;
        let flow_id = band.order.pop_front()?;
        let flow = band.flows.get_mut(&flow_id)?;
        let entry = flow.pop_front()?;
        if flow.is_empty() {
            band.flows.remove(&flow_id);
        } else {
            band.order.push_back(flow_id);
        }
        self.account_removed(key, entry.bytes);
        Some((entry.id, entry.payload))
    }

    /// Takes request `id` out of the queue (expired, or its stream ended).
    pub fn remove(&mut self, id: u64) -> Option<T> {
        let (key, flow_id, pos) = self.bands.iter().find_map(|(k, band)| {
            band.flows.iter().find_map(|(f, q)| q.iter().position(|e| e.id == id).map(|p| (*k, f.clone(), p)))
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

/// The queue shared by every stream, and its dispatcher.
pub struct FlowControl {
    queues: Mutex<Queues<oneshot::Sender<()>>>,
    wake: Notify,
    saturation: Saturation,
    config: FlowConfig,
}

impl FlowControl {
    /// `saturation` is the pool's (≥ 1.0: saturated); requests wait while it is.
    pub fn new(config: FlowConfig, saturation: impl Fn() -> f64 + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(Self { queues: Mutex::new(Queues::new(config)), wake: Notify::new(), saturation: Box::new(saturation), config })
    }

    fn queues(&self) -> std::sync::MutexGuard<'_, Queues<oneshot::Sender<()>>> {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
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
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut q = self.queues();
            if q.is_empty() && (self.saturation)() < 1.0 {
                return Ok(());
            }
            q.push(&ticket, tx)?
        };
        self.wake.notify_one();
        let mut guard = Dequeue { flow: self, id: Some(id) };
        let result = tokio::time::timeout(self.config.ttl, rx).await;
        match result {
            Ok(Ok(())) => {
                guard.id = None;
                Ok(())
            }
            Ok(Err(_)) => Err(FlowError::Closed),
            Err(_) => Err(FlowError::Expired(self.config.ttl)),
        }
    }

    /// The dispatcher: until `shutdown`, releases one waiting request per tick while the pool
    /// is not saturated. Requests whose stream is gone are skipped without costing a tick.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            if self.is_empty() {
                tokio::select! {
                    () = self.wake.notified() => continue,
                    () = shutdown.cancelled() => return,
                }
            }
            if (self.saturation)() < 1.0 {
                self.release_one();
            }
            tokio::select! {
                () = tokio::time::sleep(self.config.tick) => {}
                () = shutdown.cancelled() => return,
            }
        }
    }

    fn release_one(&self) {
        let mut q = self.queues();
        while let Some((_, tx)) = q.pop() {
            if tx.send(()).is_ok() {
                return;
            }
        }
    }
}

/// Removes a request from the queue unless it was released.
struct Dequeue<'a> {
    flow: &'a FlowControl,
    id: Option<u64>,
}

impl Drop for Dequeue<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.flow.queues().remove(id);
        }
    }
}

#[cfg(test)]
mod tests;

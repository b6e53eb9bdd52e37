//! The datastore: what epp currently knows about its endpoints, as immutable snapshots.
//!
//! Readers (every request) load an `Arc<EndpointSet>` without locking. Each source has one
//! writer: discovery replaces the endpoint set; each endpoint's scraper stores that endpoint's
//! metrics; the director counts what it dispatched. An endpoint that survives a set replacement
//! keeps its state (metrics, counters), so re-reading an unchanged endpoints file costs nothing.

use crate::endpoint::{Endpoint, EndpointId, EndpointMetrics};
use crate::objectives::Objectives;
use arc_swap::{ArcSwap, ArcSwapOption};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use tokio::sync::watch;

/// Live state of one endpoint.
#[derive(Debug)]
pub struct EndpointState {
    pub endpoint: Endpoint,
    metrics: ArcSwapOption<EndpointMetrics>,
    inflight: AtomicU32,
    dispatched_since_scrape: AtomicU32,
}

impl EndpointState {
    fn new(endpoint: Endpoint) -> Self {
        Self {
            endpoint,
            metrics: ArcSwapOption::empty(),
            inflight: AtomicU32::new(0),
            dispatched_since_scrape: AtomicU32::new(0),
        }
    }

    pub fn id(&self) -> EndpointId {
        self.endpoint.id
    }

    /// The last successful scrape, if any.
    pub fn metrics(&self) -> Option<Arc<EndpointMetrics>> {
        self.metrics.load_full()
    }

    /// Stores a scrape. Requests dispatched before it are now reflected in the pod's own
    /// numbers, so the between-scrapes correction restarts from zero.
    pub fn store_metrics(&self, metrics: EndpointMetrics) {
        self.metrics.store(Some(Arc::new(metrics)));
        self.dispatched_since_scrape.store(0, Ordering::Relaxed);
    }

    /// Requests epp routed here that have not finished.
    pub fn inflight(&self) -> u32 {
        self.inflight.load(Ordering::Relaxed)
    }

    /// Requests epp routed here since the last scrape.
    pub fn dispatched_since_scrape(&self) -> u32 {
        self.dispatched_since_scrape.load(Ordering::Relaxed)
    }

    /// Counts a request routed here until the returned guard drops.
    pub fn acquire(self: &Arc<Self>) -> InflightGuard {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        self.dispatched_since_scrape.fetch_add(1, Ordering::Relaxed);
        InflightGuard(Arc::clone(self))
    }
}

/// Holds one in-flight request against an endpoint; releases it on drop, whatever ends the
/// stream (response complete, client gone, gateway reset).
#[derive(Debug)]
pub struct InflightGuard(Arc<EndpointState>);

impl InflightGuard {
    pub fn endpoint(&self) -> &EndpointState {
        &self.0
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        let _ = self.0.inflight.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }
}

/// An immutable set of endpoints.
#[derive(Debug, Default)]
pub struct EndpointSet {
    list: Vec<Arc<EndpointState>>,
    by_id: HashMap<EndpointId, usize>,
}

impl EndpointSet {
    pub fn iter(&self) -> impl Iterator<Item = &Arc<EndpointState>> {
        self.list.iter()
    }
    pub fn get(&self, id: &EndpointId) -> Option<&Arc<EndpointState>> {
        self.by_id.get(id).map(|i| &self.list[*i])
    }
    pub fn len(&self) -> usize {
        self.list.len()
    }
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

/// Shared state: the current endpoint set and a change signal for background tasks, and the
/// objective policies (InferenceObjective / InferenceModel / InferenceModelRewrite).
#[derive(Debug)]
pub struct Datastore {
    set: ArcSwap<EndpointSet>,
    changed: watch::Sender<u64>,
    objectives: ArcSwap<Objectives>,
}

impl Default for Datastore {
    fn default() -> Self {
        Self::new()
    }
}

impl Datastore {
    pub fn new() -> Self {
        Self { set: ArcSwap::from_pointee(EndpointSet::default()), changed: watch::channel(0).0, objectives: ArcSwap::from_pointee(Objectives::default()) }
    }

    pub fn snapshot(&self) -> Arc<EndpointSet> {
        self.set.load_full()
    }

    /// Replaces the endpoint set (discovery is the only caller). Unchanged endpoints keep their
    /// state; an endpoint whose labels or weight changed keeps its metrics and counters too.
    pub fn set_endpoints(&self, endpoints: Vec<Endpoint>) {
        let old = self.set.load();
        let mut list = Vec::with_capacity(endpoints.len());
        let mut by_id = HashMap::with_capacity(endpoints.len());
        for ep in endpoints {
            if by_id.contains_key(&ep.id) {
                continue;
            }
            let state = match old.get(&ep.id) {
                Some(s) if s.endpoint == ep => Arc::clone(s),
                Some(s) => Arc::new(carry_over(s, ep.clone())),
                None => Arc::new(EndpointState::new(ep.clone())),
            };
            by_id.insert(ep.id, list.len());
            list.push(state);
        }
        if list.len() == old.len() && list.iter().all(|s| old.get(&s.id()).is_some_and(|o| Arc::ptr_eq(o, s))) {
            return;
        }
        self.set.store(Arc::new(EndpointSet { list, by_id }));
        self.changed.send_modify(|v| *v += 1);
    }

    /// The objective policies requests are matched against.
    pub fn objectives(&self) -> Arc<Objectives> {
        self.objectives.load_full()
    }

    /// Replaces the objective policies (Kubernetes discovery's objective watcher is the only
    /// caller).
    pub fn set_objectives(&self, objectives: Objectives) {
        self.objectives.store(Arc::new(objectives));
    }

    /// A receiver that wakes whenever the endpoint set changes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

fn carry_over(old: &EndpointState, endpoint: Endpoint) -> EndpointState {
    let s = EndpointState::new(endpoint);
    s.metrics.store(old.metrics());
    s.inflight.store(old.inflight(), Ordering::Relaxed);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn ep(port: u16) -> Endpoint {
        Endpoint::from_id(format!("127.0.0.1:{port}").parse().unwrap())
    }

    fn metrics() -> EndpointMetrics {
        EndpointMetrics { waiting: 1.0, running: 2.0, kv_usage: 0.5, lora: None, cache: None, gpu: None, updated: Instant::now() }
    }

    #[test]
    fn unchanged_endpoints_keep_state_and_do_not_signal() {
        let ds = Datastore::new();
        let mut rx = ds.subscribe();
        ds.set_endpoints(vec![ep(1), ep(2)]);
        assert!(rx.has_changed().unwrap());
        rx.borrow_and_update();
        let s1 = Arc::clone(ds.snapshot().get(&ep(1).id).unwrap());
        s1.store_metrics(metrics());
        ds.set_endpoints(vec![ep(2), ep(1)]);
        assert!(!rx.has_changed().unwrap(), "same set, no signal");
        let mut relabelled = ep(1);
        relabelled.weight = 3;
        ds.set_endpoints(vec![relabelled, ep(3)]);
        let snap = ds.snapshot();
        assert_eq!(snap.len(), 2);
        assert!(snap.get(&ep(2).id).is_none());
        assert_eq!(snap.get(&ep(1).id).unwrap().metrics().unwrap().waiting, 1.0);
    }

    #[test]
    fn guards_count_inflight_and_scrapes_reset_dispatch_count() {
        let ds = Datastore::new();
        ds.set_endpoints(vec![ep(1)]);
        let s = Arc::clone(ds.snapshot().get(&ep(1).id).unwrap());
        let g1 = s.acquire();
        let g2 = s.acquire();
        assert_eq!((s.inflight(), s.dispatched_since_scrape()), (2, 2));
        s.store_metrics(metrics());
        drop(g1);
        assert_eq!((s.inflight(), s.dispatched_since_scrape()), (1, 0));
        drop(g2);
        assert_eq!(s.inflight(), 0);
    }
}

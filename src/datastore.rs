//! The datastore: what epp currently knows about its endpoints, as immutable snapshots.
//!
//! Readers (every request) load an `Arc<EndpointSet>` without locking. Each source has one
//! writer: discovery replaces the endpoint set; each endpoint's scraper stores that endpoint's
//! metrics; the director counts what it dispatched. An endpoint that survives a set replacement
//! keeps its state (metrics, counters), so re-reading an unchanged endpoints file costs nothing.
//!
//! The response phase reports each request's outcome ([`Observation`]: status, connection
//! failure, TTFT, TPOT) into the served endpoint's passive state: a peak-EWMA of its latency
//! (`latency`) and its outlier-detection / slow-start state (`ejection`), one small mutex per
//! endpoint and no allocation per request.

pub(crate) mod ejection;
pub(crate) mod latency;
pub(crate) mod objectives;
pub(crate) mod ttft;

use crate::endpoint::{Endpoint, EndpointId, EndpointMetrics};
use crate::metrics::{EndpointLabels, Metrics};
use arc_swap::{ArcSwap, ArcSwapOption};
#[cfg(test)]
use ejection::Mode;
use ejection::{Health, HealthPolicy, Signal, Transition};
use latency::Latency;
use objectives::Objectives;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use ttft::{Coefficients, Features, Learned, TtftModel};

/// How a request reached (or failed to reach) its endpoint, as the gateway reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The gateway could not connect (Envoy's `upstream connect error ...` local reply, `UF`).
    Connect,
    /// The stream was reset after dispatch and before any response header.
    ResetBeforeHeaders,
}

/// What the response phase saw of one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Observation {
    /// `:status` of the response headers, when they came.
    pub(crate) status: Option<u16>,
    pub(crate) failure: Option<Failure>,
    /// Dispatch to the first response body chunk.
    pub(crate) ttft: Option<Duration>,
    /// Time per output token after the first, when the token count is known.
    pub(crate) tpot: Option<Duration>,
}

impl Observation {
    /// How the outcome counts for passive health. A 4xx is the client's fault and counts as the
    /// endpoint working; so do 501 and 505, which say the request asked for something the
    /// server does not do. Every other 5xx counts against the endpoint.
    pub(crate) fn signal(&self) -> Option<Signal> {
        if self.failure.is_some() {
            return Some(Signal::RequestLocal);
        }
        match self.status? {
            501 | 505 => Some(Signal::RequestOk),
            500..=599 => Some(Signal::Request5xx),
            _ => Some(Signal::RequestOk),
        }
    }
}

/// The passive state of an endpoint: changes together, so locked together.
#[derive(Clone, Copy, Debug)]
struct Passive {
    health: Health,
    latency: Latency,
}

/// Live state of one endpoint.
#[derive(Debug)]
pub struct EndpointState {
    pub(crate) endpoint: Endpoint,
    metrics: ArcSwapOption<EndpointMetrics>,
    inflight: AtomicU32,
    dispatched_since_scrape: AtomicU32,
    passive: Mutex<Passive>,
    /// Uncached prompt tokens (and requests) epp sent here that have no first token yet: the
    /// prefill work ahead of the next request (llm-d's token load).
    prefill_tokens: AtomicU64,
    prefill_requests: AtomicU32,
    /// The learned TTFT model ([`ttft`]): written on responses, read by every decision.
    ttft: Mutex<TtftModel>,
    ttft_learned: ArcSwapOption<Learned>,
}

impl EndpointState {
    fn new(endpoint: Endpoint) -> Self {
        Self {
            endpoint,
            metrics: ArcSwapOption::empty(),
            inflight: AtomicU32::new(0),
            dispatched_since_scrape: AtomicU32::new(0),
            passive: Mutex::new(Passive {
                health: Health::new(Instant::now()),
                latency: Latency::default(),
            }),
            prefill_tokens: AtomicU64::new(0),
            prefill_requests: AtomicU32::new(0),
            ttft: Mutex::default(),
            ttft_learned: ArcSwapOption::empty(),
        }
    }

    /// The passive state; a poisoned lock still holds valid plain data.
    fn passive(&self) -> MutexGuard<'_, Passive> {
        self.passive
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether outlier detection lets this endpoint be picked now (always, without it). An
    /// expired ejection becomes half-open here: one request at a time until one succeeds.
    pub(crate) fn available(&self, policy: &HealthPolicy, now: Instant) -> bool {
        policy
            .outlier
            .as_ref()
            .is_none_or(|p| self.passive().health.available(now, p))
    }

    /// Whether the endpoint is ejected or half-open (for gauges and logs).
    #[cfg(test)]
    pub(crate) fn ejected(&self) -> bool {
        self.passive().health.mode != Mode::Healthy
    }

    /// The slow-start share multiplier in `[min, 1]` (1 without slow start).
    pub(crate) fn ramp(&self, policy: &HealthPolicy, now: Instant) -> f64 {
        policy.slow_start.as_ref().map_or(1.0, |s| {
            s.ramp(now.saturating_duration_since(self.passive().health.warm_since))
        })
    }

    /// Peak-EWMA TTFT and TPOT in seconds at `now`; `None` for what was never observed.
    pub(crate) fn latency(&self, now: Instant) -> (Option<f64>, Option<f64>) {
        let l = self.passive().latency;
        (l.ttft.value(now), l.tpot.value(now))
    }

    /// Records a finished (or failed) request.
    pub(crate) fn record(
        &self,
        obs: &Observation,
        policy: &HealthPolicy,
        now: Instant,
    ) -> Transition {
        let Some(signal) = obs.signal() else {
            return Transition::None;
        };
        let mut p = self.passive();
        match signal {
            Signal::RequestOk => p.latency.observe(obs.ttft, obs.tpot, now),
            _ => p.latency.penalize(now),
        }
        policy
            .outlier
            .as_ref()
            .map_or(Transition::None, |o| p.health.observe(signal, now, o))
    }

    /// Records an active health probe or metrics scrape.
    pub(crate) fn record_probe(
        &self,
        who: ejection::Prober,
        ok: bool,
        policy: &HealthPolicy,
        now: Instant,
    ) -> Transition {
        let signal = if ok {
            Signal::ProbeOk(who)
        } else {
            Signal::ProbeFailed(who)
        };
        policy.outlier.as_ref().map_or(Transition::None, |o| {
            self.passive().health.observe(signal, now, o)
        })
    }

    pub(crate) fn id(&self) -> EndpointId {
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
    pub(crate) fn inflight(&self) -> u32 {
        self.inflight.load(Ordering::Relaxed)
    }

    /// Requests epp routed here since the last scrape.
    pub(crate) fn dispatched_since_scrape(&self) -> u32 {
        self.dispatched_since_scrape.load(Ordering::Relaxed)
    }

    /// Uncached prompt tokens and requests epp sent here that have no first token yet.
    pub(crate) fn prefill_pending(&self) -> (u64, u32) {
        (
            self.prefill_tokens.load(Ordering::Relaxed),
            self.prefill_requests.load(Ordering::Relaxed),
        )
    }

    /// Counts `tokens` of prefill work here until the guard is released (first token) or dropped.
    pub(crate) fn start_prefill(self: &Arc<Self>, tokens: u64) -> PrefillGuard {
        self.prefill_tokens.fetch_add(tokens, Ordering::Relaxed);
        self.prefill_requests.fetch_add(1, Ordering::Relaxed);
        PrefillGuard {
            state: Arc::clone(self),
            tokens,
        }
    }

    /// The TTFT model learned so far (`None` before the first observation).
    pub(crate) fn ttft_learned(&self) -> Option<Learned> {
        self.ttft_learned.load().as_deref().copied()
    }

    /// Records a measured TTFT (seconds) of a request dispatched with `features`.
    pub(crate) fn observe_ttft(
        &self,
        features: &Features,
        ttft: f64,
        prior: &Coefficients,
        now: Instant,
    ) {
        let learned = self
            .ttft
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .observe(features, ttft, prior, now);
        self.ttft_learned.store(Some(Arc::new(learned)));
    }

    /// Counts a request routed here at `now` (the decision's clock) until the returned guard
    /// drops.
    pub(crate) fn acquire(self: &Arc<Self>, now: Instant) -> InflightGuard {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        self.dispatched_since_scrape.fetch_add(1, Ordering::Relaxed);
        self.passive().health.dispatched(now);
        InflightGuard(Arc::clone(self))
    }
}

/// Holds one in-flight request against an endpoint; releases it on drop, whatever ends the
/// stream (response complete, client gone, gateway reset).
#[derive(Debug)]
pub(crate) struct InflightGuard(Arc<EndpointState>);

impl InflightGuard {
    pub(crate) fn endpoint(&self) -> &EndpointState {
        &self.0
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        let _ = self
            .0
            .inflight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }
}

/// One request's prefill work counted against its endpoint; released at its first token (or
/// when the request ends without one).
#[derive(Debug)]
pub(crate) struct PrefillGuard {
    state: Arc<EndpointState>,
    tokens: u64,
}

impl Drop for PrefillGuard {
    fn drop(&mut self) {
        let s = &self.state;
        let _ = s
            .prefill_tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(self.tokens))
            });
        let _ = s
            .prefill_requests
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
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
    pub(crate) fn len(&self) -> usize {
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
    /// Outlier detection and slow start, from the configuration (the director swaps it).
    health: ArcSwap<HealthPolicy>,
}

impl Default for Datastore {
    fn default() -> Self {
        Self::new()
    }
}

impl Datastore {
    pub(crate) fn new() -> Self {
        Self {
            set: ArcSwap::from_pointee(EndpointSet::default()),
            changed: watch::channel(0).0,
            objectives: ArcSwap::from_pointee(Objectives::default()),
            health: ArcSwap::from_pointee(HealthPolicy::default()),
        }
    }

    pub fn snapshot(&self) -> Arc<EndpointSet> {
        self.set.load_full()
    }

    /// Replaces the endpoint set (discovery is the only caller). Unchanged endpoints keep their
    /// state; an endpoint whose labels or weight changed keeps its metrics and counters too.
    pub(crate) fn set_endpoints(&self, endpoints: Vec<Endpoint>) {
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
        if list.len() == old.len()
            && list
                .iter()
                .all(|s| old.get(&s.id()).is_some_and(|o| Arc::ptr_eq(o, s)))
        {
            return;
        }
        self.set.store(Arc::new(EndpointSet { list, by_id }));
        self.changed.send_modify(|v| *v += 1);
    }

    /// The objective policies requests are matched against.
    pub(crate) fn objectives(&self) -> Arc<Objectives> {
        self.objectives.load_full()
    }

    /// Replaces the objective policies (Kubernetes discovery's objective watcher is the only
    /// caller).
    pub(crate) fn set_objectives(&self, objectives: Objectives) {
        self.objectives.store(Arc::new(objectives));
    }

    /// The passive-health policy in force.
    pub(crate) fn health_policy(&self) -> Arc<HealthPolicy> {
        self.health.load_full()
    }

    /// Replaces the passive-health policy (the director, on every configuration).
    pub(crate) fn set_health_policy(&self, policy: HealthPolicy) {
        self.health.store(Arc::new(policy));
    }

    /// A receiver that wakes whenever the endpoint set changes.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Keeps one task per endpoint until `shutdown`: `start` is called for each endpoint that
    /// appears and spawns its task on `tracker`; the token it receives is cancelled when the
    /// endpoint leaves the set. Shared by the metric scrapers and the health probers.
    pub(crate) async fn per_endpoint<F>(
        &self,
        tracker: &TaskTracker,
        shutdown: &CancellationToken,
        mut start: F,
    ) where
        F: FnMut(&TaskTracker, Arc<EndpointState>, CancellationToken),
    {
        let mut changes = self.subscribe();
        let mut running: HashMap<EndpointId, CancellationToken> = HashMap::new();
        loop {
            let snapshot = self.snapshot();
            running.retain(|id, token| {
                let keep = snapshot.get(id).is_some();
                if !keep {
                    token.cancel();
                }
                keep
            });
            for state in snapshot.iter() {
                if let std::collections::hash_map::Entry::Vacant(slot) = running.entry(state.id()) {
                    let token = slot.insert(shutdown.child_token()).clone();
                    start(tracker, Arc::clone(state), token);
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                changed = changes.changed() => if changed.is_err() { return },
            }
        }
    }
}

fn carry_over(old: &EndpointState, endpoint: Endpoint) -> EndpointState {
    let s = EndpointState::new(endpoint);
    s.metrics.store(old.metrics());
    s.inflight.store(old.inflight(), Ordering::Relaxed);
    *s.passive() = *old.passive();
    // Pending prefill is not carried: the old state's guards release against the old state.
    *s.ttft
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = *old
        .ttft
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    s.ttft_learned.store(old.ttft_learned.load_full());
    s
}

/// Logs and counts a passive-health transition of `endpoint`.
pub(crate) fn report(metrics: &Metrics, endpoint: &Endpoint, transition: Transition, cause: &str) {
    let labels = || EndpointLabels {
        endpoint: endpoint.id.to_string(),
    };
    match transition {
        Transition::None => {}
        Transition::Ejected { period, ejections } => {
            tracing::warn!(endpoint = %endpoint.id, name = %endpoint.name, cause, period = ?period, consecutive_ejections = ejections, "endpoint ejected by outlier detection");
            metrics.outlier_ejections.get_or_create(&labels()).inc();
            metrics.endpoint_ejected.get_or_create(&labels()).set(1);
        }
        Transition::Restored => {
            tracing::info!(endpoint = %endpoint.id, name = %endpoint.name, "endpoint restored: the half-open probe succeeded");
            metrics.outlier_restores.get_or_create(&labels()).inc();
            metrics.endpoint_ejected.get_or_create(&labels()).set(0);
        }
    }
}

#[cfg(test)]
mod tests;

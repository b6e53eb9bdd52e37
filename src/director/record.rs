//! What a decision records: the scheduling attempt, the prefix index and its hit metrics, the
//! session bindings, the no-hit LRU and the in-flight lease.

use super::exchange::Lease;
use super::Director;
use crate::datastore::EndpointState;
use crate::endpoint::EndpointId;
use crate::metrics::{AttemptLabels, ModelLabel, Outcome, RunningLabels};
use crate::prefix::source::{Lookup, Pod, PrefixSource, Source};
use crate::scheduling::scorer::{SessionBindings, SessionIdConfig};
use crate::scheduling::{self, Candidate, ScheduleError, Scheduler};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

impl Director {
    /// Counts one scheduling attempt (`scheduler_attempts`), by outcome and primary pod.
    pub(super) fn record_attempt(
        &self,
        result: &Result<scheduling::Decision, ScheduleError>,
        target: &ModelLabel,
    ) {
        let (status, pod) = match result {
            Ok(d) => (
                Outcome::success,
                d.endpoints
                    .first()
                    .map(|e| e.to_string())
                    .unwrap_or_default(),
            ),
            Err(_) => (Outcome::failure, String::new()),
        };
        let port = pod.rsplit(':').next().unwrap_or("").to_owned();
        let labels = AttemptLabels {
            status,
            target_model_name: target.clone(),
            pod_name: pod,
            namespace: String::new(),
            port,
        };
        self.metrics.scheduler_attempts.get_or_create(&labels).inc();
    }

    /// The hit metrics, then the index's own record of the decision.
    pub(super) fn record_prefix(&self, source: &Source<'_>, l: &Lookup, primary: Pod) {
        let total = l.hashes.len();
        if total == 0 {
            return;
        }
        let matched = l.held(primary.id);
        self.metrics
            .prefix_hit_ratio
            .observe(matched as f64 / total as f64);
        self.metrics
            .prefix_hit_bytes
            .observe((matched * l.block_size * 4) as f64);
        source.record(l, &primary, Instant::now());
    }

    pub(super) fn session_bound(
        &self,
        scheduler: &Scheduler,
        session: Option<&str>,
    ) -> Option<EndpointId> {
        bound(&self.sessions, scheduler.session_id()?, session?)
    }

    /// The prefill pod a session id is bound to, when an instance pins the prefill pick with
    /// the `session_id` strategy.
    pub(super) fn prefill_session_bound(
        &self,
        scheduler: &Scheduler,
        session: Option<&str>,
    ) -> Option<EndpointId> {
        bound(
            &self.prefill_sessions,
            scheduler.prefill_session_id()?,
            session?,
        )
    }

    /// Binds the session to the primary, refreshes the binding, or moves it when the bound
    /// endpoint was not a candidate (upstream's `PreRequest`).
    pub(super) fn record_session(
        &self,
        scheduler: &Scheduler,
        session: (Option<&str>, Option<EndpointId>),
        candidates: &[Candidate],
        primary: EndpointId,
    ) {
        if scheduler.session_id().is_some() {
            bind(&self.sessions, session, candidates, primary);
        }
    }

    /// The same for the prefill pick of a request prefilled remotely (upstream's instance with
    /// `profileName: prefill` reads that profile's result; a decode-only request has none).
    pub(super) fn record_prefill_session(
        &self,
        scheduler: &Scheduler,
        session: (Option<&str>, Option<EndpointId>),
        candidates: &[Candidate],
        prefill: EndpointId,
    ) {
        if scheduler.prefill_session_id().is_some() {
            bind(&self.prefill_sessions, session, candidates, prefill);
        }
    }

    /// The no-hit LRU's order for this decision (empty without a `no-hit-lru-scorer`).
    pub(super) fn lru_snapshot(&self, scheduler: &Scheduler) -> Vec<EndpointId> {
        if scheduler.no_hit_lru().is_none() {
            return Vec::new();
        }
        self.lru
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .snapshot()
    }

    /// A cold request (no candidate holds any of its blocks) makes its primary the most
    /// recently used endpoint of the no-hit LRU. Upstream decides coldness over the filtered
    /// candidates; here it is every candidate, which differs only when a filter drops each
    /// endpoint holding part of the prompt.
    pub(super) fn record_no_hit(
        &self,
        scheduler: &Scheduler,
        candidates: &[Candidate],
        primary: EndpointId,
    ) {
        let Some(s) = scheduler.no_hit_lru() else {
            return;
        };
        let all: Vec<&Candidate> = candidates.iter().collect();
        if scheduling::scorer::is_cold(&all) {
            self.lru
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .touch(primary, s.capacity());
        }
    }

    pub(super) fn lease(&self, primary: &Arc<EndpointState>, model: &ModelLabel) -> Lease {
        let running = self
            .metrics
            .running_requests
            .get_or_create(&RunningLabels {
                model_name: model.clone(),
            })
            .clone();
        running.inc();
        Lease {
            inflight: primary.acquire(),
            running,
        }
    }
}

/// The endpoint `session` is bound to in `store`.
fn bound(
    store: &Mutex<SessionBindings>,
    config: &SessionIdConfig,
    session: &str,
) -> Option<EndpointId> {
    store
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .bound(session, config, Instant::now())
}

/// Records in `store` that the session's request went to `picked`.
fn bind(
    store: &Mutex<SessionBindings>,
    (session, bound): (Option<&str>, Option<EndpointId>),
    candidates: &[Candidate],
    picked: EndpointId,
) {
    let Some(session) = session else {
        return;
    };
    let present = bound.is_some_and(|b| candidates.iter().any(|c| c.id == b));
    store.lock().unwrap_or_else(PoisonError::into_inner).record(
        session,
        picked,
        present,
        Instant::now(),
    );
}

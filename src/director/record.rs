//! What a decision records: the scheduling attempt, the prefix index and its hit metrics, and
//! the in-flight lease. (What a plugin's own state learns from a decision, the plugin records:
//! `crate::scheduling::lifecycle`.)

use super::exchange::Lease;
use super::route::{pod, pod_of};
use super::Director;
use crate::datastore::EndpointState;
use crate::metrics::{AttemptLabels, ModelLabel, Outcome, RunningLabels};
use crate::prefix::source::{Lookup, PrefixSource, Source};
use crate::scheduling::{self, Candidate, ScheduleError};
use std::sync::Arc;
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

    /// The hit metrics, then the index's own record of the decision: the primary's, and with
    /// a remote prefill the prefill pod's too (it computed the prompt; upstream records both).
    pub(super) fn record_prefix(
        &self,
        (source, l, now): (&Source<'_>, &Lookup, Instant),
        candidates: &[Candidate],
        primary: &EndpointState,
        prefill: Option<&Arc<EndpointState>>,
    ) {
        let as_pod = |s: &EndpointState| {
            let candidate = candidates.iter().find(|c| c.id == s.id());
            candidate.map_or_else(|| pod_of(s), pod)
        };
        let total = l.hashes.len();
        if total > 0 {
            let matched = l.held(primary.id());
            self.metrics
                .prefix_hit_ratio
                .observe(matched as f64 / total as f64);
            self.metrics
                .prefix_hit_bytes
                .observe((matched * l.block_size * 4) as f64);
            source.record(l, &as_pod(primary), now);
        }
        if let Some(p) = prefill {
            source.record(l, &as_pod(p), now);
        }
    }

    pub(super) fn lease(&self, primary: &Arc<EndpointState>, model: &ModelLabel) -> Lease {
        let now = self.clock.now();
        let running = self
            .metrics
            .running_requests
            .get_or_create(&RunningLabels {
                model_name: model.clone(),
            })
            .clone();
        running.inc();
        Lease {
            inflight: primary.acquire(now),
            running,
        }
    }
}

//! The candidates of one request: the snapshot's endpoints narrowed by the subset hint and
//! outlier ejection, admitted by the saturation detector, and each made into the value the
//! scheduler reads (metrics, in-flight load, latency, slow-start ramp).

use super::exchange::{Body, DirectorError, Incoming};
use super::{Director, Runtime};
use crate::admission;
use crate::datastore::objectives::Priority;
use crate::datastore::{EndpointSet, EndpointState};
use crate::endpoint::EndpointId;
use crate::scheduling::{self, Candidate};
use rand::Rng;
use std::sync::Arc;
use std::time::Instant;

impl Director {
    pub(super) fn candidate_states<'s>(
        &self,
        snapshot: &'s EndpointSet,
        subset: Option<&[String]>,
        now: Instant,
    ) -> Result<Vec<&'s Arc<EndpointState>>, DirectorError> {
        if snapshot.is_empty() {
            return Err(DirectorError::NoCandidates(
                "no ready endpoints in the pool",
            ));
        }
        let states: Vec<&Arc<EndpointState>> = match subset.filter(|_| self.opts.subset_filter) {
            None => snapshot.iter().collect(),
            Some([]) => return Err(DirectorError::NoCandidates("the subset hint is empty")),
            Some(list) => snapshot
                .iter()
                .filter(|s| in_subset(s.id(), list))
                .collect(),
        };
        if states.is_empty() {
            return Err(DirectorError::NoCandidates(
                "no endpoint matches the subset hint",
            ));
        }
        Ok(self.without_ejected(states, now))
    }

    /// Drops endpoints that outlier detection ejected, unless that would drop them all: then
    /// every one stays (a degraded pool beats no pool) and a warning is logged.
    fn without_ejected<'s>(
        &self,
        states: Vec<&'s Arc<EndpointState>>,
        now: Instant,
    ) -> Vec<&'s Arc<EndpointState>> {
        let policy = self.datastore.health_policy();
        if policy.outlier.is_none() {
            return states;
        }
        let available: Vec<&Arc<EndpointState>> = states
            .iter()
            .copied()
            .filter(|s| s.available(&policy, now))
            .collect();
        if available.is_empty() {
            tracing::warn!(
                candidates = states.len(),
                "every candidate endpoint is ejected; routing to them anyway"
            );
            return states;
        }
        available
    }

    /// Admission: the saturation detector sheds a sheddable request, then each admission
    /// plugin may refuse it. `parsed` is a parsed request's priority; a body that is not read
    /// takes its priority from the objective header alone, and a bodyless request is routed
    /// at once.
    pub(super) fn admission(
        &self,
        runtime: &Runtime,
        (inc, parsed, now): (&Incoming<'_>, Option<Priority>, Instant),
        states: &[&Arc<EndpointState>],
        rng: &mut impl Rng,
    ) -> Result<(), DirectorError> {
        let priority = match (parsed, inc.body) {
            (Some(p), _) => p,
            (None, Body::Unread) => self.priority(inc.objective, ""),
            (None, _) => return Ok(()),
        };
        let destinations = super::disagg::destinations(&runtime.scheduler, states);
        self.admit(&runtime.thresholds, priority, &destinations, now)?;
        for admitter in &runtime.admitters {
            let endpoints = states
                .iter()
                .map(|s| s.metrics().map(|m| (m.waiting, m.kv_usage)));
            if let Some(why) = admitter.refuses(priority, endpoints, rng.random()) {
                return Err(DirectorError::NotAdmitted(why));
            }
        }
        Ok(())
    }

    /// Sheds a sheddable request (priority < 0) when the candidates are saturated.
    fn admit(
        &self,
        thresholds: &admission::Thresholds,
        priority: Priority,
        states: &[&Arc<EndpointState>],
        now: Instant,
    ) -> Result<(), DirectorError> {
        let saturation = || {
            if let Some(c) = &thresholds.concurrency {
                return c.saturation(states.iter().map(|s| inflight_load(s)));
            }
            let metrics: Vec<_> = states.iter().map(|s| s.metrics()).collect();
            admission::saturation(
                metrics.iter().map(|m| m.as_deref()),
                now,
                thresholds,
                self.opts.staleness,
            )
        };
        Ok(admission::admit(priority, saturation)?)
    }

    /// The scheduler's candidates; the prefix lookup fills in their blocks afterwards.
    pub(super) fn candidates(
        &self,
        states: &[&Arc<EndpointState>],
        labels: bool,
        now: Instant,
    ) -> Vec<Candidate> {
        let policy = self.datastore.health_policy();
        let no_labels = Arc::default();
        states
            .iter()
            .map(|s| {
                let m = s.metrics();
                let fresh = m
                    .as_ref()
                    .is_some_and(|m| m.age(now) <= self.opts.staleness);
                let (waiting, running, kv) = m
                    .as_ref()
                    .map_or((0.0, 0.0, 0.0), |m| (m.waiting, m.running, m.kv_usage));
                Candidate {
                    id: s.id(),
                    weight: s.endpoint.weight,
                    metrics: m,
                    waiting: waiting + f64::from(s.dispatched_since_scrape()),
                    running: running.max(f64::from(s.inflight())),
                    inflight: f64::from(s.inflight()),
                    labels: if labels {
                        Arc::new(s.endpoint.labels.clone())
                    } else {
                        Arc::clone(&no_labels)
                    },
                    kv_usage: kv,
                    fresh,
                    prefix_blocks: 0,
                    latency: Some(s.latency(now))
                        .filter(|l| l.0.is_some() || l.1.is_some())
                        .map(|(ttft, tpot)| scheduling::scorer::LatencyEstimate { ttft, tpot }),
                    ramp: s.ramp(&policy, now),
                    prefill: prefill_load(s, waiting),
                }
            })
            .collect()
    }
}

/// The screening plugins narrow the candidates (upstream's `runScreeners`, after the
/// candidates are located): when they leave none, no endpoint may serve the request (503, as
/// upstream's director answers).
pub(super) fn screen(
    runtime: &Runtime,
    inc: &Incoming<'_>,
    snapshot: &EndpointSet,
    candidates: &mut Vec<Candidate>,
    rng: &mut impl Rng,
) -> Result<(), DirectorError> {
    if !runtime.scheduler.screens() {
        return Ok(());
    }
    let population: Vec<_> = snapshot
        .iter()
        .filter(|s| s.endpoint.rank == 0)
        .map(|s| &s.endpoint.labels)
        .collect();
    let screening = scheduling::lifecycle::Screening {
        headers: inc.headers,
        population: &population,
        draw: rng.random(),
    };
    runtime.scheduler.screen(&screening, candidates);
    if candidates.is_empty() {
        return Err(DirectorError::Screened);
    }
    Ok(())
}

/// The requests epp has in flight on `s` and their tokens still prefilling (llm-d's
/// `InFlightLoad`), for the `concurrency-detector`.
pub(super) fn inflight_load(s: &EndpointState) -> (f64, f64) {
    (f64::from(s.inflight()), s.prefill_pending().0 as f64)
}

/// What epp sent `s` that is still prefilling, its learned TTFT rates, and its queue counted
/// from the `scraped` waiting requests.
fn prefill_load(s: &EndpointState, scraped: f64) -> scheduling::scorer::PrefillLoad {
    let (tokens, requests) = s.prefill_pending();
    scheduling::scorer::PrefillLoad {
        pending_tokens: tokens as f64,
        pending_requests: f64::from(requests),
        queued: Some(scraped + f64::from(s.dispatched_since_scrape().min(requests))),
        held_past_cap: 0.0,
        cache_free_tokens: None,
        learned: s.ttft_learned().map(|l| scheduling::scorer::TtftRates {
            base: l.coefficients.base,
            per_token: l.coefficients.per_token,
            per_running: l.coefficients.per_running,
            per_waiting: l.coefficients.per_waiting,
            mean_tokens: l.mean_tokens,
        }),
    }
}

/// Whether `id` is named by a subset entry: `ip:port` matches exactly, a bare IP matches every
/// port of that IP (upstream compares IPs only; a port, when given, is honoured here).
fn in_subset(id: EndpointId, list: &[String]) -> bool {
    list.iter()
        .map(|e| e.trim())
        .any(|e| match e.parse::<EndpointId>() {
            Ok(exact) => exact == id,
            Err(_) => e
                .trim_matches(['[', ']'])
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip == id.0.ip()),
        })
}

//! `sojourn-time-observer-hub` (llm-d-router v0.11, alpha): each endpoint's sojourn split in
//! two, learned from the traffic, for `mrl-scorer-hub` ([`crate::scheduling::scorer`]).
//! Nothing is scraped.
//!
//! A request's sojourn is its TTFT (placed → first body chunk) and its decode (first chunk →
//! end of the response). Each endpoint keeps one digest of each ([`Digest`], at most
//! `compression` centroids), and the requests in flight on it with their dispatch and
//! first-chunk times, which the scorer ages. An answer not streamed gives its TTFT and a
//! decode of 0, as upstream. The digests are warm once both hold `minSamples` samples;
//! until then the scorer treats the endpoint as cold. An endpoint that is no request's
//! candidate for [`FORGET_AFTER`] has left the pool: its digests and in-flight records go.
//!
//! Upstream publishes a copy of the digests and the in-flight list every `intervalDuration`;
//! epp's scorer reads them under the observer's lock at each decision, so the parameter is
//! checked as upstream's and nothing lags behind it.

use super::latency_observer::FORGET_AFTER;
use crate::endpoint::EndpointId;
use crate::plugin::Invalid;
use crate::scheduling::lifecycle::{Completed, FirstToken, Lifecycle, Owned, Placed};
use std::collections::HashMap;
use std::time::{Duration, Instant};

#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct SojournObserver {
    /// Centroids each digest keeps at most (upstream's t-digest compression), >= 1.
    pub(crate) compression: f64,
    /// Samples each digest needs before the endpoint is scored on them.
    pub(crate) min_samples: u64,
    /// Upstream's publication period (a Go duration); checked, see the module comment.
    pub(crate) interval_duration: String,
    #[serde(skip)]
    state: Owned<Sojourns>,
}

impl Default for SojournObserver {
    fn default() -> Self {
        Self {
            compression: 200.0,
            min_samples: 60,
            interval_duration: "5s".into(),
            state: Owned::default(),
        }
    }
}

/// A bounded summary of a distribution: centroids (mean, weight) ascending by mean, at most
/// `max`; a new sample beyond that merges the adjacent pair of least combined weight (the
/// closest pair among those), so the tails stay finely resolved while the bulk coarsens.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Digest {
    centroids: Vec<(f64, u64)>,
    max: usize,
    count: u64,
}

impl Digest {
    pub(crate) fn new(compression: f64) -> Self {
        Self {
            centroids: Vec::new(),
            max: (compression.ceil() as usize).max(2),
            count: 0,
        }
    }

    pub(crate) fn add(&mut self, x: f64) {
        if !x.is_finite() || x < 0.0 {
            return;
        }
        let at = self.centroids.partition_point(|(m, _)| *m < x);
        self.centroids.insert(at, (x, 1));
        self.count += 1;
        if self.centroids.len() > self.max {
            self.merge_lightest_pair();
        }
    }

    fn merge_lightest_pair(&mut self) {
        let key = |i: usize| {
            let ((m0, w0), (m1, w1)) = (self.centroids[i], self.centroids[i + 1]);
            (w0 + w1, m1 - m0)
        };
        let Some(i) = (0..self.centroids.len() - 1)
            .min_by(|&a, &b| key(a).0.cmp(&key(b).0).then(key(a).1.total_cmp(&key(b).1)))
        else {
            return;
        };
        let ((m0, w0), (m1, w1)) = (self.centroids[i], self.centroids[i + 1]);
        let w = w0 + w1;
        self.centroids[i] = ((m0 * w0 as f64 + m1 * w1 as f64) / w as f64, w);
        self.centroids.remove(i + 1);
    }

    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    /// The mean of every sample (0 when empty).
    pub(crate) fn mean(&self) -> f64 {
        self.tail_mean(f64::NEG_INFINITY).unwrap_or(0.0)
    }

    /// The mean residual life at age `a`, E[X − a | X > a]: the centroids above `a`,
    /// averaged, minus `a` (0 when none lies above it).
    pub(crate) fn mrl(&self, a: f64) -> f64 {
        let a = a.max(0.0);
        self.tail_mean(a).map_or(0.0, |m| (m - a).max(0.0))
    }

    fn tail_mean(&self, above: f64) -> Option<f64> {
        let (sum, weight) = self
            .centroids
            .iter()
            .filter(|(m, _)| *m > above)
            .fold((0.0, 0u64), |(s, n), (m, w)| (s + m * *w as f64, n + w));
        (weight > 0).then(|| sum / weight as f64)
    }
}

/// A request in flight on an endpoint.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct InFlight {
    pub(crate) dispatched: Instant,
    /// When its first body chunk arrived (`None`: still waiting for it).
    pub(crate) first_chunk: Option<Instant>,
}

/// One endpoint's digests and in-flight requests.
#[derive(Debug)]
struct Endpoint {
    ttft: Digest,
    decode: Digest,
    inflight: HashMap<u64, InFlight>,
    seen: Instant,
}

#[derive(Debug, Default)]
struct Sojourns {
    map: HashMap<EndpointId, Endpoint>,
    /// Which endpoint each in-flight request is on.
    owner: HashMap<u64, EndpointId>,
    last_sweep: Option<Instant>,
}

/// What the scorer reads of one endpoint at one instant.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sojourn<'a> {
    /// Both digests hold `minSamples` samples.
    pub(crate) warm: bool,
    pub(crate) ttft: &'a Digest,
    pub(crate) decode: &'a Digest,
    inflight: &'a HashMap<u64, InFlight>,
}

impl Sojourn<'_> {
    /// The requests in flight on the endpoint.
    pub(crate) fn inflight(&self) -> impl Iterator<Item = &InFlight> {
        self.inflight.values()
    }
}

impl SojournObserver {
    pub(crate) fn validate(self) -> Result<Self, Invalid> {
        if self.compression.is_nan() || self.compression < 1.0 || self.compression.is_infinite() {
            return Err(Invalid::new(
                "compression",
                format!("compression must be >= 1, got {}", self.compression),
            ));
        }
        if self.min_samples == 0 {
            return Err(Invalid::new("minSamples", "minSamples must be > 0"));
        }
        let interval = crate::duration::parse(&self.interval_duration)
            .map_err(|e| Invalid::new("intervalDuration", format!("intervalDuration: {e}")))?;
        if interval.is_zero() {
            return Err(Invalid::new(
                "intervalDuration",
                "intervalDuration must be > 0",
            ));
        }
        Ok(self)
    }

    /// Reads `endpoint`'s digests and in-flight requests (`None`: never seen).
    pub(crate) fn read<R>(
        &self,
        endpoint: EndpointId,
        f: impl FnOnce(Sojourn<'_>) -> R,
    ) -> Option<R> {
        let state = self.state.lock();
        let e = state.map.get(&endpoint)?;
        Some(f(Sojourn {
            warm: e.ttft.count() >= self.min_samples && e.decode.count() >= self.min_samples,
            ttft: &e.ttft,
            decode: &e.decode,
            inflight: &e.inflight,
        }))
    }

    fn endpoint<'s>(&self, s: &'s mut Sojourns, id: EndpointId, now: Instant) -> &'s mut Endpoint {
        s.map.entry(id).or_insert_with(|| Endpoint {
            ttft: Digest::new(self.compression),
            decode: Digest::new(self.compression),
            inflight: HashMap::new(),
            seen: now,
        })
    }
}

impl Sojourns {
    /// Marks the request's candidates as in the pool and forgets the endpoints gone from it
    /// (their in-flight records too), at most once a minute.
    fn sweep(&mut self, placed: &Placed<'_>) {
        let now = placed.now;
        for c in placed.candidates {
            if let Some(e) = self.map.get_mut(&c.id) {
                e.seen = now;
            }
        }
        let due = self
            .last_sweep
            .is_none_or(|t| now.saturating_duration_since(t) >= Duration::from_secs(60));
        if !due {
            return;
        }
        self.last_sweep = Some(now);
        let gone: Vec<EndpointId> = self
            .map
            .iter()
            .filter(|(_, e)| now.saturating_duration_since(e.seen) >= FORGET_AFTER)
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            if let Some(e) = self.map.remove(&id) {
                for req in e.inflight.keys() {
                    self.owner.remove(req);
                }
            }
        }
    }
}

impl Lifecycle for SojournObserver {
    /// The request is dispatched: it joins its endpoint's in-flight requests.
    fn pre_request(&self, placed: &Placed<'_>) {
        let mut state = self.state.lock();
        state.sweep(placed);
        let e = self.endpoint(&mut state, placed.primary, placed.now);
        e.seen = placed.now;
        let entry = InFlight {
            dispatched: placed.now,
            first_chunk: None,
        };
        e.inflight.insert(placed.id, entry);
        state.owner.insert(placed.id, placed.primary);
    }

    /// The first chunk: one TTFT sample, and the request enters its decode.
    fn first_token(&self, first: &FirstToken) {
        let mut state = self.state.lock();
        let Some(id) = state.owner.get(&first.id).copied() else {
            return;
        };
        let Some(e) = state.map.get_mut(&id) else {
            return;
        };
        if let Some(r) = e.inflight.get_mut(&first.id) {
            r.first_chunk = Some(first.now);
            e.ttft.add(
                first
                    .now
                    .saturating_duration_since(r.dispatched)
                    .as_secs_f64(),
            );
        }
    }

    /// The end of the response: one decode sample (0 for an answer not streamed, which
    /// arrives as one chunk); an exchange that failed or never answered teaches nothing.
    fn response_complete(&self, done: &Completed<'_>) {
        let mut state = self.state.lock();
        let Some(id) = state.owner.remove(&done.id) else {
            return;
        };
        let Some(e) = state.map.get_mut(&id) else {
            return;
        };
        let Some(r) = e.inflight.remove(&done.id) else {
            return;
        };
        if !done.ok {
            return;
        }
        match r.first_chunk {
            Some(f) if done.stream => {
                e.decode
                    .add(done.now.saturating_duration_since(f).as_secs_f64());
            }
            // An answer not streamed is one chunk however Envoy split it: its decode is 0.
            Some(_) => e.decode.add(0.0),
            None => {
                e.ttft.add(
                    done.now
                        .saturating_duration_since(r.dispatched)
                        .as_secs_f64(),
                );
                e.decode.add(0.0);
            }
        }
    }

    fn snapshot(&self) -> Option<serde_json::Value> {
        let state = self.state.lock();
        let endpoints: Vec<serde_json::Value> = state
            .map
            .iter()
            .map(|(id, e)| {
                serde_json::json!({
                    "endpoint": id.to_string(),
                    "ttft_samples": e.ttft.count(),
                    "decode_samples": e.decode.count(),
                    "mean_ttft_s": e.ttft.mean(),
                    "mean_decode_s": e.decode.mean(),
                    "in_flight": e.inflight.len(),
                })
            })
            .collect();
        Some(serde_json::json!({
            "type": "sojourn-time-observer-hub",
            "endpoints": endpoints,
        }))
    }

    fn observer(&self) -> Option<super::Observer> {
        Some(super::Observer::Sojourn(self.clone()))
    }

    fn instance(&self) -> usize {
        self.state.instance()
    }
}

#[cfg(test)]
mod tests;

//! `latency-observer-producer-hub` (llm-d-router v0.11, alpha): each endpoint's TTFT curve
//! learned from the responses it streams, for `latency-observation-scorer-hub`
//! ([`crate::scheduling::scorer`]). Nothing is scraped.
//!
//! When a request is placed (`pre_request`) the observer notes the endpoint, the requests epp
//! already had in flight there (before this one joins, upstream's `Produce` pin) and the time;
//! the first body chunk (`first_token`) turns that into one observation (TTFT, in-flight at
//! dispatch). A response that is not streamed has no TTFT (its first chunk is its whole
//! answer) and teaches nothing, as upstream.
//!
//! Each endpoint keeps a ring of its last `windowSize` observations. Every `intervalDuration`
//! (at the next request that passes) the endpoint's [`Percentiles`] are recomputed from the
//! short window (those younger than `maxObservationAge`, the newest `maxRequests`): the P10
//! (window floor), the `lowPercentile` and `typicalPercentile` TTFTs, and the in-flight counts
//! averaged over the ±10-percentile band around each. The long-term floor is the P10 of
//! per-`bucketDuration` P10s, a history of `bucketHistorySize` that drops its slowest entry
//! when full, so it remembers the endpoint unloaded. An endpoint that is no request's
//! candidate for [`FORGET_AFTER`] has left the pool and is forgotten.

use crate::endpoint::EndpointId;
use crate::plugin::Invalid;
use crate::scheduling::lifecycle::{Completed, FirstToken, Lifecycle, Owned, Placed};
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// An endpoint no request has had as a candidate for this long is forgotten.
pub const FORGET_AFTER: Duration = Duration::from_secs(10 * 60);

/// A dispatch whose response never started is dropped after this long.
const PENDING_TTL: Duration = Duration::from_secs(60 * 60);

#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct LatencyObserver {
    /// How often an endpoint's percentiles are recomputed (a Go duration).
    pub(crate) interval_duration: String,
    /// Age bound of the short window (a Go duration).
    pub(crate) max_observation_age: String,
    /// Count bound of the short window (at most `windowSize`).
    pub(crate) max_requests: usize,
    /// Observations before the floor and the load anchors are trusted.
    pub(crate) min_requests: usize,
    /// The low-load anchor's percentile, in (0, typicalPercentile).
    pub(crate) low_percentile: f64,
    /// The typical-load anchor's percentile, in (lowPercentile, 100).
    pub(crate) typical_percentile: f64,
    /// Observations kept per endpoint.
    pub(crate) window_size: usize,
    /// Span of each floor-history entry (a Go duration).
    pub(crate) bucket_duration: String,
    /// Floor-history entries kept (at least 2).
    pub(crate) bucket_history_size: usize,
    /// Accepted as upstream; epp counts the in-flight requests per endpoint itself.
    pub(crate) in_flight_load_producer_name: String,
    #[serde(skip)]
    pub(crate) settings: Settings,
    #[serde(skip)]
    state: Owned<Endpoints>,
}

/// The parameters, checked and parsed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Settings {
    interval: Duration,
    max_age: Duration,
    bucket: Duration,
    max_requests: usize,
    min_requests: usize,
    low: f64,
    typical: f64,
    window: usize,
    history: usize,
}

impl Default for LatencyObserver {
    fn default() -> Self {
        Self {
            interval_duration: "1s".into(),
            max_observation_age: "3m".into(),
            max_requests: 100,
            min_requests: 10,
            low_percentile: 25.0,
            typical_percentile: 50.0,
            window_size: 5000,
            bucket_duration: "1m".into(),
            bucket_history_size: 1000,
            in_flight_load_producer_name: String::new(),
            settings: Settings {
                interval: Duration::from_secs(1),
                max_age: Duration::from_secs(180),
                bucket: Duration::from_secs(60),
                max_requests: 100,
                min_requests: 10,
                low: 0.25,
                typical: 0.5,
                window: 5000,
                history: 1000,
            },
            state: Owned::default(),
        }
    }
}

/// What the scorer reads of one endpoint: the anchors of its TTFT curve (seconds).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Percentiles {
    /// The long-term floor: P10 of the per-bucket P10s (0 until a bucket closed).
    pub(crate) floor_ttft: f64,
    /// P10 of the short window: the floor until the history has an entry.
    pub(crate) window_floor_ttft: f64,
    pub(crate) low_load_ttft: f64,
    pub(crate) typical_load_ttft: f64,
    pub(crate) inflight_at_low_load: f64,
    pub(crate) inflight_at_typical_load: f64,
    /// Observations in the short window.
    pub(crate) recent: usize,
    /// Observations ever made (the floor's confidence).
    pub(crate) observations: u64,
    /// `minRequests`, carried so the scorer needs no parameter of its own.
    pub(crate) threshold: usize,
}

impl Percentiles {
    /// The service floor, or 0 while the endpoint is cold (fewer observations than the
    /// threshold).
    pub(crate) fn floor(&self) -> f64 {
        if self.observations < self.threshold as u64 {
            0.0
        } else if self.floor_ttft > 0.0 {
            self.floor_ttft
        } else {
            self.window_floor_ttft
        }
    }
}

/// One TTFT observation.
#[derive(Clone, Copy, Debug)]
struct Observation {
    ttft: f64,
    inflight: f64,
    at: Instant,
}

/// A request placed and not yet answered.
#[derive(Clone, Copy, Debug)]
struct Dispatch {
    endpoint: EndpointId,
    inflight: f64,
    at: Instant,
}

/// One endpoint's observations and what was last computed from them.
#[derive(Debug)]
struct Track {
    ring: VecDeque<Observation>,
    observations: u64,
    bucket_start: Option<Instant>,
    /// Per-bucket P10s, ascending.
    bucket_p10s: Vec<f64>,
    floor: f64,
    published: Option<Percentiles>,
    flushed: Option<Instant>,
    seen: Instant,
}

#[derive(Debug, Default)]
struct Endpoints {
    map: HashMap<EndpointId, Track>,
    pending: HashMap<u64, Dispatch>,
    last_sweep: Option<Instant>,
}

fn duration(parameter: &'static str, value: &str) -> Result<Duration, Invalid> {
    let d = crate::duration::parse(value)
        .map_err(|e| Invalid::new(parameter, format!("{parameter}: {e}")))?;
    if d.is_zero() {
        return Err(Invalid::new(parameter, format!("{parameter} must be > 0")));
    }
    Ok(d)
}

impl LatencyObserver {
    pub(crate) fn validate(mut self) -> Result<Self, Invalid> {
        let (low, typical) = (self.low_percentile, self.typical_percentile);
        if !(low > 0.0 && low < typical && typical < 100.0) {
            return Err(Invalid::new(
                "lowPercentile",
                format!("lowPercentile and typicalPercentile must satisfy 0 < low < typical < 100, got {low} and {typical}"),
            ));
        }
        let positive = [
            ("windowSize", self.window_size),
            ("maxRequests", self.max_requests),
            ("minRequests", self.min_requests),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(Invalid::new(name, format!("{name} must be > 0")));
        }
        if self.max_requests > self.window_size {
            return Err(Invalid::new(
                "maxRequests",
                format!(
                    "maxRequests ({}) must be <= windowSize ({})",
                    self.max_requests, self.window_size
                ),
            ));
        }
        if self.bucket_history_size < 2 {
            return Err(Invalid::new(
                "bucketHistorySize",
                "bucketHistorySize must be >= 2",
            ));
        }
        self.settings = Settings {
            interval: duration("intervalDuration", &self.interval_duration)?,
            max_age: duration("maxObservationAge", &self.max_observation_age)?,
            bucket: duration("bucketDuration", &self.bucket_duration)?,
            max_requests: self.max_requests,
            min_requests: self.min_requests,
            low: low / 100.0,
            typical: typical / 100.0,
            window: self.window_size,
            history: self.bucket_history_size,
        };
        Ok(self)
    }

    /// What was last published for `endpoint` (`None`: nothing observed yet).
    pub(crate) fn percentiles(&self, endpoint: EndpointId) -> Option<Percentiles> {
        self.state
            .lock()
            .map
            .get(&endpoint)
            .and_then(|t| t.published)
    }

    /// Records one TTFT observed at `at` with `inflight` requests ahead at dispatch, and
    /// recomputes the endpoint's percentiles when they are due.
    pub(crate) fn observe(&self, endpoint: EndpointId, ttft: f64, inflight: f64, at: Instant) {
        let s = self.settings;
        let mut state = self.state.lock();
        let track = state.map.entry(endpoint).or_insert_with(|| Track::new(at));
        if track.ring.len() == s.window {
            track.ring.pop_front();
        }
        track.ring.push_back(Observation { ttft, inflight, at });
        track.observations += 1;
        track.seen = at;
        track.flush_if_due(at, &s);
    }
}

impl Track {
    fn new(now: Instant) -> Self {
        Self {
            ring: VecDeque::new(),
            observations: 0,
            bucket_start: None,
            bucket_p10s: Vec::new(),
            floor: 0.0,
            published: None,
            flushed: None,
            seen: now,
        }
    }

    fn flush_if_due(&mut self, now: Instant, s: &Settings) {
        let due = self
            .flushed
            .is_none_or(|t| now.saturating_duration_since(t) >= s.interval);
        if due {
            self.flushed = Some(now);
            self.published = Some(self.flush(now, s));
        }
    }

    /// The newest observations younger than `max_age` (at most `max_n`), sorted by TTFT.
    fn window(&self, now: Instant, max_age: Duration, max_n: usize) -> Vec<Observation> {
        let mut out: Vec<Observation> = self
            .ring
            .iter()
            .rev()
            .take_while(|o| now.saturating_duration_since(o.at) <= max_age)
            .take(max_n)
            .copied()
            .collect();
        out.sort_by(|a, b| a.ttft.total_cmp(&b.ttft));
        out
    }

    /// Recomputes the percentiles from the short window and rolls the floor's bucket.
    fn flush(&mut self, now: Instant, s: &Settings) -> Percentiles {
        let short = self.window(now, s.max_age, s.max_requests);
        let ttfts: Vec<f64> = short.iter().map(|o| o.ttft).collect();
        let mut p = Percentiles {
            recent: short.len(),
            observations: self.observations,
            threshold: s.min_requests,
            ..Percentiles::default()
        };
        if !short.is_empty() {
            p.window_floor_ttft = percentile(&ttfts, 0.10);
            p.low_load_ttft = percentile(&ttfts, s.low);
            p.typical_load_ttft = percentile(&ttfts, s.typical);
            p.inflight_at_low_load = band_inflight(&short, s.low);
            p.inflight_at_typical_load = band_inflight(&short, s.typical);
        }
        self.roll_bucket(now, s);
        p.floor_ttft = self.floor;
        p
    }

    /// Closes the floor's bucket once `bucket` has passed: its P10 joins the history (the
    /// slowest entry leaves a full one), whose P10 is the floor.
    fn roll_bucket(&mut self, now: Instant, s: &Settings) {
        let Some(start) = self.bucket_start else {
            self.bucket_start = Some(now);
            return;
        };
        if now.saturating_duration_since(start) < s.bucket {
            return;
        }
        let bucket: Vec<f64> = self
            .window(now, s.bucket, usize::MAX)
            .iter()
            .map(|o| o.ttft)
            .collect();
        if !bucket.is_empty() {
            let p10 = percentile(&bucket, 0.10);
            let at = self.bucket_p10s.partition_point(|v| *v < p10);
            self.bucket_p10s.insert(at, p10);
            if self.bucket_p10s.len() > s.history {
                self.bucket_p10s.pop();
            }
            self.floor = percentile(&self.bucket_p10s, 0.10);
        }
        self.bucket_start = Some(now);
    }
}

/// The `p`-quantile (a fraction) of ascending `sorted`, interpolated linearly.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    let Some(last) = sorted.len().checked_sub(1) else {
        return 0.0;
    };
    let idx = p * last as f64;
    let lo = idx as usize;
    match sorted.get(lo + 1) {
        Some(next) => sorted[lo] + (idx - lo as f64) * (next - sorted[lo]),
        None => sorted[last],
    }
}

/// The in-flight counts at dispatch averaged over the [p − 0.1, p + 0.1] band of `sorted`
/// (ascending by TTFT): a band steadies the anchor.
fn band_inflight(sorted: &[Observation], p: f64) -> f64 {
    let Some(last) = sorted.len().checked_sub(1) else {
        return 0.0;
    };
    let lo = ((p - 0.10) * last as f64).max(0.0) as usize;
    let hi = (((p + 0.10) * last as f64) as usize).min(last);
    let band = &sorted[lo..=hi];
    band.iter().map(|o| o.inflight).sum::<f64>() / band.len() as f64
}

impl Endpoints {
    /// Marks the request's candidates as in the pool, recomputes the percentiles that are due
    /// (so a quiet endpoint's window ages out) and forgets endpoints gone from the pool.
    fn sweep(&mut self, placed: &Placed<'_>, s: &Settings) {
        let now = placed.now;
        for c in placed.candidates {
            if let Some(t) = self.map.get_mut(&c.id) {
                t.seen = now;
            }
        }
        let due = self
            .last_sweep
            .is_none_or(|t| now.saturating_duration_since(t) >= s.interval);
        if !due {
            return;
        }
        self.last_sweep = Some(now);
        self.map
            .retain(|_, t| now.saturating_duration_since(t.seen) < FORGET_AFTER);
        for t in self.map.values_mut() {
            t.flush_if_due(now, s);
        }
        self.pending
            .retain(|_, d| now.saturating_duration_since(d.at) < PENDING_TTL);
    }
}

impl Lifecycle for LatencyObserver {
    /// Notes where the request went, what was in flight there before it, and when.
    fn pre_request(&self, placed: &Placed<'_>) {
        let inflight = placed
            .candidates
            .iter()
            .find(|c| c.id == placed.primary)
            .map_or(0.0, |c| c.inflight);
        let dispatch = Dispatch {
            endpoint: placed.primary,
            inflight,
            at: placed.now,
        };
        let mut state = self.state.lock();
        state.pending.insert(placed.id, dispatch);
        state.sweep(placed, &self.settings);
    }

    /// The first chunk of a streamed response is the request's TTFT.
    fn first_token(&self, first: &FirstToken) {
        let Some(d) = self.state.lock().pending.remove(&first.id) else {
            return;
        };
        if first.stream && d.endpoint == first.served {
            let ttft = first.now.saturating_duration_since(d.at).as_secs_f64();
            self.observe(d.endpoint, ttft, d.inflight, first.now);
        }
    }

    fn response_complete(&self, done: &Completed<'_>) {
        self.state.lock().pending.remove(&done.id);
    }

    fn snapshot(&self) -> Option<serde_json::Value> {
        let state = self.state.lock();
        let endpoints: Vec<serde_json::Value> = state
            .map
            .iter()
            .filter_map(|(id, t)| t.published.map(|p| (id, p)))
            .map(|(id, p)| {
                serde_json::json!({
                    "endpoint": id.to_string(),
                    "floor_s": p.floor(),
                    "low_load_s": p.low_load_ttft,
                    "typical_load_s": p.typical_load_ttft,
                    "inflight_at_low_load": p.inflight_at_low_load,
                    "inflight_at_typical_load": p.inflight_at_typical_load,
                    "recent": p.recent,
                    "observations": p.observations,
                })
            })
            .collect();
        Some(serde_json::json!({
            "type": "latency-observer-producer-hub",
            "endpoints": endpoints,
        }))
    }

    fn observer(&self) -> Option<super::Observer> {
        Some(super::Observer::Latency(self.clone()))
    }

    fn instance(&self) -> usize {
        self.state.instance()
    }
}

#[cfg(test)]
mod tests;

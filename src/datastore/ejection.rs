//! Passive health (outlier detection) and slow start for one endpoint.
//!
//! Why: a pod that fails fast looks idle to load-aware scorers (empty queue, low KV usage) and
//! would attract *more* traffic the worse it gets. Outcomes seen in the response phase, and
//! failures of the active `/health` probe and of metric scrapes, drive a small per-endpoint state
//! machine modelled on Envoy's outlier detection:
//!
//! ```text
//! Healthy ──N consecutive failures──▶ Ejected(until = now + base·2^(k−1), capped at max)
//!    ▲                                   │ until passes
//!    │ a request succeeds                ▼
//!    └──────────────────────────── HalfOpen (one probe request at a time)
//!                                        │ it fails
//!                                        └──▶ Ejected again, k + 1 (the backoff grows)
//! ```
//!
//! Counters, as Envoy's `split_external_local_origin_errors`: `consecutive5xx` counts
//! model-server 5xx answers (a 4xx, the client's fault, never counts) plus requests that could
//! not reach the pod; `consecutiveLocalOriginFailure` is the threshold for requests that could
//! not reach the pod (connection failure, reset before headers), and separately for each
//! prober's streak (failed `/health` probes; failed metric scrapes). A request success resets
//! every counter; a probe success resets only its own prober's streak, so a pod whose
//! `/metrics` answers while its `/health` (or its inference) fails is still ejected. `k`, the
//! ejection multiplier, restarts at 1 once the endpoint has stayed restored for
//! `maxEjectionTime`.
//!
//! Slow start: after it appears or is restored, an endpoint's share ramps as Envoy's
//! `slow_start_config`: `max(minWeightPercent, (elapsed / window)^(1/aggression))`.

use crate::plugin::Invalid;
use serde::Deserialize;
use std::time::{Duration, Instant};

/// Parameters of the `outlier-detection` plugin (Envoy's names, camelCase).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct OutlierParams {
    /// Consecutive 5xx (or local-origin failures) that eject; 0 disables this trigger.
    #[serde(rename = "consecutive5xx")]
    pub(crate) consecutive_5xx: u32,
    /// Consecutive local-origin failures (of requests, or of one prober) that eject; 0 disables
    /// this trigger.
    pub(crate) consecutive_local_origin_failure: u32,
    /// First ejection period; the k-th consecutive ejection lasts `base · 2^(k−1)`.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub(crate) base_ejection_time: Duration,
    /// Cap of the ejection period.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub(crate) max_ejection_time: Duration,
}

impl Default for OutlierParams {
    fn default() -> Self {
        Self {
            consecutive_5xx: 5,
            consecutive_local_origin_failure: 3,
            base_ejection_time: Duration::from_secs(30),
            max_ejection_time: Duration::from_secs(300),
        }
    }
}

impl OutlierParams {
    /// Every value the policy cannot take.
    pub(crate) fn validate(self) -> Result<Self, Vec<Invalid>> {
        let mut out = Vec::new();
        if self.base_ejection_time.is_zero() {
            out.push(Invalid::new(
                "baseEjectionTime",
                "baseEjectionTime must be greater than zero",
            ));
        }
        if self.max_ejection_time < self.base_ejection_time {
            out.push(Invalid::new(
                "maxEjectionTime",
                "maxEjectionTime must be at least baseEjectionTime",
            ));
        }
        if out.is_empty() {
            Ok(self)
        } else {
            Err(out)
        }
    }

    /// How long the `k`-th consecutive ejection lasts (k ≥ 1).
    pub(crate) fn ejection_time(&self, k: u32) -> Duration {
        let factor = 1u32
            .checked_shl(k.saturating_sub(1).min(30))
            .unwrap_or(u32::MAX);
        self.base_ejection_time
            .saturating_mul(factor)
            .min(self.max_ejection_time)
    }
}

/// Parameters of the `slow-start` plugin (Envoy's `slow_start_config`).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct SlowStartParams {
    /// Time for a new or restored endpoint to reach its full share.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub(crate) slow_start_window: Duration,
    /// Shape of the ramp: 1 is linear, larger ramps faster at first.
    pub(crate) aggression: f64,
    /// Share at the start of the window, in percent of full.
    pub(crate) min_weight_percent: f64,
}

impl Default for SlowStartParams {
    fn default() -> Self {
        Self {
            slow_start_window: Duration::from_secs(30),
            aggression: 1.0,
            min_weight_percent: 10.0,
        }
    }
}

impl SlowStartParams {
    /// Every value the ramp cannot take.
    pub(crate) fn validate(self) -> Result<Self, Vec<Invalid>> {
        let mut out = Vec::new();
        if !(self.aggression.is_finite() && self.aggression > 0.0) {
            out.push(Invalid::new(
                "aggression",
                "aggression must be a number greater than zero",
            ));
        }
        if !(0.0..=100.0).contains(&self.min_weight_percent) {
            out.push(Invalid::new(
                "minWeightPercent",
                "minWeightPercent must be in 0..=100",
            ));
        }
        if out.is_empty() {
            Ok(self)
        } else {
            Err(out)
        }
    }

    /// The share multiplier, in `[minWeightPercent/100, 1]`, `elapsed` after the ramp began.
    pub(crate) fn ramp(&self, elapsed: Duration) -> f64 {
        let min = self.min_weight_percent / 100.0;
        if self.slow_start_window.is_zero() || elapsed >= self.slow_start_window {
            return 1.0;
        }
        let t = elapsed.as_secs_f64() / self.slow_start_window.as_secs_f64();
        t.powf(1.0 / self.aggression).max(min).min(1.0)
    }
}

/// The health policy in force: from the configuration (`crate::config` decodes the
/// `outlier-detection` and `slow-start` plugins; listing one turns it on), swapped on reload.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct HealthPolicy {
    pub(crate) outlier: Option<OutlierParams>,
    pub(crate) slow_start: Option<SlowStartParams>,
}

/// What one observation did to an endpoint's state, for logs and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transition {
    None,
    Ejected { period: Duration, ejections: u32 },
    Restored,
}

/// Where an endpoint is in the state machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Healthy,
    Ejected {
        until: Instant,
    },
    /// Ejection over; `probe` is when the one request let through was dispatched.
    HalfOpen {
        probe: Option<Instant>,
    },
}

/// One endpoint's passive-health state (kept behind a small mutex in `EndpointState`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Health {
    pub(crate) mode: Mode,
    fails_5xx: u32,
    fails_local: u32,
    /// Failure streak of each prober ([`Prober`] as index).
    fails_probe: [u32; 2],
    /// Consecutive ejections (the backoff exponent).
    ejections: u32,
    /// When the endpoint last appeared or was restored: the slow-start ramp begins here.
    pub(crate) warm_since: Instant,
}

/// Who probes an endpoint besides its traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Prober {
    /// The active `/health` probe (`--health-check-interval`).
    Health = 0,
    /// The metrics scraper.
    Scrape = 1,
}

/// How an observation is classified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Signal {
    /// A request succeeded (any answer other than a counted 5xx).
    RequestOk,
    /// The model server answered 5xx.
    Request5xx,
    /// A request could not reach the pod (connection failure, reset before headers).
    RequestLocal,
    /// An active probe or scrape succeeded.
    ProbeOk(Prober),
    /// An active probe or scrape failed.
    ProbeFailed(Prober),
}

impl Health {
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            mode: Mode::Healthy,
            fails_5xx: 0,
            fails_local: 0,
            fails_probe: [0; 2],
            ejections: 0,
            warm_since: now,
        }
    }

    /// Whether the endpoint may be picked now; moves an expired ejection to half-open.
    pub(crate) fn available(&mut self, now: Instant, p: &OutlierParams) -> bool {
        match self.mode {
            Mode::Healthy => true,
            Mode::Ejected { until } if now >= until => {
                self.mode = Mode::HalfOpen { probe: None };
                true
            }
            Mode::Ejected { .. } => false,
            // A probe that never reported (client gone) frees the slot after one base period.
            Mode::HalfOpen { probe: Some(at) } => {
                now.saturating_duration_since(at) >= p.base_ejection_time
            }
            Mode::HalfOpen { probe: None } => true,
        }
    }

    /// A request was dispatched here: in half-open it is the probe.
    pub(crate) fn dispatched(&mut self, now: Instant) {
        if let Mode::HalfOpen { .. } = self.mode {
            self.mode = Mode::HalfOpen { probe: Some(now) };
        }
    }

    /// Feeds one observation.
    pub(crate) fn observe(
        &mut self,
        signal: Signal,
        now: Instant,
        p: &OutlierParams,
    ) -> Transition {
        match signal {
            Signal::RequestOk => {
                self.reset();
                self.restore_if_half_open(now)
            }
            Signal::ProbeOk(who) => {
                self.fails_probe[who as usize] = 0;
                Transition::None
            }
            Signal::Request5xx => {
                self.fails_5xx += 1;
                self.failed(now, p)
            }
            Signal::RequestLocal => {
                self.fails_5xx += 1;
                self.fails_local += 1;
                self.failed(now, p)
            }
            Signal::ProbeFailed(who) => {
                self.fails_probe[who as usize] += 1;
                self.failed(now, p)
            }
        }
    }

    fn reset(&mut self) {
        (self.fails_5xx, self.fails_local, self.fails_probe) = (0, 0, [0; 2]);
    }

    fn restore_if_half_open(&mut self, now: Instant) -> Transition {
        if let Mode::HalfOpen { .. } = self.mode {
            self.mode = Mode::Healthy;
            self.warm_since = now;
            return Transition::Restored;
        }
        Transition::None
    }

    fn failed(&mut self, now: Instant, p: &OutlierParams) -> Transition {
        let tripped = |n: u32, limit: u32| limit > 0 && n >= limit;
        let eject = match self.mode {
            Mode::Ejected { .. } => false,
            Mode::HalfOpen { .. } => true,
            Mode::Healthy => {
                let local = self
                    .fails_local
                    .max(self.fails_probe[0])
                    .max(self.fails_probe[1]);
                tripped(self.fails_5xx, p.consecutive_5xx)
                    || tripped(local, p.consecutive_local_origin_failure)
            }
        };
        if !eject {
            return Transition::None;
        }
        let long_healthy = self.mode == Mode::Healthy
            && now.saturating_duration_since(self.warm_since) >= p.max_ejection_time;
        self.ejections = if long_healthy {
            1
        } else {
            self.ejections.saturating_add(1)
        };
        let period = p.ejection_time(self.ejections);
        self.mode = Mode::Ejected {
            until: now + period,
        };
        self.reset();
        Transition::Ejected {
            period,
            ejections: self.ejections,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> OutlierParams {
        OutlierParams {
            consecutive_5xx: 3,
            consecutive_local_origin_failure: 2,
            base_ejection_time: Duration::from_secs(10),
            max_ejection_time: Duration::from_secs(60),
        }
    }

    #[test]
    fn consecutive_5xx_eject_and_a_success_in_between_resets_the_count() {
        let (p, t0) = (params(), Instant::now());
        let mut h = Health::new(t0);
        h.observe(Signal::Request5xx, t0, &p);
        h.observe(Signal::Request5xx, t0, &p);
        h.observe(Signal::RequestOk, t0, &p);
        h.observe(Signal::Request5xx, t0, &p);
        assert_eq!(h.observe(Signal::Request5xx, t0, &p), Transition::None);
        assert_eq!(
            h.observe(Signal::Request5xx, t0, &p),
            Transition::Ejected {
                period: Duration::from_secs(10),
                ejections: 1
            }
        );
        assert!(!h.available(t0 + Duration::from_secs(9), &p));
    }

    #[test]
    fn probe_successes_do_not_hide_inference_5xx() {
        let (p, t0) = (params(), Instant::now());
        let mut h = Health::new(t0);
        for _ in 0..2 {
            h.observe(Signal::Request5xx, t0, &p);
            h.observe(Signal::ProbeOk(Prober::Health), t0, &p);
            h.observe(Signal::ProbeOk(Prober::Scrape), t0, &p);
        }
        assert!(matches!(
            h.observe(Signal::Request5xx, t0, &p),
            Transition::Ejected { .. }
        ));
    }

    #[test]
    fn local_origin_failures_trip_their_own_lower_threshold() {
        let (p, t0) = (params(), Instant::now());
        let mut h = Health::new(t0);
        h.observe(Signal::RequestLocal, t0, &p);
        assert!(matches!(
            h.observe(Signal::RequestLocal, t0, &p),
            Transition::Ejected { .. }
        ));
    }

    #[test]
    fn a_failing_health_probe_is_not_hidden_by_successful_scrapes() {
        let (p, t0) = (params(), Instant::now());
        let mut h = Health::new(t0);
        h.observe(Signal::ProbeFailed(Prober::Health), t0, &p);
        h.observe(Signal::ProbeOk(Prober::Scrape), t0, &p);
        assert!(matches!(
            h.observe(Signal::ProbeFailed(Prober::Health), t0, &p),
            Transition::Ejected { .. }
        ));
        let mut h = Health::new(t0);
        h.observe(Signal::ProbeFailed(Prober::Scrape), t0, &p);
        h.observe(Signal::ProbeOk(Prober::Scrape), t0, &p);
        assert_eq!(
            h.observe(Signal::ProbeFailed(Prober::Scrape), t0, &p),
            Transition::None,
            "its own success resets a streak"
        );
    }

    #[test]
    fn half_open_lets_one_probe_through_and_a_failure_doubles_the_backoff() {
        let (p, t0) = (params(), Instant::now());
        let mut h = Health::new(t0);
        h.observe(Signal::RequestLocal, t0, &p);
        h.observe(Signal::RequestLocal, t0, &p);
        let t1 = t0 + Duration::from_secs(10);
        assert!(h.available(t1, &p), "ejection over: half-open");
        h.dispatched(t1);
        assert!(!h.available(t1, &p), "one probe at a time");
        assert!(
            h.available(t1 + Duration::from_secs(10), &p),
            "a probe that never reported frees the slot"
        );
        assert_eq!(
            h.observe(Signal::Request5xx, t1, &p),
            Transition::Ejected {
                period: Duration::from_secs(20),
                ejections: 2
            }
        );
        let t2 = t1 + Duration::from_secs(20);
        assert!(h.available(t2, &p));
        assert_eq!(h.observe(Signal::RequestOk, t2, &p), Transition::Restored);
        assert_eq!((h.mode, h.warm_since), (Mode::Healthy, t2));
    }

    #[test]
    fn backoff_is_capped_and_resets_after_a_long_healthy_spell() {
        let p = params();
        assert_eq!(p.ejection_time(3), Duration::from_secs(40));
        assert_eq!(p.ejection_time(4), Duration::from_secs(60));
        assert_eq!(p.ejection_time(40), Duration::from_secs(60));
        let t0 = Instant::now();
        let mut h = Health::new(t0);
        h.ejections = 3;
        let later = t0 + Duration::from_secs(61);
        h.observe(Signal::RequestLocal, later, &p);
        assert_eq!(
            h.observe(Signal::RequestLocal, later, &p),
            Transition::Ejected {
                period: Duration::from_secs(10),
                ejections: 1
            }
        );
    }

    #[test]
    fn slow_start_ramps_from_the_minimum_to_full() {
        let s = SlowStartParams {
            slow_start_window: Duration::from_secs(10),
            aggression: 1.0,
            min_weight_percent: 10.0,
        };
        assert_eq!(s.ramp(Duration::ZERO), 0.1);
        assert!((s.ramp(Duration::from_secs(5)) - 0.5).abs() < 1e-9);
        assert_eq!(s.ramp(Duration::from_secs(10)), 1.0);
        let eager = SlowStartParams {
            aggression: 2.0,
            ..s
        };
        assert!((eager.ramp(Duration::from_secs(1)) - 0.1f64.sqrt()).abs() < 1e-9);
    }

    /// The policy the configuration decoder makes of `(name, type, parameters)` plugins; its
    /// problems as `(plugin, message)`.
    fn from_plugins<'a>(
        plugins: impl IntoIterator<Item = (&'a str, &'a str, Option<&'a serde_norway::Value>)>,
    ) -> Result<HealthPolicy, Vec<(String, String)>> {
        use crate::config::{Config, EndpointPickerConfig, PluginSpec, Problem};
        let mut doc: EndpointPickerConfig = serde_norway::from_str("plugins: []").unwrap();
        doc.plugins = plugins
            .into_iter()
            .map(|(name, kind, params)| PluginSpec {
                name: Some(name.to_owned()),
                plugin_type: kind.to_owned(),
                parameters: params.cloned(),
            })
            .collect();
        let pair = |p: Problem| match p {
            Problem::Parameters { plugin, message } => (plugin, message),
            other => panic!("{other}"),
        };
        Config::decode(&doc, Default::default())
            .map(|c| c.health)
            .map_err(|e| e.problems.into_iter().map(pair).collect())
    }

    #[test]
    fn the_shipped_example_turns_everything_on() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/examples/resilient.yaml"
        ))
        .unwrap();
        let doc = crate::config::parse(&text).unwrap();
        let policy = crate::config::Config::decode(&doc, Default::default())
            .unwrap()
            .health;
        assert_eq!(policy.outlier, Some(OutlierParams::default()));
        assert_eq!(policy.slow_start, Some(SlowStartParams::default()));
    }

    #[test]
    fn parameters_parse_with_envoy_names_and_reject_nonsense() {
        let p: OutlierParams = serde_norway::from_str(
            "consecutive5xx: 2\nbaseEjectionTime: 500ms\nmaxEjectionTime: 1m",
        )
        .unwrap();
        assert_eq!(
            (p.consecutive_5xx, p.base_ejection_time, p.max_ejection_time),
            (2, Duration::from_millis(500), Duration::from_secs(60))
        );
        assert!(serde_norway::from_str::<OutlierParams>("consecutive5xxx: 2").is_err());
        assert!(serde_norway::from_str::<OutlierParams>("baseEjectionTime: soon").is_err());
        let bad = OutlierParams {
            base_ejection_time: Duration::from_secs(9),
            max_ejection_time: Duration::from_secs(1),
            ..p
        };
        assert_eq!(bad.validate().unwrap_err().len(), 1);
        let s = SlowStartParams {
            aggression: 0.0,
            min_weight_percent: 120.0,
            ..Default::default()
        };
        assert_eq!(s.validate().unwrap_err().len(), 2);
        let yaml: serde_norway::Value =
            serde_norway::from_str("slowStartWindow: 10s\nminWeightPercent: 5").unwrap();
        let policy = from_plugins([
            ("od", "outlier-detection", None),
            ("ss", "slow-start", Some(&yaml)),
            ("q", "queue-scorer", None),
        ])
        .unwrap();
        assert_eq!(policy.outlier, Some(OutlierParams::default()));
        assert_eq!(policy.slow_start.unwrap().min_weight_percent, 5.0);
        let bad: serde_norway::Value = serde_norway::from_str("baseEjectionTime: 0s").unwrap();
        let errs = from_plugins([("od", "outlier-detection", Some(&bad))]).unwrap_err();
        assert_eq!(
            errs,
            vec![(
                "od".to_owned(),
                "baseEjectionTime must be greater than zero".to_owned()
            )]
        );
    }
}

//! Peak-EWMA of observed latency per endpoint (Finagle's `PeakEwma`, seed document 002).
//!
//! Why peak: a moving average hides a sudden slowdown for many samples; peak-EWMA jumps to any
//! observation above the current estimate at once and decays back only as faster observations
//! come in, or as time passes without observations (so a drained pod is retried after roughly
//! [`DECAY`] instead of being shunned forever on one bad sample).
//!
//! Errors count as slow: a failed request is recorded as `max(2 × estimate, floor)`, so a pod
//! that fails fast cannot look fast. The read path never mutates: decay since the last
//! observation is applied when the value is read.

use std::time::{Duration, Instant};

/// Decay time constant τ: an observation's weight falls to 1/e after τ (Finagle's default).
pub(crate) const DECAY: Duration = Duration::from_secs(10);
/// Smallest penalty recorded for a failed request, for time to first token.
pub(crate) const TTFT_PENALTY_FLOOR: Duration = Duration::from_secs(1);
/// Smallest penalty recorded for a failed request, for time per output token.
pub(crate) const TPOT_PENALTY_FLOOR: Duration = Duration::from_millis(50);
/// The largest estimate a run of failures can push an endpoint to.
pub(crate) const PENALTY_CEILING: Duration = Duration::from_secs(60);

/// One peak-EWMA, in seconds.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PeakEwma {
    cost: f64,
    stamp: Option<Instant>,
}

impl PeakEwma {
    /// The estimate at `now` (decayed since the last observation); `None` if never observed.
    pub(crate) fn value(&self, now: Instant) -> Option<f64> {
        let stamp = self.stamp?;
        let td = now.saturating_duration_since(stamp).as_secs_f64();
        Some(self.cost * (-td / DECAY.as_secs_f64()).exp())
    }

    /// Records one observation.
    pub(crate) fn observe(&mut self, sample: Duration, now: Instant) {
        let rtt = sample.as_secs_f64();
        let decayed = self.value(now).unwrap_or(0.0);
        self.cost = if rtt > decayed {
            rtt
        } else {
            let td = self
                .stamp
                .map_or(0.0, |s| now.saturating_duration_since(s).as_secs_f64());
            let w = (-td / DECAY.as_secs_f64()).exp();
            self.cost * w + rtt * (1.0 - w)
        };
        self.stamp = Some(now);
    }

    /// Records a failure as a slow observation: twice the current estimate, at least `floor`,
    /// at most [`PENALTY_CEILING`] (doubling without a bound overflowed `Duration` after a
    /// hundred failures in a row: a fuzz finding; a minute already ranks a pod last).
    pub(crate) fn penalize(&mut self, floor: Duration, now: Instant) {
        let current = self.value(now).unwrap_or(0.0);
        let doubled = (current * 2.0).min(PENALTY_CEILING.as_secs_f64());
        self.observe(
            Duration::from_secs_f64(doubled)
                .max(floor)
                .min(PENALTY_CEILING.max(floor)),
            now,
        );
    }
}

/// TTFT and TPOT estimates of one endpoint.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Latency {
    pub(crate) ttft: PeakEwma,
    pub(crate) tpot: PeakEwma,
}

impl Latency {
    /// A finished request: what was measured of it.
    pub(crate) fn observe(&mut self, ttft: Option<Duration>, tpot: Option<Duration>, now: Instant) {
        if let Some(t) = ttft {
            self.ttft.observe(t, now);
        }
        if let Some(t) = tpot {
            self.tpot.observe(t, now);
        }
    }

    /// A failed request (5xx, connection failure, reset before headers): slow on both counts.
    pub(crate) fn penalize(&mut self, now: Instant) {
        self.ttft.penalize(TTFT_PENALTY_FLOOR, now);
        self.tpot.penalize(TPOT_PENALTY_FLOOR, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn jumps_to_a_peak_at_once_and_decays_slowly_with_faster_samples() {
        let t0 = Instant::now();
        let mut e = PeakEwma::default();
        assert_eq!(e.value(t0), None);
        e.observe(ms(100), t0);
        e.observe(ms(900), t0 + ms(100));
        assert!(
            (e.value(t0 + ms(100)).unwrap() - 0.9).abs() < 1e-9,
            "peak taken at once"
        );
        e.observe(ms(100), t0 + ms(1100));
        let v = e.value(t0 + ms(1100)).unwrap();
        assert!(
            v > 0.8 && v < 0.9,
            "one fast sample a second later barely moves it: {v}"
        );
    }

    #[test]
    fn an_unobserved_estimate_decays_with_time() {
        let t0 = Instant::now();
        let mut e = PeakEwma::default();
        e.observe(Duration::from_secs(2), t0);
        let later = e.value(t0 + DECAY).unwrap();
        assert!((later - 2.0 / std::f64::consts::E).abs() < 1e-9, "{later}");
    }

    #[test]
    fn failures_make_a_fast_pod_look_slow() {
        let t0 = Instant::now();
        let mut fast_failing = Latency::default();
        fast_failing.observe(Some(ms(5)), Some(ms(1)), t0);
        fast_failing.penalize(t0);
        assert!(fast_failing.ttft.value(t0).unwrap() >= 1.0);
        assert!(fast_failing.tpot.value(t0).unwrap() >= 0.05);
        let mut slow = Latency::default();
        slow.observe(Some(Duration::from_secs(3)), None, t0);
        slow.penalize(t0);
        assert!(
            (slow.ttft.value(t0).unwrap() - 6.0).abs() < 1e-9,
            "twice the estimate when above the floor"
        );
    }

    #[test]
    fn a_long_run_of_failures_is_capped_not_overflowed() {
        let t0 = Instant::now();
        let mut e = Latency::default();
        for _ in 0..2000 {
            e.penalize(t0);
        }
        assert_eq!(e.ttft.value(t0), Some(PENALTY_CEILING.as_secs_f64()));
        assert_eq!(e.tpot.value(t0), Some(PENALTY_CEILING.as_secs_f64()));
    }
}

//! `latency-observation-scorer-hub` (llm-d-router v0.11, alpha): each candidate's TTFT
//! predicted at the load it carries now, from the curve its `latency-observer-producer-hub`
//! learned ([`crate::scheduling::producer`]); the lowest prediction scores 1.
//!
//! The curve runs through A (0, floor), B (in-flight at low load, low-load TTFT) and
//! C (in-flight at typical load, typical-load TTFT), evaluated at the candidate's live
//! in-flight count. B is used only when it is separated from C by `minInflightGap` requests,
//! below C and above the floor in latency, and at a positive load; otherwise the curve is the
//! chord A→C. A prediction never falls below the floor.
//!
//! An endpoint is cold without a floor (fewer observations than the observer's
//! `minRequests`): it is seeded at the best prediction. With a floor but too few recent
//! observations (or no load anchor above the floor) it is predicted at its floor. Scores are
//! (max − p) / (max − min) over the predictions. With probability `explorationRate` each
//! endpoint not yet trusted is probed (scored 1); otherwise, when some endpoint is trusted,
//! it scores 0, so a new endpoint earns its calibration without stealing traffic first.

use crate::plugin::Invalid;
use crate::scheduling::producer::{LatencyObserver, Percentiles};
use crate::scheduling::Candidate;
use rand::Rng;

#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct LatencyObservationScorer {
    /// Probability that an endpoint not yet trusted is probed, in [0, 1].
    pub(crate) exploration_rate: f64,
    /// In-flight separation the two load anchors need before the low one is used, > 0.
    pub(crate) min_inflight_gap: f64,
    /// Predictions are rounded to this step (seconds; 0 disables), >= 0.
    #[serde(rename = "roundTTFTStep")]
    pub(crate) round_ttft_step: f64,
    /// The `latency-observer-producer-hub` instance read (empty: the configured one).
    pub(crate) ttft_percentiles_producer_name: String,
    /// Accepted as upstream; epp counts the in-flight requests per endpoint itself.
    pub(crate) in_flight_load_producer_name: String,
    /// The observer, bound when the scheduler is assembled.
    #[serde(skip)]
    pub(crate) observer: Option<LatencyObserver>,
}

impl Default for LatencyObservationScorer {
    fn default() -> Self {
        Self {
            exploration_rate: 0.1,
            min_inflight_gap: 2.0,
            round_ttft_step: 0.0,
            ttft_percentiles_producer_name: String::new(),
            in_flight_load_producer_name: String::new(),
            observer: None,
        }
    }
}

/// One candidate's prediction.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Eval {
    pred: f64,
    /// Its load anchors are trusted: the whole curve applies.
    trusted: bool,
    /// It has a floor: not cold.
    warm: bool,
}

impl LatencyObservationScorer {
    pub(crate) fn validate(self) -> Result<Self, Invalid> {
        if !(0.0..=1.0).contains(&self.exploration_rate) {
            let got = self.exploration_rate;
            return Err(Invalid::new(
                "explorationRate",
                format!("explorationRate must be in [0, 1], got {got}"),
            ));
        }
        if self.min_inflight_gap.is_nan() || self.min_inflight_gap <= 0.0 {
            let got = self.min_inflight_gap;
            return Err(Invalid::new(
                "minInflightGap",
                format!("minInflightGap must be > 0, got {got}"),
            ));
        }
        if self.round_ttft_step.is_nan() || self.round_ttft_step < 0.0 {
            let got = self.round_ttft_step;
            return Err(Invalid::new(
                "roundTTFTStep",
                format!("roundTTFTStep must be >= 0, got {got}"),
            ));
        }
        Ok(self)
    }

    /// The producer instance named (`None`: whichever is configured).
    pub(crate) fn producer_name(&self) -> Option<&str> {
        Some(self.ttft_percentiles_producer_name.as_str()).filter(|n| !n.is_empty())
    }

    pub(crate) fn score(&self, pool: &[&Candidate], out: &mut [f64], rng: &mut impl Rng) {
        let evals: Vec<Eval> = pool
            .iter()
            .map(|c| {
                let p = self.observer.as_ref().and_then(|o| o.percentiles(c.id));
                self.eval(p.as_ref(), c.inflight)
            })
            .collect();
        self.normalise(&evals, out, || rng.random::<f64>());
    }

    /// The candidate's prediction at `inflight` requests, from what its observer published.
    fn eval(&self, p: Option<&Percentiles>, inflight: f64) -> Eval {
        let Some(p) = p else {
            return Eval::default();
        };
        let floor = p.floor();
        if floor <= 0.0 {
            return Eval::default();
        }
        let trusted = p.recent >= p.threshold
            && p.inflight_at_typical_load > 0.0
            && p.typical_load_ttft > floor;
        let mut pred = if trusted {
            self.predict(p, floor, inflight)
        } else {
            floor
        };
        if self.round_ttft_step > 0.0 {
            pred = (pred / self.round_ttft_step).round() * self.round_ttft_step;
        }
        Eval {
            pred,
            trusted,
            warm: true,
        }
    }

    /// The piecewise-linear curve A → B → C (B only when admissible), at `cur` in flight.
    fn predict(&self, p: &Percentiles, floor: f64, cur: f64) -> f64 {
        let (b_load, b_ttft) = (p.inflight_at_low_load, p.low_load_ttft);
        let (c_load, c_ttft) = (p.inflight_at_typical_load, p.typical_load_ttft);
        let use_low = c_load - b_load >= self.min_inflight_gap
            && c_ttft > b_ttft
            && b_ttft > floor
            && b_load > 0.0;
        let pred = if use_low && cur < b_load {
            floor + cur * (b_ttft - floor) / b_load
        } else if use_low {
            b_ttft + (cur - b_load) * (c_ttft - b_ttft) / (c_load - b_load)
        } else {
            floor + cur * (c_ttft - floor) / c_load
        };
        pred.max(floor)
    }

    /// Min-max normalised scores, cold endpoints seeded at the best prediction, then the
    /// exploration coin (`coin` draws in [0, 1)) over the endpoints not yet trusted.
    fn normalise(&self, evals: &[Eval], out: &mut [f64], mut coin: impl FnMut() -> f64) {
        let warm = evals.iter().filter(|e| e.warm).map(|e| e.pred);
        let Some(best) = warm.reduce(f64::min) else {
            out.fill(1.0);
            return;
        };
        super::min_max_inverse(
            evals.iter().map(|e| if e.warm { e.pred } else { best }),
            out,
        );
        let any_trusted = evals.iter().any(|e| e.trusted);
        for (o, e) in out.iter_mut().zip(evals) {
            if self.exploration_rate > 0.0 && !e.trusted {
                if coin() < self.exploration_rate {
                    *o = 1.0;
                } else if any_trusted {
                    *o = 0.0;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;

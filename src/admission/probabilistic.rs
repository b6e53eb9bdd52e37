//! llm-d-router's `probabilistic-admitter` (v0.10, `requestcontrol/admitter/probabilisticadmitter`):
//! a sheddable request (priority < 0) is refused with probability
//! `min(saturation^power × k, 1)`, where saturation is the mean over the candidate endpoints of
//! `max(waiting / queueDepthThreshold, kvUsage / kvCacheUtilThreshold)` and an endpoint with no
//! metrics counts 1. Critical and standard requests, and a request with no candidates, always
//! pass. With the defaults (power 5, k 300) about 2.3% are refused at saturation 0.15 and all
//! from ≈ 0.34.
//!
//! As upstream, it runs after the saturation detector's admission and before scheduling, and a
//! refusal is answered like upstream's: 500, `request cannot be admitted: probabilistic-admitter:
//! rejected, saturation=… prob=…`.

use crate::plugin::Invalid;
use serde::Deserialize;

/// The parameters as configured (upstream's names and defaults).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub(crate) struct ProbabilisticParams {
    queue_depth_threshold: i64,
    kv_cache_util_threshold: f64,
    power: f64,
    k: f64,
}

impl Default for ProbabilisticParams {
    fn default() -> Self {
        Self {
            queue_depth_threshold: 5,
            kv_cache_util_threshold: 0.8,
            power: 5.0,
            k: 300.0,
        }
    }
}

/// A validated `probabilistic-admitter`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Probabilistic {
    queue_depth: f64,
    kv_cache_util: f64,
    power: f64,
    k: f64,
}

impl ProbabilisticParams {
    /// Upstream's checks (each value above 0), every failing one reported.
    pub(crate) fn validate(self) -> Result<Probabilistic, Vec<Invalid>> {
        let mut problems = Vec::new();
        let mut positive = |name: &'static str, ok: bool, shown: String| {
            if !ok {
                problems.push(Invalid::new(
                    name,
                    format!("plugin 'probabilistic-admitter': {name} must be > 0, got {shown}"),
                ));
            }
        };
        let p = &self;
        positive(
            "queueDepthThreshold",
            p.queue_depth_threshold > 0,
            p.queue_depth_threshold.to_string(),
        );
        positive(
            "kvCacheUtilThreshold",
            p.kv_cache_util_threshold > 0.0,
            p.kv_cache_util_threshold.to_string(),
        );
        positive(
            "power",
            p.power > 0.0 && p.power.is_finite(),
            p.power.to_string(),
        );
        positive("k", p.k > 0.0 && p.k.is_finite(), p.k.to_string());
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Probabilistic {
            queue_depth: self.queue_depth_threshold as f64,
            kv_cache_util: self.kv_cache_util_threshold,
            power: self.power,
            k: self.k,
        })
    }
}

impl Probabilistic {
    /// The mean over `endpoints` of each one's `(waiting, kv usage)` saturation; `None` (no
    /// metrics) counts 1.
    pub(crate) fn saturation(
        &self,
        endpoints: impl ExactSizeIterator<Item = Option<(f64, f64)>>,
    ) -> f64 {
        let n = endpoints.len();
        if n == 0 {
            return 0.0;
        }
        let total: f64 = endpoints
            .map(|m| match m {
                None => 1.0,
                Some((waiting, kv)) => (waiting / self.queue_depth).max(kv / self.kv_cache_util),
            })
            .sum();
        total / n as f64
    }

    /// Why a request of `priority` is refused, given the candidates' saturation and a uniform
    /// draw in [0, 1); `None` admits it.
    pub(crate) fn refuses(
        &self,
        priority: i32,
        endpoints: impl ExactSizeIterator<Item = Option<(f64, f64)>>,
        draw: f64,
    ) -> Option<String> {
        if priority >= 0 || endpoints.len() == 0 {
            return None;
        }
        let saturation = self.saturation(endpoints);
        let prob = (saturation.powf(self.power) * self.k).min(1.0);
        (draw < prob).then(|| {
            format!("probabilistic-admitter: rejected, saturation={saturation:.3} prob={prob:.2}")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> Probabilistic {
        ProbabilisticParams::default().validate().unwrap()
    }

    #[test]
    fn only_sheddable_requests_are_refused_and_by_the_curve() {
        let a = defaults();
        // Saturation 0.15 (waiting 0.75 of 5): p = 0.15^5 × 300 ≈ 0.0228.
        let at = |s: f64| vec![Some((s * 5.0, 0.0)), Some((0.0, s * 0.8))];
        let p = |s: f64| (s.powf(5.0) * 300.0).min(1.0);
        assert!((p(0.15) - 0.0228).abs() < 1e-3);
        assert!(a.refuses(-1, at(0.15).into_iter(), 0.02).is_some());
        assert!(a.refuses(-1, at(0.15).into_iter(), 0.03).is_none());
        // From ≈ 0.34 everything sheddable goes, with upstream's message.
        let why = a.refuses(-1, at(0.35).into_iter(), 0.999_999).unwrap();
        assert_eq!(
            why,
            "probabilistic-admitter: rejected, saturation=0.350 prob=1.00"
        );
        assert!(
            a.refuses(0, at(5.0).into_iter(), 0.0).is_none(),
            "standard passes"
        );
        assert!(
            a.refuses(10, at(5.0).into_iter(), 0.0).is_none(),
            "critical passes"
        );
        assert!(
            a.refuses(-1, Vec::new().into_iter(), 0.0).is_none(),
            "no candidates"
        );
        // An endpoint without metrics counts as fully saturated.
        assert_eq!(a.saturation(vec![None, Some((0.0, 0.0))].into_iter()), 0.5);
        assert_eq!(a.saturation(vec![Some((10.0, 0.4))].into_iter()), 2.0);
    }

    #[test]
    fn every_value_that_is_not_above_zero_is_named() {
        let bad = ProbabilisticParams {
            queue_depth_threshold: 0,
            kv_cache_util_threshold: -0.1,
            power: 0.0,
            k: f64::NAN,
        };
        let problems = bad.validate().unwrap_err();
        let names: Vec<&str> = problems.iter().map(|p| p.parameter).collect();
        assert_eq!(
            names,
            ["queueDepthThreshold", "kvCacheUtilThreshold", "power", "k"]
        );
        assert!(problems[0]
            .message
            .contains("queueDepthThreshold must be > 0, got 0"));
    }
}

//! `load-aware-scorer` (llm-d): an empty queue scores 0.5, a queue at or above `threshold`
//! scores 0, linearly between: `0.5 · (1 − min(q, threshold) / threshold)` with `q` the
//! scraped waiting-queue size (`vllm:num_requests_waiting`; 0 before the first scrape).

use crate::plugin::Invalid;
use crate::scheduling::Candidate;

const DEFAULT_THRESHOLD: i64 = 128;

#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct LoadAwareScorer {
    /// Queue length that scores 0; ≤ 0 means the default (128).
    pub(crate) threshold: i64,
}

impl Default for LoadAwareScorer {
    fn default() -> Self {
        Self {
            threshold: DEFAULT_THRESHOLD,
        }
    }
}

impl LoadAwareScorer {
    pub(crate) fn validate(mut self) -> Result<Self, Invalid> {
        if self.threshold <= 0 {
            tracing::info!(
                "queueThreshold {} should be positive, using default queue threshold {DEFAULT_THRESHOLD}",
                self.threshold
            );
            self.threshold = DEFAULT_THRESHOLD;
        }
        Ok(self)
    }

    pub(crate) fn score(&self, pool: &[&Candidate], out: &mut [f64]) {
        let thr = self.threshold.max(1) as f64;
        for (o, c) in out.iter_mut().zip(pool) {
            let q = c.metrics.as_ref().map_or(0.0, |m| m.waiting);
            *o = if q == 0.0 {
                0.5
            } else {
                0.5 * (1.0 - q.min(thr) / thr)
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::plugin::params;
    use crate::scheduling::testing::{cand, metrics};

    fn queued(port: u16, waiting: Option<f64>) -> Candidate {
        Candidate {
            metrics: waiting.map(|w| metrics(w, 0.0, 0.0)),
            ..cand(port, 0.0, 0.0, 0)
        }
    }

    #[test]
    fn empty_queue_scores_half_and_full_queue_zero() {
        let s = LoadAwareScorer { threshold: 10 };
        let table = [
            (None, 0.5),
            (Some(0.0), 0.5),
            (Some(5.0), 0.25),
            (Some(40.0), 0.0),
        ];
        for (i, (q, want)) in table.into_iter().enumerate() {
            let c = queued(i as u16 + 1, q);
            let mut out = [0.0];
            s.score(&[&c], &mut out);
            assert_eq!(out[0], want, "{q:?}");
        }
    }

    #[test]
    fn non_positive_threshold_means_default() {
        let v: serde_norway::Value = serde_norway::from_str("threshold: 0").unwrap();
        let s = params::<LoadAwareScorer>(&v).unwrap().validate().unwrap();
        assert_eq!(s.threshold, 128);
        let v: serde_norway::Value = serde_norway::from_str("queueThreshold: 3").unwrap();
        assert!(params::<LoadAwareScorer>(&v).is_err());
    }
}

//! `latency-scorer`: prefer the endpoint that has been answering fastest, by a peak-EWMA of
//! observed time to first token (TTFT) and time per output token (TPOT) (seed document 002).
//!
//! Why: queue depth and KV usage are what a pod *reports*; latency is what clients *get*. A pod
//! that is slow without being down (thermal throttling, a noisy neighbour, a degraded NIC) keeps
//! reporting short queues while every request to it takes twice as long. The estimates come
//! from the response phase (`datastore::latency`): peak-sensitive, decaying with time, and
//! errors count as slow, so a pod that fails fast never looks fast.
//!
//! Cost of a candidate: `(ttft + expectedOutputTokens · tpot) · (1 + running)`, Finagle's
//! load-weighted peak-EWMA (the in-flight factor stops every request herding onto the single
//! fastest pod between observations). Score: `min cost / cost`, in (0, 1]. An endpoint with no
//! observations yet is given the median cost of those that have some (neutral: neither
//! shunned nor flooded); when none has any, every candidate scores 1.

use crate::scheduling::Candidate;

/// What the datastore has observed of one endpoint, decayed to now (seconds).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LatencyEstimate {
    pub(crate) ttft: Option<f64>,
    pub(crate) tpot: Option<f64>,
}

impl LatencyEstimate {
    /// Expected seconds for a request of `tokens` output tokens; `None` when nothing observed.
    fn cost(&self, tokens: f64) -> Option<f64> {
        match (self.ttft, self.tpot) {
            (None, None) => None,
            (ttft, tpot) => Some(ttft.unwrap_or(0.0) + tokens * tpot.unwrap_or(0.0)),
        }
    }
}

#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct LatencyScorer {
    /// Output tokens assumed per request when weighing TPOT against TTFT.
    pub(crate) expected_output_tokens: f64,
}

impl Default for LatencyScorer {
    fn default() -> Self {
        Self {
            expected_output_tokens: 100.0,
        }
    }
}

impl LatencyScorer {
    pub(crate) fn score(&self, pool: &[&Candidate], out: &mut [f64]) {
        let tokens = if self.expected_output_tokens.is_finite() {
            self.expected_output_tokens.max(0.0)
        } else {
            100.0
        };
        let raw: Vec<Option<f64>> = pool
            .iter()
            .map(|c| {
                c.latency
                    .and_then(|l| l.cost(tokens))
                    .map(|v| v.max(1e-6) * (1.0 + c.running.max(0.0)))
            })
            .collect();
        let mut known: Vec<f64> = raw
            .iter()
            .flatten()
            .copied()
            .filter(|v| v.is_finite())
            .collect();
        if known.is_empty() {
            out.iter_mut().for_each(|o| *o = 1.0);
            return;
        }
        known.sort_by(f64::total_cmp);
        let median = known[known.len() / 2];
        let best = known[0];
        for (o, r) in out.iter_mut().zip(&raw) {
            let cost = r.filter(|v| v.is_finite()).unwrap_or(median);
            *o = best / cost;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::cand;

    fn with_latency(port: u16, ttft: Option<f64>, tpot: Option<f64>, running: f64) -> Candidate {
        let mut c = cand(port, 0.0, 0.0, 0);
        c.latency = Some(LatencyEstimate { ttft, tpot });
        c.running = running;
        c
    }

    fn scores(s: &LatencyScorer, cands: &[Candidate]) -> Vec<f64> {
        let pool: Vec<&Candidate> = cands.iter().collect();
        let mut out = vec![0.0; cands.len()];
        s.score(&pool, &mut out);
        out
    }

    #[test]
    fn the_fastest_endpoint_scores_one_and_a_slow_one_proportionally_less() {
        let s = LatencyScorer {
            expected_output_tokens: 10.0,
        };
        let cands = [
            with_latency(1, Some(0.1), Some(0.01), 0.0),
            with_latency(2, Some(0.4), Some(0.04), 0.0),
        ];
        assert_eq!(scores(&s, &cands), [1.0, 0.25]);
    }

    #[test]
    fn load_weighs_in_so_the_fastest_pod_is_not_flooded() {
        let s = LatencyScorer::default();
        let cands = [
            with_latency(1, Some(0.1), None, 3.0),
            with_latency(2, Some(0.2), None, 0.0),
        ];
        let out = scores(&s, &cands);
        assert!(out[1] > out[0], "{out:?}");
    }

    #[test]
    fn unobserved_endpoints_get_the_median_and_no_data_at_all_is_neutral() {
        let s = LatencyScorer::default();
        let cands = [
            with_latency(1, Some(0.1), None, 0.0),
            with_latency(2, Some(0.3), None, 0.0),
            with_latency(3, Some(0.2), None, 0.0),
            cand(4, 0.0, 0.0, 0),
        ];
        let out = scores(&s, &cands);
        assert!((out[3] - 0.5).abs() < 1e-9, "median 0.2 → 0.1/0.2: {out:?}");
        assert_eq!(
            scores(&s, &[cand(1, 0.0, 0.0, 0), cand(2, 0.0, 0.0, 0)]),
            [1.0, 1.0]
        );
    }

    #[test]
    fn scores_stay_in_the_unit_interval_for_degenerate_estimates() {
        let s = LatencyScorer {
            expected_output_tokens: f64::NAN,
        };
        let cands = [
            with_latency(1, Some(0.0), Some(0.0), 0.0),
            with_latency(2, Some(f64::INFINITY), None, 0.0),
        ];
        for v in scores(&s, &cands) {
            assert!((0.0..=1.0).contains(&v), "{v}");
        }
    }
}

//! `active-request-scorer` (llm-d): fewer of epp's own in-flight requests is better.
//!
//! `c` = requests epp routed to the endpoint that have not finished (`Candidate::inflight`,
//! llm-d's `InFlightLoad.Requests`), `max` = the largest `c` among the candidates:
//! `c ≤ idleThreshold` scores 1, else `(max − c) / max · maxBusyScore`.

use crate::plugin::Invalid;
use crate::scheduling::Candidate;

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ActiveRequestScorer {
    /// Deprecated upstream and ignored (logged at load).
    pub(crate) request_timeout: String,
    /// Endpoints with at most this many in-flight requests count as idle (negative → 0).
    pub(crate) idle_threshold: i64,
    /// The best score a busy endpoint can get; outside [0, 1] → 1.
    pub(crate) max_busy_score: Option<f64>,
    /// Names the in-flight load producer; epp has one, so any name is accepted.
    pub(crate) in_flight_load_producer_name: String,
}

impl ActiveRequestScorer {
    /// Applies upstream's corrections (they are logged there, not refused).
    pub(crate) fn validate(mut self) -> Result<Self, Invalid> {
        if !self.request_timeout.is_empty() {
            tracing::info!(
                request_timeout = %self.request_timeout,
                "DEPRECATED: requestTimeout is deprecated and ignored; active-request-scorer counts requests until their response ends"
            );
        }
        self.idle_threshold = self.idle_threshold.max(0);
        if self
            .max_busy_score
            .is_some_and(|m| !(0.0..=1.0).contains(&m))
        {
            tracing::info!(
                max_busy_score = ?self.max_busy_score,
                "active-request-scorer: maxBusyScore must be in [0, 1]; using 1.0"
            );
            self.max_busy_score = None;
        }
        Ok(self)
    }

    pub(crate) fn score(&self, pool: &[&Candidate], out: &mut [f64]) {
        let max = pool.iter().map(|c| c.inflight).fold(0.0, f64::max);
        let busy = self.max_busy_score.unwrap_or(1.0);
        for (o, c) in out.iter_mut().zip(pool) {
            *o = if c.inflight <= self.idle_threshold as f64 {
                1.0
            } else {
                (max - c.inflight) / max * busy
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::plugin::params;
    use crate::scheduling::testing::cand;

    fn scores(s: &ActiveRequestScorer, inflight: &[f64]) -> Vec<f64> {
        let cands: Vec<Candidate> = inflight
            .iter()
            .enumerate()
            .map(|(i, n)| Candidate {
                inflight: *n,
                ..cand(i as u16 + 1, 0.0, 0.0, 0)
            })
            .collect();
        let pool: Vec<&Candidate> = cands.iter().collect();
        let mut out = vec![0.0; pool.len()];
        s.score(&pool, &mut out);
        out
    }

    #[test]
    fn scores_follow_upstream_formula() {
        let d = ActiveRequestScorer::default();
        let idle2 = ActiveRequestScorer {
            idle_threshold: 2,
            max_busy_score: Some(0.5),
            ..Default::default()
        };
        let table: [(&ActiveRequestScorer, &[f64], &[f64]); 4] = [
            (&d, &[0.0, 0.0], &[1.0, 1.0]),
            (&d, &[0.0, 2.0, 4.0], &[1.0, 0.5, 0.0]),
            (&idle2, &[1.0, 2.0, 4.0], &[1.0, 1.0, 0.0]),
            (&idle2, &[3.0, 6.0], &[0.25, 0.0]),
        ];
        for (s, inflight, want) in table {
            assert_eq!(scores(s, inflight), want, "{inflight:?}");
        }
    }

    #[test]
    fn out_of_range_parameters_are_corrected_as_upstream() {
        let v: serde_norway::Value =
            serde_norway::from_str("{idleThreshold: -3, maxBusyScore: 1.5, requestTimeout: 2m}")
                .unwrap();
        let s = params::<ActiveRequestScorer>(&v)
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!((s.idle_threshold, s.max_busy_score), (0, None));
        let v: serde_norway::Value = serde_norway::from_str("{idleThresholds: 1}").unwrap();
        assert!(params::<ActiveRequestScorer>(&v).is_err());
    }
}

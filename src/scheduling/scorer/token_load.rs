//! `token-load-scorer` (llm-d): fewer tokens of prefill ahead is better, against a fixed
//! threshold rather than min-max, so a lightly loaded pool keeps scores near 1.
//!
//! `score = 1 − min(T, thr) / thr` with `T` = the endpoint's in-flight tokens (uncached prompt
//! tokens epp sent there that have no first token yet: `Candidate::prefill.pending_tokens`,
//! llm-d's `InFlightLoad.Tokens`) plus this request's uncached tokens on that endpoint
//! ([`SchedulingRequest::uncached_tokens`], llm-d's `UncachedRequestTokens`); `T ≤ 0` scores 1.

use crate::plugin::Invalid;
use crate::scheduling::{Candidate, SchedulingRequest};

/// 128 requests of 32K tokens (upstream's default).
const DEFAULT_THRESHOLD: i64 = 4_194_304;

#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct TokenLoadScorer {
    /// Tokens at which the score reaches 0; ≤ 0 means the default.
    pub(crate) queue_threshold_tokens: i64,
    /// Names the in-flight load producer; epp has one, so any name is accepted.
    pub(crate) in_flight_load_producer_name: String,
}

impl Default for TokenLoadScorer {
    fn default() -> Self {
        Self {
            queue_threshold_tokens: DEFAULT_THRESHOLD,
            in_flight_load_producer_name: String::new(),
        }
    }
}

impl TokenLoadScorer {
    /// Upstream replaces a threshold ≤ 0 by the default.
    pub(crate) fn validate(mut self) -> Result<Self, Invalid> {
        if self.queue_threshold_tokens <= 0 {
            self.queue_threshold_tokens = DEFAULT_THRESHOLD;
        }
        Ok(self)
    }

    pub(crate) fn score(&self, req: &SchedulingRequest<'_>, pool: &[&Candidate], out: &mut [f64]) {
        let thr = self.queue_threshold_tokens.max(1) as f64;
        for (o, c) in out.iter_mut().zip(pool) {
            let t = c.prefill.pending_tokens + req.uncached_tokens(c);
            *o = if t <= 0.0 {
                1.0
            } else {
                1.0 - t.min(thr) / thr
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::plugin::params;
    use crate::scheduling::testing::cand;

    fn with_pending(port: u16, pending: f64, prefix_blocks: usize) -> Candidate {
        let mut c = cand(port, 0.0, 0.0, prefix_blocks);
        c.prefill.pending_tokens = pending;
        c
    }

    #[test]
    fn scores_in_flight_plus_uncached_tokens_against_the_threshold() {
        let s = TokenLoadScorer {
            queue_threshold_tokens: 1000,
            ..Default::default()
        };
        let req = SchedulingRequest {
            prompt_tokens: 320,
            prefix_total_blocks: 20,
            block_size: 16,
            ..Default::default()
        };
        // (pending, prefix blocks held) → expected score
        let table = [
            (0.0, 20, 1.0),    // idle and fully cached: T = 0
            (0.0, 0, 0.68),    // 320 uncached
            (180.0, 10, 0.66), // 180 + 160
            (5000.0, 0, 0.0),  // capped at the threshold
        ];
        for (i, (pending, held, want)) in table.into_iter().enumerate() {
            let c = with_pending(i as u16 + 1, pending, held);
            let mut out = [0.0];
            s.score(&req, &[&c], &mut out);
            assert!(
                (out[0] - want).abs() < 1e-9,
                "case {i}: {} != {want}",
                out[0]
            );
        }
    }

    #[test]
    fn parameters_default_strictly_and_replace_non_positive_thresholds() {
        let s: TokenLoadScorer = params(&serde_norway::Value::Null).unwrap();
        assert_eq!(s.queue_threshold_tokens, 4_194_304);
        let v: serde_norway::Value = serde_norway::from_str("queueThresholdTokens: -5").unwrap();
        let s = params::<TokenLoadScorer>(&v).unwrap().validate().unwrap();
        assert_eq!(s.queue_threshold_tokens, 4_194_304);
        let v: serde_norway::Value =
            serde_norway::from_str("{queueThresholdTokens: 64, inFlightLoadProducerName: x}")
                .unwrap();
        assert_eq!(
            params::<TokenLoadScorer>(&v)
                .unwrap()
                .queue_threshold_tokens,
            64
        );
        let v: serde_norway::Value = serde_norway::from_str("threshold: 5").unwrap();
        assert!(params::<TokenLoadScorer>(&v).is_err());
    }
}

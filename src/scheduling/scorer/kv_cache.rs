//! `kv-cache-utilization-scorer`: `1 − kv_usage`; an emptier KV cache is better.

use crate::scheduling::Candidate;

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvCacheScorer {}

impl KvCacheScorer {
    pub(crate) fn score(&self, pool: &[&Candidate], out: &mut [f64]) {
        for (o, c) in out.iter_mut().zip(pool) {
            *o = 1.0 - c.kv_usage.clamp(0.0, 1.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::cand;

    #[test]
    fn emptier_cache_scores_higher() {
        let cands = [cand(1, 0.0, 0.25, 0), cand(2, 0.0, 1.5, 0)];
        let mut out = [0.0; 2];
        KvCacheScorer {}.score(&cands.iter().collect::<Vec<_>>(), &mut out);
        assert_eq!(out, [0.75, 0.0]);
    }
}

//! `multicluster-kv-cache-utilization-scorer` (llm-d-router v0.10, alpha): a hub's clusters by
//! `1 − ` their pool's average KV-cache utilization, which each spoke EPP publishes
//! (`llm_d_epp_average_kv_cache_utilization`, read by `multicluster-metrics-extractor`). A
//! cluster without the value is left unscored (0), as upstream leaves it out of its scores. No
//! parameters (`kv-cache-utilization-scorer`'s).

use crate::scheduling::Candidate;

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MulticlusterKvCacheScorer {}

impl MulticlusterKvCacheScorer {
    pub(crate) fn score(&self, pool: &[&Candidate], out: &mut [f64]) {
        for (o, c) in out.iter_mut().zip(pool) {
            let util = c.metrics.as_ref().and_then(|m| m.pool?.kv_usage);
            // Upstream scores `1 - util` as read; clamped here so a spoke's bad gauge keeps
            // the score in [0, 1].
            *o = util.map_or(0.0, |u| 1.0 - u.clamp(0.0, 1.0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::cand;

    fn cluster(port: u16, kv: Option<f64>) -> Candidate {
        Candidate {
            metrics: Some(crate::fixtures::metrics().pool(kv, Some(1.0)).arc()),
            ..cand(port, 0.0, 0.9, 0)
        }
    }

    #[test]
    fn an_emptier_pool_scores_higher_and_a_silent_cluster_zero() {
        let cands = [
            cluster(1, Some(0.25)),
            cluster(2, Some(1.0)),
            cluster(3, None),
            cand(4, 0.0, 0.0, 0),
        ];
        let mut out = [9.0; 4];
        MulticlusterKvCacheScorer {}.score(&cands.iter().collect::<Vec<_>>(), &mut out);
        assert_eq!(out, [0.75, 0.0, 0.0, 0.0]);
    }
}

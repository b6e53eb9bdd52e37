//! `multicluster-queue-scorer` (llm-d-router v0.10, alpha): a hub's clusters by their pool's
//! average waiting queue, which each spoke EPP publishes (`llm_d_epp_average_queue_size`, read
//! by `multicluster-metrics-extractor`), min-max normalised over the clusters that report one:
//! the shortest scores 1, the longest 0, all equal 1. A cluster without the value is left
//! unscored (0), as upstream leaves it out of its scores. A cluster is one endpoint whose own
//! queue gauge is empty, so `queue-scorer` cannot see this. No parameters (`queue-scorer`'s).

use crate::scheduling::Candidate;

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MulticlusterQueueScorer {}

/// A candidate's pool queue, when its last scrape carried one.
fn pool_queue(c: &Candidate) -> Option<f64> {
    c.metrics.as_ref()?.pool?.queue
}

impl MulticlusterQueueScorer {
    pub(crate) fn score(&self, pool: &[&Candidate], out: &mut [f64]) {
        let (lo, hi) = pool
            .iter()
            .filter_map(|c| pool_queue(c))
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), q| {
                (lo.min(q), hi.max(q))
            });
        for (o, c) in out.iter_mut().zip(pool) {
            *o = match pool_queue(c) {
                None => 0.0,
                Some(_) if hi <= lo => 1.0,
                Some(q) => (hi - q) / (hi - lo),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::cand;

    fn cluster(port: u16, queue: Option<f64>) -> Candidate {
        Candidate {
            metrics: Some(crate::fixtures::metrics().pool(Some(0.5), queue).arc()),
            ..cand(port, 0.0, 0.0, 0)
        }
    }

    #[test]
    fn the_shortest_pool_queue_scores_highest_and_a_silent_cluster_zero() {
        let cands = [
            cluster(1, Some(2.0)),
            cluster(2, Some(6.0)),
            cluster(3, Some(4.0)),
            cluster(4, None),
            cand(5, 0.0, 0.0, 0),
        ];
        let mut out = [9.0; 5];
        MulticlusterQueueScorer {}.score(&cands.iter().collect::<Vec<_>>(), &mut out);
        assert_eq!(out, [1.0, 0.0, 0.5, 0.0, 0.0]);
    }

    #[test]
    fn equal_queues_all_score_one() {
        let cands = [cluster(1, Some(3.0)), cluster(2, Some(3.0))];
        let mut out = [0.0; 2];
        MulticlusterQueueScorer {}.score(&cands.iter().collect::<Vec<_>>(), &mut out);
        assert_eq!(out, [1.0, 1.0]);
    }

    #[test]
    fn the_pods_own_queue_is_not_read() {
        let cands = [
            Candidate {
                waiting: 50.0,
                ..cluster(1, Some(1.0))
            },
            cluster(2, Some(2.0)),
        ];
        let mut out = [0.0; 2];
        MulticlusterQueueScorer {}.score(&cands.iter().collect::<Vec<_>>(), &mut out);
        assert_eq!(out, [1.0, 0.0]);
    }
}

//! `queue-scorer`: fewer waiting requests is better, min-max normalised over the candidates:
//! `(maxQ − q) / (maxQ − minQ)`, all equal ⇒ 1. The queue includes what epp dispatched since
//! the last scrape, so a burst between scrapes spreads instead of herding on one pod.

use crate::scheduling::Candidate;

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueScorer {}

impl QueueScorer {
    pub(crate) fn score(&self, pool: &[&Candidate], out: &mut [f64]) {
        super::min_max_inverse(pool.iter().map(|c| c.waiting), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::cand;

    #[test]
    fn scores_min_max_over_queue_depth() {
        let cands = [
            cand(1, 0.0, 0.0, 0),
            cand(2, 5.0, 0.0, 0),
            cand(3, 10.0, 0.0, 0),
        ];
        let pool: Vec<&Candidate> = cands.iter().collect();
        let mut out = [0.0; 3];
        QueueScorer {}.score(&pool, &mut out);
        assert_eq!(out, [1.0, 0.5, 0.0]);
        let same = [cand(1, 3.0, 0.0, 0), cand(2, 3.0, 0.0, 0)];
        let mut out = [0.0; 2];
        QueueScorer {}.score(&same.iter().collect::<Vec<_>>(), &mut out);
        assert_eq!(out, [1.0, 1.0]);
    }
}

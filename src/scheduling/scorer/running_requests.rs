//! `running-requests-size-scorer`: fewer running requests is better, min-max normalised.

use crate::scheduling::Candidate;

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunningRequestsScorer {}

impl RunningRequestsScorer {
    pub(crate) fn score(&self, pool: &[&Candidate], out: &mut [f64]) {
        super::min_max_inverse(pool.iter().map(|c| c.running), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::cand;

    #[test]
    fn fewer_running_scores_higher() {
        let mut a = cand(1, 0.0, 0.0, 0);
        a.running = 2.0;
        let mut b = cand(2, 0.0, 0.0, 0);
        b.running = 6.0;
        let mut out = [0.0; 2];
        RunningRequestsScorer {}.score(&[&a, &b], &mut out);
        assert_eq!(out, [1.0, 0.0]);
    }
}

//! `max-score-picker`: the highest total scores win; ties are broken at random (shuffle, then a
//! stable sort by score, as upstream), so equal endpoints share load instead of the first one
//! taking everything.

use super::PickerParams;
use crate::endpoint::EndpointId;
use crate::scheduling::Candidate;
use rand::seq::SliceRandom;
use rand::Rng;

#[derive(Clone, Debug)]
pub struct MaxScorePicker {
    pub params: PickerParams,
}

impl MaxScorePicker {
    pub fn pick(&self, scored: &[(&Candidate, f64)], rng: &mut impl Rng) -> Vec<EndpointId> {
        let mut order: Vec<(EndpointId, f64)> = scored.iter().map(|(c, s)| (c.id, *s)).collect();
        order.shuffle(rng);
        order.sort_by(|a, b| b.1.total_cmp(&a.1));
        order
            .into_iter()
            .take(self.params.max_num_of_endpoints)
            .map(|(id, _)| id)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::cand;
    use rand::{rngs::SmallRng, SeedableRng};

    #[test]
    fn returns_best_first_and_breaks_ties_randomly() {
        let cands = [
            cand(1, 0.0, 0.0, 0),
            cand(2, 0.0, 0.0, 0),
            cand(3, 0.0, 0.0, 0),
        ];
        let p = MaxScorePicker {
            params: PickerParams {
                max_num_of_endpoints: 2,
            },
        };
        let mut rng = SmallRng::seed_from_u64(7);
        let scored = [(&cands[0], 1.0), (&cands[1], 3.0), (&cands[2], 2.0)];
        assert_eq!(p.pick(&scored, &mut rng), vec![cands[1].id, cands[2].id]);
        let tied = [(&cands[0], 1.0), (&cands[1], 1.0)];
        let firsts: std::collections::HashSet<_> =
            (0..32).map(|_| p.pick(&tied, &mut rng)[0]).collect();
        assert_eq!(
            firsts.len(),
            2,
            "ties must not always go to the same endpoint"
        );
    }
}

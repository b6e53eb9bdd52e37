//! `max-score-picker`: the highest total scores win; ties are broken at random (shuffle, then a
//! stable sort by score, as upstream), so equal endpoints share load instead of the first one
//! taking everything.

use super::{best_first, PickerParams};
use crate::endpoint::EndpointId;
use crate::scheduling::Candidate;
use rand::seq::SliceRandom;
use rand::Rng;

#[derive(Clone, Debug)]
pub struct MaxScorePicker {
    pub(crate) params: PickerParams,
}

impl MaxScorePicker {
    pub(crate) fn pick(&self, scored: &[(&Candidate, f64)], rng: &mut impl Rng) -> Vec<EndpointId> {
        let mut order: Vec<(EndpointId, f64)> = scored.iter().map(|(c, s)| (c.id, *s)).collect();
        order.shuffle(rng);
        // Best first, ties in shuffled order (only the returned ones are put in order).
        best_first(&order, self.params.max_num_of_endpoints)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::cand;
    use rand::{rngs::SmallRng, SeedableRng};

    proptest::proptest! {
        /// The same picks as shuffling and stable-sorting the whole list (upstream's way), for
        /// the same random draws.
        #[test]
        fn picks_as_a_full_stable_sort_would(scores in proptest::collection::vec(0u8..4, 0..40), k in 0usize..6, seed in 0u64..1000) {
            let cands: Vec<Candidate> = (0..scores.len()).map(|i| cand(i as u16 + 1, 0.0, 0.0, 0)).collect();
            let scored: Vec<(&Candidate, f64)> = cands.iter().zip(&scores).map(|(c, s)| (c, f64::from(*s))).collect();
            let p = MaxScorePicker { params: PickerParams { max_num_of_endpoints: k } };
            let got = p.pick(&scored, &mut SmallRng::seed_from_u64(seed));
            let mut order: Vec<(EndpointId, f64)> = scored.iter().map(|(c, s)| (c.id, *s)).collect();
            order.shuffle(&mut SmallRng::seed_from_u64(seed));
            order.sort_by(|a, b| b.1.total_cmp(&a.1));
            let want: Vec<EndpointId> = order.into_iter().take(k).map(|(id, _)| id).collect();
            proptest::prop_assert_eq!(got, want);
        }
    }

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

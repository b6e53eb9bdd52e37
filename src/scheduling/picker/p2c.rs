//! `power-of-two-choices-picker` (alias `p2c`): sample two distinct candidates uniformly and take
//! the one with the higher total score (a coin decides equal scores); fallbacks
//! (`maxNumOfEndpoints` > 1) follow in score order.
//!
//! Why: between two scrapes every epp replica sees the same scores, so max-score sends a whole
//! burst to the same "best" pod (herding). Two random choices keep most of the benefit of
//! choosing the best (the maximum load drops from `log n / log log n` to `log log n`, Mitzenmacher)
//! while a burst spreads over many pods. Never picks the strictly worst candidate of two or more.

use super::{fill_by_score, PickerParams};
use crate::endpoint::EndpointId;
use crate::scheduling::Candidate;
use rand::Rng;

#[derive(Clone, Debug)]
pub struct PowerOfTwoChoicesPicker {
    pub(crate) params: PickerParams,
}

impl PowerOfTwoChoicesPicker {
    pub(crate) fn pick(&self, scored: &[(&Candidate, f64)], rng: &mut impl Rng) -> Vec<EndpointId> {
        let primary = match scored.len() {
            0 => return Vec::new(),
            1 => scored[0].0.id,
            n => {
                let a = rng.random_range(0..n);
                let b = (a + rng.random_range(1..n)) % n;
                let (sa, sb) = (scored[a].1, scored[b].1);
                let a_wins = match sa.total_cmp(&sb) {
                    std::cmp::Ordering::Greater => true,
                    std::cmp::Ordering::Less => false,
                    std::cmp::Ordering::Equal => rng.random_bool(0.5),
                };
                scored[if a_wins { a } else { b }].0.id
            }
        };
        fill_by_score(primary, scored, self.params.max_num_of_endpoints)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::cand;
    use proptest::prelude::*;
    use rand::{rngs::SmallRng, SeedableRng};

    #[test]
    fn spreads_over_all_but_the_worst_in_proportion_to_rank() {
        let cands: Vec<_> = (1..=4).map(|p| cand(p, 0.0, 0.0, 0)).collect();
        let scored: Vec<_> = cands.iter().zip([4.0, 3.0, 2.0, 1.0]).collect();
        let p = PowerOfTwoChoicesPicker {
            params: PickerParams::default(),
        };
        let mut rng = SmallRng::seed_from_u64(5);
        let mut wins = [0usize; 4];
        for _ in 0..6000 {
            let id = p.pick(&scored, &mut rng)[0];
            wins[cands.iter().position(|c| c.id == id).unwrap()] += 1;
        }
        // Of the 6 pairs, rank 1 wins 3, rank 2 wins 2, rank 3 wins 1, rank 4 none.
        assert_eq!(wins[3], 0);
        for (w, expect) in wins.iter().zip([0.5, 1.0 / 3.0, 1.0 / 6.0]) {
            let share = *w as f64 / 6000.0;
            assert!(
                (share - expect).abs() < 0.03,
                "share {share} expected {expect}: {wins:?}"
            );
        }
    }

    #[test]
    fn single_candidate_and_fallbacks_in_score_order() {
        let cands: Vec<_> = (1..=3).map(|p| cand(p, 0.0, 0.0, 0)).collect();
        let p = PowerOfTwoChoicesPicker {
            params: PickerParams {
                max_num_of_endpoints: 3,
            },
        };
        let mut rng = SmallRng::seed_from_u64(9);
        assert_eq!(p.pick(&[(&cands[0], 0.0)], &mut rng), vec![cands[0].id]);
        let scored = [(&cands[0], 0.2), (&cands[1], 0.9), (&cands[2], 0.5)];
        for _ in 0..16 {
            let picked = p.pick(&scored, &mut rng);
            let mut rest: Vec<_> = scored.iter().filter(|(c, _)| c.id != picked[0]).collect();
            rest.sort_by(|a, b| b.1.total_cmp(&a.1));
            assert_eq!(picked[1..], [rest[0].0.id, rest[1].0.id]);
        }
    }

    proptest! {
        #[test]
        fn never_the_strict_minimum_and_no_duplicates(
            scores in proptest::collection::vec(0.0f64..3.0, 2..10),
            n in 1usize..5,
            seed in any::<u64>(),
        ) {
            let cands: Vec<_> = (0..scores.len()).map(|i| cand(i as u16 + 1, 0.0, 0.0, 0)).collect();
            let scored: Vec<_> = cands.iter().zip(scores.iter().copied()).collect();
            let p = PowerOfTwoChoicesPicker { params: PickerParams { max_num_of_endpoints: n } };
            let picked = p.pick(&scored, &mut SmallRng::seed_from_u64(seed));
            prop_assert_eq!(picked.len(), n.min(cands.len()));
            let unique: std::collections::HashSet<_> = picked.iter().collect();
            prop_assert_eq!(unique.len(), picked.len());
            let min = scores.iter().copied().fold(f64::INFINITY, f64::min);
            let strict_min = scores.iter().filter(|s| **s == min).count() == 1;
            let chosen = scored.iter().find(|(c, _)| c.id == picked[0]).map(|(_, s)| *s);
            prop_assert!(!(strict_min && chosen == Some(min)));
        }
    }
}

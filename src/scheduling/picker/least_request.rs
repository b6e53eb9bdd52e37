//! `weighted-least-request-picker`: the endpoint with the fewest outstanding requests per unit
//! of weight wins, `(running + waiting) / weight`, as nginx `least_conn` with weights and Envoy's
//! `LEAST_REQUEST` with a full scan instead of sampling. Scores are ignored for the primary;
//! fallbacks follow in score order.
//!
//! Why a picker and not a scorer: the point is a capacity-proportional split on a mixed fleet
//! (an A100 with weight 5 takes five times the requests of a T4 with weight 2 at equal
//! latency), which a min-max normalised score blended with others would not preserve.
//! `running` already includes epp's own in-flight count and `waiting` what epp dispatched since
//! the last scrape, so a burst between scrapes spreads instead of herding.
//! Ties are broken at random; weight 0 counts as the smallest positive weight.

use super::{fill_by_score, PickerParams};
use crate::endpoint::EndpointId;
use crate::scheduling::Candidate;
use rand::Rng;

#[derive(Clone, Debug)]
pub struct WeightedLeastRequestPicker {
    pub(crate) params: PickerParams,
}

impl WeightedLeastRequestPicker {
    /// Outstanding requests per unit of weight.
    pub(crate) fn load(c: &Candidate) -> f64 {
        (c.running + c.waiting).max(0.0) / f64::from(c.weight.max(1))
    }

    pub(crate) fn pick(&self, scored: &[(&Candidate, f64)], rng: &mut impl Rng) -> Vec<EndpointId> {
        let mut best: Option<(EndpointId, f64)> = None;
        let mut ties = 0u32;
        for (c, _) in scored {
            let load = Self::load(c);
            match best {
                Some((_, b)) if load > b => {}
                Some((_, b)) if load == b => {
                    // Reservoir sampling over the tied minima: each keeps a 1/n chance.
                    ties += 1;
                    if rng.random_range(0..ties) == 0 {
                        best = Some((c.id, load));
                    }
                }
                _ => {
                    best = Some((c.id, load));
                    ties = 1;
                }
            }
        }
        match best {
            Some((id, _)) => fill_by_score(id, scored, self.params.max_num_of_endpoints),
            None => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::cand;
    use proptest::prelude::*;
    use rand::{rngs::SmallRng, SeedableRng};

    fn loaded(port: u16, running: f64, weight: u32) -> Candidate {
        Candidate {
            running,
            weight,
            ..cand(port, 0.0, 0.0, 0)
        }
    }

    #[test]
    fn divides_outstanding_requests_by_weight() {
        let cands = [loaded(1, 8.0, 4), loaded(2, 3.0, 1), loaded(3, 4.0, 1)];
        let scored: Vec<_> = cands.iter().map(|c| (c, 0.0)).collect();
        let p = WeightedLeastRequestPicker {
            params: PickerParams::default(),
        };
        let mut rng = SmallRng::seed_from_u64(1);
        assert_eq!(
            p.pick(&scored, &mut rng),
            vec![cands[0].id],
            "8/4 = 2 beats 3/1 and 4/1"
        );
    }

    #[test]
    fn ties_are_shared_and_waiting_counts() {
        let mut a = loaded(1, 1.0, 1);
        a.waiting = 2.0;
        let cands = [a, loaded(2, 1.0, 1), loaded(3, 1.0, 1)];
        let scored: Vec<_> = cands.iter().map(|c| (c, 0.0)).collect();
        let p = WeightedLeastRequestPicker {
            params: PickerParams::default(),
        };
        let mut rng = SmallRng::seed_from_u64(2);
        let seen: std::collections::HashSet<_> =
            (0..64).map(|_| p.pick(&scored, &mut rng)[0]).collect();
        assert_eq!(
            seen.len(),
            2,
            "the two idle-equal pods share, the one with a queue does not: {seen:?}"
        );
        assert!(!seen.contains(&cands[0].id));
    }

    proptest! {
        #[test]
        fn primary_has_the_least_load_per_weight(
            loads in proptest::collection::vec((0.0f64..50.0, 0.0f64..50.0, 0u32..6), 1..10),
            n in 1usize..4,
            seed in any::<u64>(),
        ) {
            let cands: Vec<Candidate> = loads.iter().enumerate().map(|(i, (r, w, wt))| Candidate { waiting: *w, ..loaded(i as u16 + 1, *r, *wt) }).collect();
            let scored: Vec<_> = cands.iter().map(|c| (c, 0.5)).collect();
            let p = WeightedLeastRequestPicker { params: PickerParams { max_num_of_endpoints: n } };
            let picked = p.pick(&scored, &mut SmallRng::seed_from_u64(seed));
            prop_assert_eq!(picked.len(), n.min(cands.len()));
            let chosen = cands.iter().find(|c| c.id == picked[0]).map(WeightedLeastRequestPicker::load);
            let min = cands.iter().map(WeightedLeastRequestPicker::load).fold(f64::INFINITY, f64::min);
            prop_assert_eq!(chosen, Some(min));
        }
    }
}

//! `random-picker`: uniform choice, ignoring scores.

use super::PickerParams;
use crate::endpoint::EndpointId;
use crate::scheduling::Candidate;
use rand::seq::SliceRandom;
use rand::Rng;

#[derive(Clone, Debug)]
pub struct RandomPicker {
    pub(crate) params: PickerParams,
}

impl RandomPicker {
    pub(crate) fn pick(&self, scored: &[(&Candidate, f64)], rng: &mut impl Rng) -> Vec<EndpointId> {
        let mut ids: Vec<EndpointId> = scored.iter().map(|(c, _)| c.id).collect();
        ids.shuffle(rng);
        ids.truncate(self.params.max_num_of_endpoints);
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::cand;
    use rand::{rngs::SmallRng, SeedableRng};

    #[test]
    fn spreads_over_all_candidates() {
        let cands: Vec<_> = (1..=4).map(|p| cand(p, 0.0, 0.0, 0)).collect();
        let scored: Vec<_> = cands.iter().map(|c| (c, 0.0)).collect();
        let p = RandomPicker {
            params: PickerParams::default(),
        };
        let mut rng = SmallRng::seed_from_u64(3);
        let seen: std::collections::HashSet<_> =
            (0..64).map(|_| p.pick(&scored, &mut rng)[0]).collect();
        assert_eq!(seen.len(), 4);
    }
}

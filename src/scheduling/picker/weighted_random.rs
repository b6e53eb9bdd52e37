//! `weighted-random-picker`: chance proportional to score, by A-Res reservoir sampling (key
//! `u^(1/score)`, largest keys win); uniform when every score is ≤ 0, as upstream.

use super::{best_first, PickerParams};
use crate::endpoint::EndpointId;
use crate::scheduling::Candidate;
use rand::Rng;

#[derive(Clone, Debug)]
pub struct WeightedRandomPicker {
    pub(crate) params: PickerParams,
}

impl WeightedRandomPicker {
    pub(crate) fn pick(&self, scored: &[(&Candidate, f64)], rng: &mut impl Rng) -> Vec<EndpointId> {
        let uniform = scored.iter().all(|(_, s)| *s <= 0.0);
        let keyed: Vec<(EndpointId, f64)> = scored
            .iter()
            .map(|(c, s)| {
                let u: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
                let key = match (uniform, *s > 0.0) {
                    (true, _) => u,
                    (false, true) => u.powf(1.0 / s),
                    (false, false) => -1.0,
                };
                (c.id, key)
            })
            .collect();
        best_first(&keyed, self.params.max_num_of_endpoints)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::cand;
    use rand::{rngs::SmallRng, SeedableRng};

    #[test]
    fn frequency_follows_score() {
        let cands = [
            cand(1, 0.0, 0.0, 0),
            cand(2, 0.0, 0.0, 0),
            cand(3, 0.0, 0.0, 0),
        ];
        let scored = [(&cands[0], 3.0), (&cands[1], 1.0), (&cands[2], 0.0)];
        let p = WeightedRandomPicker {
            params: PickerParams::default(),
        };
        let mut rng = SmallRng::seed_from_u64(11);
        let n = 4000;
        let first = (0..n)
            .filter(|_| p.pick(&scored, &mut rng)[0] == cands[0].id)
            .count();
        let share = first as f64 / n as f64;
        assert!((0.70..0.80).contains(&share), "expected ~0.75, got {share}");
        assert!(
            (0..200).all(|_| p.pick(&scored, &mut rng)[0] != cands[2].id),
            "score 0 never wins over positive scores"
        );
    }
}

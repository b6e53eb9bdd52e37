//! `prefix-cache-scorer` reading a gathering producer's placements (llm-d v0.10's
//! `prefixMatchInfoProducerName` naming a `burst-prefix-cache-producer`): the producer emits a
//! full prefix match on the endpoint its window placed the request on and none elsewhere, and
//! this scores that match with the prefix scorer's blend. A request the window left without a
//! placement scores 0 everywhere (upstream: no match information, score 0), leaving it to the
//! other scorers. The profile builder puts this in the prefix scorer's place
//! (`crate::scheduling::profile`).

use super::prefix::MatchBlend;
use crate::scheduling::{Candidate, SchedulingRequest};

#[derive(Clone, Debug)]
pub struct GatheredScorer {
    /// The producer instance whose placements are scored.
    pub(crate) instance: usize,
    pub(crate) blend: MatchBlend,
}

impl GatheredScorer {
    pub(crate) fn score(&self, req: &SchedulingRequest<'_>, pool: &[&Candidate], out: &mut [f64]) {
        let placed = req.gathered.iter().find(|p| p.instance == self.instance);
        for (o, c) in out.iter_mut().zip(pool) {
            *o = match placed {
                Some(p) if p.endpoint == c.id => self.blend.score(p.blocks, p.blocks, p.block_size),
                Some(p) => self.blend.score(0, p.blocks, p.block_size),
                None => 0.0,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::gather::Placement;
    use crate::scheduling::testing::cand;

    #[test]
    fn the_placed_endpoint_scores_a_full_match_and_the_others_none() {
        let cands = [cand(1, 0.0, 0.0, 0), cand(2, 0.0, 0.0, 0)];
        let pool: Vec<&Candidate> = cands.iter().collect();
        let placed = [Placement {
            instance: 7,
            endpoint: cands[1].id,
            blocks: 3,
            block_size: 64,
        }];
        let scorer = GatheredScorer {
            instance: 7,
            blend: MatchBlend::default(),
        };
        let mut out = [9.0; 2];
        let req = SchedulingRequest {
            gathered: &placed,
            ..Default::default()
        };
        scorer.score(&req, &pool, &mut out);
        assert_eq!(out, [0.0, 1.0]);
        let other = GatheredScorer {
            instance: 8,
            ..scorer
        };
        other.score(&req, &pool, &mut out);
        assert_eq!(out, [0.0, 0.0], "another instance's placement is not read");
    }
}

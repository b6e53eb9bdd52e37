//! `weighted-round-robin-picker` and `round-robin-picker`: smooth weighted round robin, as
//! nginx does it, over the candidates that survive the filters. Scores are ignored for the
//! primary; fallbacks (`maxNumOfEndpoints` > 1) follow in score order.
//!
//! # Algorithm (nginx smooth WRR)
//! Each endpoint keeps a `current` counter. Per pick, every candidate adds its weight to its
//! counter, the largest counter wins, and the winner subtracts the candidates' total weight.
//! Over any `Σweights` consecutive picks on a fixed set each endpoint wins exactly `weight`
//! times, and the wins are interleaved (weights 5,1,1 give `a a b a c a a`, not `a a a a a b c`),
//! so a heavy pod never receives a burst. `round-robin-picker` is the same with every weight 1.
//!
//! # State
//! Round robin is the one picker with memory between requests: the counters live behind a
//! mutex shared by clones of the picker (a configuration reload starts afresh). The critical
//! section is O(candidates) additions; endpoints absent from a request keep their counters,
//! and counters of endpoints gone for good are dropped once the map outgrows the live set.

use super::{fill_by_score, PickerParams};
use crate::endpoint::EndpointId;
use crate::scheduling::Candidate;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Clone, Debug, Default)]
pub struct RoundRobinPicker {
    pub(crate) params: PickerParams,
    /// Use `Candidate::weight` (`weighted-round-robin-picker`) or weight 1 for all.
    pub(crate) weighted: bool,
    current: Arc<Mutex<HashMap<EndpointId, i64>>>,
}

impl RoundRobinPicker {
    pub(crate) fn new(params: PickerParams, weighted: bool) -> Self {
        Self {
            params,
            weighted,
            current: Arc::default(),
        }
    }

    fn weight(&self, c: &Candidate) -> i64 {
        if self.weighted {
            i64::from(c.weight)
        } else {
            1
        }
    }

    pub(crate) fn pick(&self, scored: &[(&Candidate, f64)]) -> Vec<EndpointId> {
        let Some(primary) = self.next(scored) else {
            return Vec::new();
        };
        fill_by_score(primary, scored, self.params.max_num_of_endpoints)
    }

    /// One step of smooth WRR; `None` only for an empty pool. Weight-0 endpoints win only when
    /// every candidate has weight 0 (then the set is served in plain rotation).
    fn next(&self, scored: &[(&Candidate, f64)]) -> Option<EndpointId> {
        let all_zero = scored.iter().all(|(c, _)| self.weight(c) == 0);
        let weight = |c: &Candidate| if all_zero { 1 } else { self.weight(c) };
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.len() > 4 * scored.len() + 64 {
            current.retain(|id, _| scored.iter().any(|(c, _)| c.id == *id));
        }
        let mut total = 0i64;
        let mut best: Option<(EndpointId, i64)> = None;
        for (c, _) in scored {
            let w = weight(c);
            if w == 0 {
                continue;
            }
            let cw = current.entry(c.id).or_insert(0);
            *cw += w;
            total += w;
            if best.is_none_or(|(_, b)| *cw > b) {
                best = Some((c.id, *cw));
            }
        }
        let (id, _) = best?;
        if let Some(cw) = current.get_mut(&id) {
            *cw -= total;
        }
        Some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::cand;
    use proptest::prelude::*;

    fn weighted(ws: &[u32]) -> Vec<Candidate> {
        ws.iter()
            .enumerate()
            .map(|(i, w)| Candidate {
                weight: *w,
                ..cand(i as u16 + 1, 0.0, 0.0, 0)
            })
            .collect()
    }

    fn port(id: EndpointId) -> u16 {
        id.0.port()
    }

    #[test]
    fn five_one_one_interleaves_like_nginx() {
        let cands = weighted(&[5, 1, 1]);
        let scored: Vec<_> = cands.iter().map(|c| (c, 0.0)).collect();
        let p = RoundRobinPicker::new(PickerParams::default(), true);
        let seq: Vec<u16> = (0..7).map(|_| port(p.pick(&scored)[0])).collect();
        assert_eq!(seq, vec![1, 1, 2, 1, 3, 1, 1]);
    }

    #[test]
    fn plain_round_robin_ignores_weights_and_fallbacks_follow_scores() {
        let cands = weighted(&[9, 1, 1]);
        let scored = [(&cands[0], 0.1), (&cands[1], 0.9), (&cands[2], 0.5)];
        let p = RoundRobinPicker::new(
            PickerParams {
                max_num_of_endpoints: 3,
            },
            false,
        );
        let firsts: Vec<u16> = (0..6).map(|_| port(p.pick(&scored)[0])).collect();
        assert_eq!(firsts, vec![1, 2, 3, 1, 2, 3]);
        assert_eq!(
            p.pick(&scored).iter().map(|e| port(*e)).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        assert_eq!(
            p.pick(&scored).iter().map(|e| port(*e)).collect::<Vec<_>>(),
            vec![2, 3, 1]
        );
    }

    #[test]
    fn zero_weights_are_skipped_unless_all_are_zero() {
        let cands = weighted(&[0, 2]);
        let scored: Vec<_> = cands.iter().map(|c| (c, 0.0)).collect();
        let p = RoundRobinPicker::new(PickerParams::default(), true);
        assert!((0..10).all(|_| port(p.pick(&scored)[0]) == 2));
        let zeros = weighted(&[0, 0]);
        let scored: Vec<_> = zeros.iter().map(|c| (c, 0.0)).collect();
        let seen: std::collections::HashSet<u16> =
            (0..4).map(|_| port(p.pick(&scored)[0])).collect();
        assert_eq!(seen.len(), 2);
        assert!(p.pick(&[]).is_empty());
    }

    proptest! {
        #[test]
        fn each_endpoint_wins_exactly_its_weight_per_cycle(ws in proptest::collection::vec(1u32..8, 1..8), cycles in 1usize..4) {
            let cands = weighted(&ws);
            let scored: Vec<_> = cands.iter().map(|c| (c, 0.0)).collect();
            let p = RoundRobinPicker::new(PickerParams::default(), true);
            let total: u32 = ws.iter().sum();
            let mut wins: HashMap<u16, u32> = HashMap::new();
            for _ in 0..(total as usize * cycles) {
                *wins.entry(port(p.pick(&scored)[0])).or_default() += 1;
            }
            for (i, w) in ws.iter().enumerate() {
                prop_assert_eq!(wins.get(&(i as u16 + 1)).copied().unwrap_or(0), w * cycles as u32);
            }
        }
    }
}

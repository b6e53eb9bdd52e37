//! `no-hit-lru-scorer` (llm-d): spread prompts nobody holds over the endpoints that have gone
//! longest without one, so new prefixes land evenly and later hits find them.
//!
//! A request is cold when no candidate holds any of its blocks; a warm request scores 0.5
//! everywhere (the prefix scorers decide). For a cold one over `N` candidates: endpoints never
//! given a cold request come first, in candidate order (`1 − i/(N−1)`), then the others from
//! least to most recently used (`rank = never-used count + LRU position`,
//! `max(0, 1 − rank/(N−1))`); one candidate scores 1.
//!
//! # State
//! The scorer owns its [`LruOrder`]: scoring reads it, and after a cold request is placed its
//! `pre_request` moves the primary to the newest end (upstream's `PreRequest`). Positions count
//! every endpoint still in the LRU, as upstream's do (an endpoint that left keeps its slot
//! until evicted). Upstream decides coldness over the filtered candidates; here it is every
//! candidate, which differs only when a filter drops each endpoint holding part of the prompt.

use crate::endpoint::EndpointId;
use crate::plugin::Invalid;
use crate::scheduling::lifecycle::{Lifecycle, Owned, Placed};
use crate::scheduling::{Candidate, SchedulingRequest};
use std::collections::VecDeque;

const DEFAULT_LRU_SIZE: i64 = 1024;

#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct NoHitLruScorer {
    /// Endpoints remembered (≤ 0 → 1024).
    pub(crate) lru_size: i64,
    /// Names the prefix producer; epp has one, so any name is accepted.
    pub(crate) prefix_match_info_producer_name: String,
    /// Accepted and unused, as upstream.
    pub(crate) prefix_plugin_type: String,
    pub(crate) prefix_plugin_name: String,
    /// Endpoints by their last cold request.
    #[serde(skip)]
    order: Owned<LruOrder>,
}

impl Default for NoHitLruScorer {
    fn default() -> Self {
        Self {
            lru_size: DEFAULT_LRU_SIZE,
            prefix_match_info_producer_name: String::new(),
            prefix_plugin_type: String::new(),
            prefix_plugin_name: String::new(),
            order: Owned::default(),
        }
    }
}

impl NoHitLruScorer {
    pub(crate) fn validate(mut self) -> Result<Self, Invalid> {
        if self.lru_size <= 0 {
            self.lru_size = DEFAULT_LRU_SIZE;
        }
        Ok(self)
    }

    /// How many endpoints the LRU remembers.
    pub(crate) fn capacity(&self) -> usize {
        usize::try_from(self.lru_size).unwrap_or(1).max(1)
    }

    pub(crate) fn score(&self, _req: &SchedulingRequest<'_>, pool: &[&Candidate], out: &mut [f64]) {
        if !is_cold(pool) {
            out.fill(0.5);
            return;
        }
        let n = pool.len();
        if n == 1 {
            out.fill(1.0);
            return;
        }
        let span = (n - 1) as f64;
        let lru = self.order.lock();
        let position = |c: &Candidate| lru.order.iter().position(|id| *id == c.id);
        let never_used = pool.iter().filter(|c| position(c).is_none()).count();
        let mut next_never = 0;
        for (o, c) in out.iter_mut().zip(pool) {
            let rank = match position(c) {
                Some(pos) => never_used + pos,
                None => {
                    next_never += 1;
                    next_never - 1
                }
            };
            *o = (1.0 - rank as f64 / span).max(0.0);
        }
    }
}

impl Lifecycle for NoHitLruScorer {
    /// A cold request makes its primary the most recently used endpoint.
    fn pre_request(&self, placed: &Placed<'_>) {
        if placed.candidates.iter().all(|c| c.prefix_blocks == 0) {
            self.order.lock().touch(placed.primary, self.capacity());
        }
    }

    fn snapshot(&self) -> Option<serde_json::Value> {
        let order = self.order.lock().snapshot();
        let order: Vec<String> = order.iter().map(ToString::to_string).collect();
        Some(serde_json::json!({ "lru": order }))
    }

    fn instance(&self) -> usize {
        self.order.instance()
    }
}

/// No candidate holds any block of the prompt.
pub(crate) fn is_cold(pool: &[&Candidate]) -> bool {
    pool.iter().all(|c| c.prefix_blocks == 0)
}

/// Endpoints in order of their last cold request, oldest first, at most `capacity` of them.
#[derive(Clone, Debug, Default)]
pub(crate) struct LruOrder {
    order: VecDeque<EndpointId>,
}

impl LruOrder {
    /// Moves `id` to the newest end, forgetting the oldest beyond `capacity`.
    pub(crate) fn touch(&mut self, id: EndpointId, capacity: usize) {
        if let Some(i) = self.order.iter().position(|e| *e == id) {
            self.order.remove(i);
        }
        self.order.push_back(id);
        while self.order.len() > capacity.max(1) {
            self.order.pop_front();
        }
    }

    /// The order, oldest first.
    pub(crate) fn snapshot(&self) -> Vec<EndpointId> {
        self.order.iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::plugin::params;
    use crate::scheduling::testing::cand;

    fn scores(lru: &[u16], pool: &[Candidate]) -> Vec<f64> {
        let scorer = NoHitLruScorer::default();
        for p in lru {
            scorer.order.lock().touch(cand(*p, 0.0, 0.0, 0).id, 1024);
        }
        let refs: Vec<&Candidate> = pool.iter().collect();
        let mut out = vec![0.0; refs.len()];
        scorer.score(&SchedulingRequest::default(), &refs, &mut out);
        out
    }

    fn cold(ports: &[u16]) -> Vec<Candidate> {
        ports.iter().map(|p| cand(*p, 0.0, 0.0, 0)).collect()
    }

    #[test]
    fn cold_requests_prefer_never_used_then_least_recently_used() {
        let table: [(&[u16], Vec<Candidate>, &[f64]); 5] = [
            (&[], cold(&[1, 2, 3]), &[1.0, 0.5, 0.0]),
            // 3 never used; 2 older than 1.
            (&[2, 1], cold(&[1, 2, 3]), &[0.0, 0.5, 1.0]),
            // 9 left the pool but keeps its slot: ranks shift, clamped at 0.
            (&[9, 2, 1], cold(&[1, 2, 3]), &[0.0, 0.0, 1.0]),
            (&[1], cold(&[1]), &[1.0]),
            // Warm: somebody holds a block.
            (
                &[],
                vec![cand(1, 0.0, 0.0, 2), cand(2, 0.0, 0.0, 0)],
                &[0.5, 0.5],
            ),
        ];
        for (lru, pool, want) in table {
            assert_eq!(scores(lru, &pool), want, "{lru:?}");
        }
    }

    #[test]
    fn the_order_moves_touched_endpoints_to_the_newest_end_within_capacity() {
        let id = |p| cand(p, 0.0, 0.0, 0).id;
        let mut lru = LruOrder::default();
        for p in [1, 2, 3, 1] {
            lru.touch(id(p), 3);
        }
        assert_eq!(lru.snapshot(), vec![id(2), id(3), id(1)]);
        lru.touch(id(4), 3);
        assert_eq!(lru.snapshot(), vec![id(3), id(1), id(4)]);
        let v: serde_norway::Value =
            serde_norway::from_str("{lruSize: 0, prefixPluginType: x, prefixPluginName: y}")
                .unwrap();
        assert_eq!(
            params::<NoHitLruScorer>(&v)
                .unwrap()
                .validate()
                .unwrap()
                .capacity(),
            1024
        );
    }
}

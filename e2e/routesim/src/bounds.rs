//! Two bounds a router is measured against, computed from the very token sequences a run sends:
//!
//! - **The own-prefill floor**: each request served alone on an idle pod (the fastest) that
//!   holds every block of its prefix that was ever sent before (capped at what one pod's cache
//!   can hold): its TTFT is the steps that compute the rest of its prompt, nothing else. No
//!   router can do better on any request.
//! - **Cache hit rates without load**: `ideal` is the share of prompt tokens that an unbounded
//!   cache would hold (every earlier prefix); `oracle` places each request, knowing every pod's
//!   cache exactly, on the pod holding its longest prefix (ties: the pod given the fewest
//!   tokens), with the pods' real cache sizes and LRU eviction, and ignores load. A router
//!   beyond `oracle`'s hit rate is possible (look-ahead) but rare; one far below it is leaving
//!   cache on the table.

use inference_sim::tokenizer::TokenId;
use inference_sim::EngineConfig;
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::time::Duration;

/// Above this many pods the oracle placement is skipped (its cost grows with pods × blocks).
pub const ORACLE_MAX_PODS: usize = 64;

/// What the bounds say of one request.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Bound {
    pub prompt_tokens: usize,
    /// Own-prefill floor TTFT, seconds.
    pub floor_ttft: f64,
    /// Prompt tokens an unbounded cache holds.
    pub ideal_cached: usize,
    /// Prompt tokens the oracle placement finds cached (`None` above [`ORACLE_MAX_PODS`]).
    pub oracle_cached: Option<usize>,
}

/// The bounds' state over one run.
pub struct Bounds {
    engine: EngineConfig,
    fastest: f64,
    seen: HashSet<u64>,
    oracle: Option<Vec<LruBlocks>>,
    given: Vec<u64>,
}

impl Bounds {
    pub fn new(engine: &EngineConfig, pods: usize, fastest: f64) -> Self {
        let capacity = engine.num_gpu_blocks.saturating_sub(1);
        Self {
            engine: engine.clone(),
            fastest: fastest.max(1e-9),
            seen: HashSet::new(),
            oracle: (pods <= ORACLE_MAX_PODS)
                .then(|| (0..pods).map(|_| LruBlocks::new(capacity)).collect()),
            given: vec![0; pods],
        }
    }

    /// The bounds of the next request sent, `tokens` as its pod computes them.
    pub fn observe(&mut self, tokens: &[TokenId]) -> Bound {
        let blocks = chain(tokens, self.engine.block_size);
        // As the engine: at most `len - 1` tokens come from the cache.
        let usable = tokens.len().saturating_sub(1) / self.engine.block_size.max(1);
        let blocks_cap = self.engine.num_gpu_blocks.saturating_sub(1);
        let held = blocks
            .iter()
            .take(usable.min(blocks_cap))
            .take_while(|b| self.seen.contains(b))
            .count();
        self.seen.extend(blocks.iter().copied());
        let ideal_cached = held * self.engine.block_size;
        Bound {
            prompt_tokens: tokens.len(),
            floor_ttft: self.prefill_secs(tokens.len() - ideal_cached.min(tokens.len())),
            ideal_cached,
            oracle_cached: self.place(&blocks, usable, tokens.len() as u64),
        }
    }

    /// Steps to compute `uncached` prompt tokens alone on the fastest pod, chunked to the token
    /// budget; the first token is sampled at the end of the last.
    fn prefill_secs(&self, uncached: usize) -> f64 {
        let t = &self.engine.timing;
        let budget = self.engine.max_num_batched_tokens.max(1);
        let mut left = uncached.max(1);
        let mut total = Duration::ZERO;
        let mut context = 0;
        while left > 0 {
            let chunk = left.min(budget);
            context += chunk;
            total += t.step_overhead
                + t.prefill_per_token * chunk as u32
                + t.attention_per_context_token * context as u32;
            left -= chunk;
        }
        total.as_secs_f64() / self.fastest
    }

    fn place(&mut self, blocks: &[u64], usable: usize, tokens: u64) -> Option<usize> {
        let caches = self.oracle.as_mut()?;
        let best = (0..caches.len()).max_by_key(|&p| {
            let hit = caches[p].prefix(&blocks[..usable.min(blocks.len())]);
            (hit, std::cmp::Reverse(self.given[p]))
        })?;
        let hit = caches[best].prefix(&blocks[..usable.min(blocks.len())]);
        caches[best].touch_all(blocks);
        self.given[best] += tokens;
        Some(hit * self.engine.block_size)
    }
}

/// Chained hashes of the full blocks of `tokens` (each block's hash covers its whole prefix).
fn chain(tokens: &[TokenId], block_size: usize) -> Vec<u64> {
    let mut parent = 0u64;
    tokens
        .chunks_exact(block_size.max(1))
        .map(|block| {
            let mut h = DefaultHasher::new();
            parent.hash(&mut h);
            block.hash(&mut h);
            parent = h.finish();
            parent
        })
        .collect()
}

/// One pod's cache in the oracle: block hashes with LRU eviction at a capacity.
struct LruBlocks {
    capacity: usize,
    stamp: u64,
    used: HashMap<u64, u64>,
    order: BTreeMap<u64, u64>,
}

impl LruBlocks {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            stamp: 0,
            used: HashMap::new(),
            order: BTreeMap::new(),
        }
    }

    /// Leading blocks of `blocks` held.
    fn prefix(&self, blocks: &[u64]) -> usize {
        blocks
            .iter()
            .take_while(|b| self.used.contains_key(b))
            .count()
    }

    fn touch_all(&mut self, blocks: &[u64]) {
        for &b in blocks {
            self.stamp += 1;
            if let Some(old) = self.used.insert(b, self.stamp) {
                self.order.remove(&old);
            }
            self.order.insert(self.stamp, b);
        }
        while self.used.len() > self.capacity {
            let Some((_, b)) = self.order.pop_first() else {
                break;
            };
            self.used.remove(&b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine() -> EngineConfig {
        EngineConfig {
            block_size: 4,
            num_gpu_blocks: 4,
            ..EngineConfig::default()
        }
    }

    #[test]
    fn a_repeated_prompt_is_held_but_for_its_last_token_and_the_floor_shrinks() {
        let mut b = Bounds::new(&engine(), 2, 1.0);
        let prompt: Vec<u32> = (0..9).collect();
        let first = b.observe(&prompt);
        assert_eq!(first.ideal_cached, 0);
        let again = b.observe(&prompt);
        // 9 tokens: 2 full blocks usable (at most 8 of len - 1 = 8).
        assert_eq!(again.ideal_cached, 8);
        assert!(again.floor_ttft < first.floor_ttft);
        assert_eq!(again.oracle_cached, Some(8));
    }

    #[test]
    fn the_oracle_evicts_at_the_pods_capacity() {
        let mut b = Bounds::new(&engine(), 1, 1.0);
        let a: Vec<u32> = (0..13).collect();
        let other: Vec<u32> = (100..113).collect();
        b.observe(&a);
        b.observe(&other);
        // Capacity 3 blocks: `other`'s three evicted `a`'s.
        let back = b.observe(&a);
        assert_eq!(back.ideal_cached, 12);
        assert_eq!(back.oracle_cached, Some(0));
    }
}

//! The approximate prefix index: per-endpoint LRUs of block hashes plus a reverse map, so a
//! lookup touches only the endpoints that hold the request's blocks. See the parent module for
//! the algorithm and its costs.

use crate::endpoint::EndpointId;
use lru::LruCache;
use smallvec::SmallVec;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::RwLock;

/// Block hashes are already uniformly distributed: hash them by identity.
#[derive(Default, Clone, Copy)]
pub struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type IdBuild = BuildHasherDefault<IdentityHasher>;
type Slot = u32;
type Lru = LruCache<u64, (), IdBuild>;
/// The endpoints holding a block, sorted. Inline up to four: most blocks have one holder, and a
/// heap list per block cost an allocation on every insert and a free on every eviction (about a
/// tenth of a cold 8K-token route, perf on `cold_text` in `e2e/benches/decision.rs`).
type Holders = SmallVec<[Slot; 4]>;

struct Inner {
    slots: HashMap<EndpointId, Slot>,
    lrus: Vec<Option<(EndpointId, Lru)>>,
    holders: HashMap<u64, Holders, IdBuild>,
}

/// Which endpoints were routed which prefixes. Shared by every request; see module docs.
pub struct PrefixIndex {
    inner: RwLock<Inner>,
    /// Index tokens per model-server token, when the index counts pseudo-tokens.
    pub scale: TokenScale,
}

/// How many of the index's tokens make one token of the model server, learned from the
/// responses' `usage.prompt_tokens`.
///
/// Why: with `tokenizer: characters` the index counts 4-byte pseudo-tokens, while the pods
/// report their cache in blocks of real tokens. Sized in pseudo-blocks as if they were real
/// ones, the index forgets prefixes the pods still hold whenever text runs longer than 4 bytes a
/// token (one-token English words average ~4.7), and spreads groups it should keep together
/// (shared-prefix hit rate 41–47% against cl100k's 69%; BENCHMARKS.md). Until the first
/// response teaches it there is no conversion (the configured capacity holds): a group spread
/// over two pods by an index that forgot too early stays spread. Stored in 1/64 steps so the
/// capacity it scales changes only when the ratio does.
pub struct TokenScale {
    /// Index tokens per server token × 64; 0 until a response teaches it.
    sixty_fourths: AtomicU32,
}

impl TokenScale {
    const ONE: u32 = 64;
    /// The ratio is kept within 1/4..=4 (a response outside is an outlier, not a tokenizer).
    const MIN: u32 = Self::ONE / 4;
    const MAX: u32 = Self::ONE * 4;

    /// The learned ratio, 1.0 until a response has taught one.
    pub fn get(&self) -> f64 {
        match self.sixty_fourths.load(Ordering::Relaxed) {
            0 => 1.0,
            q => f64::from(q) / f64::from(Self::ONE),
        }
    }

    /// `ours` index tokens were `theirs` tokens for the model server: moves the ratio a tenth of
    /// the way towards this observation (the first sets it).
    pub fn observe(&self, ours: u32, theirs: u64) {
        if ours == 0 || theirs == 0 {
            return;
        }
        let seen = f64::from(ours) / theirs as f64 * f64::from(Self::ONE);
        let seen = seen.clamp(f64::from(Self::MIN), f64::from(Self::MAX));
        let _ = self
            .sixty_fourths
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| {
                let next = if q == 0 {
                    seen
                } else {
                    f64::from(q) + (seen - f64::from(q)) / 10.0
                };
                Some(next.round() as u32)
            });
    }

    /// `blocks` of the model server's tokens, in the index's blocks; `None` until a response
    /// has taught the ratio.
    pub fn blocks(&self, blocks: usize) -> Option<usize> {
        match self.sixty_fourths.load(Ordering::Relaxed) {
            0 => None,
            q => Some(blocks.saturating_mul(q as usize) / Self::ONE as usize),
        }
    }
}

impl Default for PrefixIndex {
    fn default() -> Self {
        Self::new()
    }
}

impl PrefixIndex {
    pub fn new() -> Self {
        let inner = Inner {
            slots: HashMap::new(),
            lrus: Vec::new(),
            holders: HashMap::default(),
        };
        Self {
            inner: RwLock::new(inner),
            scale: TokenScale {
                sixty_fourths: AtomicU32::new(0),
            },
        }
    }

    /// Longest run of consecutive leading blocks of `hashes` held by each endpoint; endpoints with
    /// no match are absent.
    pub fn longest_prefix(&self, hashes: &[u64]) -> Vec<(EndpointId, usize)> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        // `alive` holds the endpoints that hold every block so far (sorted); an endpoint that
        // drops out at block i matched exactly i blocks.
        let mut alive: Vec<Slot> = Vec::new();
        let mut matched: Vec<(Slot, usize)> = Vec::new();
        let mut depth = 0;
        for (i, h) in hashes.iter().enumerate() {
            let holders = inner.holders.get(h).map_or(&[][..], Holders::as_slice);
            if i == 0 {
                alive.extend_from_slice(holders);
            } else if holders != alive.as_slice() {
                alive.retain(|s| {
                    let keep = holders.binary_search(s).is_ok();
                    if !keep {
                        matched.push((*s, i));
                    }
                    keep
                });
            }
            if alive.is_empty() {
                break;
            }
            depth = i + 1;
        }
        matched.extend(alive.into_iter().map(|s| (s, depth)));
        matched
            .into_iter()
            .filter_map(|(slot, n)| inner.endpoint(slot).map(|id| (id, n)))
            .collect()
    }

    /// Records that `hashes` were routed to `endpoint`, whose cache holds `capacity` blocks.
    ///
    /// Last block first, so the prompt's head is the most recently used: a model server frees a
    /// request's blocks in reverse (vLLM's block pool, inference-sim) so that a full cache
    /// evicts a prompt's tail before its head, and a prefix survives as long as its first
    /// blocks do. Recorded head first, the index evicted the head first and forgot the whole
    /// prefix (a match needs block 0) while the pod still held all but its tail.
    pub fn record(&self, endpoint: EndpointId, hashes: &[u64], capacity: usize) {
        if hashes.is_empty() {
            return;
        }
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let slot = inner.slot_for(endpoint, capacity);
        for h in hashes.iter().rev() {
            inner.insert(slot, *h);
        }
    }

    /// Forgets endpoints that no longer exist.
    pub fn retain(&self, live: &HashSet<EndpointId>) {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let gone: Vec<(EndpointId, Slot)> = inner
            .slots
            .iter()
            .filter(|(id, _)| !live.contains(id))
            .map(|(id, s)| (*id, *s))
            .collect();
        for (id, slot) in gone {
            inner.slots.remove(&id);
            if let Some((_, lru)) = inner.lrus[slot as usize].take() {
                for (h, ()) in lru.iter() {
                    inner.unhold(*h, slot);
                }
            }
        }
    }

    /// Blocks held across all endpoints.
    pub fn size(&self) -> usize {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        inner.lrus.iter().flatten().map(|(_, l)| l.len()).sum()
    }
}

impl Inner {
    fn endpoint(&self, slot: Slot) -> Option<EndpointId> {
        self.lrus.get(slot as usize)?.as_ref().map(|(id, _)| *id)
    }

    fn slot_for(&mut self, endpoint: EndpointId, capacity: usize) -> Slot {
        let cap = NonZeroUsize::new(capacity.max(1)).unwrap_or(NonZeroUsize::MIN);
        if let Some(slot) = self.slots.get(&endpoint).copied() {
            if let Some((_, lru)) = self.lrus[slot as usize].as_mut() {
                if lru.cap() != cap {
                    let evicted = shrink(lru, cap);
                    evicted.into_iter().for_each(|h| self.unhold(h, slot));
                }
            }
            return slot;
        }
        // Grown with its content, not allocated at `cap` buckets: 100 pods × 8,001 blocks
        // preallocated was ~26 MB of tables whose pages the few first inserts, landing on
        // random buckets, made resident (BENCHMARKS.md, "The default tokenizer without ...").
        let mut lru = LruCache::unbounded_with_hasher(IdBuild::default());
        lru.resize(cap);
        let entry = Some((endpoint, lru));
        let slot = match self.lrus.iter().position(Option::is_none) {
            Some(free) => {
                self.lrus[free] = entry;
                free
            }
            None => {
                self.lrus.push(entry);
                self.lrus.len() - 1
            }
        } as Slot;
        self.slots.insert(endpoint, slot);
        slot
    }

    fn insert(&mut self, slot: Slot, hash: u64) {
        let Some((_, lru)) = self.lrus[slot as usize].as_mut() else {
            return;
        };
        if lru.get(&hash).is_some() {
            return;
        }
        if let Some((old, ())) = lru.push(hash, ()) {
            if old != hash {
                self.unhold(old, slot);
            }
        }
        let holders = self.holders.entry(hash).or_default();
        if let Err(at) = holders.binary_search(&slot) {
            holders.insert(at, slot);
        }
    }

    fn unhold(&mut self, hash: u64, slot: Slot) {
        if let Some(holders) = self.holders.get_mut(&hash) {
            holders.retain(|s| *s != slot);
            if holders.is_empty() {
                self.holders.remove(&hash);
            }
        }
    }
}

fn shrink(lru: &mut LruCache<u64, (), IdBuild>, cap: NonZeroUsize) -> Vec<u64> {
    let mut evicted = Vec::new();
    while lru.len() > cap.get() {
        match lru.pop_lru() {
            Some((h, ())) => evicted.push(h),
            None => break,
        }
    }
    lru.resize(cap);
    evicted
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ep(n: u16) -> EndpointId {
        format!("10.0.0.1:{n}").parse().unwrap()
    }

    #[test]
    fn counts_only_consecutive_blocks_per_endpoint() {
        let idx = PrefixIndex::new();
        idx.record(ep(1), &[1, 2, 3, 4], 100);
        idx.record(ep(2), &[1, 9, 3, 4], 100);
        let mut m = idx.longest_prefix(&[1, 2, 3, 4]);
        m.sort();
        assert_eq!(m, vec![(ep(1), 4), (ep(2), 1)]);
        assert!(
            idx.longest_prefix(&[7, 1]).is_empty(),
            "a miss on block 0 matches nothing"
        );
    }

    #[test]
    fn lru_evicts_oldest_and_forgets_removed_endpoints() {
        let idx = PrefixIndex::new();
        idx.record(ep(1), &[1], 2);
        idx.record(ep(1), &[2], 2);
        idx.record(ep(1), &[3], 2);
        assert!(
            idx.longest_prefix(&[1]).is_empty(),
            "block 1 was least recently used"
        );
        assert_eq!(idx.longest_prefix(&[2]), vec![(ep(1), 1)]);
        idx.record(ep(2), &[2], 10);
        idx.retain(&[ep(2)].into_iter().collect());
        assert_eq!(idx.longest_prefix(&[2]), vec![(ep(2), 1)]);
        assert_eq!(idx.size(), 1);
    }

    #[test]
    fn a_full_lru_evicts_a_prompts_tail_before_its_head() {
        let idx = PrefixIndex::new();
        idx.record(ep(1), &[1, 2, 3], 3);
        idx.record(ep(1), &[9], 3);
        assert_eq!(
            idx.longest_prefix(&[1, 2, 3]),
            vec![(ep(1), 2)],
            "the tail block went, the head stayed (as the pod frees them)"
        );
        idx.record(ep(1), &[7], 3);
        assert_eq!(idx.longest_prefix(&[1, 2, 3]), vec![(ep(1), 1)]);
        assert_eq!(idx.longest_prefix(&[7]), vec![(ep(1), 1)]);
    }

    #[test]
    fn token_scale_starts_at_one_learns_a_tenth_at_a_time_and_stays_bounded() {
        let s = PrefixIndex::new().scale;
        assert_eq!((s.get(), s.blocks(1000)), (1.0, None));
        s.observe(0, 10);
        s.observe(10, 0);
        assert_eq!(s.get(), 1.0, "empty observations teach nothing");
        s.observe(1180, 1000);
        assert_eq!(
            s.blocks(1000),
            Some(1187),
            "the first sets it, in 1/64 steps (76/64)"
        );
        s.observe(2000, 1000);
        assert_eq!(
            s.get(),
            81.0 / 64.0,
            "a tenth of the way: 76 + (128 - 76) / 10 ≈ 81"
        );
        let s = PrefixIndex::new().scale;
        s.observe(1_000_000, 1);
        assert_eq!(s.get(), 4.0);
        s.observe(1, 1_000_000);
        assert!(s.get() > 0.25 && s.get() < 4.0);
    }

    proptest! {
        #[test]
        fn index_respects_capacity(records in proptest::collection::vec((1u16..4, proptest::collection::vec(0u64..50, 0..20)), 0..40), cap in 1usize..16) {
            let idx = PrefixIndex::new();
            for (e, hashes) in &records {
                idx.record(ep(*e), hashes, cap);
            }
            prop_assert!(idx.size() <= 3 * cap);
            for (e, n) in idx.longest_prefix(&[0, 1, 2, 3]) {
                prop_assert!(n <= 4 && e.0.port() < 4);
            }
        }
    }
}

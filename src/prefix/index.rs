//! The approximate prefix index: per-endpoint LRUs of block hashes plus a reverse map, so a
//! lookup touches only the endpoints that hold the request's blocks. See the parent module for
//! the algorithm and its costs.

use crate::endpoint::EndpointId;
use lru::LruCache;
use smallvec::SmallVec;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::num::NonZeroUsize;
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
    pub fn record(&self, endpoint: EndpointId, hashes: &[u64], capacity: usize) {
        if hashes.is_empty() {
            return;
        }
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let slot = inner.slot_for(endpoint, capacity);
        for h in hashes {
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
        let entry = Some((endpoint, LruCache::with_hasher(cap, IdBuild::default())));
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
        idx.record(ep(1), &[1, 2], 2);
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

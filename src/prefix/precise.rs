//! The precise prefix index: what every endpoint's KV cache actually holds, fed by the vLLM
//! KV-cache events that `kvevents` decodes, plus short-lived speculative entries for what epp
//! just routed and the pod has not announced yet.
//!
//! # Algorithm
//! Keys are epp's own chained block keys ([`super::chain_block`] over the block's token ids,
//! seeded with the model name), **not** the pods' hashes: a BlockStored event carries its
//! `token_ids`, so the subscriber computes the same key the director computes from the
//! request's tokens, whatever hash algorithm or `PYTHONHASHSEED` the pods run with (llm-d's
//! "dual key" design). A block's parent key is found through the per-endpoint map
//! `engine hash → request key`; a block whose parent the index never saw is skipped
//! (its key cannot be computed), as are its descendants in the same event.
//!
//! State: `engine: HashMap<engine hash, key>`, shared by all endpoints (an engine hash names
//! content, so pods agree on it or never collide), and `holders: HashMap<key, Holders>`: the
//! sorted endpoint slots holding the key, each with a reference count (the same hash may be
//! stored twice, two physical copies announced by two BlockStored and removed by two
//! BlockRemoved). A
//! lookup walks the request's keys in order and keeps the set of endpoints that held every key
//! so far (sorted slot lists, merged linearly), so the answer is the longest **consecutive**
//! cached prefix per endpoint. Speculative entries `(key, slot, expiry)` live in a side map and a
//! FIFO; they count as held until they expire.
//!
//! Complexity: store/remove O(1) expected per block (one xxh64 of the block's tokens, two map
//! operations); clear O(blocks of that endpoint); lookup O(Σ holders of matched blocks) and
//! stops at the first block nobody holds. Memory: 16 bytes per engine hash and 24 per key with
//! one holder (a shared key: +24 once, +4 per holder, so shared prefixes are cheap), plus the hash tables' control
//! bytes and slack
//! (BENCHMARKS.md, "Precise prefix").
//!
//! Concurrency: one `RwLock`. Each endpoint's subscriber applies a whole event batch under one
//! write lock ([`PreciseIndex::writer`]); lookups share the read lock. Time comes in as an
//! `Instant` so tests control expiry.

pub mod home;

use super::index::IdentityHasher;
use crate::endpoint::EndpointId;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::BuildHasherDefault;
use std::sync::{RwLock, RwLockWriteGuard};
use std::time::{Duration, Instant};

type IdBuild = BuildHasherDefault<IdentityHasher>;
type Slot = u16;

/// One endpoint holding a key, and how many distinct engine hashes of it map there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Holder {
    slot: Slot,
    refs: u16,
}

/// Holders of one key, sorted by slot; one holder is stored inline. The list is boxed so the
/// value is 16 bytes: most keys have one holder, and the table entry is what costs.
#[derive(Debug)]
enum Holders {
    One(Holder),
    #[allow(clippy::box_collection)]
    Many(Box<Vec<Holder>>),
}

impl Holders {
    fn as_slice(&self) -> &[Holder] {
        match self {
            Self::One(h) => std::slice::from_ref(h),
            Self::Many(v) => v,
        }
    }

    /// Adds one reference of `slot`; true when `slot` did not hold the key before.
    fn add(&mut self, slot: Slot) -> bool {
        let mut list = match self {
            Self::One(h) if h.slot == slot => {
                h.refs = h.refs.saturating_add(1);
                return false;
            }
            Self::One(h) => Box::new(vec![*h]),
            Self::Many(v) => std::mem::take(v),
        };
        let new = match list.binary_search_by_key(&slot, |h| h.slot) {
            Ok(i) => {
                list[i].refs = list[i].refs.saturating_add(1);
                false
            }
            Err(i) => {
                list.insert(i, Holder { slot, refs: 1 });
                true
            }
        };
        *self = Self::Many(list);
        new
    }

    /// Removes `slot` whatever its references; true when nobody holds the key any more.
    fn drop_slot(&mut self, slot: Slot) -> bool {
        match self {
            Self::One(h) => h.slot == slot,
            Self::Many(v) => {
                v.retain(|h| h.slot != slot);
                v.is_empty()
            }
        }
    }

    /// Drops one reference of `slot`: `(slot no longer holds the key, nobody holds it)`.
    fn release(&mut self, slot: Slot) -> (bool, bool) {
        let (single, gone, empty) = match self {
            Self::One(h) if h.slot == slot => {
                h.refs -= 1;
                return (h.refs == 0, h.refs == 0);
            }
            Self::One(_) => return (false, false),
            Self::Many(v) => {
                let mut gone = false;
                if let Ok(i) = v.binary_search_by_key(&slot, |h| h.slot) {
                    v[i].refs -= 1;
                    if v[i].refs == 0 {
                        v.remove(i);
                        gone = true;
                    }
                }
                (
                    if let [only] = v.as_slice() {
                        Some(*only)
                    } else {
                        None
                    },
                    gone,
                    v.is_empty(),
                )
            }
        };
        if let Some(only) = single {
            *self = Self::One(only);
        }
        (gone, empty)
    }
}

#[derive(Debug, Default)]
struct Inner {
    slots: HashMap<EndpointId, Slot>,
    /// Slot → endpoint (`None` when free).
    ids: Vec<Option<EndpointId>>,
    /// Engine hash → request key, shared by all endpoints (engine hashes name content).
    engine: HashMap<u64, u64, IdBuild>,
    holders: HashMap<u64, Holders, IdBuild>,
    speculative: HashMap<u64, Vec<(Slot, Instant)>, IdBuild>,
    expiry: VecDeque<(Instant, u64)>,
    block_size: usize,
    /// Keys of first blocks (stored with no parent) that somebody holds.
    roots: HashSet<u64, IdBuild>,
    /// Per slot: how many of `roots` it holds, i.e. how many distinct prompt beginnings.
    prefixes: Vec<u32>,
    /// Per slot: prompt beginnings it evicted, decayed with [`LOST_DECAY`].
    lost: Vec<Decayed>,
    /// Prompt beginnings this replica sent to a slot that did not hold them, until the slot's
    /// BlockStored confirms them or [`PLACED_WINDOW`] passes: `(slot, first block key) → counted
    /// until`, with the same entries oldest first in `placed_order`, and `pending` counting
    /// them per slot (so neither routing nor reading scans them).
    placed: HashMap<(Slot, u64), Instant, rustc_hash::FxBuildHasher>,
    placed_order: VecDeque<(Instant, Slot, u64)>,
    pending: Vec<u32>,
}

/// How long a prompt beginning this replica placed counts towards [`CacheShape::prefixes`]
/// before the pod's events confirm it: about one prefill behind a short queue. Without it a
/// burst of new prefixes (the first seconds of a run) was placed on counts that lagged by a
/// prefill, and one replica's pods ended up holding 4 to 8 of 48 prefixes.
pub(crate) const PLACED_WINDOW: Duration = Duration::from_secs(5);

/// How fast the count of evicted prompt beginnings fades: e-folding time. A pod that evicts the
/// first block of a prompt held a chain past everything after it (vLLM evicts a chain's tail
/// first), so its cache holds more than it fits; a minute later that is old news.
pub(crate) const LOST_DECAY: Duration = Duration::from_secs(30);

/// A count that decays exponentially with [`LOST_DECAY`].
#[derive(Clone, Copy, Debug, Default)]
struct Decayed {
    value: f64,
    at: Option<Instant>,
}

impl Decayed {
    fn at(&self, now: Instant) -> f64 {
        match self.at {
            Some(t) => {
                self.value
                    * (-now.saturating_duration_since(t).as_secs_f64() / LOST_DECAY.as_secs_f64())
                        .exp()
            }
            None => 0.0,
        }
    }

    fn add(&mut self, n: f64, now: Instant) {
        *self = Self {
            value: self.at(now) + n,
            at: Some(now),
        };
    }
}

/// What the events say about an endpoint's cache, for choosing a cold prompt's home.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CacheShape {
    /// Distinct prompt beginnings (first blocks) held, plus those this replica just placed
    /// there and the events have not confirmed yet ([`PLACED_WINDOW`]).
    pub(crate) prefixes: u32,
    /// Prompt beginnings evicted lately (decayed count, see [`LOST_DECAY`]).
    pub lost: f64,
}

/// What every endpoint's KV cache holds; see the module docs.
#[derive(Debug, Default)]
pub struct PreciseIndex {
    inner: RwLock<Inner>,
}

/// Applies one endpoint's events under a single write lock.
pub struct Writer<'a> {
    inner: RwLockWriteGuard<'a, Inner>,
    slot: Slot,
    now: Instant,
}

/// A BlockStored event as the index needs it.
#[derive(Clone, Copy, Debug)]
pub struct Stored<'a> {
    /// The model the blocks belong to: the LoRA adapter name when there is one, else the
    /// base model (from the event topic); it seeds the chain as the director's target model does.
    pub model: &'a str,
    pub parent: Option<u64>,
    pub hashes: &'a [u64],
    pub tokens: &'a [u32],
    pub block_size: usize,
}

impl PreciseIndex {
    pub fn new() -> Self {
        Self::default()
    }

    /// A writer for `endpoint`'s events (creates its slot on first use).
    pub fn writer(&self, endpoint: EndpointId) -> Writer<'_> {
        self.writer_at(endpoint, Instant::now())
    }

    /// [`Self::writer`] with the events' arrival time given (tests).
    pub(crate) fn writer_at(&self, endpoint: EndpointId, now: Instant) -> Writer<'_> {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let slot = inner.slot_for(endpoint);
        Writer { inner, slot, now }
    }

    /// Block size the pods announce (0 until the first BlockStored).
    pub fn block_size(&self) -> usize {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .block_size
    }

    /// Longest run of leading `keys` each endpoint holds (or was speculatively sent before
    /// `now`'s TTL ran out); endpoints with no match are absent.
    pub fn longest_prefix(&self, keys: &[u64], now: Instant) -> Vec<(EndpointId, usize)> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let mut alive: Vec<Slot> = Vec::new();
        let mut cur: Vec<Slot> = Vec::new();
        let mut matched: Vec<(Slot, usize)> = Vec::new();
        let mut depth = 0;
        for (i, key) in keys.iter().enumerate() {
            let holders = inner.holders.get(key).map_or(&[][..], Holders::as_slice);
            if inner.has_speculative(*key, now) {
                inner.holders_at(*key, now, &mut cur);
                intersect(&mut alive, &cur, i == 0, |s| *s, |s| matched.push((s, i)));
            } else {
                intersect(
                    &mut alive,
                    holders,
                    i == 0,
                    |h| h.slot,
                    |s| matched.push((s, i)),
                );
            }
            if alive.is_empty() {
                break;
            }
            depth = i + 1;
        }
        matched.extend(alive.into_iter().map(|s| (s, depth)));
        matched
            .into_iter()
            .filter_map(|(s, n)| inner.ids.get(usize::from(s))?.map(|id| (id, n)))
            .collect()
    }

    /// Counts `keys` as held by `endpoint` until `expires` (routing until the first BlockStored).
    pub(crate) fn speculate(
        &self,
        endpoint: EndpointId,
        keys: &[u64],
        now: Instant,
        ttl: Duration,
    ) {
        if keys.is_empty() {
            return;
        }
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        inner.expire(now);
        let slot = inner.slot_for(endpoint);
        let root = keys[0];
        if !inner.holds(root, slot) {
            if let Entry::Vacant(v) = inner.placed.entry((slot, root)) {
                v.insert(now + PLACED_WINDOW);
                inner
                    .placed_order
                    .push_back((now + PLACED_WINDOW, slot, root));
                if let Some(n) = inner.pending.get_mut(usize::from(slot)) {
                    *n += 1;
                }
            }
        }
        let expires = now + ttl;
        for key in keys {
            let list = inner.speculative.entry(*key).or_default();
            match list.iter_mut().find(|(s, _)| *s == slot) {
                Some(entry) => entry.1 = expires,
                None => list.push((slot, expires)),
            }
            inner.expiry.push_back((expires, *key));
        }
    }

    /// Forgets endpoints that no longer exist.
    pub(crate) fn retain(&self, live: &HashSet<EndpointId>) {
        let gone: Vec<EndpointId> = {
            let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
            inner
                .slots
                .keys()
                .filter(|id| !live.contains(id))
                .copied()
                .collect()
        };
        for id in gone {
            let mut w = self.writer(id);
            w.clear();
            let Writer {
                mut inner, slot, ..
            } = w;
            inner.slots.remove(&id);
            inner.ids[usize::from(slot)] = None;
            inner
                .speculative
                .values_mut()
                .for_each(|l| l.retain(|(s, _)| *s != slot));
            inner.placed.retain(|(s, _), _| *s != slot);
            inner.placed_order.retain(|(_, s, _)| *s != slot);
        }
    }

    /// Each endpoint's [`CacheShape`] at `now`: what the events say, which every replica
    /// computes alike, plus the prompt beginnings this replica placed in the last
    /// [`PLACED_WINDOW`] and the events have not confirmed. Zero for an endpoint the index has
    /// not seen.
    pub fn shapes(
        &self,
        ids: impl IntoIterator<Item = EndpointId>,
        now: Instant,
    ) -> Vec<CacheShape> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        // Entries past their window that no write has expired yet (the oldest ones) no longer count.
        let mut pending = inner.pending.clone();
        for (until, slot, key) in inner
            .placed_order
            .iter()
            .take_while(|(until, _, _)| *until <= now)
        {
            if let Some(n) = pending
                .get_mut(usize::from(*slot))
                .filter(|_| inner.placed.get(&(*slot, *key)) == Some(until))
            {
                *n = n.saturating_sub(1);
            }
        }
        ids.into_iter()
            .map(|id| {
                let Some(s) = inner.slots.get(&id).map(|s| usize::from(*s)) else {
                    return CacheShape::default();
                };
                let held = inner.prefixes.get(s).copied().unwrap_or(0);
                CacheShape {
                    prefixes: held + pending.get(s).copied().unwrap_or(0),
                    lost: inner.lost.get(s).map_or(0.0, |d| d.at(now)),
                }
            })
            .collect()
    }

    /// (endpoint, key) entries confirmed by events.
    pub fn entries(&self) -> usize {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        inner.holders.values().map(|h| h.as_slice().len()).sum()
    }

    /// Heap bytes of the confirmed entries (table capacity × entry size + control bytes, the
    /// holder lists and the set of first-block keys), for the memory budget.
    pub fn heap_bytes(&self) -> usize {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let engine = inner.engine.capacity() * (16 + 1);
        let lists: usize = inner
            .holders
            .values()
            .map(|h| {
                if let Holders::Many(v) = h {
                    24 + v.capacity() * 4
                } else {
                    0
                }
            })
            .sum();
        let roots = inner.roots.capacity() * (8 + 1);
        engine + inner.holders.capacity() * (24 + 1) + lists + roots
    }
}

/// Keeps the slots of `alive` that are in `cur` (both sorted by slot), or takes all of `cur`
/// on the first block; reports each dropped slot. Linear in both lengths.
fn intersect<T>(
    alive: &mut Vec<Slot>,
    cur: &[T],
    first: bool,
    slot: impl Fn(&T) -> Slot,
    mut dropped: impl FnMut(Slot),
) {
    if first {
        alive.extend(cur.iter().map(&slot));
        return;
    }
    if cur.len() == alive.len() && cur.iter().zip(alive.iter()).all(|(c, a)| slot(c) == *a) {
        return;
    }
    let mut j = 0;
    alive.retain(|s| {
        while j < cur.len() && slot(&cur[j]) < *s {
            j += 1;
        }
        let keep = j < cur.len() && slot(&cur[j]) == *s;
        if !keep {
            dropped(*s);
        }
        keep
    });
}

impl Inner {
    fn slot_for(&mut self, endpoint: EndpointId) -> Slot {
        if let Some(slot) = self.slots.get(&endpoint) {
            return *slot;
        }
        let slot = match self.ids.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                self.ids.push(None);
                self.ids.len() - 1
            }
        };
        self.ids[slot] = Some(endpoint);
        if self.prefixes.len() < self.ids.len() {
            self.prefixes.resize(self.ids.len(), 0);
            self.lost.resize(self.ids.len(), Decayed::default());
            self.pending.resize(self.ids.len(), 0);
        }
        self.prefixes[slot] = 0;
        self.lost[slot] = Decayed::default();
        self.pending[slot] = 0;
        let slot = Slot::try_from(slot).unwrap_or(Slot::MAX);
        self.slots.insert(endpoint, slot);
        slot
    }

    /// Whether `slot` holds `key` by the events.
    fn holds(&self, key: u64, slot: Slot) -> bool {
        self.holders
            .get(&key)
            .is_some_and(|h| h.as_slice().iter().any(|h| h.slot == slot))
    }

    fn has_speculative(&self, key: u64, now: Instant) -> bool {
        !self.speculative.is_empty()
            && self
                .speculative
                .get(&key)
                .is_some_and(|l| l.iter().any(|(_, t)| *t > now))
    }

    /// Sorted slots holding `key` (confirmed or speculative and unexpired).
    fn holders_at(&self, key: u64, now: Instant, out: &mut Vec<Slot>) {
        out.clear();
        if let Some(h) = self.holders.get(&key) {
            out.extend(h.as_slice().iter().map(|h| h.slot));
        }
        if let Some(spec) = self.speculative.get(&key) {
            let before = out.len();
            out.extend(spec.iter().filter(|(_, t)| *t > now).map(|(s, _)| *s));
            if out.len() > before {
                out.sort_unstable();
                out.dedup();
            }
        }
    }

    fn expire(&mut self, now: Instant) {
        while let Some((until, slot, key)) = self.placed_order.front().copied() {
            if until > now {
                break;
            }
            self.placed_order.pop_front();
            if self.placed.get(&(slot, key)) == Some(&until) {
                self.placed.remove(&(slot, key));
                if let Some(n) = self.pending.get_mut(usize::from(slot)) {
                    *n = n.saturating_sub(1);
                }
            }
        }
        while let Some((t, key)) = self.expiry.front().copied() {
            if t > now {
                break;
            }
            self.expiry.pop_front();
            if let Some(list) = self.speculative.get_mut(&key) {
                list.retain(|(_, t)| *t > now);
                if list.is_empty() {
                    self.speculative.remove(&key);
                }
            }
        }
    }
}

impl Writer<'_> {
    /// Applies a BlockStored: each new block's key chains from its parent's key.
    pub fn store(&mut self, ev: &Stored<'_>) {
        let bs = ev.block_size.max(1);
        let slot = self.slot;
        let inner = &mut *self.inner;
        inner.block_size = bs;
        // llm-d's adapters read a missing parent as hash 0 (`EmptyBlockHash`), and
        // llm-d-inference-sim's positional encoding sends 0 for "no parent": a 0 that names no
        // stored block is a root, as llm-d-router reads it.
        let parent_hash = ev
            .parent
            .filter(|p| *p != 0 || inner.engine.contains_key(p));
        let mut parent = match parent_hash {
            None => super::chain_seed(ev.model, None),
            Some(p) => match inner.engine.get(&p) {
                Some(key) => *key,
                None => return,
            },
        };
        let mut root = parent_hash.is_none();
        for (hash, block) in ev.hashes.iter().zip(ev.tokens.chunks_exact(bs)) {
            let key = super::chain_block(parent, block);
            parent = key;
            inner.engine.insert(*hash, key);
            // Confirmed: the speculative entry has done its job. Dropping it keeps the index
            // what the events say, so a later BlockRemoved is not outlived by a guess, and every
            // replica, whichever routed the request, sees the same holders from here on.
            if !inner.speculative.is_empty() {
                if let Some(list) = inner.speculative.get_mut(&key) {
                    list.retain(|(s, _)| *s != slot);
                    if list.is_empty() {
                        inner.speculative.remove(&key);
                    }
                }
            }
            let new = match inner.holders.entry(key) {
                Entry::Occupied(mut o) => o.get_mut().add(slot),
                Entry::Vacant(v) => {
                    v.insert(Holders::One(Holder { slot, refs: 1 }));
                    true
                }
            };
            if root && new {
                inner.roots.insert(key);
                if let Some(n) = inner.prefixes.get_mut(usize::from(slot)) {
                    *n += 1;
                }
                // A placement of this beginning is confirmed: it now counts as held.
                if !inner.placed.is_empty() && inner.placed.remove(&(slot, key)).is_some() {
                    if let Some(n) = inner.pending.get_mut(usize::from(slot)) {
                        *n = n.saturating_sub(1);
                    }
                }
            }
            root = false;
        }
    }

    /// Applies a BlockRemoved: one copy of each hash is gone from this endpoint.
    pub fn remove(&mut self, hashes: &[u64]) {
        let (slot, now) = (self.slot, self.now);
        let inner = &mut *self.inner;
        for hash in hashes {
            let Some(key) = inner.engine.get(hash).copied() else {
                continue;
            };
            let Entry::Occupied(mut h) = inner.holders.entry(key) else {
                continue;
            };
            let (gone, empty) = h.get_mut().release(slot);
            if empty {
                h.remove();
                inner.engine.remove(hash);
            }
            if gone && !inner.roots.is_empty() && inner.roots.contains(&key) {
                if let Some(n) = inner.prefixes.get_mut(usize::from(slot)) {
                    *n = n.saturating_sub(1);
                }
                if let Some(l) = inner.lost.get_mut(usize::from(slot)) {
                    l.add(1.0, now);
                }
                if empty {
                    inner.roots.remove(&key);
                }
            }
        }
    }

    /// Drops every entry of this endpoint (AllBlocksCleared, a restart, an unrepaired gap).
    /// O(entries of the whole index): rare, and it also collects engine hashes nobody holds.
    pub(crate) fn clear(&mut self) {
        let slot = self.slot;
        let inner = &mut *self.inner;
        inner.holders.retain(|_, h| !h.drop_slot(slot));
        let holders = &inner.holders;
        inner.engine.retain(|_, key| holders.contains_key(key));
        inner.roots.retain(|key| holders.contains_key(key));
        if let Some(n) = inner.prefixes.get_mut(usize::from(slot)) {
            *n = 0;
        }
    }
}

#[cfg(test)]
mod tests;

//! The approximate prefix index: per-endpoint LRUs of block hashes plus a reverse map, so a
//! lookup touches only the endpoints that hold the request's blocks. Both are intrusive lists
//! through one array of entries (see `Node`). See the parent module for
//! the algorithm and its costs.

use crate::endpoint::EndpointId;
use smallvec::SmallVec;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::RwLock;

/// Block hashes are already uniformly distributed: hash them by identity.
#[derive(Default, Clone, Copy)]
pub(crate) struct IdentityHasher(u64);

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
/// A node index; `NIL` ends a list.
type NodeId = u32;
const NIL: NodeId = u32::MAX;
/// Set in [`Head::first_slot`] when the block has more holders than the first.
const MORE: Slot = 1 << 31;

/// One (endpoint, block) entry: 24 bytes, in one array for every endpoint, linked twice: into
/// its endpoint's recency list and into its block's list of holders.
///
/// Why not a per-endpoint `LruCache` plus a map of holder lists (the previous version): that
/// cost ~137 bytes of RSS per entry (a boxed list node and a hash-table slot per endpoint, a
/// slot per block with its inline holder list), ~60 here, so a full index for 100 pods of 8,001
/// blocks is ~48 MB instead of ~110, with lookups no slower (BENCHMARKS.md, "Peak RSS, closer").
#[derive(Clone, Copy)]
struct Node {
    hash: u64,
    /// Neighbours in the endpoint's recency list; the free list runs through `older`.
    newer: NodeId,
    older: NodeId,
    /// The next holder of the same block.
    next_holder: NodeId,
    slot: Slot,
}

/// A block's holder list, as the hash table keeps it: the first node and its endpoint, so a
/// lookup of a block held by one endpoint (the common case) reads no node.
#[derive(Clone, Copy)]
struct Head {
    node: NodeId,
    /// The first node's slot, with [`MORE`] set when more holders follow.
    first_slot: Slot,
}

/// One endpoint's recency list, newest first.
struct Lane {
    id: EndpointId,
    newest: NodeId,
    oldest: NodeId,
    len: usize,
    cap: usize,
}

struct Inner {
    slots: HashMap<EndpointId, Slot>,
    lanes: Vec<Option<Lane>>,
    nodes: Vec<Node>,
    /// First free node (linked through `older`).
    free: NodeId,
    heads: HashMap<u64, Head, IdBuild>,
    /// Blocks a node stands for beyond itself: the part of a prompt past the match cap, which
    /// is not hashed but fills the pod's cache all the same ([`PrefixIndex::record_with_tail`]).
    /// Kept beside the nodes, not in them: only a prompt longer than the cap has one, and a
    /// field would make every node 32 bytes instead of 24.
    tails: HashMap<NodeId, u32, IdBuild>,
}

/// Which endpoints were routed which prefixes. Shared by every request; see module docs.
pub struct PrefixIndex {
    inner: RwLock<Inner>,
    /// Index tokens per model-server token, when the index counts pseudo-tokens.
    pub(crate) scale: TokenScale,
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
pub(crate) struct TokenScale {
    /// Index tokens per server token × 64; 0 until a response teaches it.
    sixty_fourths: AtomicU32,
}

impl TokenScale {
    const ONE: u32 = 64;
    /// The ratio is kept within 1/4..=4 (a response outside is an outlier, not a tokenizer).
    const MIN: u32 = Self::ONE / 4;
    const MAX: u32 = Self::ONE * 4;

    /// The learned ratio, 1.0 until a response has taught one.
    pub(crate) fn get(&self) -> f64 {
        match self.sixty_fourths.load(Ordering::Relaxed) {
            0 => 1.0,
            q => f64::from(q) / f64::from(Self::ONE),
        }
    }

    /// `ours` index tokens were `theirs` tokens for the model server: moves the ratio a tenth of
    /// the way towards this observation (the first sets it).
    pub(crate) fn observe(&self, ours: u32, theirs: u64) {
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
    pub(crate) fn blocks(&self, blocks: usize) -> Option<usize> {
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
            lanes: Vec::new(),
            nodes: Vec::new(),
            free: NIL,
            heads: HashMap::default(),
            tails: HashMap::default(),
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
        let mut holders: SmallVec<[Slot; 8]> = SmallVec::new();
        let mut depth = 0;
        for (i, h) in hashes.iter().enumerate() {
            inner.holders(*h, &mut holders);
            let holders = holders.as_slice();
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
        self.record_with_tail(endpoint, hashes, 0, capacity);
    }

    /// [`Self::record`] for a prompt that goes on for `tail` blocks past its last hash (the match
    /// cap). The tail is charged to the endpoint's LRU with the last block, so a pod's long
    /// prompts evict its other prefixes here as they do in its cache, and it is what
    /// [`Self::tails_at`] reports: how far past the cap the endpoint was last sent after this
    /// chain. A chain recorded again keeps the longer of its tails (the pod holds at least
    /// that much after it).
    pub(crate) fn record_with_tail(
        &self,
        endpoint: EndpointId,
        hashes: &[u64],
        tail: usize,
        capacity: usize,
    ) {
        let Some(last) = hashes.last() else {
            return;
        };
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let slot = inner.slot_for(endpoint, capacity);
        if let Some(n) = inner.insert(slot, *last) {
            inner.set_tail(slot, n, u32::try_from(tail).unwrap_or(u32::MAX));
        }
        for h in hashes.iter().rev().skip(1) {
            inner.insert(slot, *h);
        }
    }

    /// The tail (in blocks) recorded after the block `last` by each endpoint holding it; an
    /// endpoint holding it without a tail is absent.
    pub(crate) fn tails_at(&self, last: u64) -> Vec<(EndpointId, usize)> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        if inner.tails.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut n = inner.heads.get(&last).map_or(NIL, |h| h.node);
        while n != NIL {
            let node = inner.nodes[n as usize];
            if let (Some(t), Some(id)) = (inner.tails.get(&n), inner.endpoint(node.slot)) {
                out.push((id, *t as usize));
            }
            n = node.next_holder;
        }
        out
    }

    /// The blocks each of `endpoints` has room for before a recorded block is evicted
    /// (capacity less what is recorded, tails included), in their order; `None` for an
    /// endpoint never recorded.
    pub(crate) fn free_blocks(
        &self,
        endpoints: impl Iterator<Item = EndpointId>,
    ) -> Vec<Option<usize>> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        endpoints
            .map(|id| {
                let slot = *inner.slots.get(&id)?;
                let lane = inner.lanes[slot as usize].as_ref()?;
                Some(lane.cap.saturating_sub(lane.len))
            })
            .collect()
    }

    /// Forgets endpoints that no longer exist.
    pub(crate) fn retain(&self, live: &HashSet<EndpointId>) {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let gone: Vec<(EndpointId, Slot)> = inner
            .slots
            .iter()
            .filter(|(id, _)| !live.contains(id))
            .map(|(id, s)| (*id, *s))
            .collect();
        for (id, slot) in gone {
            inner.slots.remove(&id);
            inner.drop_lane(slot);
        }
    }

    /// Blocks held across all endpoints.
    pub(crate) fn size(&self) -> usize {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        inner.lanes.iter().flatten().map(|l| l.len).sum()
    }
}

impl Inner {
    fn endpoint(&self, slot: Slot) -> Option<EndpointId> {
        self.lanes.get(slot as usize)?.as_ref().map(|l| l.id)
    }

    /// The endpoints holding block `hash`, sorted, into `out`.
    fn holders(&self, hash: u64, out: &mut SmallVec<[Slot; 8]>) {
        out.clear();
        let Some(head) = self.heads.get(&hash) else {
            return;
        };
        out.push(head.first_slot & !MORE);
        if head.first_slot & MORE != 0 {
            let mut n = self.nodes[head.node as usize].next_holder;
            while n != NIL {
                out.push(self.nodes[n as usize].slot);
                n = self.nodes[n as usize].next_holder;
            }
            out.sort_unstable();
        }
    }

    fn slot_for(&mut self, endpoint: EndpointId, capacity: usize) -> Slot {
        let cap = capacity.max(1);
        if let Some(slot) = self.slots.get(&endpoint).copied() {
            if let Some(lane) = self.lanes[slot as usize].as_mut() {
                lane.cap = cap;
            }
            self.evict_over_capacity(slot);
            return slot;
        }
        let lane = Some(Lane {
            id: endpoint,
            newest: NIL,
            oldest: NIL,
            len: 0,
            cap,
        });
        let slot = match self.lanes.iter().position(Option::is_none) {
            Some(free) => {
                self.lanes[free] = lane;
                free
            }
            None => {
                self.lanes.push(lane);
                self.lanes.len() - 1
            }
        } as Slot;
        self.slots.insert(endpoint, slot);
        slot
    }

    /// Makes `hash` the newest block of `slot`'s lane, adding it (and evicting the lane's
    /// oldest when over capacity) if the endpoint did not hold it.
    /// Makes `hash` the newest block of `slot`'s lane; the node, unless the index is full.
    fn insert(&mut self, slot: Slot, hash: u64) -> Option<NodeId> {
        self.lanes[slot as usize].as_ref()?;
        let head = self.heads.get(&hash).copied();
        if let Some(head) = head {
            let mut n = head.node;
            while n != NIL {
                if self.nodes[n as usize].slot == slot {
                    self.unlink_lane(n);
                    self.push_newest(slot, n);
                    return Some(n);
                }
                n = self.nodes[n as usize].next_holder;
            }
        }
        let next_holder = head.map_or(NIL, |h| h.node);
        let node = Node {
            hash,
            newer: NIL,
            older: NIL,
            next_holder,
            slot,
        };
        let n = if self.free == NIL {
            if self.nodes.len() >= NIL as usize {
                // 4 billion entries (~96 GB): not reachable with real capacities; a full index
                // stops learning rather than wrap an index into `NIL`.
                return None;
            }
            self.nodes.push(node);
            (self.nodes.len() - 1) as NodeId
        } else {
            let n = self.free;
            self.free = self.nodes[n as usize].older;
            self.nodes[n as usize] = node;
            n
        };
        let more = if head.is_some() { MORE } else { 0 };
        self.heads.insert(
            hash,
            Head {
                node: n,
                first_slot: slot | more,
            },
        );
        self.push_newest(slot, n);
        if let Some(lane) = self.lanes[slot as usize].as_mut() {
            lane.len += 1;
        }
        self.evict_over_capacity(slot);
        Some(n)
    }

    /// Node `n` of `slot` now stands for `tail` more blocks, unless it already stood for more.
    fn set_tail(&mut self, slot: Slot, n: NodeId, tail: u32) {
        let old = self.tails.get(&n).copied().unwrap_or(0);
        if tail <= old {
            return;
        }
        self.tails.insert(n, tail);
        if let Some(lane) = self.lanes[slot as usize].as_mut() {
            lane.len += (tail - old) as usize;
        }
        self.evict_over_capacity(slot);
    }

    /// Evicts `slot`'s oldest blocks while its lane holds more than its capacity.
    fn evict_over_capacity(&mut self, slot: Slot) {
        while self.lanes[slot as usize]
            .as_ref()
            .is_some_and(|l| l.len > l.cap && l.oldest != NIL)
        {
            self.evict_oldest(slot);
        }
    }

    fn push_newest(&mut self, slot: Slot, n: NodeId) {
        let Some(lane) = self.lanes[slot as usize].as_mut() else {
            return;
        };
        let old_newest = lane.newest;
        lane.newest = n;
        if lane.oldest == NIL {
            lane.oldest = n;
        }
        self.nodes[n as usize].newer = NIL;
        self.nodes[n as usize].older = old_newest;
        if old_newest != NIL {
            self.nodes[old_newest as usize].newer = n;
        }
    }

    /// Takes node `n` out of its lane's recency list (the lane's length is the caller's).
    fn unlink_lane(&mut self, n: NodeId) {
        let Node {
            newer, older, slot, ..
        } = self.nodes[n as usize];
        if newer != NIL {
            self.nodes[newer as usize].older = older;
        }
        if older != NIL {
            self.nodes[older as usize].newer = newer;
        }
        if let Some(lane) = self.lanes[slot as usize].as_mut() {
            if lane.newest == n {
                lane.newest = older;
            }
            if lane.oldest == n {
                lane.oldest = newer;
            }
        }
    }

    /// Takes node `n` out of its block's holder list, dropping the block when it was the last.
    fn unlink_holder(&mut self, n: NodeId) {
        let Node {
            hash, next_holder, ..
        } = self.nodes[n as usize];
        let Inner { heads, nodes, .. } = self;
        let Some(head) = heads.get_mut(&hash) else {
            return;
        };
        if head.node == n {
            head.node = next_holder;
        } else {
            let mut p = head.node;
            while p != NIL && nodes[p as usize].next_holder != n {
                p = nodes[p as usize].next_holder;
            }
            if p != NIL {
                nodes[p as usize].next_holder = next_holder;
            }
        }
        if head.node == NIL {
            heads.remove(&hash);
            return;
        }
        let first = nodes[head.node as usize];
        let more = if first.next_holder == NIL { 0 } else { MORE };
        head.first_slot = first.slot | more;
    }

    fn release(&mut self, n: NodeId) {
        self.unlink_holder(n);
        if !self.tails.is_empty() {
            self.tails.remove(&n);
        }
        self.nodes[n as usize].older = self.free;
        self.free = n;
    }

    fn evict_oldest(&mut self, slot: Slot) {
        let Some(oldest) = self.lanes[slot as usize].as_ref().map(|l| l.oldest) else {
            return;
        };
        if oldest == NIL {
            return;
        }
        self.unlink_lane(oldest);
        let tail = self.tails.remove(&oldest).map_or(0, |t| t as usize);
        if let Some(lane) = self.lanes[slot as usize].as_mut() {
            lane.len = lane.len.saturating_sub(1 + tail);
        }
        self.release(oldest);
    }

    fn drop_lane(&mut self, slot: Slot) {
        let Some(lane) = self.lanes[slot as usize].take() else {
            return;
        };
        let mut n = lane.newest;
        while n != NIL {
            let older = self.nodes[n as usize].older;
            self.release(n);
            n = older;
        }
    }
}

#[cfg(test)]
mod tests;

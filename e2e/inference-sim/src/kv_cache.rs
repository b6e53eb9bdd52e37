//! The KV-cache block pool, modelled on vLLM's `v1/core/block_pool.py`.
//!
//! Why it matters for routing: prefix-aware routers win by steering requests to
//! pods that still hold their prefix, and KV-aware routers read
//! `kv_cache_usage_perc`. Both only mean something if the pool behaves as
//! vLLM's does:
//!
//! - `num_gpu_blocks` blocks; block 0 is the reserved null block, so usage is
//!   `1 - free / (num_gpu_blocks - 1)`.
//! - A freed block keeps its hash and stays findable until it is reused: the
//!   free queue holds evictable cached blocks, so a warm idle cache reads ≈ 0.
//! - The free queue is LRU: allocation pops the head, freeing appends to the
//!   tail, and a request frees its blocks in reverse so its tail goes first.
//! - `BlockRemoved` is emitted lazily, when a cached block is popped for reuse
//!   (one event per physical copy); `BlockStored` when full blocks are cached.
//!
//! Complexity: every operation is O(blocks touched); the free queue is an
//! index-linked list so a cache hit can unlink a block in O(1).

use std::collections::HashMap;

use super::hashing::BlockHash;

/// Index of a physical block.
pub type BlockId = u32;

const NIL: u32 = u32::MAX;

/// One KV-cache event, before wire encoding (see `kv_events`).
#[derive(Clone, Debug, PartialEq)]
pub enum KvEvent {
    BlockStored {
        block_hashes: Vec<u64>,
        parent_block_hash: Option<u64>,
        token_ids: Vec<u32>,
        block_size: usize,
        lora_id: Option<u64>,
        lora_name: Option<String>,
    },
    BlockRemoved {
        block_hashes: Vec<u64>,
    },
    AllBlocksCleared,
}

#[derive(Clone, Debug)]
struct Block {
    ref_cnt: u32,
    hash: Option<BlockHash>,
    prev: u32,
    next: u32,
    in_free: bool,
}

/// What a request's newly full blocks need to be announced and indexed.
pub struct CacheBlocks<'a> {
    /// The request's block table.
    pub table: &'a [BlockId],
    /// The request's full-block hashes.
    pub hashes: &'a [BlockHash],
    /// All tokens of the request so far.
    pub tokens: &'a [u32],
    /// Blocks `[from, to)` become cached.
    pub from: usize,
    pub to: usize,
    pub lora: Option<(u64, &'a str)>,
}

/// The pool: blocks, the LRU free queue, and the hash → blocks index.
pub struct BlockPool {
    block_size: usize,
    blocks: Vec<Block>,
    head: u32,
    tail: u32,
    free_len: usize,
    cached: HashMap<BlockHash, Vec<BlockId>>,
    events: Vec<KvEvent>,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks (including the null block), all free.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        let empty = Block {
            ref_cnt: 0,
            hash: None,
            prev: NIL,
            next: NIL,
            in_free: false,
        };
        let mut pool = Self {
            block_size,
            blocks: vec![empty; num_blocks.max(2)],
            head: NIL,
            tail: NIL,
            free_len: 0,
            cached: HashMap::new(),
            events: Vec::new(),
        };
        for id in 1..pool.blocks.len() as u32 {
            pool.push_tail(id);
        }
        pool
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks available to allocate (free, including evictable cached ones).
    pub fn num_free(&self) -> usize {
        self.free_len
    }

    /// vLLM's `get_usage()`: the fraction of blocks held by requests.
    pub fn usage(&self) -> f64 {
        let total = self.blocks.len() - 1;
        1.0 - self.free_len as f64 / total as f64
    }

    /// The longest prefix of `hashes` whose blocks are cached, capped at `max`.
    pub fn lookup_prefix(&self, hashes: &[BlockHash], max: usize) -> Vec<BlockId> {
        hashes
            .iter()
            .take(max)
            .map_while(|h| self.cached.get(h).and_then(|ids| ids.first().copied()))
            .collect()
    }

    /// How many of `ids` are currently free (touching them uses up free space).
    pub fn count_evictable(&self, ids: &[BlockId]) -> usize {
        ids.iter()
            .filter(|&&id| self.block(id).is_some_and(|b| b.ref_cnt == 0))
            .count()
    }

    /// Takes a reference on cache-hit blocks, unlinking free ones from the queue.
    pub fn touch(&mut self, ids: &[BlockId]) {
        for &id in ids {
            if self.blocks[id as usize].ref_cnt == 0 {
                self.unlink(id);
            }
            self.blocks[id as usize].ref_cnt += 1;
        }
    }

    /// Pops `n` blocks from the LRU head, evicting cached ones; `None` if short.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        if n > self.free_len {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        let mut removed = Vec::new();
        for _ in 0..n {
            let id = self.head;
            self.unlink(id);
            let block = &mut self.blocks[id as usize];
            block.ref_cnt = 1;
            if let Some(hash) = block.hash.take() {
                self.uncache(hash, id);
                removed.push(hash.to_u64());
            }
            out.push(id);
        }
        if !removed.is_empty() {
            self.events.push(KvEvent::BlockRemoved {
                block_hashes: removed,
            });
        }
        Some(out)
    }

    /// Releases a request's blocks, last block first (so its tail is evicted first).
    pub fn free(&mut self, table: &[BlockId]) {
        for &id in table.iter().rev() {
            let block = &mut self.blocks[id as usize];
            block.ref_cnt = block.ref_cnt.saturating_sub(1);
            if block.ref_cnt == 0 {
                self.push_tail(id);
            }
        }
    }

    /// Marks blocks `[from, to)` of a request as cached and emits `BlockStored`.
    pub fn cache_blocks(&mut self, req: CacheBlocks<'_>) {
        if req.from >= req.to {
            return;
        }
        for i in req.from..req.to {
            let id = req.table[i];
            self.blocks[id as usize].hash = Some(req.hashes[i]);
            self.cached.entry(req.hashes[i]).or_default().push(id);
        }
        let bs = self.block_size;
        self.events.push(KvEvent::BlockStored {
            block_hashes: req.hashes[req.from..req.to]
                .iter()
                .map(|h| h.to_u64())
                .collect(),
            parent_block_hash: req.from.checked_sub(1).map(|p| req.hashes[p].to_u64()),
            token_ids: req.tokens[req.from * bs..req.to * bs].to_vec(),
            block_size: bs,
            lora_id: req.lora.map(|(id, _)| id),
            lora_name: req.lora.map(|(_, name)| name.to_owned()),
        });
    }

    /// vLLM's `reset_prefix_cache`: only when no block is in use.
    pub fn reset(&mut self) -> bool {
        if self.free_len != self.blocks.len() - 1 {
            return false;
        }
        self.cached.clear();
        for block in &mut self.blocks {
            block.hash = None;
        }
        self.events.push(KvEvent::AllBlocksCleared);
        true
    }

    /// Events since the last call (one batch per engine step).
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }

    /// Number of distinct cached hashes (for tests and debugging).
    pub fn num_cached(&self) -> usize {
        self.cached.len()
    }

    fn block(&self, id: BlockId) -> Option<&Block> {
        self.blocks.get(id as usize)
    }

    fn uncache(&mut self, hash: BlockHash, id: BlockId) {
        if let Some(ids) = self.cached.get_mut(&hash) {
            ids.retain(|&b| b != id);
            if ids.is_empty() {
                self.cached.remove(&hash);
            }
        }
    }

    fn push_tail(&mut self, id: BlockId) {
        let tail = self.tail;
        let block = &mut self.blocks[id as usize];
        block.prev = tail;
        block.next = NIL;
        block.in_free = true;
        if tail == NIL {
            self.head = id;
        } else {
            self.blocks[tail as usize].next = id;
        }
        self.tail = id;
        self.free_len += 1;
    }

    fn unlink(&mut self, id: BlockId) {
        let Block {
            prev,
            next,
            in_free,
            ..
        } = self.blocks[id as usize];
        if !in_free {
            return;
        }
        if prev == NIL {
            self.head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        let block = &mut self.blocks[id as usize];
        block.in_free = false;
        block.prev = NIL;
        block.next = NIL;
        self.free_len -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::super::hashing::{none_hash, BlockHasher, HashExtras};
    use super::*;

    fn hashes(tokens: &[u32]) -> Vec<BlockHash> {
        let mut h = BlockHasher::new(none_hash("0"), 4, HashExtras::default());
        h.update(tokens);
        h.hashes().to_vec()
    }

    fn store(pool: &mut BlockPool, table: &[BlockId], tokens: &[u32]) {
        let hs = hashes(tokens);
        let to = hs.len();
        pool.cache_blocks(CacheBlocks {
            table,
            hashes: &hs,
            tokens,
            from: 0,
            to,
            lora: None,
        });
    }

    #[test]
    fn usage_excludes_the_null_block_and_counts_free_cached_blocks_as_free() {
        let mut pool = BlockPool::new(11, 4);
        assert_eq!(pool.usage(), 0.0);
        let table = pool.allocate(5).unwrap();
        assert!((pool.usage() - 0.5).abs() < 1e-12);
        store(&mut pool, &table, &(0..20).collect::<Vec<_>>());
        pool.free(&table);
        assert_eq!(pool.usage(), 0.0);
        assert_eq!(pool.num_cached(), 5);
    }

    #[test]
    fn freed_blocks_stay_cached_until_reused_then_emit_removed() {
        let mut pool = BlockPool::new(5, 4);
        let tokens: Vec<u32> = (0..8).collect();
        let table = pool.allocate(2).unwrap();
        store(&mut pool, &table, &tokens);
        pool.free(&table);
        assert!(matches!(
            pool.take_events()[..],
            [KvEvent::BlockStored { .. }]
        ));
        assert_eq!(pool.lookup_prefix(&hashes(&tokens), 8), table);
        // Two never-used blocks are popped first; the third pop reuses the
        // request's *tail* block (freed first), evicting it.
        let other = pool.allocate(3).unwrap();
        assert_eq!(other[2], table[1]);
        let events = pool.take_events();
        let want = vec![KvEvent::BlockRemoved {
            block_hashes: vec![hashes(&tokens)[1].to_u64()],
        }];
        assert_eq!(events, want);
        assert_eq!(pool.lookup_prefix(&hashes(&tokens), 8), vec![table[0]]);
    }

    #[test]
    fn touching_a_free_cached_block_removes_it_from_the_free_queue() {
        let mut pool = BlockPool::new(4, 4);
        let table = pool.allocate(1).unwrap();
        store(&mut pool, &table, &[1, 2, 3, 4]);
        pool.free(&table);
        assert_eq!(pool.num_free(), 3);
        assert_eq!(pool.count_evictable(&table), 1);
        pool.touch(&table);
        assert_eq!(pool.num_free(), 2);
        assert!(pool.allocate(3).is_none());
        assert_eq!(pool.allocate(2).map(|v| v.len()), Some(2));
    }

    #[test]
    fn reset_needs_an_idle_pool_and_clears_every_hash() {
        let mut pool = BlockPool::new(4, 4);
        let table = pool.allocate(1).unwrap();
        store(&mut pool, &table, &[1, 2, 3, 4]);
        assert!(!pool.reset());
        pool.free(&table);
        pool.take_events();
        assert!(pool.reset());
        assert_eq!(pool.num_cached(), 0);
        assert_eq!(pool.take_events(), vec![KvEvent::AllBlocksCleared]);
    }

    #[test]
    fn stored_event_carries_parent_tokens_and_lora() {
        let mut pool = BlockPool::new(8, 4);
        let tokens: Vec<u32> = (0..12).collect();
        let hs = hashes(&tokens);
        let table = pool.allocate(3).unwrap();
        let req = CacheBlocks {
            table: &table,
            hashes: &hs,
            tokens: &tokens,
            from: 1,
            to: 3,
            lora: Some((7, "a")),
        };
        pool.cache_blocks(req);
        let want = KvEvent::BlockStored {
            block_hashes: vec![hs[1].to_u64(), hs[2].to_u64()],
            parent_block_hash: Some(hs[0].to_u64()),
            token_ids: (4..12).collect(),
            block_size: 4,
            lora_id: Some(7),
            lora_name: Some("a".into()),
        };
        assert_eq!(pool.take_events(), vec![want]);
    }
}

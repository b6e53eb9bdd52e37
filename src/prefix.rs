//! Approximate prefix-cache affinity: chained block hashes of the prompt's tokens and an index of
//! which endpoint was last sent which blocks.
//!
//! # Algorithm
//! A prompt's tokens are cut into blocks of `block_size` tokens (vLLM's default 16, or what the
//! pods report in `cache_config_info`). Only full blocks count, as in vLLM. Block hashes chain:
//! `h0 = xxh64(model ‖ 0x00 ‖ cache_salt)`, `h_i = xxh64(LE32 tokens of block i ‖ LE64 h_{i-1})`,
//! so a hash names the whole prefix up to its block and two prompts share block i's hash only if
//! they share every token before it.
//!
//! The index ([`index::PrefixIndex`]) keeps, per endpoint, an LRU of the block hashes routed
//! there (capacity = the endpoint's KV blocks), and a reverse map hash → endpoints, both threaded
//! through one array of 24-byte entries (about 60 bytes per (endpoint, block) with the hash
//! table and the array's growth). A lookup walks
//! the request's hashes in order and, unlike upstream, counts only **consecutive** matches per
//! endpoint: a pod missing block k cannot use block k+1 of the same prompt.
//!
//! Complexity: hashing O(tokens); lookup O(blocks × holders per block), stopping at the first
//! block nobody holds; record O(blocks) amortised. 100 endpoints and a 4K-token prompt take a few
//! microseconds (see BENCHMARKS.md).
//!
//! Concurrency: one `RwLock`; lookups share it, records (once per routed request, after the
//! decision) take it briefly. Selection never writes; the director records afterwards.
//!
//! Both this index and the precise one ([`precise`]) keep one contract, [`source::PrefixSource`]:
//! `lookup` once per request, `record` once per decision.

pub mod index;
pub mod precise;
pub mod source;

use std::hash::Hasher;
use xxhash_rust::xxh64::Xxh64;

/// Chained block hashes of `tokens` for `model` (post-rewrite) and `cache_salt`, at most
/// `max_blocks` of them.
pub fn block_hashes(
    model: &str,
    cache_salt: Option<&str>,
    tokens: &[u32],
    block_size: usize,
    max_blocks: usize,
) -> Vec<u64> {
    let block_size = block_size.max(1);
    let mut parent = chain_seed(model, cache_salt);
    let mut out = Vec::with_capacity((tokens.len() / block_size).min(max_blocks));
    for block in tokens.chunks_exact(block_size).take(max_blocks) {
        parent = chain_block(parent, block);
        out.push(parent);
    }
    out
}

/// The parent of a chain's first block: `xxh64(model ‖ 0x00 ‖ cache_salt)`.
pub(crate) fn chain_seed(model: &str, cache_salt: Option<&str>) -> u64 {
    let mut seed = Xxh64::new(0);
    seed.write(model.as_bytes());
    if let Some(salt) = cache_salt {
        seed.write(&[0]);
        seed.write(salt.as_bytes());
    }
    seed.finish()
}

/// The key of one block: `xxh64(LE32 tokens ‖ LE64 parent)`. Also used by the precise index
/// to key the token ids carried in vLLM's BlockStored events, so both sides agree.
pub(crate) fn chain_block(parent: u64, block: &[u32]) -> u64 {
    let mut buf = [0u8; 4 * 64 + 8];
    if block.len() <= 64 {
        let n = block.len() * 4;
        for (chunk, t) in buf[..n].chunks_exact_mut(4).zip(block) {
            chunk.copy_from_slice(&t.to_le_bytes());
        }
        buf[n..n + 8].copy_from_slice(&parent.to_le_bytes());
        return xxhash_rust::xxh64::xxh64(&buf[..n + 8], 0);
    }
    let mut h = Xxh64::new(0);
    block.iter().for_each(|t| h.write(&t.to_le_bytes()));
    h.write(&parent.to_le_bytes());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_chain_over_full_blocks_only() {
        let a: Vec<u32> = (0..40).collect();
        let h = block_hashes("m", None, &a, 16, 100);
        assert_eq!(h.len(), 2, "the trailing 8 tokens form no block");
        let mut b = a.clone();
        b[3] = 999;
        let hb = block_hashes("m", None, &b, 16, 100);
        assert_ne!(h[0], hb[0]);
        assert_ne!(h[1], hb[1], "a change in block 0 changes every later hash");
        let mut c = a.clone();
        c[20] = 999;
        let hc = block_hashes("m", None, &c, 16, 100);
        assert_eq!(h[0], hc[0]);
        assert_ne!(h[1], hc[1]);
    }

    #[test]
    fn model_salt_and_cap_change_the_chain() {
        let t: Vec<u32> = (0..64).collect();
        let base = block_hashes("m", None, &t, 16, 100);
        assert_ne!(base, block_hashes("n", None, &t, 16, 100));
        assert_ne!(base, block_hashes("m", Some("s"), &t, 16, 100));
        assert_eq!(block_hashes("m", None, &t, 16, 2), base[..2]);
    }
}

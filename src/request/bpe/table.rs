//! The layout of an embedded vocabulary, shared by `build.rs` (which writes it into `OUT_DIR`)
//! and [`super::vocab`] (which reads it in place from the binary's read-only data). Std only:
//! `build.rs` includes this file by path.
//!
//! All integers are little-endian `u32`, after an 8-byte magic:
//!
//! ```text
//! magic  "eppbpe1\0"
//! n      tokens; token id = tiktoken rank, 0..n, no gaps
//! bits   the lookup table has 1 << bits slots
//! starts n + 1 byte offsets into `bytes` (token i is bytes[starts[i]..starts[i + 1]])
//! slots  open addressing, linear probing from home(hash(token)); a slot is
//!        id | tag(hash) << ID_BITS, or EMPTY
//! bytes  the tokens' bytes, concatenated in id order
//! ```
//!
//! The 14-bit tag lets a probe skip a slot without touching the token's bytes, so a miss (most
//! pair lookups during merging miss) costs about one or two table reads.

/// First eight bytes of the file; the 1 is the layout's version.
pub const MAGIC: &[u8; 8] = b"eppbpe1\0";
/// Bits of a slot that hold the token id (o200k_base has 199,998 tokens).
pub const ID_BITS: u32 = 18;
pub const ID_MASK: u32 = (1 << ID_BITS) - 1;
/// An empty slot. Ids stay below `ID_MASK`, so no filled slot equals it.
pub const EMPTY: u32 = u32::MAX;
/// Header length in bytes: magic, `n`, `bits`.
pub const HEADER: usize = 16;

const K: u64 = 0x9E37_79B9_7F4A_7C15;

/// The hash of a token's bytes: eight bytes a round (tokens average ~6.5 bytes, so one or two
/// rounds), the length mixed in first, a final avalanche for the table's top bits and the tag's
/// low bits.
#[inline]
pub fn hash(bytes: &[u8]) -> u64 {
    let mut h = (bytes.len() as u64).wrapping_mul(K);
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        h = (h ^ u64::from_le_bytes(word))
            .wrapping_mul(K)
            .rotate_left(26);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut word = [0u8; 8];
        word[..rest.len()].copy_from_slice(rest);
        h = (h ^ u64::from_le_bytes(word))
            .wrapping_mul(K)
            .rotate_left(26);
    }
    let h = (h ^ (h >> 32)).wrapping_mul(K);
    h ^ (h >> 29)
}

/// The slot a probe for `h` starts at, in a table of `1 << bits` slots (`bits` in 1..=32).
#[inline]
pub fn home(h: u64, bits: u32) -> usize {
    (h >> (64 - bits)) as usize
}

/// The tag bits stored beside the id (the hash's low bits; `home` uses its high ones).
#[inline]
pub fn tag(h: u64) -> u32 {
    (h as u32) >> ID_BITS
}

/// The filled slot for token `id` whose bytes hash to `h`.
#[inline]
pub fn slot(id: u32, h: u64) -> u32 {
    id | tag(h) << ID_BITS
}

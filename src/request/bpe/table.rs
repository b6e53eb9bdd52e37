//! The layout of an embedded vocabulary, shared by `build.rs` (which writes it into `OUT_DIR`)
//! and [`super::vocab`] (which reads it in place from the binary's read-only data). Std only:
//! `build.rs` includes this file by path.
//!
//! Integers are little-endian. After a 16-byte header (magic, `n` tokens as `u32`, `bits` as
//! `u32`) come `1 << bits` slots (`u32`), then the records:
//!
//! ```text
//! slot    EMPTY, or offset << 8 | tag: the record's byte offset and 8 bits of its hash
//! record  len (u8), the token's bytes, its id (u24; id = tiktoken rank)
//! ```
//!
//! Open addressing with linear probing from `home(hash(token))`, load ≤ 0.4. A lookup that hits
//! reads one slot and one record (two cache lines where a table of offsets into a byte pool read
//! three); the tag lets a probe pass a slot without reading its record, so a miss (most pair
//! lookups while merging miss) reads only slots. Nothing maps id → bytes: encoding never needs it.

/// First eight bytes of the file; the 2 is the layout's version.
pub(crate) const MAGIC: &[u8; 8] = b"eppbpe2\0";
/// Header length in bytes: magic, `n`, `bits`.
pub(crate) const HEADER: usize = 16;
/// An empty slot. Record offsets (24 bits) stay below 2^24 - 1 (`build.rs` checks), so no
/// filled slot equals it.
pub(crate) const EMPTY: u32 = u32::MAX;

const K1: u64 = 0xa076_1d64_78bd_642f;
const K2: u64 = 0xe703_7ed1_a0b4_28db;

/// The 128-bit product of `a` and `b`, folded: every output bit depends on every input bit.
#[inline(always)]
fn mum(a: u64, b: u64) -> u64 {
    let r = u128::from(a) * u128::from(b);
    (r as u64) ^ ((r >> 64) as u64)
}

#[inline(always)]
fn le32(b: &[u8]) -> u64 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[..4]);
    u64::from(u32::from_le_bytes(w))
}

#[inline(always)]
fn le64(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[..8]);
    u64::from_le_bytes(w)
}

/// Up to 8 bytes as one word, without a variable-length copy: two overlapping 4-byte loads, or
/// first, middle and last byte. Distinct inputs of the same length give distinct words, so two
/// such slices of equal length are equal exactly when their words are.
#[inline(always)]
pub(crate) fn load(bytes: &[u8]) -> u64 {
    let n = bytes.len();
    if n >= 4 {
        le32(bytes) << 32 | le32(&bytes[n - 4..])
    } else if n > 0 {
        u64::from(bytes[0]) << 16 | u64::from(bytes[n / 2]) << 8 | u64::from(bytes[n - 1])
    } else {
        0
    }
}

/// The hash of a token's bytes (wyhash-style: one folded multiply per 8 bytes, the last 8 read
/// overlapping; tokens average ~6.5 bytes, so usually one multiply).
#[inline(always)]
pub(crate) fn hash(bytes: &[u8]) -> u64 {
    let n = bytes.len();
    if n <= 8 {
        return mum(load(bytes) ^ K1, n as u64 ^ K2);
    }
    let mut h = n as u64 ^ K2;
    let mut rest = bytes;
    while rest.len() > 8 {
        h = mum(le64(rest) ^ K1, h);
        rest = &rest[8..];
    }
    mum(le64(&bytes[n - 8..]) ^ K1, h ^ K2)
}

/// The slot a probe for `h` starts at, in a table of `1 << bits` slots (`bits` in 1..=32).
#[inline(always)]
pub(crate) fn home(h: u64, bits: u32) -> usize {
    (h >> (64 - bits)) as usize
}

/// The 8 tag bits stored beside the offset (the hash's low bits; `home` uses its high ones).
#[inline(always)]
pub(crate) fn tag(h: u64) -> u32 {
    (h & 0xFF) as u32
}

/// The filled slot for the record at `offset` whose token hashes to `h`.
#[inline(always)]
pub(crate) fn slot(offset: usize, h: u64) -> u32 {
    (offset as u32) << 8 | tag(h)
}

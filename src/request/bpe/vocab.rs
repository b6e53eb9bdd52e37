//! An embedded vocabulary read in place: token bytes by id, and id by bytes through the
//! prebuilt open-addressing table (layout: [`super::table`]). Nothing is copied or allocated;
//! the pages a lookup touches are the binary's own read-only data, paged in on demand.
//!
//! The header and section sizes are checked once; every later read is bounds-checked and
//! answers "no such token" rather than panicking on a malformed table.

use super::table::{self, EMPTY, HEADER, ID_MASK};

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VocabError {
    #[error("the embedded vocabulary is malformed ({0})")]
    Malformed(&'static str),
    #[error("the embedded vocabulary lacks the single byte {0:#04x}")]
    MissingByte(u8),
}

/// One vocabulary: `n` tokens, id = rank.
pub struct Vocab {
    n: usize,
    bits: u32,
    mask: usize,
    starts: &'static [u8],
    slots: &'static [u8],
    bytes: &'static [u8],
}

impl std::fmt::Debug for Vocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vocab")
            .field("tokens", &self.n)
            .field("slots", &(self.mask + 1))
            .finish()
    }
}

/// The `i`-th little-endian `u32` of `words`, or `None` past its end.
#[inline(always)]
fn word(words: &[u8], i: usize) -> Option<u32> {
    let at = i.checked_mul(4)?;
    let w: [u8; 4] = words.get(at..at + 4)?.try_into().ok()?;
    Some(u32::from_le_bytes(w))
}

impl Vocab {
    pub fn parse(data: &'static [u8]) -> Result<Self, VocabError> {
        let malformed = VocabError::Malformed;
        if data.len() < HEADER || &data[..8] != table::MAGIC {
            return Err(malformed("bad magic"));
        }
        let n = word(&data[8..], 0).ok_or(malformed("header"))? as usize;
        let bits = word(&data[8..], 1).ok_or(malformed("header"))?;
        if n >= ID_MASK as usize || !(1..=30).contains(&bits) || (1usize << bits) < n {
            return Err(malformed("sizes"));
        }
        let (starts, rest) = data[HEADER..]
            .split_at_checked((n + 1) * 4)
            .ok_or(malformed("starts"))?;
        let (slots, bytes) = rest
            .split_at_checked((1usize << bits) * 4)
            .ok_or(malformed("slots"))?;
        if word(starts, n).map(|end| end as usize) != Some(bytes.len()) {
            return Err(malformed("token bytes"));
        }
        Ok(Self {
            n,
            bits,
            mask: (1usize << bits) - 1,
            starts,
            slots,
            bytes,
        })
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Token `id`'s bytes (empty for an id out of range).
    #[inline]
    pub fn token(&self, id: u32) -> &'static [u8] {
        let span = word(self.starts, id as usize).zip(word(self.starts, id as usize + 1));
        span.and_then(|(a, b)| self.bytes.get(a as usize..b as usize))
            .unwrap_or(&[])
    }

    /// The id (rank) of the token whose bytes are `key`.
    #[inline]
    pub fn rank(&self, key: &[u8]) -> Option<u32> {
        let h = table::hash(key);
        let mut i = table::home(h, self.bits);
        // At most every slot once, so a malformed (full) table cannot loop.
        for _ in 0..=self.mask {
            let slot = word(self.slots, i)?;
            if slot == EMPTY {
                return None;
            }
            // Same tag (no touch of the token's bytes otherwise), then same bytes.
            if slot == table::slot(slot & ID_MASK, h) && self.token(slot & ID_MASK) == key {
                return Some(slot & ID_MASK);
            }
            i = (i + 1) & self.mask;
        }
        None
    }

    /// The ids of the 256 single bytes (every byte-level vocabulary has them all).
    pub fn byte_ranks(&self) -> Result<[u32; 256], VocabError> {
        let mut ranks = [0u32; 256];
        for (byte, rank) in (0..=255u8).zip(&mut ranks) {
            *rank = self.rank(&[byte]).ok_or(VocabError::MissingByte(byte))?;
        }
        Ok(ranks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_tables_are_errors_not_panics() {
        assert_eq!(
            Vocab::parse(b"short").unwrap_err(),
            VocabError::Malformed("bad magic")
        );
        let mut bad: Vec<u8> = table::MAGIC.to_vec();
        bad.extend_from_slice(&3u32.to_le_bytes());
        bad.extend_from_slice(&2u32.to_le_bytes());
        bad.extend_from_slice(&[0; 8]);
        let bad: &'static [u8] = bad.leak();
        assert_eq!(
            Vocab::parse(bad).unwrap_err(),
            VocabError::Malformed("starts")
        );
    }

    #[test]
    fn a_tiny_table_finds_each_token_and_nothing_else() {
        // Two tokens "a" and "bc", four slots, written as build.rs writes them.
        let tokens: [&[u8]; 2] = [b"a", b"bc"];
        let bits = 2;
        let mut slots = [EMPTY; 4];
        for (id, t) in (0u32..).zip(tokens) {
            let h = table::hash(t);
            let mut i = table::home(h, bits);
            while slots[i] != EMPTY {
                i = (i + 1) & 3;
            }
            slots[i] = table::slot(id, h);
        }
        let mut data: Vec<u8> = table::MAGIC.to_vec();
        for w in [2u32, bits, 0, 1, 3].into_iter().chain(slots) {
            data.extend_from_slice(&w.to_le_bytes());
        }
        data.extend_from_slice(b"abc");
        let vocab = Vocab::parse(data.leak()).unwrap();
        assert_eq!(vocab.len(), 2);
        assert_eq!(vocab.token(1), b"bc");
        assert_eq!(vocab.token(7), b"", "an id out of range is no token");
        assert_eq!(vocab.rank(b"a"), Some(0));
        assert_eq!(vocab.rank(b"bc"), Some(1));
        assert_eq!(vocab.rank(b"ab"), None);
        assert_eq!(vocab.rank(b""), None);
        assert_eq!(vocab.byte_ranks(), Err(VocabError::MissingByte(0)));
    }
}

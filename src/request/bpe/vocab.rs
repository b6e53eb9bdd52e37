//! An embedded vocabulary read in place: id by bytes through the prebuilt open-addressing table
//! (layout: [`super::table`]). Nothing is copied or allocated; the pages a lookup touches are
//! the binary's own read-only data, paged in on demand.
//!
//! The header and section sizes are checked once; every later read is bounds-checked and
//! answers "no such token" rather than panicking on a malformed table.

use super::table::{self, EMPTY, HEADER};

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum VocabError {
    #[error("the embedded vocabulary is malformed ({0})")]
    Malformed(&'static str),
    #[error("the embedded vocabulary lacks the single byte {0:#04x}")]
    MissingByte(u8),
}

/// One vocabulary: `n` tokens, id = rank.
pub(crate) struct Vocab {
    n: usize,
    bits: u32,
    mask: usize,
    slots: &'static [u8],
    records: &'static [u8],
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
    pub(crate) fn parse(data: &'static [u8]) -> Result<Self, VocabError> {
        let malformed = VocabError::Malformed;
        if data.len() < HEADER || &data[..8] != table::MAGIC {
            return Err(malformed("bad magic"));
        }
        let n = word(&data[8..], 0).ok_or(malformed("header"))? as usize;
        let bits = word(&data[8..], 1).ok_or(malformed("header"))?;
        if !(1..=30).contains(&bits) || (1usize << bits) < n {
            return Err(malformed("sizes"));
        }
        let (slots, records) = data[HEADER..]
            .split_at_checked((1usize << bits) * 4)
            .ok_or(malformed("slots"))?;
        Ok(Self {
            n,
            bits,
            mask: (1usize << bits) - 1,
            slots,
            records,
        })
    }

    /// Number of tokens.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.n
    }

    /// The id (rank) of the token whose bytes are `key`.
    #[inline(always)]
    pub(crate) fn rank(&self, key: &[u8]) -> Option<u32> {
        let h = table::hash(key);
        let mut i = table::home(h, self.bits);
        // At most every slot once, so a malformed (full) table cannot loop.
        for _ in 0..=self.mask {
            let slot = word(self.slots, i)?;
            if slot == EMPTY {
                return None;
            }
            // The slot this record would have for `key`'s hash: same tag.
            let offset = slot as usize >> 8;
            if slot == table::slot(offset, h) {
                if let Some(id) = self.record(offset, key) {
                    return Some(id);
                }
            }
            i = (i + 1) & self.mask;
        }
        None
    }

    /// The id in the record at `offset` if its token is `key`.
    #[inline(always)]
    fn record(&self, offset: usize, key: &[u8]) -> Option<u32> {
        let len = usize::from(*self.records.get(offset)?);
        if len != key.len() {
            return None;
        }
        let bytes = self.records.get(offset + 1..offset + 1 + len)?;
        // `load` is one-to-one for a given length up to 8: no memcmp call for short tokens.
        let same = if len <= 8 {
            table::load(bytes) == table::load(key)
        } else {
            bytes == key
        };
        let id = self.records.get(offset + 1 + len..offset + 4 + len)?;
        same.then(|| u32::from_le_bytes([id[0], id[1], id[2], 0]))
    }

    /// The ids of the 256 single bytes (every byte-level vocabulary has them all).
    pub(crate) fn byte_ranks(&self) -> Result<[u32; 256], VocabError> {
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
        assert_eq!(
            Vocab::parse(bad.leak()).unwrap_err(),
            VocabError::Malformed("slots")
        );
        // A slot pointing past the records, and a full table: no token, no panic, no loop.
        let mut bad: Vec<u8> = table::MAGIC.to_vec();
        for w in [1u32, 1, 0x7FFF_FF00 | table::tag(table::hash(b"a")), 0] {
            bad.extend_from_slice(&w.to_le_bytes());
        }
        let vocab = Vocab::parse(bad.leak()).unwrap();
        assert_eq!(vocab.rank(b"a"), None);
        assert_eq!(vocab.byte_ranks(), Err(VocabError::MissingByte(0)));
    }

    #[test]
    fn a_tiny_table_finds_each_token_and_nothing_else() {
        // "a", "bc" and a 9-byte token, four slots, written as build.rs writes them.
        let tokens: [&[u8]; 3] = [b"a", b"bc", b"123456789"];
        let bits = 2;
        let (mut slots, mut records) = ([EMPTY; 4], Vec::new());
        for (id, t) in (0u8..).zip(tokens) {
            let h = table::hash(t);
            let mut i = table::home(h, bits);
            while slots[i] != EMPTY {
                i = (i + 1) & 3;
            }
            slots[i] = table::slot(records.len(), h);
            records.push(t.len() as u8);
            records.extend_from_slice(t);
            records.extend_from_slice(&[id, 0, 0]);
        }
        let mut data: Vec<u8> = table::MAGIC.to_vec();
        for w in [3u32, bits].into_iter().chain(slots) {
            data.extend_from_slice(&w.to_le_bytes());
        }
        data.extend_from_slice(&records);
        let vocab = Vocab::parse(data.leak()).unwrap();
        assert_eq!(vocab.len(), 3);
        assert_eq!(vocab.rank(b"a"), Some(0));
        assert_eq!(vocab.rank(b"bc"), Some(1));
        assert_eq!(vocab.rank(b"123456789"), Some(2));
        assert_eq!(vocab.rank(b"123456788"), None);
        assert_eq!(vocab.rank(b"ab"), None);
        assert_eq!(vocab.rank(b""), None);
        assert_eq!(vocab.byte_ranks(), Err(VocabError::MissingByte(0)));
    }

    #[test]
    fn short_words_change_with_every_byte() {
        // `load` keeps every byte of a slice of up to 8 in bits of its own, so slices of one
        // length differing anywhere give different words.
        let base = *b"abcdefgh";
        for len in 1..=8 {
            for at in 0..len {
                for value in [0u8, b'x', 0xFF] {
                    let mut other = base;
                    other[at] = value;
                    assert_eq!(
                        table::load(&base[..len]) == table::load(&other[..len]),
                        base[at] == value,
                        "len {len}, byte {at} = {value}"
                    );
                }
            }
        }
    }
}

//! tiktoken's byte-pair encoding for cl100k_base and o200k_base, on compact tables embedded in
//! the binary.
//!
//! # Why not a BPE crate
//! bpe-openai (GitHub's linear-time BPE) gives the same ids, but deserializes three Aho-Corasick
//! automata over the whole vocabulary at start-up: with its embedded dictionary and a whole-piece
//! hash map that was ~40–50 MiB resident for cl100k_base, most of epp's peak RSS. Here the
//! vocabulary is what `build.rs` writes from tiktoken-rs's copy of OpenAI's file (token bytes, byte
//! offsets and a prebuilt hash table: 2.1 MB for cl100k_base, 4.3 MB for o200k_base, see
//! [`table`]), read in place through `include_bytes!`: nothing is built or copied at start-up, and
//! only the pages lookups touch become resident.
//!
//! # Algorithm
//! Text is cut into pieces ([`pretokenize`]); a piece that is itself a token is that token (one
//! table lookup: most pieces of ordinary text, " the", " model"). Any other piece is merged as
//! tiktoken merges it: start from single bytes, and repeatedly merge the adjacent pair whose
//! concatenation has the lowest rank, the leftmost on ties, until no adjacent pair is a token.
//! Pieces up to [`SHORT`] bytes do this with a linear scan over a stack array (tiktoken's own
//! loop, quadratic but tiny); longer ones keep the candidate pairs in a min-heap keyed by (rank,
//! position) over a linked list of parts, with stale entries skipped on pop, so a pathological
//! piece (100 KB of spaces or punctuation is one piece) costs O(n log n), not O(n²). Both give
//! the same merges: each step takes the minimum of (rank, position) over the current pairs.
//! Token id = rank for these vocabularies. Exactness against tiktoken-rs is tested here and in
//! `tokenize`.

pub(crate) mod pretokenize;
mod table;
mod vocab;

use pretokenize::{Pattern, Pretokenizer};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::OnceLock;
use vocab::Vocab;
pub(crate) use vocab::VocabError;

static CL100K: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/cl100k_base.bpe"));
static O200K: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/o200k_base.bpe"));

/// Pieces up to this many bytes merge by linear scan; longer ones through the heap.
const SHORT: usize = 48;
/// No pair: a rank no token has.
const NONE: u32 = u32::MAX;

/// One vocabulary's encoder (a process-wide static, see [`Encoder::cl100k`]).
#[derive(Debug)]
pub(crate) struct Encoder {
    vocab: Vocab,
    byte_ranks: [u32; 256],
    pattern: Pattern,
    /// The regex pre-tokenizer, built on first use: cl100k_base needs it only for non-ASCII
    /// text. `None` if it failed to build (it does not: `pretokenizers_build`); the text is then
    /// encoded as one piece rather than not at all.
    pre: OnceLock<Option<Pretokenizer>>,
}

impl Encoder {
    pub(crate) fn cl100k() -> Result<&'static Encoder, VocabError> {
        static ENCODER: OnceLock<Result<Encoder, VocabError>> = OnceLock::new();
        ENCODER
            .get_or_init(|| Encoder::new(CL100K, Pattern::Cl100k))
            .as_ref()
            .map_err(|e| *e)
    }

    pub(crate) fn o200k() -> Result<&'static Encoder, VocabError> {
        static ENCODER: OnceLock<Result<Encoder, VocabError>> = OnceLock::new();
        ENCODER
            .get_or_init(|| Encoder::new(O200K, Pattern::O200k))
            .as_ref()
            .map_err(|e| *e)
    }

    fn new(data: &'static [u8], pattern: Pattern) -> Result<Self, VocabError> {
        let vocab = Vocab::parse(data)?;
        let byte_ranks = vocab.byte_ranks()?;
        Ok(Self {
            vocab,
            byte_ranks,
            pattern,
            pre: OnceLock::new(),
        })
    }

    /// tiktoken's `encode_ordinary` (no special tokens; these vocabularies do not normalize).
    pub(crate) fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 4 + 1);
        if self.pattern == Pattern::Cl100k && text.is_ascii() {
            pretokenize::cl100k_ascii_pieces(text.as_bytes(), |p| self.push_piece(p, &mut out));
            return out;
        }
        match self.pretokenizer() {
            Some(pre) => pre.split(text, |p| self.push_piece(p, &mut out)),
            None => self.push_piece(text.as_bytes(), &mut out),
        }
        out
    }

    /// This vocabulary's regex pre-tokenizer.
    pub(crate) fn pretokenizer(&self) -> Option<&Pretokenizer> {
        self.pre
            .get_or_init(|| Pretokenizer::new(self.pattern).ok())
            .as_ref()
    }

    /// One piece's tokens. Inlined into the pre-tokenizer loop: a call per piece costs about as
    /// much as the whole-token lookup it wraps (callgrind, BENCHMARKS.md #16).
    #[inline(always)]
    fn push_piece(&self, piece: &[u8], out: &mut Vec<u32>) {
        match self.vocab.rank(piece) {
            Some(id) => out.push(id),
            None if piece.len() <= SHORT => self.merge_short(piece, out),
            None => self.merge_long(piece, out),
        }
    }

    /// The rank of `piece[from..to]` as one token, or [`NONE`].
    #[inline]
    fn pair(&self, piece: &[u8], from: usize, to: usize) -> u32 {
        piece
            .get(from..to)
            .and_then(|bytes| self.vocab.rank(bytes))
            .unwrap_or(NONE)
    }

    /// tiktoken's loop for a piece of at most [`SHORT`] bytes: parts as (start, token, rank of
    /// the pair it starts), the minimum found by scanning.
    fn merge_short(&self, piece: &[u8], out: &mut Vec<u32>) {
        let n = piece.len();
        let mut parts = [(0usize, 0u32, NONE); SHORT];
        for (i, part) in parts[..n].iter_mut().enumerate() {
            *part = (
                i,
                self.byte_ranks[usize::from(piece[i])],
                self.pair(piece, i, i + 2),
            );
        }
        let mut len = n;
        loop {
            let mut min = (NONE, 0);
            for (i, part) in parts[..len].iter().enumerate() {
                if part.2 < min.0 {
                    min = (part.2, i);
                }
            }
            let (rank, i) = min;
            if rank == NONE {
                break;
            }
            // Part i absorbs part i + 1 (which exists: the last part has no pair).
            parts.copy_within(i + 2..len, i + 1);
            len -= 1;
            let start = |j: usize| if j < len { parts[j].0 } else { n };
            let (after, after_next) = (start(i + 1), start(i + 2));
            parts[i].1 = rank;
            parts[i].2 = if i + 1 < len {
                self.pair(piece, parts[i].0, after_next)
            } else {
                NONE
            };
            if i > 0 {
                parts[i - 1].2 = self.pair(piece, parts[i - 1].0, after);
            }
        }
        out.extend(parts[..len].iter().map(|p| p.1));
    }

    /// The same merges for a long piece: parts in a linked list indexed by their start byte,
    /// candidate pairs in a min-heap of (rank, start). An entry is stale when its part was
    /// absorbed or its pair re-ranked since (`pair[i]` no longer equals its rank): skipped.
    fn merge_long(&self, piece: &[u8], out: &mut Vec<u32>) {
        let n = piece.len();
        // next[i]: where the part starting at i ends (n for the last); prev[i]: where the part
        // before it starts (usize::MAX for the first).
        let mut next: Vec<usize> = (1..=n).collect();
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
        let mut token: Vec<u32> = piece
            .iter()
            .map(|&b| self.byte_ranks[usize::from(b)])
            .collect();
        let mut pair: Vec<u32> = (0..n).map(|i| self.pair(piece, i, i + 2)).collect();
        let mut heap: BinaryHeap<Reverse<(u32, usize)>> = (0..n)
            .filter(|&i| pair[i] != NONE)
            .map(|i| Reverse((pair[i], i)))
            .collect();
        while let Some(Reverse((rank, i))) = heap.pop() {
            if pair[i] != rank {
                continue;
            }
            let gone = next[i];
            let end = next[gone];
            next[i] = end;
            pair[gone] = NONE;
            token[i] = rank;
            pair[i] = NONE;
            if end < n {
                prev[end] = i;
                pair[i] = self.pair(piece, i, next[end]);
                if pair[i] != NONE {
                    heap.push(Reverse((pair[i], i)));
                }
            }
            let p = prev[i];
            if p < n {
                pair[p] = self.pair(piece, p, end);
                if pair[p] != NONE {
                    heap.push(Reverse((pair[p], p)));
                }
            }
        }
        let mut i = 0;
        while i < n {
            out.push(token[i]);
            i = next[i];
        }
    }
}

#[cfg(test)]
mod tests;

//! Tokenization for the prefix index, with OpenAI's vocabularies embedded (no network).
//!
//! cl100k_base and o200k_base use our own BPE ([`crate::request::bpe`]): tiktoken's merge rule
//! on compact tables that `build.rs` writes and the binary carries, read in place, so a
//! vocabulary costs a few MB of read-only pages instead of the ~40–50 MiB of automata and maps
//! that bpe-openai, used before, built at start-up. It gives exactly tiktoken's token ids (checked
//! against tiktoken-rs and bpe-openai in `bpe::tests` and below). p50k_base stays on tiktoken-rs.
//! Only a bounded prefix of the prompt is tokenized: the index never looks past its token cap,
//! and tokenizing is the largest per-request cost epp has.
//!
//! # Segment cache
//! Prompts repeat: system prompts, tool definitions, and every turn of a chat resends the whole
//! conversation. The text is therefore cut into segments of about [`SEGMENT_BYTES`], each ending
//! just before a whitespace run (where BPE pre-tokenization splits anyway), and each segment's
//! tokens are cached by the segment's hash. A repeated prefix costs a hash per segment instead
//! of a BPE pass. A segment is cached the second time it is seen (a direct-mapped table of the
//! hashes seen once decides): a prompt never repeated, such as a one-off 100K-token document,
//! would otherwise fill the cache with segments nobody asks for again, push out the shared
//! system prompts and histories the cache is for, and keep ~1 KiB resident per segment (up to
//! ~8 MiB with `CACHE_SEGMENTS`). The price is one more BPE pass over a segment, on its first
//! repeat. Segment boundaries depend only on the text before them, so two prompts that share a
//! text prefix share their leading segments and therefore their leading tokens. Tokens
//! can differ from a single-pass encoding only where a boundary splits what one pass would have
//! merged across whitespace; for the approximate prefix index that is immaterial, since the same
//! text always yields the same tokens.
//!
//! A Hugging Face `tokenizer.json` ([`crate::request::hf`]) serves the precise prefix scorer,
//! whose block keys must equal the pod's, so its segments are cut only before a space that
//! follows a non-space (a pre-token boundary for the GPT-2, Llama 3, Qwen 2 and cl100k regexes:
//! none continues a piece into a following space) and never mid-run: a long text without such
//! a place is encoded in one pass.

use crate::request::bpe::{Encoder, VocabError};
use crate::request::hf::{HfError, HfTokenizer, LocalTokenizer};
use lru::LruCache;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use tiktoken_rs::CoreBPE;

/// Target segment length in bytes.
pub(crate) const SEGMENT_BYTES: usize = 1024;
/// Segments kept (~1 KiB of tokens each: about 8 MiB in all, when that much text repeats).
const CACHE_SEGMENTS: usize = 8192;

/// The vocabularies epp can tokenize with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize)]
pub enum Vocabulary {
    #[default]
    #[serde(rename = "cl100k_base")]
    Cl100kBase,
    #[serde(rename = "o200k_base")]
    O200kBase,
    #[serde(rename = "p50k_base")]
    P50kBase,
    /// No tokenizer: every 4 bytes of text are one pseudo-token (upstream's approximation,
    /// `averageCharactersPerToken = 4`), so a 16-token block is 64 bytes of text, as in GIE's
    /// and llm-d's approximate index. No vocabulary tables (≈ 50 MiB less resident memory)
    /// and no BPE pass; block boundaries fall mid-word, so matches are as coarse as upstream's.
    #[serde(rename = "characters")]
    Characters,
}

/// Where a tokenizer's vocabulary comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenizerSource {
    Tiktoken(Vocabulary),
    /// A `tokenizer.json` found through llm-d's `tokenizersPoolConfig.local`.
    HuggingFace(LocalTokenizer),
}

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("building the {vocab:?} tokenizer failed: {message}")]
    Tiktoken { vocab: Vocabulary, message: String },
    #[error(transparent)]
    HuggingFace(#[from] HfError),
}

type SegmentCache = Mutex<Segments>;

/// Recently used segments' tokens, and the hashes of segments seen once (see the module docs).
struct Segments {
    lru: LruCache<u64, Arc<[u32]>>,
    /// Direct-mapped by hash, twice the cache's entries: a segment whose hash is found here has
    /// been seen before and is admitted to `lru`.
    seen: Box<[u64]>,
}

impl Segments {
    fn new(entries: usize) -> Mutex<Self> {
        let cap = NonZeroUsize::new(entries).unwrap_or(NonZeroUsize::MIN);
        Mutex::new(Self {
            lru: LruCache::new(cap),
            seen: vec![0; (entries * 2).next_power_of_two()].into_boxed_slice(),
        })
    }

    /// Caches `tokens` if `key` was seen before; otherwise remembers `key`.
    fn offer(&mut self, key: u64, tokens: &Arc<[u32]>) {
        let at = key as usize & (self.seen.len() - 1);
        if self.seen[at] == key {
            self.lru.put(key, Arc::clone(tokens));
        } else {
            self.seen[at] = key;
        }
    }
}

/// The BPE implementation behind a vocabulary.
#[derive(Clone)]
enum Bpe {
    /// Our BPE on the embedded cl100k_base / o200k_base tables ([`crate::request::bpe`]), a
    /// process-wide static.
    Ranked(&'static Encoder),
    Tiktoken(Arc<CoreBPE>),
    /// A Hugging Face byte-level BPE `tokenizer.json`, with its origin and content digest.
    Hf(Arc<HfTokenizer>, Arc<(LocalTokenizer, u64)>),
    /// [`Vocabulary::Characters`].
    Characters,
}

/// Bytes of text per pseudo-token in [`Vocabulary::Characters`].
const CHARACTERS_PER_TOKEN: usize = 4;

/// [`Vocabulary::Characters`]: each whole group of 4 bytes, as a little-endian `u32`; a
/// trailing partial group is dropped (it may still grow into a different group).
fn character_tokens(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(CHARACTERS_PER_TOKEN)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

impl Bpe {
    fn encode(&self, text: &str) -> Vec<u32> {
        match self {
            Bpe::Characters => character_tokens(text.as_bytes()),
            Bpe::Ranked(t) => t.encode(text),
            Bpe::Tiktoken(t) => t.encode_ordinary(text),
            Bpe::Hf(t, _) => t.encode(text),
        }
    }
}

fn vocab_error(vocab: Vocabulary, e: VocabError) -> TokenizerError {
    TokenizerError::Tiktoken {
        vocab,
        message: e.to_string(),
    }
}

/// A shared tokenizer with its segment cache.
#[derive(Clone)]
pub struct Tokenizer {
    bpe: Bpe,
    vocab: Vocabulary,
    cache: Arc<SegmentCache>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.bpe {
            Bpe::Hf(t, built) => f
                .debug_struct("Tokenizer")
                .field("hf", t)
                .field("source", &built.0)
                .finish(),
            _ => f
                .debug_struct("Tokenizer")
                .field("vocab", &self.vocab)
                .finish(),
        }
    }
}

/// Upper bound on bytes per token used to size the text prefix worth tokenizing.
const MAX_BYTES_PER_TOKEN: usize = 8;

impl Tokenizer {
    pub fn new(vocab: Vocabulary) -> Result<Self, TokenizerError> {
        let bpe = match vocab {
            Vocabulary::Cl100kBase => {
                Bpe::Ranked(Encoder::cl100k().map_err(|e| vocab_error(vocab, e))?)
            }
            Vocabulary::O200kBase => {
                let encoder = Encoder::o200k().map_err(|e| vocab_error(vocab, e))?;
                // Every o200k text goes through the regex: build it now, not on a request.
                encoder.pretokenizer();
                Bpe::Ranked(encoder)
            }
            Vocabulary::P50kBase => {
                let built = tiktoken_rs::p50k_base().map_err(|e| TokenizerError::Tiktoken {
                    vocab,
                    message: e.to_string(),
                })?;
                Bpe::Tiktoken(Arc::new(built))
            }
            Vocabulary::Characters => Bpe::Characters,
        };
        // Pseudo-tokens cost less to make than to cache.
        let segments = match vocab {
            Vocabulary::Characters => 1,
            _ => CACHE_SEGMENTS,
        };
        Ok(Self {
            bpe,
            vocab,
            cache: Arc::new(Segments::new(segments)),
        })
    }

    pub(crate) fn vocabulary(&self) -> Vocabulary {
        self.vocab
    }

    /// Builds the tokenizer `source` names (a `tokenizer.json` is read and parsed).
    pub(crate) fn from_source(source: &TokenizerSource) -> Result<Self, TokenizerError> {
        let local = match source {
            TokenizerSource::Tiktoken(v) => return Self::new(*v),
            TokenizerSource::HuggingFace(local) => local,
        };
        let path = local.resolve()?;
        let digest = file_digest(&path)?;
        let hf = HfTokenizer::from_file(&path)?;
        let bpe = Bpe::Hf(Arc::new(hf), Arc::new((local.clone(), digest)));
        Ok(Self {
            bpe,
            vocab: Vocabulary::default(),
            cache: Arc::new(Segments::new(CACHE_SEGMENTS)),
        })
    }

    /// Whether this tokenizer is what `source` builds now (for a `tokenizer.json`: the same
    /// configuration and an unchanged file), so a reload can keep it.
    pub fn is_built_from(&self, source: &TokenizerSource) -> bool {
        match (&self.bpe, source) {
            (Bpe::Hf(_, built), TokenizerSource::HuggingFace(local)) => {
                built.0 == *local
                    && local.resolve().ok().and_then(|p| file_digest(&p).ok()) == Some(built.1)
            }
            (Bpe::Hf(..), _) | (_, TokenizerSource::HuggingFace(_)) => false,
            (_, TokenizerSource::Tiktoken(v)) => self.vocab == *v,
        }
    }

    /// Tokens of the first `max_tokens` of `text`. The text is cut before tokenizing; the token
    /// at the cut may differ from a full tokenization, so it is dropped.
    pub fn encode_prefix(&self, text: &str, max_tokens: usize) -> Vec<u32> {
        if let Bpe::Characters = self.bpe {
            let limit = max_tokens.saturating_mul(CHARACTERS_PER_TOKEN);
            let bytes = text.as_bytes();
            return character_tokens(&bytes[..bytes.len().min(limit)]);
        }
        let limit = max_tokens.saturating_mul(MAX_BYTES_PER_TOKEN);
        let (slice, cut) = if text.len() > limit {
            let mut end = limit;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            (&text[..end], true)
        } else {
            (text, false)
        };
        let mut tokens = Vec::new();
        let strict = matches!(self.bpe, Bpe::Hf(..));
        for segment in segments(slice, strict) {
            if tokens.len() >= max_tokens {
                break;
            }
            tokens.extend_from_slice(&self.segment_tokens(segment));
        }
        if cut {
            tokens.pop();
        }
        tokens.truncate(max_tokens);
        tokens
    }

    fn segment_tokens(&self, segment: &str) -> Arc<[u32]> {
        let key = xxhash_rust::xxh64::xxh64(segment.as_bytes(), 0);
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(hit) = cache.lru.get(&key) {
            return Arc::clone(hit);
        }
        drop(cache);
        let tokens: Arc<[u32]> = self.bpe.encode(segment).into();
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .offer(key, &tokens);
        tokens
    }
}

/// Splits `text` into segments of about [`SEGMENT_BYTES`], each cut just before a whitespace
/// byte that follows a non-whitespace byte; a text without such a place within four segment
/// lengths is cut at a character boundary. `strict` (exact tokens): cut only before a space
/// byte that follows a non-whitespace byte, and nowhere else.
fn segments(text: &str, strict: bool) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = cut_point(rest, strict);
        let (head, tail) = rest.split_at(end);
        rest = tail;
        Some(head)
    })
}

fn cut_point(text: &str, strict: bool) -> usize {
    let bytes = text.as_bytes();
    if bytes.len() <= SEGMENT_BYTES {
        return bytes.len();
    }
    let horizon = bytes.len().min(SEGMENT_BYTES * 4);
    let ws = |b: u8| b == b' ' || b == b'\n' || b == b'\t' || b == b'\r';
    if strict {
        return (SEGMENT_BYTES..bytes.len())
            .find(|&i| bytes[i] == b' ' && !ws(bytes[i - 1]))
            .unwrap_or(bytes.len());
    }
    if let Some(i) = (SEGMENT_BYTES..horizon).find(|&i| ws(bytes[i]) && !ws(bytes[i - 1])) {
        return i;
    }
    let mut end = horizon;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    end
}

/// xxh64 of a file's bytes (a changed `tokenizer.json` is rebuilt on reload).
fn file_digest(path: &std::path::Path) -> Result<u64, HfError> {
    let bytes = std::fs::read(path).map_err(|source| HfError::Io {
        path: path.to_owned(),
        source,
    })?;
    Ok(xxhash_rust::xxh64::xxh64(&bytes, 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::bpe::pretokenize::cl100k_ascii_pieces;

    #[test]
    fn characters_are_four_bytes_a_token_with_no_tables() {
        let t = Tokenizer::new(Vocabulary::Characters).unwrap();
        let a = "You are a helpful assistant. Answer briefly. Question one?";
        let b = "You are a helpful assistant. Answer briefly. Question two?";
        let (ta, tb) = (t.encode_prefix(a, 1000), t.encode_prefix(b, 1000));
        assert_eq!(ta.len(), a.len() / 4);
        assert_eq!(ta[0], u32::from_le_bytes(*b"You "));
        let shared = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
        let same = ta.iter().zip(&tb).take_while(|(x, y)| x == y).count();
        assert_eq!(
            same,
            shared / 4,
            "a shared text prefix is a shared token prefix"
        );
        assert_eq!(t.encode_prefix(a, 3).len(), 3);
        assert!(
            t.encode_prefix("abc", 10).is_empty(),
            "a partial group is no token"
        );
        let serde: Vocabulary = serde_norway::from_str("characters").unwrap();
        assert_eq!(serde, Vocabulary::Characters);
    }

    #[test]
    fn prefix_tokens_agree_with_full_tokenization() {
        let t = Tokenizer::new(Vocabulary::Cl100kBase).unwrap();
        let text = "The quick brown fox jumps over the lazy dog. ".repeat(200);
        let full = t.encode_prefix(&text, usize::MAX / 16);
        let head = t.encode_prefix(&text, 50);
        assert_eq!(head.len(), 50);
        assert_eq!(head[..], full[..50]);
        assert!(t.encode_prefix("", 10).is_empty());
    }

    #[test]
    fn segments_cover_the_text_and_share_prefixes() {
        let a = "word ".repeat(2000) + "tail one";
        let b = "word ".repeat(2000) + "other tail";
        let sa: Vec<&str> = segments(&a, false).collect();
        let sb: Vec<&str> = segments(&b, false).collect();
        assert_eq!(sa.concat(), a);
        assert!(sa.len() > 5 && sa.iter().all(|s| s.len() <= SEGMENT_BYTES * 4));
        assert_eq!(
            sa[..sa.len() - 1],
            sb[..sb.len() - 1],
            "a shared text prefix gives shared segments"
        );
        let unbroken = "é".repeat(5000);
        assert_eq!(
            segments(&unbroken, false).collect::<Vec<_>>().concat(),
            unbroken
        );
        assert_eq!(
            segments(&unbroken, true).count(),
            1,
            "strict: no cut inside a run"
        );
    }

    #[test]
    fn cached_tokens_match_a_single_pass_on_ordinary_text() {
        let t = Tokenizer::new(Vocabulary::Cl100kBase).unwrap();
        let text: String = (0..400)
            .map(|i| format!("The quick brown fox {i} jumps over the lazy dog, again. "))
            .collect();
        let single = t.bpe.encode(&text);
        let cached = |t: &Tokenizer| t.cache.lock().unwrap().lru.len();
        let first = t.encode_prefix(&text, usize::MAX / 16);
        assert_eq!(cached(&t), 0, "seen once: nothing cached");
        let second = t.encode_prefix(&text, usize::MAX / 16);
        assert_eq!(first, second, "deterministic");
        let n = cached(&t);
        assert_eq!(n, segments(&text, false).count(), "seen twice: cached");
        let third = t.encode_prefix(&text, usize::MAX / 16);
        assert_eq!(
            (third, cached(&t)),
            (first.clone(), n),
            "third pass from the cache"
        );
        assert_eq!(
            first, single,
            "boundaries before spaces do not change pre-tokenization here"
        );
    }

    /// Text that stresses pre-tokenization: contractions, digit runs, whitespace runs before
    /// words and at the end, CRLF, CJK, emoji sequences, combining marks, odd spaces, code.
    const ATOMS: [&str; 52] = [
        "a",
        "Hello",
        " world",
        " ",
        "  ",
        "   ",
        "\n",
        "\n\n",
        "\r\n",
        "\t",
        " \n ",
        "'s",
        "'S",
        "'ll",
        "DON'T",
        "0",
        "12",
        "1234567",
        "½",
        "٣",
        "?!",
        "...",
        "->",
        "::",
        "{",
        "}",
        "fn main()",
        "==",
        "//",
        "__init__",
        "中文",
        "日本語",
        "한국어",
        "e\u{301}",
        "ß",
        "Σ",
        "العربية",
        "\u{a0}",
        "\u{3000}",
        "\u{2028}",
        "😀",
        "👍🏽",
        "👨‍👩‍👧",
        "🇫🇷",
        "\u{85}",
        "ǅ",
        "𝔘",
        "—",
        "’s",
        "camelCase",
        "x/y",
        "$",
    ];

    /// The ASCII pre-tokenizer cuts every ASCII text where bpe-openai's regex does: random
    /// texts over the bytes where the pattern's alternatives meet (apostrophes and the letters of
    /// contractions, each whitespace byte, digits, punctuation, control bytes).
    #[test]
    fn ascii_pieces_equal_the_regex() {
        const BYTES: &[u8] =
            b"sStTrReEvVmMlLdDax'  \t\n\r\x0B\x0C0123.,!?-_(){}\x00\x01\x1F\x7F\"/";
        let tok = bpe_openai::cl100k_base();
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut texts: Vec<String> = vec![
            String::new(),
            " ".into(),
            "\n".into(),
            "'".into(),
            "  a".into(),
            "a  ".into(),
            " \n ".into(),
        ];
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 32) as usize
        };
        for _ in 0..20_000 {
            let len = 1 + next() % 24;
            texts.push(
                (0..len)
                    .map(|_| char::from(BYTES[next() % BYTES.len()]))
                    .collect(),
            );
        }
        texts.push(include_str!("tokenize.rs").replace(|c: char| !c.is_ascii(), "?"));
        for text in &texts {
            let mut ours: Vec<&[u8]> = Vec::new();
            cl100k_ascii_pieces(text.as_bytes(), |p| ours.push(p));
            let regex: Vec<&[u8]> = tok.split(text).map(str::as_bytes).collect();
            assert_eq!(ours, regex, "on {text:?}");
        }
    }

    #[test]
    fn the_tokenizers_bpe_gives_tiktokens_ids() {
        let reference = [
            (Vocabulary::Cl100kBase, tiktoken_rs::cl100k_base().unwrap()),
            (Vocabulary::O200kBase, tiktoken_rs::o200k_base().unwrap()),
        ];
        let mut texts: Vec<String> = vec![
            String::new(),
            " ".into(),
            "a  ".into(),
            "  a".into(),
            "x".repeat(3000),
            " ".repeat(2000),
            "\n".repeat(500),
            "😀".repeat(200),
            "1234567890".repeat(50),
            "a\u{301}".repeat(100),
            include_str!("tokenize.rs").to_owned(),
        ];
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..300 {
            let mut s = String::new();
            let len = 1 + (state % 400) as usize;
            while s.len() < len {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                match state % 4 {
                    0 => s.extend(char::from_u32((state >> 40) as u32 % 0x3_0000)),
                    _ => s.push_str(ATOMS[(state >> 32) as usize % ATOMS.len()]),
                }
            }
            texts.push(s);
        }
        // ASCII-only texts, which cl100k_base pre-tokenizes without the regex.
        let ascii: Vec<&str> = ATOMS.iter().copied().filter(|a| a.is_ascii()).collect();
        for _ in 0..100 {
            let mut s = String::new();
            while s.len() < 200 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                s.push_str(ascii[(state >> 32) as usize % ascii.len()]);
            }
            texts.push(s);
        }
        for (vocab, tiktoken) in &reference {
            let ours = Tokenizer::new(*vocab).unwrap();
            for text in &texts {
                assert_eq!(
                    ours.bpe.encode(text),
                    tiktoken.encode_ordinary(text),
                    "{vocab:?} on {text:?}"
                );
            }
        }
    }
}

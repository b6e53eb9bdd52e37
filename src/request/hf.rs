//! Hugging Face byte-level BPE tokenizers (`tokenizer.json`), for the precise prefix scorer.
//!
//! The precise index keys blocks by the token ids the model server produced, so epp must
//! tokenize exactly as the server does. Llama 3, Qwen 2/3, Mistral-Nemo, DeepSeek and GPT-2
//! ship byte-level BPE tokenizers as `tokenizer.json`; this module reads that file directly
//! (no `tokenizers` crate, whose Python-compatible machinery is far larger than the one model
//! shape needed here) and reproduces `Tokenizer.encode(text, add_special_tokens=False)`, which
//! is what llm-d's indexer calls:
//!
//! 1. added tokens (`added_tokens`) are cut out of the raw text, leftmost-longest, and become
//!    their own ids;
//! 2. every other piece is normalized (none or NFC), split by the pre-tokenizers in order
//!    (`Split` with a regex, `Isolated`), then by `ByteLevel` (optional leading space, optional
//!    GPT-2 regex), and mapped to bytes;
//! 3. each pre-token is merged by BPE: the adjacent pair with the lowest **merge rank** (its
//!    line in `merges`) first, leftmost on ties. Merge order, not token id, decides: the two
//!    agree for tiktoken vocabularies but not for trained HF ones, so tiktoken's `CoreBPE`
//!    (which merges whatever concatenation is in the vocabulary) is not used.
//!
//! Any other shape (WordPiece, Unigram, SentencePiece-style `Metaspace`, other normalizers,
//! dropout, byte fallback, added tokens with `lstrip`/`rstrip`/`single_word`) is refused with
//! an [`HfError::Unsupported`] naming the field, rather than tokenized approximately.
//!
//! Cost: pre-tokenization is one regex pass per step; merging is O(n log n) per pre-token with
//! a binary heap, so a long run without a split (a base64 blob) cannot go quadratic.

pub(crate) mod local;
mod model;

use fancy_regex::Regex;
use model::{AddedTokens, Bpe};
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use unicode_normalization::UnicodeNormalization;

pub use local::LocalTokenizer;

/// GPT-2's pre-tokenization regex, used by `ByteLevel` when `use_regex` is true.
const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

#[derive(Debug, thiserror::Error)]
pub enum HfError {
    #[error("reading tokenizer {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("tokenizer {path} is not a valid tokenizer.json: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("tokenizer.json: unsupported {0} (epp reads byte-level BPE tokenizers only)")]
    Unsupported(String),
    #[error("tokenizer.json: {0}")]
    Invalid(String),
    #[error("local tokenizer: {0}")]
    Local(String),
}

/// One pre-tokenization step, in the file's order.
enum PreStep {
    /// `Split` with behavior `Isolated`: matches and the text between them become pieces.
    Split(Regex),
}

/// The final `ByteLevel` step.
struct ByteLevel {
    add_prefix_space: bool,
    regex: Option<Regex>,
}

/// A loaded byte-level BPE tokenizer.
pub struct HfTokenizer {
    added: AddedTokens,
    nfc: bool,
    steps: Vec<PreStep>,
    byte_level: ByteLevel,
    bpe: Bpe,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("vocab", &self.bpe.len())
            .field("added", &self.added.len())
            .finish()
    }
}

impl HfTokenizer {
    pub fn from_file(path: &Path) -> Result<Self, HfError> {
        let bytes = std::fs::read(path).map_err(|source| HfError::Io {
            path: path.to_owned(),
            source,
        })?;
        let file: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|source| HfError::Json {
                path: path.to_owned(),
                source,
            })?;
        Self::from_json(&file)
    }

    /// Builds a tokenizer from a parsed `tokenizer.json`.
    pub(crate) fn from_json(file: &serde_json::Value) -> Result<Self, HfError> {
        let model = file
            .get("model")
            .ok_or_else(|| HfError::Invalid("no \"model\"".into()))?;
        let bpe = Bpe::from_json(model)?;
        let added = AddedTokens::from_json(file.get("added_tokens"))?;
        let nfc = normalizer_is_nfc(file.get("normalizer"))?;
        let mut steps = Vec::new();
        let byte_level = pre_tokenizer(
            file.get("pre_tokenizer")
                .unwrap_or(&serde_json::Value::Null),
            &mut steps,
        )?
        .ok_or_else(|| {
            HfError::Unsupported("pre_tokenizer without a final ByteLevel step".into())
        })?;
        Ok(Self {
            added,
            nfc,
            steps,
            byte_level,
            bpe,
        })
    }

    /// Token ids of `text`, as `encode(text, add_special_tokens=False)` gives them.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3);
        let mut start = 0;
        for (at, end, id) in self.added.find_iter(text) {
            self.encode_plain(&text[start..at], &mut out);
            out.push(id);
            start = end;
        }
        self.encode_plain(&text[start..], &mut out);
        out
    }

    /// Encodes text that holds no added token.
    fn encode_plain(&self, text: &str, out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let text: Cow<'_, str> = if self.nfc {
            Cow::Owned(text.nfc().collect())
        } else {
            Cow::Borrowed(text)
        };
        let mut pieces = vec![text.as_ref()];
        for PreStep::Split(re) in &self.steps {
            pieces = pieces
                .into_iter()
                .flat_map(|p| split_isolated(re, p))
                .collect();
        }
        for piece in pieces {
            let prefixed: Cow<'_, str> =
                if self.byte_level.add_prefix_space && !piece.starts_with(' ') {
                    Cow::Owned(format!(" {piece}"))
                } else {
                    Cow::Borrowed(piece)
                };
            match &self.byte_level.regex {
                Some(re) => split_isolated(re, &prefixed)
                    .for_each(|w| self.bpe.encode_word(w.as_bytes(), out)),
                None => self.bpe.encode_word(prefixed.as_bytes(), out),
            }
        }
    }
}

/// `Split` with `Isolated` behavior: each match and each non-empty gap is a piece. A regex
/// that fails at run time (backtrack limit) leaves the rest of the text as one piece.
fn split_isolated<'t>(re: &Regex, text: &'t str) -> impl Iterator<Item = &'t str> {
    let mut pieces = Vec::new();
    let mut last = 0;
    for m in re.find_iter(text) {
        let Ok(m) = m else { break };
        if m.start() > last {
            pieces.push(&text[last..m.start()]);
        }
        if m.end() > m.start() {
            pieces.push(m.as_str());
        }
        last = m.end();
    }
    if last < text.len() {
        pieces.push(&text[last..]);
    }
    pieces.into_iter()
}

fn type_of(v: &serde_json::Value) -> &str {
    v.get("type")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("?")
}

/// `None`, `NFC`, or a `Sequence` of those; anything else is refused.
fn normalizer_is_nfc(v: Option<&serde_json::Value>) -> Result<bool, HfError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(false);
    };
    match type_of(v) {
        "NFC" => Ok(true),
        "Sequence" => {
            let parts = v
                .get("normalizers")
                .and_then(serde_json::Value::as_array)
                .ok_or_else(|| {
                    HfError::Invalid("normalizer Sequence without \"normalizers\"".into())
                })?;
            parts
                .iter()
                .try_fold(false, |nfc, n| Ok(normalizer_is_nfc(Some(n))? || nfc))
        }
        other => Err(HfError::Unsupported(format!(
            "normalizer {other} (only none or NFC)"
        ))),
    }
}

/// Flattens the pre-tokenizer into `steps`; returns the `ByteLevel` step, which must be last.
fn pre_tokenizer(
    v: &serde_json::Value,
    steps: &mut Vec<PreStep>,
) -> Result<Option<ByteLevel>, HfError> {
    if v.is_null() {
        return Ok(None);
    }
    match type_of(v) {
        "Sequence" => {
            let parts = v
                .get("pretokenizers")
                .and_then(serde_json::Value::as_array)
                .ok_or_else(|| {
                    HfError::Invalid("pre_tokenizer Sequence without \"pretokenizers\"".into())
                })?;
            let mut byte_level = None;
            for p in parts {
                if byte_level.is_some() {
                    return Err(HfError::Unsupported(format!(
                        "pre_tokenizer {} after ByteLevel",
                        type_of(p)
                    )));
                }
                byte_level = pre_tokenizer(p, steps)?;
            }
            Ok(byte_level)
        }
        "Split" => {
            steps.push(PreStep::Split(split_step(v)?));
            Ok(None)
        }
        "ByteLevel" => {
            let flag = |k: &str| {
                v.get(k)
                    .and_then(serde_json::Value::as_bool)
                    .unwrap_or(true)
            };
            let regex = if flag("use_regex") {
                Some(compile(GPT2_PATTERN)?)
            } else {
                None
            };
            Ok(Some(ByteLevel {
                add_prefix_space: flag("add_prefix_space"),
                regex,
            }))
        }
        other => Err(HfError::Unsupported(format!(
            "pre_tokenizer {other} (only Sequence, Split and ByteLevel)"
        ))),
    }
}

fn split_step(v: &serde_json::Value) -> Result<Regex, HfError> {
    let behavior = v
        .get("behavior")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("?");
    if behavior != "Isolated" {
        return Err(HfError::Unsupported(format!(
            "Split behavior {behavior} (only Isolated)"
        )));
    }
    if v.get("invert")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false)
    {
        return Err(HfError::Unsupported("Split with invert: true".into()));
    }
    let pattern = v
        .get("pattern")
        .ok_or_else(|| HfError::Invalid("Split without \"pattern\"".into()))?;
    match (
        pattern.get("Regex").and_then(serde_json::Value::as_str),
        pattern.get("String").and_then(serde_json::Value::as_str),
    ) {
        (Some(re), _) => compile(re),
        (None, Some(literal)) => compile(&fancy_regex::escape(literal)),
        _ => Err(HfError::Invalid(
            "Split pattern is neither Regex nor String".into(),
        )),
    }
}

fn compile(pattern: &str) -> Result<Regex, HfError> {
    Regex::new(pattern).map_err(|e| HfError::Unsupported(format!("Split regex {pattern:?}: {e}")))
}

#[cfg(test)]
mod tests;

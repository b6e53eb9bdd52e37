//! Tokenization for the prefix index, with tiktoken's embedded vocabularies (no network).
//!
//! Building an encoder costs 0.1–0.2 s, so one is built per vocabulary at start-up and shared.
//! Only a bounded prefix of the prompt is tokenized: the index never looks past its token cap,
//! and tokenizing costs ~70 ns per byte, the largest per-request cost epp has.

use std::sync::Arc;
use tiktoken_rs::CoreBPE;

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
}

#[derive(Debug, thiserror::Error)]
#[error("building the {vocab:?} tokenizer failed: {message}")]
pub struct TokenizerError {
    vocab: Vocabulary,
    message: String,
}

/// A shared, immutable tokenizer.
#[derive(Clone)]
pub struct Tokenizer {
    bpe: Arc<CoreBPE>,
    vocab: Vocabulary,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("vocab", &self.vocab).finish()
    }
}

/// Upper bound on bytes per token used to size the text prefix worth tokenizing.
const MAX_BYTES_PER_TOKEN: usize = 8;

impl Tokenizer {
    pub fn new(vocab: Vocabulary) -> Result<Self, TokenizerError> {
        let built = match vocab {
            Vocabulary::Cl100kBase => tiktoken_rs::cl100k_base(),
            Vocabulary::O200kBase => tiktoken_rs::o200k_base(),
            Vocabulary::P50kBase => tiktoken_rs::p50k_base(),
        };
        let bpe = built.map_err(|e| TokenizerError { vocab, message: e.to_string() })?;
        Ok(Self { bpe: Arc::new(bpe), vocab })
    }

    pub fn vocabulary(&self) -> Vocabulary {
        self.vocab
    }

    /// Tokens of the first `max_tokens` of `text`. The text is cut before tokenizing; the token
    /// at the cut may differ from a full tokenization, so it is dropped.
    pub fn encode_prefix(&self, text: &str, max_tokens: usize) -> Vec<u32> {
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
        let mut tokens = self.bpe.encode_ordinary(slice);
        if cut {
            tokens.pop();
        }
        tokens.truncate(max_tokens);
        tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

//! Deterministic tokenization and the chat template.
//!
//! Why: prefix caching works on token ids, and a router predicts hits from the
//! text it sees. The simulator therefore tokenizes with the same BPE that epp
//! can be configured with (tiktoken `cl100k_base` by default), so a shared text
//! prefix is a shared token prefix for both. The encoder is a process-wide
//! singleton (building one costs 0.1–0.2 s) shared by every pod.
//!
//! Chat template (documented, deliberately simple): each message renders as
//! `<|{role}|>\n{content}\n`, then `<|assistant|>\n` as the generation prompt.
//! The markers are ordinary text (no special tokens), and the whole string is
//! tokenized at once, as vLLM applies the template and then tokenizes. A
//! growing conversation therefore shares its token prefix with earlier turns.
//!
//! Simplification: generated text is drawn from a fixed ASCII word list (the
//! content does not matter to routing, its length in tokens does).

use thiserror::Error;
use tiktoken_rs::CoreBPE;

/// Token id type (tiktoken's `Rank`).
pub type TokenId = u32;

/// Which BPE vocabulary to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum TokenizerKind {
    #[default]
    #[value(name = "cl100k_base")]
    Cl100kBase,
    #[value(name = "o200k_base")]
    O200kBase,
}

#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error("token id {0} is not in the vocabulary")]
    UnknownToken(TokenId),
}

/// One chat message after the content parts are joined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatTurn {
    pub role: String,
    pub content: String,
}

/// The chat template: `<|role|>\ncontent\n` per message (+ `<|assistant|>\n`).
pub fn render_chat(turns: &[ChatTurn], add_generation_prompt: bool) -> String {
    let mut out = String::new();
    for turn in turns {
        out.push_str("<|");
        out.push_str(&turn.role);
        out.push_str("|>\n");
        out.push_str(&turn.content);
        out.push('\n');
    }
    if add_generation_prompt {
        out.push_str("<|assistant|>\n");
    }
    out
}

const WORDS: &str = "The quick brown fox jumps over the lazy dog while a simulated model \
server streams plausible tokens so that routers can be measured without any GPU at all and \
every answer keeps the same length in tokens as a real one would";

/// A shared BPE encoder plus the word list used for generated text. Encoding runs on
/// `bpe-openai` (GitHub's linear-time BPE: tiktoken's exact ids at 2–3× its speed, about
/// epp's own BPE's speed), so tokenizing a long prompt costs the pod what it costs a real server, not
/// several times more; decoding stays on tiktoken-rs.
#[derive(Clone, Copy)]
pub struct Tokenizer {
    bpe: &'static CoreBPE,
    fast: &'static bpe_openai::Tokenizer,
    kind: TokenizerKind,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind)
            .finish()
    }
}

impl Tokenizer {
    /// The process-wide encoder of this vocabulary (built on first use).
    pub fn new(kind: TokenizerKind) -> Self {
        let (bpe, fast) = match kind {
            TokenizerKind::Cl100kBase => (
                tiktoken_rs::cl100k_base_singleton(),
                bpe_openai::cl100k_base(),
            ),
            TokenizerKind::O200kBase => (
                tiktoken_rs::o200k_base_singleton(),
                bpe_openai::o200k_base(),
            ),
        };
        Self { bpe, fast, kind }
    }

    /// Tokens of `text`, special-token markers treated as ordinary text.
    pub fn encode(&self, text: &str) -> Vec<TokenId> {
        self.fast.encode(text)
    }

    /// Text of `ids`; invalid UTF-8 across token boundaries is replaced.
    pub fn decode(&self, ids: &[TokenId]) -> Result<String, TokenizerError> {
        let bytes = self
            .bpe
            .decode_bytes(ids)
            .map_err(|e| TokenizerError::UnknownToken(e.token))?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The token ids generated text is drawn from (ASCII words, each decodes alone).
    pub fn output_vocabulary(&self) -> Vec<TokenId> {
        self.encode(WORDS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(role: &str, content: &str) -> ChatTurn {
        ChatTurn {
            role: role.into(),
            content: content.into(),
        }
    }

    #[test]
    fn encode_decode_round_trips() {
        let tok = Tokenizer::new(TokenizerKind::Cl100kBase);
        let ids = tok.encode("Hello, world! <|endoftext|>");
        assert_eq!(tok.decode(&ids).unwrap(), "Hello, world! <|endoftext|>");
        assert!(tok.decode(&[u32::MAX]).is_err());
    }

    #[test]
    fn the_fast_encoder_gives_tiktokens_ids() {
        let texts = [
            "Hello, world! <|endoftext|> café 😀 naïve",
            "  leading spaces, 12345 numbers, tabs\t and\nnewlines\r\n",
            "<|user|>\nWhat's a KV cache?\n<|assistant|>\n",
            "river copper lantern meadow ",
        ];
        for kind in [TokenizerKind::Cl100kBase, TokenizerKind::O200kBase] {
            let tok = Tokenizer::new(kind);
            for text in texts {
                assert_eq!(
                    tok.encode(text),
                    tok.bpe.encode_ordinary(text),
                    "{kind:?} {text:?}"
                );
            }
        }
    }

    #[test]
    fn text_prefix_sharing_is_token_prefix_sharing() {
        let tok = Tokenizer::new(TokenizerKind::Cl100kBase);
        let system = "You are a helpful assistant. ".repeat(20);
        let a = tok.encode(&format!("{system}Question one?"));
        let b = tok.encode(&format!("{system}A different question."));
        let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        assert!(shared >= tok.encode(&system).len() - 1, "{shared}");
    }

    #[test]
    fn a_growing_conversation_shares_its_token_prefix() {
        let tok = Tokenizer::new(TokenizerKind::Cl100kBase);
        let mut turns = vec![
            turn("system", "Be brief."),
            turn("user", "What is a KV cache?"),
        ];
        let first = tok.encode(&render_chat(&turns, true));
        turns.push(turn("assistant", "Stored attention keys and values."));
        turns.push(turn("user", "Why reuse it?"));
        let second = tok.encode(&render_chat(&turns, true));
        assert_eq!(&second[..first.len()], &first[..]);
    }

    #[test]
    fn output_vocabulary_tokens_decode_to_ascii_alone() {
        let tok = Tokenizer::new(TokenizerKind::Cl100kBase);
        for id in tok.output_vocabulary() {
            assert!(tok.decode(&[id]).unwrap().is_ascii());
        }
    }
}

//! The BPE model of a `tokenizer.json` (vocabulary, merges by rank) and its added tokens.
//!
//! Byte-level vocabularies write each byte as a printable character (GPT-2's byte↔unicode
//! map: `Ġ` is the space byte); [`byte_chars`] is that map. Merging works on byte values:
//! single-byte tokens come from the map, and merges are keyed by the ids of their two parts,
//! so the text is never mapped back to those characters.

use super::HfError;
use serde_json::Value;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// GPT-2's byte → printable character map: printable Latin-1 bytes stand for themselves, the
/// other 68 bytes take U+0100 onwards in byte order.
pub(crate) fn byte_chars() -> [char; 256] {
    let printable = |b: u32| {
        (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    let mut out = ['\0'; 256];
    let mut next = 0x100;
    for (b, c) in out.iter_mut().enumerate() {
        let b = b as u32;
        *c = if printable(b) {
            char::from_u32(b).unwrap_or('\0')
        } else {
            next += 1;
            char::from_u32(next - 1).unwrap_or('\0')
        };
    }
    out
}

/// Decodes a byte-level vocabulary string to its bytes; `None` if it holds another character.
fn decode(s: &str, inverse: &HashMap<char, u8>) -> Option<Vec<u8>> {
    s.chars().map(|c| inverse.get(&c).copied()).collect()
}

/// (left id, right id) → (rank, merged id).
type Merges = HashMap<(u32, u32), (u32, u32)>;
/// Added tokens by first byte: (content, id), longest first.
type ByFirstByte = HashMap<u8, Vec<(Box<[u8]>, u32)>>;

/// The merge table and the tokens that start every word.
pub(crate) struct Bpe {
    /// Id of each single byte (`None`: not in the vocabulary).
    bytes: [Option<u32>; 256],
    merges: Merges,
    /// `ignore_merges` (Llama 3): a whole pre-token found in the vocabulary is one token.
    words: Option<HashMap<Vec<u8>, u32>>,
    unk: Option<u32>,
    fuse_unk: bool,
    vocab_len: usize,
}

fn refuse_if(cond: bool, what: &str) -> Result<(), HfError> {
    if cond {
        return Err(HfError::Unsupported(what.into()));
    }
    Ok(())
}

impl Bpe {
    pub(crate) fn from_json(model: &Value) -> Result<Self, HfError> {
        let kind = model.get("type").and_then(Value::as_str).unwrap_or("BPE");
        refuse_if(kind != "BPE", &format!("model type {kind} (only BPE)"))?;
        refuse_if(
            model
                .get("dropout")
                .and_then(Value::as_f64)
                .is_some_and(|d| d > 0.0),
            "BPE dropout",
        )?;
        refuse_if(
            model
                .get("byte_fallback")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            "byte_fallback (SentencePiece-style BPE)",
        )?;
        for affix in ["continuing_subword_prefix", "end_of_word_suffix"] {
            refuse_if(
                model
                    .get(affix)
                    .and_then(Value::as_str)
                    .is_some_and(|s| !s.is_empty()),
                affix,
            )?;
        }
        let vocab: HashMap<String, u32> =
            serde_json::from_value(model.get("vocab").cloned().unwrap_or(Value::Null))
                .map_err(|e| HfError::Invalid(format!("model.vocab: {e}")))?;
        let chars = byte_chars();
        let mut bytes = [None; 256];
        for (b, c) in chars.iter().enumerate() {
            bytes[b] = vocab.get(c.encode_utf8(&mut [0; 4]) as &str).copied();
        }
        let merges = merges(model.get("merges"), &vocab)?;
        let words = model
            .get("ignore_merges")
            .and_then(Value::as_bool)
            .unwrap_or(false)
            .then(|| {
                let inverse: HashMap<char, u8> = chars
                    .iter()
                    .enumerate()
                    .map(|(b, &c)| (c, b as u8))
                    .collect();
                vocab
                    .iter()
                    .filter_map(|(s, &id)| Some((decode(s, &inverse)?, id)))
                    .collect()
            });
        let unk = match model.get("unk_token").and_then(Value::as_str) {
            Some(t) => Some(*vocab.get(t).ok_or_else(|| {
                HfError::Invalid(format!("unk_token {t:?} is not in the vocabulary"))
            })?),
            None => None,
        };
        let fuse_unk = model
            .get("fuse_unk")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        Ok(Self {
            bytes,
            merges,
            words,
            unk,
            fuse_unk,
            vocab_len: vocab.len(),
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.vocab_len
    }

    /// Appends the tokens of one pre-token.
    pub(crate) fn encode_word(&self, word: &[u8], out: &mut Vec<u32>) {
        if let Some(&id) = self.words.as_ref().and_then(|w| w.get(word)) {
            out.push(id);
            return;
        }
        let mut ids: Vec<u32> = Vec::with_capacity(word.len());
        let mut last_unk = false;
        for &b in word {
            match (self.bytes[b as usize], self.unk) {
                (Some(id), _) => ids.push(id),
                (None, Some(unk)) if !(self.fuse_unk && last_unk) => ids.push(unk),
                _ => {}
            }
            last_unk = self.bytes[b as usize].is_none();
        }
        self.merge(&mut ids);
        out.extend_from_slice(&ids);
    }

    /// Applies merges lowest rank first (leftmost on ties) over a linked list of symbols.
    fn merge(&self, ids: &mut Vec<u32>) {
        if ids.len() < 2 {
            return;
        }
        const NONE: usize = usize::MAX;
        let n = ids.len();
        let mut next: Vec<usize> = (1..=n).map(|i| if i == n { NONE } else { i }).collect();
        let mut prev: Vec<usize> = (0..n).map(|i| i.checked_sub(1).unwrap_or(NONE)).collect();
        let mut heap = BinaryHeap::new();
        let push = |heap: &mut BinaryHeap<_>, ids: &[u32], at: usize, right: usize| {
            if let Some(&(rank, _)) = self.merges.get(&(ids[at], ids[right])) {
                heap.push(Reverse((rank, at, ids[at], ids[right])));
            }
        };
        for i in 0..n - 1 {
            push(&mut heap, ids, i, i + 1);
        }
        while let Some(Reverse((_, at, left, right))) = heap.pop() {
            let r = next[at];
            if r == NONE || ids[at] != left || ids[r] != right {
                continue;
            }
            let Some(&(_, merged)) = self.merges.get(&(left, right)) else {
                continue;
            };
            ids[at] = merged;
            next[at] = next[r];
            if next[r] != NONE {
                prev[next[r]] = at;
            }
            next[r] = NONE;
            ids[r] = u32::MAX;
            if prev[at] != NONE {
                push(&mut heap, ids, prev[at], at);
            }
            if next[at] != NONE {
                push(&mut heap, ids, at, next[at]);
            }
        }
        let mut i = 0;
        let mut kept = Vec::with_capacity(n);
        while i != NONE {
            kept.push(ids[i]);
            i = next[i];
        }
        *ids = kept;
    }
}

/// `merges` as `"a b"` lines or `["a", "b"]` pairs → (ids of the parts) → (rank, merged id).
fn merges(v: Option<&Value>, vocab: &HashMap<String, u32>) -> Result<Merges, HfError> {
    let list = v
        .and_then(Value::as_array)
        .ok_or_else(|| HfError::Invalid("model.merges is missing".into()))?;
    let id = |s: &str| {
        vocab
            .get(s)
            .copied()
            .ok_or_else(|| HfError::Invalid(format!("merge part {s:?} is not in the vocabulary")))
    };
    let mut out = HashMap::with_capacity(list.len());
    for (rank, m) in list.iter().enumerate() {
        let (a, b) = match m {
            Value::String(s) => {
                let mut parts = s.split(' ');
                match (parts.next(), parts.next(), parts.next()) {
                    (Some(a), Some(b), None) => (a, b),
                    _ => return Err(HfError::Invalid(format!("merge {s:?} is not two tokens"))),
                }
            }
            Value::Array(p) if p.len() == 2 => match (p[0].as_str(), p[1].as_str()) {
                (Some(a), Some(b)) => (a, b),
                _ => return Err(HfError::Invalid(format!("merge {m} is not two strings"))),
            },
            other => {
                return Err(HfError::Invalid(format!(
                    "merge {other} is neither \"a b\" nor [a, b]"
                )))
            }
        };
        let pair = (id(a)?, id(b)?);
        // A repeated pair keeps its last rank, as `tokenizers` does.
        out.insert(pair, (rank as u32, id(&format!("{a}{b}"))?));
    }
    Ok(out)
}

/// Added tokens, matched in the raw text leftmost-longest (what `tokenizers` does).
pub(crate) struct AddedTokens {
    by_first: ByFirstByte,
    len: usize,
}

impl AddedTokens {
    pub(crate) fn from_json(v: Option<&Value>) -> Result<Self, HfError> {
        let mut by_first = ByFirstByte::new();
        let list = v
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        for t in list {
            let content = t
                .get("content")
                .and_then(Value::as_str)
                .ok_or_else(|| HfError::Invalid(format!("added token {t} has no content")))?;
            let id = t
                .get("id")
                .and_then(Value::as_u64)
                .and_then(|i| u32::try_from(i).ok())
                .ok_or_else(|| HfError::Invalid(format!("added token {content:?} has no id")))?;
            for flag in ["single_word", "lstrip", "rstrip"] {
                refuse_if(
                    t.get(flag).and_then(Value::as_bool).unwrap_or(false),
                    &format!("added token {content:?} with {flag}: true"),
                )?;
            }
            if let Some(&first) = content.as_bytes().first() {
                by_first
                    .entry(first)
                    .or_default()
                    .push((content.as_bytes().into(), id));
            }
        }
        for v in by_first.values_mut() {
            v.sort_by_key(|(c, _)| Reverse(c.len()));
        }
        Ok(Self {
            by_first,
            len: list.len(),
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// (start, end, id) of each added token in `text`, left to right, longest at each start.
    pub(crate) fn find_iter<'a>(
        &'a self,
        text: &'a str,
    ) -> impl Iterator<Item = (usize, usize, u32)> + 'a {
        let bytes = text.as_bytes();
        let mut at = 0;
        std::iter::from_fn(move || {
            if self.by_first.is_empty() {
                return None;
            }
            while at < bytes.len() {
                let hit = self
                    .by_first
                    .get(&bytes[at])
                    .and_then(|c| c.iter().find(|(t, _)| bytes[at..].starts_with(t)));
                if let Some((t, id)) = hit {
                    let start = at;
                    at += t.len();
                    return Some((start, at, *id));
                }
                at += 1;
            }
            None
        })
    }
}

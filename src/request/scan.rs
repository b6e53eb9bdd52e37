//! An incremental scan of a request body that is still arriving, for the early routing
//! decision (issue #8): it finds the top-level `model` and the start of the prompt in a partial
//! body so that epp can route before the whole body has arrived.
//!
//! Why not parse: the body is incomplete, and re-parsing it at every chunk would cost O(n²).
//! The scan keeps its state between chunks and reads each byte once. It is not a validator:
//! anything it does not understand (not an object, escaped or repeated top-level keys, bytes
//! after the object) makes it give up, and the request is then decided on the whole body, whose
//! parse gives the precise error.
//!
//! What it returns, [`Scanner::early_request`], is what [`super::parse`] returns for the whole
//! body in every field the decision reads (model, model span, prompt, cache salt) for any
//! chunking: the prompt is only taken when the part the prefix scorer reads is determined.
//! Fields that are only known to be absent at the end (chat `tools` after `messages`, a
//! `cache_salt` after the prompt) are the documented exception: a decision made before they
//! arrive does not see them. `stream` is reported when seen; the stream machine updates it at
//! the end of the body.

use super::{completion_prompt, is_empty_value, truncate, ApiKind, LlmRequest, Prompt};
use std::ops::Range;

/// The top-level fields the decision reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Model,
    Stream,
    CacheSalt,
    Prompt,
    Messages,
    Input,
    Items,
    Tools,
    Instructions,
}

const FIELDS: [(&[u8], Field); 9] = [
    (b"model", Field::Model),
    (b"stream", Field::Stream),
    (b"cache_salt", Field::CacheSalt),
    (b"prompt", Field::Prompt),
    (b"messages", Field::Messages),
    (b"input", Field::Input),
    (b"items", Field::Items),
    (b"tools", Field::Tools),
    (b"instructions", Field::Instructions),
];

/// Where the scan is in the top-level object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Top {
    /// Before the opening `{`.
    Start,
    /// After `{` or `,`: a key (or `}` right after `{`).
    Key,
    /// Inside a key string.
    InKey,
    Colon,
    /// After `:`.
    Value,
    /// Inside a string value at depth 1.
    StringValue,
    /// Inside an object or array value (depth > 1).
    Nested,
    /// Inside a number or literal at depth 1.
    Scalar,
    /// After a value: `,` or `}`.
    AfterValue,
    /// After the closing `}`: only whitespace.
    Closed,
}

/// A field's value so far: its byte range (end `None` while incomplete) and first byte.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    field: Field,
    start: usize,
    end: Option<usize>,
    first: u8,
}

/// The incremental scanner; feed it every chunk in order.
#[derive(Clone, Debug)]
pub(crate) struct Scanner {
    pos: usize,
    top: Top,
    depth: u32,
    in_string: bool,
    escape: bool,
    key_start: usize,
    key: Vec<u8>,
    key_escaped: bool,
    current: Option<usize>,
    seen: Vec<Seen>,
    /// Elements of the `messages` array seen so far (commas at its depth, plus one).
    messages: usize,
    messages_nonempty: bool,
    /// Not an object as expected: the scan stopped.
    broken: bool,
    /// An escaped or repeated field name: the structure is still followed (messages are
    /// counted) but only the whole body decides.
    no_early: bool,
    /// Nested deeper than the parser accepts.
    too_deep: bool,
}

impl Default for Scanner {
    fn default() -> Self {
        Self::new()
    }
}

impl Scanner {
    pub(crate) fn new() -> Self {
        Self {
            pos: 0,
            top: Top::Start,
            depth: 0,
            in_string: false,
            escape: false,
            key_start: 0,
            key: Vec::new(),
            key_escaped: false,
            current: None,
            seen: Vec::new(),
            messages: 0,
            messages_nonempty: false,
            broken: false,
            no_early: false,
            too_deep: false,
        }
    }

    /// The scan gave up on an early decision: the whole body decides.
    pub(crate) fn is_broken(&self) -> bool {
        self.broken || self.no_early
    }

    /// Whether the body nests deeper than the parser accepts ([`super::MAX_DEPTH`]): refused
    /// even when it shows after an early decision.
    pub(crate) fn too_deep(&self) -> bool {
        self.too_deep
    }

    /// Elements of the top-level `messages` array seen so far.
    pub(crate) fn messages_seen(&self) -> usize {
        self.messages
    }

    /// `stream` as far as seen: `Some(true)` only for the literal `true`, as the parser reads it.
    pub(crate) fn stream(&self) -> Option<bool> {
        self.find(Field::Stream)
            .filter(|s| s.end.is_some())
            .map(|s| s.first == b't')
    }

    /// Scans the next chunk of the body.
    pub(crate) fn feed(&mut self, chunk: &[u8]) {
        let mut i = 0;
        while i < chunk.len() && !self.broken {
            if self.in_string {
                i = self.string_bytes(chunk, i);
                continue;
            }
            self.byte(chunk[i], self.pos + i);
            i += 1;
        }
        self.pos += chunk.len();
    }

    /// Skips through string content; returns the index after what it consumed.
    fn string_bytes(&mut self, chunk: &[u8], from: usize) -> usize {
        let mut i = from;
        while i < chunk.len() {
            let b = chunk[i];
            if self.escape {
                self.escape = false;
                if self.top == Top::InKey {
                    self.key_escaped = true;
                }
            } else if b == b'\\' {
                self.escape = true;
            } else if b == b'"' {
                self.in_string = false;
                self.string_end(self.pos + i);
                return i + 1;
            } else if self.top == Top::InKey && self.key.len() < 32 {
                self.key.push(b);
            }
            i += 1;
        }
        i
    }

    fn string_end(&mut self, at: usize) {
        match self.top {
            Top::InKey => self.top = Top::Colon,
            Top::StringValue => self.end_value(at + 1),
            _ => {}
        }
    }

    fn byte(&mut self, b: u8, at: usize) {
        let ws = matches!(b, b' ' | b'\n' | b'\r' | b'\t');
        match self.top {
            Top::Start if ws => {}
            Top::Start if b == b'{' => {
                self.depth = 1;
                self.top = Top::Key;
            }
            Top::Key | Top::AfterValue | Top::Colon | Top::Closed if ws => {}
            Top::Key if b == b'"' => self.start_key(at),
            Top::Key | Top::AfterValue if b == b'}' => self.top = Top::Closed,
            Top::AfterValue if b == b',' => self.top = Top::Key,
            Top::Colon if b == b':' => self.top = Top::Value,
            Top::Value if ws => {}
            Top::Value => self.start_value(b, at),
            Top::Scalar if ws || b == b',' || b == b'}' => {
                self.end_value(at);
                self.byte(b, at);
            }
            Top::Scalar => {}
            Top::Nested => self.nested(b, at),
            _ => self.broken = true,
        }
    }

    fn start_key(&mut self, at: usize) {
        self.in_string = true;
        self.top = Top::InKey;
        self.key_start = at;
        self.key.clear();
        self.key_escaped = false;
    }

    fn start_value(&mut self, b: u8, at: usize) {
        let field = FIELDS
            .iter()
            .find(|(name, _)| *name == self.key.as_slice())
            .map(|(_, f)| *f);
        self.current = None;
        self.no_early |= self.key_escaped;
        match field {
            Some(field) if self.find(field).is_some() => self.no_early = true,
            Some(field) => {
                self.seen.push(Seen {
                    field,
                    start: at,
                    end: None,
                    first: b,
                });
                self.current = Some(self.seen.len() - 1);
            }
            None => {}
        }
        match b {
            b'"' => {
                self.in_string = true;
                self.top = Top::StringValue;
            }
            b'{' | b'[' => {
                self.depth = 2;
                self.top = Top::Nested;
            }
            _ => self.top = Top::Scalar,
        }
    }

    fn nested(&mut self, b: u8, at: usize) {
        let in_messages = self
            .current
            .is_some_and(|c| self.seen[c].field == Field::Messages);
        match b {
            b'"' => self.in_string = true,
            b'{' | b'[' => {
                self.depth += 1;
                // serde_json accepts 128 levels (the top-level object included).
                if self.depth as usize > super::MAX_DEPTH {
                    self.too_deep = true;
                    self.no_early = true;
                }
            }
            b'}' | b']' => {
                self.depth -= 1;
                if self.depth == 1 {
                    self.end_value(at + 1);
                    return;
                }
            }
            b',' if in_messages && self.depth == 2 => self.messages += 1,
            _ => {}
        }
        if in_messages
            && self.depth >= 2
            && !self.messages_nonempty
            && !matches!(b, b' ' | b'\n' | b'\r' | b'\t' | b']')
        {
            self.messages_nonempty = true;
            self.messages = self.messages.max(1);
        }
    }

    fn end_value(&mut self, end: usize) {
        if let Some(c) = self.current.take() {
            self.seen[c].end = Some(end);
        }
        self.top = Top::AfterValue;
    }

    fn find(&self, field: Field) -> Option<&Seen> {
        self.seen.iter().find(|s| s.field == field)
    }

    /// The decision inputs, once determined by the bytes so far (`body` is everything fed).
    /// `prompt_cap` is the prompt text the prefix scorer reads (0: the model alone decides).
    pub(crate) fn early_request(
        &self,
        api: ApiKind,
        body: &[u8],
        prompt_cap: usize,
    ) -> Option<LlmRequest> {
        if self.is_broken() || body.len() != self.pos || !api.scans_early() {
            return None;
        }
        let model = self.complete(Field::Model)?;
        let model_text: String = serde_json::from_slice(&body[model.clone()]).ok()?;
        let cache_salt = match self.find(Field::CacheSalt) {
            None => None,
            Some(_) => {
                serde_json::from_slice::<Option<String>>(&body[self.complete(Field::CacheSalt)?])
                    .ok()?
            }
        };
        let prompt = if prompt_cap == 0 {
            self.prompt_begun(api, body)?;
            Prompt::Text(String::new())
        } else {
            self.prompt(api, body, prompt_cap)?
        };
        Some(LlmRequest {
            api,
            model: model_text,
            model_span: model,
            stream: self.stream().unwrap_or(false),
            prompt,
            cache_salt,
        })
    }

    fn complete(&self, field: Field) -> Option<Range<usize>> {
        let s = self.find(field)?;
        Some(s.start..s.end?)
    }

    /// Whether the API's required prompt field has begun with a value that is not empty or
    /// `null`: the model alone decides only then (the whole-body parse refuses a missing or
    /// empty prompt, as upstream's parser does). A few bytes of it suffice.
    fn prompt_begun(&self, api: ApiKind, body: &[u8]) -> Option<()> {
        let field = match api {
            ApiKind::Completions => Field::Prompt,
            ApiKind::Embeddings | ApiKind::Responses => Field::Input,
            ApiKind::Conversations => Field::Items,
            ApiKind::ChatCompletions => {
                let m = self.find(Field::Messages)?;
                return (m.first == b'[' && self.messages_nonempty).then_some(());
            }
            _ => return Some(()),
        };
        let s = self.find(field)?;
        let rest = body.get(s.start + 1..)?;
        let next = match s.first {
            b'"' => *rest.first()?,
            b'[' => *rest.iter().find(|b| !b.is_ascii_whitespace())?,
            b'n' => return None,
            _ => return Some(()),
        };
        (next != b'"' && next != b']').then_some(())
    }

    /// The prompt as the parser would cap it, when determined.
    fn prompt(&self, api: ApiKind, body: &[u8], cap: usize) -> Option<Prompt> {
        match api {
            ApiKind::Completions | ApiKind::Embeddings => {
                let field = if api == ApiKind::Completions {
                    Field::Prompt
                } else {
                    Field::Input
                };
                self.completion(field, body, cap)
            }
            ApiKind::ChatCompletions => {
                let m = self.find(Field::Messages)?;
                if m.first != b'[' || !self.messages_nonempty {
                    return None;
                }
                self.raw_concat(&[Field::Messages, Field::Tools], body, cap)
            }
            ApiKind::Responses => self.raw_concat(
                &[Field::Input, Field::Instructions, Field::Tools],
                body,
                cap,
            ),
            ApiKind::Conversations => self.raw_concat(&[Field::Items], body, cap),
            // Only the whole body decides these (see `ApiKind::scans_early`).
            ApiKind::Messages
            | ApiKind::VllmGenerate
            | ApiKind::SglangGenerate
            | ApiKind::VertexChatCompletions
            | ApiKind::VertexRawPredict
            | ApiKind::VllmGrpcGenerate
            | ApiKind::VllmGrpcEmbed => None,
        }
    }

    /// A completions-style prompt: complete values as the parser reads them; a string still
    /// arriving once its decoded prefix reaches the cap.
    fn completion(&self, field: Field, body: &[u8], cap: usize) -> Option<Prompt> {
        let s = self.find(field)?;
        match s.end {
            Some(end) => {
                let text = std::str::from_utf8(&body[s.start..end]).ok()?;
                // `null` and an empty prompt are refused by the whole-body parse.
                (text != "null" && !is_empty_value(text)).then_some(())?;
                completion_prompt(text, cap).ok()
            }
            None if s.first == b'"' => {
                let decoded = decode_partial(&body[s.start..], cap)?;
                (decoded.len() >= cap).then(|| Prompt::Text(truncate(decoded, cap)))
            }
            None => None,
        }
    }

    /// Raw JSON text of `fields` in order, capped, when its first `cap` bytes are determined:
    /// a field not seen yet may still come, so it ends what is known.
    fn raw_concat(&self, fields: &[Field], body: &[u8], cap: usize) -> Option<Prompt> {
        let mut known: Vec<u8> = Vec::new();
        let mut all_seen = true;
        for field in fields {
            let Some(s) = self.find(*field) else {
                all_seen = false;
                break;
            };
            let raw = &body[s.start..s.end.unwrap_or(body.len())];
            if s.end.is_some() && raw == b"null" {
                // serde reads `null` as absent: a required field then is missing.
                if *field == fields[0] {
                    return None;
                }
                continue;
            }
            let room = (cap + 4).saturating_sub(known.len());
            known.extend_from_slice(&raw[..raw.len().min(room)]);
            if s.end.is_none() {
                all_seen = false;
                break;
            }
            if known.len() >= cap {
                break;
            }
        }
        if known.len() < cap && !all_seen {
            return None;
        }
        let text = valid_prefix(&known)?;
        Some(Prompt::Text(truncate(text, cap)))
    }
}

/// The UTF-8 text of `bytes`, allowing a cut character at the end (at most 3 bytes).
fn valid_prefix(bytes: &[u8]) -> Option<String> {
    match std::str::from_utf8(bytes) {
        Ok(s) => Some(s.to_owned()),
        Err(e) if e.error_len().is_none() => {
            Some(String::from_utf8_lossy(&bytes[..e.valid_up_to()]).into_owned())
        }
        Err(_) => None,
    }
}

/// Decodes the start of a JSON string that is still arriving (`raw` begins at its quote), at
/// least `cap` bytes of text when available ([`super::unescape`]); `None` when nothing decodes
/// (invalid text: the whole body will tell).
fn decode_partial(raw: &[u8], cap: usize) -> Option<String> {
    if raw.len() <= cap {
        return None;
    }
    super::unescape::string_prefix(raw, cap)
}

#[cfg(test)]
mod tests;

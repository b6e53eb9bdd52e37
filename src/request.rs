//! The OpenAI-style request as epp understands it: which API, which model, whether it streams,
//! and the prompt the prefix index hashes.
//!
//! Parsing borrows the body and never re-serialises it: the model server must receive the
//! client's bytes unchanged (upstream re-marshals and sorts keys, llm-d-router #2590). The only
//! edit epp makes is the `model` value, patched in place at the byte range recorded here.
//!
//! The prompt text of chat and responses requests starts with the conversation (`messages`,
//! `input`) and only then adds `tools` and `instructions`: a field's absence is only known at the
//! end of the body, so with the conversation first the prefix the index hashes is known as soon
//! as enough of it has arrived (the early decision, [`scan`]).

pub(crate) mod bpe;
pub mod chat;
pub(crate) mod grpc;
pub(crate) mod headers;
pub mod hf;
pub mod multimodal;
pub(crate) mod native;
pub(crate) mod parsers;
pub(crate) mod priority;
pub(crate) mod render;
pub mod scan;
pub mod tokenize;
pub(crate) mod unescape;
pub mod vertex;
pub(crate) mod vllm_grpc;

pub(crate) use parsers::{Handling, ParserKind, ParserSet};

use serde::Deserialize;
use serde_json::value::RawValue;
use std::ops::Range;

/// The API a request targets, detected by the suffix of its path as upstream does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiKind {
    Completions,
    ChatCompletions,
    Responses,
    Embeddings,
    Conversations,
    /// Anthropic Messages (`anthropic-parser`): `system`, `messages`, `tools`.
    Messages,
    /// vLLM's token-in `/inference/v1/generate` (`vllmhttp-parser`): `token_ids`.
    VllmGenerate,
    /// SGLang's native `/generate` (`sglanghttp-parser`): `input_ids`, no model rewrite.
    SglangGenerate,
    /// Vertex AI's gRPC `PredictionService/ChatCompletions` (`vertexai-parser`): a chat
    /// completion in an `HttpBody`, no model rewrite.
    VertexChatCompletions,
    /// Vertex AI's gRPC `RawPredict` / `StreamRawPredict`: a Responses request in an
    /// `HttpBody`, no model rewrite.
    VertexRawPredict,
    /// vLLM's gRPC `VllmEngine/Generate` (`vllmgrpc-parser`): token ids or text, no model.
    VllmGrpcGenerate,
    /// vLLM's gRPC `VllmEngine/Embed`: token ids, no model.
    VllmGrpcEmbed,
}

impl ApiKind {
    /// Detects the OpenAI API from a request path (query string ignored). Unknown paths are
    /// treated as completions, upstream's default; `/render` sub-paths share their parent's body.
    pub fn from_path(path: &str) -> Self {
        let path = path
            .split(['?', '#'])
            .next()
            .unwrap_or(path)
            .trim_end_matches('/');
        let path = path.strip_suffix("/render").unwrap_or(path);
        if path.ends_with("/chat/completions") {
            Self::ChatCompletions
        } else if path.ends_with("/completions") {
            Self::Completions
        } else if path.ends_with("/responses") {
            Self::Responses
        } else if path.ends_with("/embeddings") {
            Self::Embeddings
        } else if path.ends_with("/conversations") {
            Self::Conversations
        } else {
            Self::Completions
        }
    }

    /// The body field this API cannot do without.
    pub(crate) fn required_field(self) -> &'static str {
        match self {
            Self::Completions => "prompt",
            Self::ChatCompletions => "messages",
            Self::Responses | Self::Embeddings => "input",
            Self::Conversations => "items",
            Self::Messages => "messages",
            Self::VllmGenerate => "token_ids",
            Self::SglangGenerate => "input_ids",
            Self::VertexChatCompletions => "messages",
            Self::VertexRawPredict => "input",
            Self::VllmGrpcGenerate | Self::VllmGrpcEmbed => "tokenized",
        }
    }

    /// Whether the body's `model` can be rewritten (SGLang's body is forwarded as raw bytes
    /// upstream, so neither a header nor an objective rewrites it).
    pub(crate) fn rewrites_model(self) -> bool {
        !matches!(
            self,
            Self::SglangGenerate
                | Self::VertexChatCompletions
                | Self::VertexRawPredict
                | Self::VllmGrpcGenerate
                | Self::VllmGrpcEmbed
        )
    }

    /// Whether the incremental scan can decide before the whole body (the OpenAI APIs).
    pub(crate) fn scans_early(self) -> bool {
        !matches!(
            self,
            Self::Messages
                | Self::VllmGenerate
                | Self::SglangGenerate
                | Self::VertexChatCompletions
                | Self::VertexRawPredict
                | Self::VllmGrpcGenerate
                | Self::VllmGrpcEmbed
        )
    }
}

/// What the prefix index hashes: text to tokenize, or token ids the client already supplied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

/// A parsed request body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LlmRequest {
    pub(crate) api: ApiKind,
    /// The `model` the client asked for.
    pub model: String,
    /// Byte range of the `model` JSON string (quotes included) in the body.
    pub(crate) model_span: Range<usize>,
    pub stream: bool,
    pub prompt: Prompt,
    /// `cache_salt` (vLLM): requests with different salts must not share cached prefixes.
    pub cache_salt: Option<String>,
}

/// Why a body was refused. All of these are the client's fault (HTTP 400).
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("request body is not valid JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("request body nests JSON deeper than {limit} levels")]
    TooDeep { limit: usize },
    #[error("request body is not valid UTF-8 at byte {at}")]
    NotUtf8 { at: usize },
    #[error("request has more than {limit} messages")]
    TooManyMessages { limit: usize },
    #[error("request body must be a JSON object")]
    NotObject,
    #[error("model not found in request body")]
    MissingModel,
    #[error("model must be a string")]
    ModelNotString,
    #[error("field `{0}` is required for this API")]
    MissingField(&'static str),
    #[error("field `{field}` is invalid: {reason}")]
    InvalidField {
        field: &'static str,
        reason: &'static str,
    },
    #[error("no parser registered matching path suffix for: {path}")]
    NoParser { path: String },
    #[error("unsupported path: {path}")]
    UnsupportedPath { path: String },
    /// A gRPC body that is not one uncompressed message (`vertexai-parser`).
    #[error("invalid or unsupported gRPC payload: {0}")]
    GrpcFrame(&'static str),
    /// The gRPC message is not the protobuf it should be.
    #[error("unmarshaling {0}: malformed protobuf")]
    Proto(&'static str),
    #[error("{0} has no HttpBody")]
    NoHttpBody(&'static str),
    /// A vLLM gRPC request without the input its method takes (upstream's message).
    #[error("{0}")]
    NoInput(&'static str),
    /// The JSON inside a Vertex AI message, refused as the OpenAI parser refuses it.
    #[error("parsing {message}: {source}")]
    Vertex {
        message: &'static str,
        #[source]
        source: Box<RequestError>,
    },
}

#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream: Option<&'a RawValue>,
    #[serde(borrow, default)]
    prompt: Option<&'a RawValue>,
    #[serde(borrow, default)]
    messages: Option<&'a RawValue>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    #[serde(borrow, default)]
    items: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(borrow, default)]
    instructions: Option<&'a RawValue>,
    #[serde(default)]
    cache_salt: Option<String>,
}

/// Parses `body` for `api`. `max_prompt_bytes` bounds how much prompt text is copied out: the
/// prefix index never looks further than its token cap, so longer text is dead weight.
pub fn parse(
    api: ApiKind,
    body: &[u8],
    max_prompt_bytes: usize,
) -> Result<LlmRequest, RequestError> {
    match api {
        ApiKind::Messages => return native::messages(body, max_prompt_bytes),
        ApiKind::VllmGenerate => return native::vllm_generate(body),
        ApiKind::SglangGenerate => return native::sglang_generate(body),
        ApiKind::VertexChatCompletions | ApiKind::VertexRawPredict => {
            return vertex::request(api, body, max_prompt_bytes)
        }
        ApiKind::VllmGrpcGenerate | ApiKind::VllmGrpcEmbed => {
            return vllm_grpc::request(api, body, max_prompt_bytes)
        }
        _ => {}
    }
    openai(api, body, max_prompt_bytes, true)
}

/// An OpenAI body. Without `model_required` (a body the model is not rewritten in: Vertex AI,
/// whose upstream parser reads a string `model` if there is one) a missing model is empty.
fn openai(
    api: ApiKind,
    body: &[u8],
    max_prompt_bytes: usize,
    model_required: bool,
) -> Result<LlmRequest, RequestError> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
            Err(e) => Err(json_error(body, e)),
            Ok(_) => Err(RequestError::NotObject),
        };
    }
    let wire: Wire<'_> = serde_json::from_slice(body).map_err(|e| json_error(body, e))?;
    let (model, model_span) = match wire.model {
        Some(raw) if model_required => (
            serde_json::from_str(raw.get()).map_err(|_| RequestError::ModelNotString)?,
            span_of(body, raw.get()).ok_or(RequestError::ModelNotString)?,
        ),
        None if model_required => return Err(RequestError::MissingModel),
        raw => {
            let model = raw.and_then(|m| serde_json::from_str::<String>(m.get()).ok());
            (model.unwrap_or_default(), 0..0)
        }
    };
    let stream = wire.stream.is_some_and(|s| s.get() == "true");
    let prompt = prompt_of(api, &wire, max_prompt_bytes)?;
    Ok(LlmRequest {
        api,
        model,
        model_span,
        stream,
        prompt,
        cache_salt: wire.cache_salt,
    })
}

/// serde_json's error, or the named limit it hit: its recursion limit (128 levels), or bytes
/// that are not UTF-8 (inside a prompt string, typically). serde_json skips unknown fields
/// without recursing, so deep nesting there is refused by the stream's scan instead.
fn json_error(body: &[u8], e: serde_json::Error) -> RequestError {
    if e.to_string().starts_with("recursion limit exceeded") {
        return RequestError::TooDeep { limit: MAX_DEPTH };
    }
    match std::str::from_utf8(body) {
        Err(u) => RequestError::NotUtf8 {
            at: u.valid_up_to(),
        },
        Ok(_) => RequestError::NotJson(e),
    }
}

/// serde_json's nesting limit: deeper bodies are refused (400), never recursed into.
pub(crate) const MAX_DEPTH: usize = 128;

/// A prompt's length in tokens estimated from its size in bytes, where it was not tokenized
/// (4 bytes a token): the director's prompt size and the prefix index's part past its cap.
pub(crate) const fn estimated_tokens(bytes: usize) -> usize {
    bytes.div_ceil(4)
}

/// Byte range of `inner` within `outer`, when `inner` borrows from it.
fn span_of(outer: &[u8], inner: &str) -> Option<Range<usize>> {
    let start = (inner.as_ptr() as usize).checked_sub(outer.as_ptr() as usize)?;
    let end = start + inner.len();
    (end <= outer.len()).then_some(start..end)
}

fn prompt_of(api: ApiKind, w: &Wire<'_>, cap: usize) -> Result<Prompt, RequestError> {
    let field = api.required_field();
    let required = match api {
        ApiKind::Completions => w.prompt,
        ApiKind::ChatCompletions => w.messages,
        ApiKind::Responses | ApiKind::Embeddings => w.input,
        ApiKind::Conversations => w.items,
        ApiKind::Messages
        | ApiKind::VllmGenerate
        | ApiKind::SglangGenerate
        | ApiKind::VertexChatCompletions
        | ApiKind::VertexRawPredict
        | ApiKind::VllmGrpcGenerate
        | ApiKind::VllmGrpcEmbed => None,
    }
    .filter(|v| v.get() != "null")
    .ok_or(RequestError::MissingField(field))?;
    if matches!(api, ApiKind::Completions | ApiKind::Embeddings) && is_empty_value(required.get()) {
        // Upstream's parser refuses an empty prompt or input (`""`, `[]`) before scheduling.
        return Err(RequestError::InvalidField {
            field,
            reason: "must not be empty",
        });
    }
    match api {
        ApiKind::Completions => completion_prompt(required.get(), cap),
        ApiKind::ChatCompletions => {
            if !required.get().starts_with('[') {
                return Err(RequestError::InvalidField {
                    field,
                    reason: "must be an array",
                });
            }
            if serde_json::from_str::<[serde::de::IgnoredAny; 0]>(required.get()).is_ok() {
                return Err(RequestError::InvalidField {
                    field,
                    reason: "must not be empty",
                });
            }
            Ok(Prompt::Text(concat_raw(&[Some(required), w.tools], cap)))
        }
        ApiKind::Responses => Ok(Prompt::Text(concat_raw(
            &[Some(required), w.instructions, w.tools],
            cap,
        ))),
        ApiKind::Embeddings => completion_prompt(required.get(), cap),
        ApiKind::Conversations => Ok(Prompt::Text(concat_raw(&[Some(required)], cap))),
        ApiKind::Messages
        | ApiKind::VllmGenerate
        | ApiKind::SglangGenerate
        | ApiKind::VertexChatCompletions
        | ApiKind::VertexRawPredict
        | ApiKind::VllmGrpcGenerate
        | ApiKind::VllmGrpcEmbed => Err(RequestError::MissingField(field)),
    }
}

/// Whether a raw JSON value is the empty string or an empty array.
fn is_empty_value(raw: &str) -> bool {
    let raw = raw.trim();
    raw == "\"\""
        || raw
            .strip_prefix('[')
            .and_then(|r| r.strip_suffix(']'))
            .is_some_and(|r| r.trim().is_empty())
}

/// A completions prompt: a string, a list of strings, token ids, or a list of token-id lists.
/// The shape is chosen from the leading characters, so each is decoded once, directly (an
/// untagged enum would buffer the whole value first: 8K token ids cost ~300 µs that way).
fn completion_prompt(text: &str, cap: usize) -> Result<Prompt, RequestError> {
    let invalid = || RequestError::InvalidField {
        field: "prompt",
        reason: "must be a string, strings or token ids",
    };
    let inner = text
        .strip_prefix('[')
        .map(|rest| rest.trim_start().chars().next());
    let prompt = match (text.chars().next(), inner) {
        // Only the capped start is decoded; a string it cannot decode gets serde's error.
        (Some('"'), _) => match unescape::literal_prefix(text, cap) {
            Some(t) => Ok(Prompt::Text(truncate(t, cap))),
            None => serde_json::from_str::<String>(text).map(|t| Prompt::Text(truncate(t, cap))),
        },
        (_, Some(Some('"'))) => serde_json::from_str::<Vec<String>>(text)
            .map(|ts| Prompt::Text(truncate(ts.join("\n"), cap))),
        (_, Some(Some('['))) => serde_json::from_str::<Vec<Vec<u32>>>(text)
            .map(|ls| Prompt::Tokens(ls.into_iter().next().unwrap_or_default())),
        (_, Some(_)) => return token_array(text).map(Prompt::Tokens).ok_or_else(invalid),
        _ => return Err(invalid()),
    };
    prompt.map_err(|_| invalid())
}

/// A JSON array of unsigned integers (`[1, 2 ,3]`), already validated as JSON by the caller.
/// One pass over the bytes: token-id prompts are long (8K ids ≈ 45 KB).
fn token_array(text: &str) -> Option<Vec<u32>> {
    let body = text.strip_prefix('[')?.strip_suffix(']')?.as_bytes();
    let mut out = Vec::with_capacity(body.len() / 5);
    let mut current: Option<u64> = None;
    let mut expect_item = false;
    for &b in body {
        match b {
            b'0'..=b'9' => {
                let v = current.unwrap_or(0) * 10 + u64::from(b - b'0');
                if v > u64::from(u32::MAX) {
                    return None;
                }
                current = Some(v);
            }
            b',' => {
                out.push(u32::try_from(current.take()?).ok()?);
                expect_item = true;
            }
            b' ' | b'\n' | b'\t' | b'\r' => {}
            _ => return None,
        }
    }
    match current {
        Some(v) => out.push(u32::try_from(v).ok()?),
        None if expect_item => return None,
        None => {}
    }
    Some(out)
}

fn concat_raw(parts: &[Option<&RawValue>], cap: usize) -> String {
    let mut out = String::new();
    for part in parts.iter().flatten() {
        if out.len() >= cap {
            break;
        }
        // Up to the cap only (a 400 KB conversation is not copied whole to keep 128 KB).
        let text = part.get();
        let mut end = text.len().min(cap - out.len() + 3);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        out.push_str(&text[..end]);
    }
    truncate(out, cap)
}

fn truncate(mut s: String, cap: usize) -> String {
    if s.len() > cap {
        let mut end = cap;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// Returns `body` with the `model` value at `span` replaced by `new_model` (JSON-escaped).
/// Every other byte is the client's.
pub(crate) fn rewrite_model(body: &[u8], span: &Range<usize>, new_model: &str) -> Vec<u8> {
    let quoted = serde_json::Value::String(new_model.to_owned()).to_string();
    let mut out = Vec::with_capacity(body.len() + quoted.len());
    out.extend_from_slice(&body[..span.start]);
    out.extend_from_slice(quoted.as_bytes());
    out.extend_from_slice(&body[span.end..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<LlmRequest, RequestError> {
        parse(ApiKind::ChatCompletions, body.as_bytes(), 1 << 20)
    }

    #[test]
    fn detects_api_by_path_suffix() {
        assert_eq!(
            ApiKind::from_path("/v1/chat/completions?x=1"),
            ApiKind::ChatCompletions
        );
        assert_eq!(ApiKind::from_path("/v1/completions"), ApiKind::Completions);
        assert_eq!(
            ApiKind::from_path("/openai/v1/responses"),
            ApiKind::Responses
        );
        assert_eq!(ApiKind::from_path("/v1/embeddings/"), ApiKind::Embeddings);
        assert_eq!(ApiKind::from_path("/v1/models"), ApiKind::Completions);
    }

    #[test]
    fn extracts_model_stream_and_chat_prompt_with_messages_first() {
        let body = r#"{"messages":[{"role":"system","content":"be brief"}],"tools":[{"t":1}], "model" : "m\u0031","stream":true}"#;
        let r = chat(body).unwrap();
        assert_eq!(r.model, "m1");
        assert!(r.stream);
        assert_eq!(&body[r.model_span.clone()], r#""m\u0031""#);
        assert_eq!(
            r.prompt,
            Prompt::Text(r#"[{"role":"system","content":"be brief"}][{"t":1}]"#.into())
        );
    }

    #[test]
    fn rewrite_keeps_every_other_byte() {
        let body = br#"{ "z": 1,  "model":"a", "a" : [ 1 ,2 ] }"#;
        let r = parse(
            ApiKind::Completions,
            br#"{ "z": 1,  "model":"a", "prompt" : [ 1 ,2 ] }"#,
            99,
        )
        .unwrap();
        assert_eq!(r.prompt, Prompt::Tokens(vec![1, 2]));
        let out = rewrite_model(body, &r.model_span, "b\"x");
        assert_eq!(
            out,
            br#"{ "z": 1,  "model":"b\"x", "a" : [ 1 ,2 ] }"#.to_vec()
        );
    }

    #[test]
    fn refuses_bad_bodies_with_named_causes() {
        let cases: &[(&str, &str)] = &[
            ("not json", "not valid JSON"),
            ("[1,2]", "must be a JSON object"),
            (r#"{"messages":[{}]}"#, "model not found"),
            (r#"{"model":7,"messages":[{}]}"#, "model must be a string"),
            (r#"{"model":"m"}"#, "`messages` is required"),
            (r#"{"model":"m","messages":[]}"#, "must not be empty"),
            (r#"{"model":"m","messages":{}}"#, "must be an array"),
            (
                r#"{"model":"m","model":"n","messages":[{}]}"#,
                "duplicate field",
            ),
            (
                r#"{"model":"m","messages":[{}]} trailing"#,
                "not valid JSON",
            ),
        ];
        for (body, want) in cases {
            let err = chat(body).unwrap_err().to_string();
            assert!(err.contains(want), "{body}: {err}");
        }
        let err = parse(
            ApiKind::Completions,
            br#"{"model":"m","prompt":{"a":1}}"#,
            9,
        )
        .unwrap_err();
        assert!(err.to_string().contains("prompt"));
        for bad in [
            r#"[1,-2]"#,
            r#"[1.5]"#,
            r#"[1,"a"]"#,
            r#"[99999999999]"#,
            r#"[1,]"#,
        ] {
            let body = format!(r#"{{"model":"m","prompt":{bad}}}"#);
            assert!(
                parse(ApiKind::Completions, body.as_bytes(), 9).is_err(),
                "{bad}"
            );
        }
        let ok = parse(
            ApiKind::Completions,
            br#"{"model":"m","prompt":[ 1 ,2,	3 ]}"#,
            9,
        )
        .unwrap();
        assert_eq!(ok.prompt, Prompt::Tokens(vec![1, 2, 3]));
        // Empty, as upstream's parser refuses it; a list of one empty string is not.
        for empty in [r#""""#, "[ ]", "[]"] {
            let body = format!(r#"{{"model":"m","prompt":{empty}}}"#);
            let err = parse(ApiKind::Completions, body.as_bytes(), 9).unwrap_err();
            assert!(
                err.to_string().contains("must not be empty"),
                "{empty}: {err}"
            );
        }
        let one = parse(ApiKind::Completions, br#"{"model":"m","prompt":[""]}"#, 9).unwrap();
        assert_eq!(one.prompt, Prompt::Text(String::new()));
        let err = parse(ApiKind::Embeddings, br#"{"model":"m","input":""}"#, 9).unwrap_err();
        assert!(
            err.to_string()
                .contains("`input` is invalid: must not be empty"),
            "{err}"
        );
    }

    #[test]
    fn deep_nesting_and_invalid_utf8_are_named() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let recursion = serde_json::from_str::<serde_json::Value>(&deep).unwrap_err();
        let err = json_error(deep.as_bytes(), recursion);
        assert!(matches!(err, RequestError::TooDeep { limit: 128 }), "{err}");
        let mut bad = br#"{"model":"m","prompt":"ab"#.to_vec();
        bad.extend_from_slice(&[0xff, 0xfe, b'"', b'}']);
        let err = parse(ApiKind::Completions, &bad, 9).unwrap_err();
        assert!(matches!(err, RequestError::NotUtf8 { at: 25 }), "{err}");
    }

    #[test]
    fn prompt_text_is_capped_on_a_char_boundary() {
        let r = parse(
            ApiKind::Completions,
            r#"{"model":"m","prompt":"ééé"}"#.as_bytes(),
            3,
        )
        .unwrap();
        assert_eq!(r.prompt, Prompt::Text("é".into()));
    }
}

//! Bodies that are not OpenAI's: Anthropic Messages (`anthropic-parser`), vLLM's token-in
//! `/inference/v1/generate` (`vllmhttp-parser`) and SGLang's `/generate` (`sglanghttp-parser`),
//! with llm-d-router v0.10's rules for what is required.
//!
//! As for OpenAI bodies, nothing is re-serialised: the model server receives the client's bytes.
//! - Messages: `model` and a non-empty `messages` array are required; the prompt the prefix
//!   index hashes is `system`, then `messages`, then `tools` (raw JSON, capped), so a shared
//!   system prompt is a shared prefix.
//! - vLLM generate: `model` and a non-empty `token_ids` array are required; the ids are the
//!   prompt tokens as they are (no tokenizer runs).
//! - SGLang generate: a non-empty `input_ids` array is required, `extra_key` (a string) is the
//!   cache salt, and `model` is optional and never rewritten (upstream forwards the raw body).

use super::ApiKind;
use super::{concat_raw, json_error, span_of, token_array, LlmRequest, Prompt, RequestError};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::ops::Range;

#[derive(Deserialize)]
struct MessagesWire<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream: Option<&'a RawValue>,
    #[serde(borrow, default)]
    system: Option<&'a RawValue>,
    #[serde(borrow, default)]
    messages: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(default)]
    cache_salt: Option<String>,
}

#[derive(Deserialize)]
struct VllmWire<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream: Option<&'a RawValue>,
    #[serde(borrow, default)]
    token_ids: Option<&'a RawValue>,
    #[serde(default)]
    cache_salt: Option<String>,
}

#[derive(Deserialize)]
struct SglangWire<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream: Option<&'a RawValue>,
    #[serde(borrow, default)]
    input_ids: Option<&'a RawValue>,
    #[serde(borrow, default)]
    extra_key: Option<&'a RawValue>,
}

/// An Anthropic Messages body.
pub(crate) fn messages(body: &[u8], cap: usize) -> Result<LlmRequest, RequestError> {
    let w: MessagesWire<'_> = object(body)?;
    let (model, model_span) = model(body, w.model)?;
    let messages = present(w.messages).ok_or(RequestError::MissingField("messages"))?;
    non_empty_array(messages, "messages")?;
    if let Some(system) = present(w.system) {
        if !system.get().starts_with(['"', '[']) {
            return Err(RequestError::InvalidField {
                field: "system",
                reason: "must be a string or an array of content blocks",
            });
        }
    }
    let text = concat_raw(&[present(w.system), Some(messages), present(w.tools)], cap);
    Ok(LlmRequest {
        api: ApiKind::Messages,
        model,
        model_span,
        stream: is_true(w.stream),
        prompt: Prompt::Text(text),
        cache_salt: w.cache_salt,
    })
}

/// A vLLM `/inference/v1/generate` body.
pub(crate) fn vllm_generate(body: &[u8]) -> Result<LlmRequest, RequestError> {
    let w: VllmWire<'_> = object(body)?;
    let (model, model_span) = model(body, w.model)?;
    let tokens = token_ids(w.token_ids, "token_ids")?;
    Ok(LlmRequest {
        api: ApiKind::VllmGenerate,
        model,
        model_span,
        stream: is_true(w.stream),
        prompt: Prompt::Tokens(tokens),
        cache_salt: w.cache_salt,
    })
}

/// An SGLang `/generate` body. The model is read for metrics only (empty span: not rewritten).
pub(crate) fn sglang_generate(body: &[u8]) -> Result<LlmRequest, RequestError> {
    let w: SglangWire<'_> = object(body)?;
    let tokens = token_ids(w.input_ids, "input_ids")?;
    let cache_salt = match present(w.extra_key) {
        None => None,
        Some(raw) => Some(serde_json::from_str::<String>(raw.get()).map_err(|_| {
            RequestError::InvalidField {
                field: "extra_key",
                reason: "must be a string",
            }
        })?),
    };
    let model = w
        .model
        .and_then(|m| serde_json::from_str::<String>(m.get()).ok())
        .unwrap_or_default();
    Ok(LlmRequest {
        api: ApiKind::SglangGenerate,
        model,
        model_span: 0..0,
        stream: is_true(w.stream),
        prompt: Prompt::Tokens(tokens),
        cache_salt,
    })
}

/// The body decoded as a JSON object of shape `T`.
fn object<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, RequestError> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
            Err(e) => Err(json_error(body, e)),
            Ok(_) => Err(RequestError::NotObject),
        };
    }
    serde_json::from_slice(body).map_err(|e| json_error(body, e))
}

/// The required string `model` and its byte range in `body`.
fn model(body: &[u8], raw: Option<&RawValue>) -> Result<(String, Range<usize>), RequestError> {
    let raw = raw.ok_or(RequestError::MissingModel)?;
    let model: String =
        serde_json::from_str(raw.get()).map_err(|_| RequestError::ModelNotString)?;
    let span = span_of(body, raw.get()).ok_or(RequestError::ModelNotString)?;
    Ok((model, span))
}

/// A field that is there and not `null` (serde reads `null` as absent).
fn present(v: Option<&RawValue>) -> Option<&RawValue> {
    v.filter(|v| v.get() != "null")
}

fn is_true(v: Option<&RawValue>) -> bool {
    v.is_some_and(|s| s.get() == "true")
}

fn non_empty_array(v: &RawValue, field: &'static str) -> Result<(), RequestError> {
    if !v.get().starts_with('[') {
        return Err(RequestError::InvalidField {
            field,
            reason: "must be an array",
        });
    }
    if serde_json::from_str::<[serde::de::IgnoredAny; 0]>(v.get()).is_ok() {
        return Err(RequestError::InvalidField {
            field,
            reason: "must not be empty",
        });
    }
    Ok(())
}

/// A required, non-empty array of token ids (u32).
fn token_ids(v: Option<&RawValue>, field: &'static str) -> Result<Vec<u32>, RequestError> {
    let raw = present(v).ok_or(RequestError::MissingField(field))?;
    match token_array(raw.get()) {
        Some(ids) if !ids.is_empty() => Ok(ids),
        Some(_) => Err(RequestError::InvalidField {
            field,
            reason: "must not be empty",
        }),
        None => Err(RequestError::InvalidField {
            field,
            reason: "must be an array of token ids",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::parse;

    #[test]
    fn messages_hash_system_then_messages_then_tools() {
        let body = br#"{"tools":[{"name":"t"}],"messages":[{"role":"user","content":"hi"}],"model":"claude","system":"be brief","stream":true,"max_tokens":9}"#;
        let r = parse(ApiKind::Messages, body, 1 << 20).unwrap();
        assert_eq!(r.model, "claude");
        assert_eq!(&body[r.model_span.clone()], br#""claude""#);
        assert!(r.stream);
        assert_eq!(
            r.prompt,
            Prompt::Text(r#""be brief"[{"role":"user","content":"hi"}][{"name":"t"}]"#.into())
        );
        let blocks = br#"{"model":"m","system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"cache_salt":"k"}"#;
        let r = parse(ApiKind::Messages, blocks, 1 << 20).unwrap();
        assert_eq!(r.cache_salt.as_deref(), Some("k"));
        let Prompt::Text(t) = r.prompt else { panic!() };
        assert!(
            t.starts_with(r#"[{"type":"text","text":"s"}][{"role""#),
            "{t}"
        );
        let capped = parse(ApiKind::Messages, body, 5).unwrap();
        assert_eq!(capped.prompt, Prompt::Text(r#""be b"#.into()));
    }

    #[test]
    fn generate_bodies_give_their_token_ids_as_the_prompt() {
        let vllm = br#"{"model":"m","token_ids":[1, 2,3],"sampling_params":{"max_tokens":4},"cache_salt":"s"}"#;
        let r = parse(ApiKind::VllmGenerate, vllm, 1).unwrap();
        assert_eq!(r.prompt, Prompt::Tokens(vec![1, 2, 3]));
        assert_eq!(
            (r.model.as_str(), r.cache_salt.as_deref()),
            ("m", Some("s"))
        );
        assert!(!r.stream);
        let sglang = br#"{"input_ids":[7,8],"extra_key":"tenant","stream":true,"model":"q"}"#;
        let r = parse(ApiKind::SglangGenerate, sglang, 1).unwrap();
        assert_eq!(r.prompt, Prompt::Tokens(vec![7, 8]));
        assert_eq!(r.cache_salt.as_deref(), Some("tenant"));
        assert_eq!((r.model.as_str(), r.model_span.clone()), ("q", 0..0));
        assert!(r.stream);
        let bare = parse(ApiKind::SglangGenerate, br#"{"input_ids":[1]}"#, 1).unwrap();
        assert_eq!(bare.model, "");
    }

    #[test]
    fn refuses_what_upstream_refuses() {
        let cases: &[(ApiKind, &str, &str)] = &[
            (ApiKind::Messages, "nope", "not valid JSON"),
            (ApiKind::Messages, "[]", "must be a JSON object"),
            (ApiKind::Messages, r#"{"messages":[{}]}"#, "model not found"),
            (
                ApiKind::Messages,
                r#"{"model":"m"}"#,
                "`messages` is required",
            ),
            (
                ApiKind::Messages,
                r#"{"model":"m","messages":[]}"#,
                "must not be empty",
            ),
            (
                ApiKind::Messages,
                r#"{"model":"m","messages":"x"}"#,
                "must be an array",
            ),
            (
                ApiKind::Messages,
                r#"{"model":"m","messages":[{}],"system":7}"#,
                "`system` is invalid",
            ),
            (
                ApiKind::VllmGenerate,
                r#"{"token_ids":[1]}"#,
                "model not found",
            ),
            (
                ApiKind::VllmGenerate,
                r#"{"model":"m"}"#,
                "`token_ids` is required",
            ),
            (
                ApiKind::VllmGenerate,
                r#"{"model":"m","token_ids":[]}"#,
                "must not be empty",
            ),
            (
                ApiKind::VllmGenerate,
                r#"{"model":"m","token_ids":["a"]}"#,
                "array of token ids",
            ),
            (
                ApiKind::SglangGenerate,
                r#"{"text":"hi"}"#,
                "`input_ids` is required",
            ),
            (
                ApiKind::SglangGenerate,
                r#"{"input_ids":null}"#,
                "`input_ids` is required",
            ),
            (
                ApiKind::SglangGenerate,
                r#"{"input_ids":[[1,2]]}"#,
                "array of token ids",
            ),
            (
                ApiKind::SglangGenerate,
                r#"{"input_ids":[1],"extra_key":3}"#,
                "`extra_key` is invalid",
            ),
        ];
        for (api, body, want) in cases {
            let err = parse(*api, body.as_bytes(), 64).unwrap_err().to_string();
            assert!(err.contains(want), "{api:?} {body}: {err}");
        }
    }
}

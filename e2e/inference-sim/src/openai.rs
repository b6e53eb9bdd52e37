//! The OpenAI-compatible wire shapes vLLM accepts and returns, and the one
//! place where errors become HTTP statuses and OpenAI error bodies.
//!
//! Prompts may be a string, a token-id array, or a one-element list of
//! either (vLLM also batches longer lists; the simulator answers 400).
//! Chat content may be a string or a list of `{"type":"text"}` parts.

use http::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};
use thiserror::Error;

use super::engine::{FinishReason, Usage};
use super::faults::FaultError;
use super::lora::LoraError;
use super::tokenizer::{ChatTurn, TokenId, TokenizerError};

/// Everything that can fail while serving one HTTP request.
#[derive(Debug, Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("invalid JSON body: {0}")]
    Json(#[from] serde_json::Error),
    #[error("The model `{0}` does not exist.")]
    ModelNotFound(String),
    #[error("This model's maximum context length is {max} tokens. However, you requested {total} tokens ({prompt} in the messages, {output} in the completion). Please reduce the length of the messages or completion.")]
    ContextTooLong {
        max: usize,
        total: usize,
        prompt: usize,
        output: usize,
    },
    #[error("injected failure")]
    Injected(StatusCode),
    #[error(transparent)]
    Fault(#[from] FaultError),
    #[error(transparent)]
    Lora(#[from] LoraError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("{0}")]
    Unavailable(&'static str),
    #[error("Not Found")]
    NoRoute,
    #[error("request body could not be read")]
    Body,
}

impl ApiError {
    /// HTTP status of each error (the only such mapping).
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_)
            | ApiError::Json(_)
            | ApiError::ContextTooLong { .. }
            | ApiError::Fault(_)
            | ApiError::Tokenizer(_)
            | ApiError::Body
            | ApiError::Lora(LoraError::AlreadyLoaded(_) | LoraError::Disabled) => {
                StatusCode::BAD_REQUEST
            }
            ApiError::ModelNotFound(_)
            | ApiError::NoRoute
            | ApiError::Lora(LoraError::NotFound(_)) => StatusCode::NOT_FOUND,
            ApiError::Injected(status) => *status,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// vLLM's `ErrorResponse` body: `{"error": {message, type, param, code}}`.
    pub fn body(&self) -> Value {
        let status = self.status();
        let kind = match status.as_u16() {
            400 => "BadRequestError",
            401 => "AuthenticationError",
            404 => "NotFoundError",
            429 => "RateLimitError",
            503 => "ServiceUnavailableError",
            _ => "InternalServerError",
        };
        let message = match self {
            ApiError::Injected(s) => format!("Injected failure ({})", s.as_u16()),
            other => other.to_string(),
        };
        json!({"error": {"message": message, "type": kind, "param": null, "code": status.as_u16()}})
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<TokenId>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<TokenId>>),
}

/// A prompt before tokenization.
#[derive(Debug, PartialEq, Eq)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<TokenId>),
}

impl Prompt {
    pub fn single(self) -> Result<PromptInput, ApiError> {
        let batched = || {
            ApiError::BadRequest(
                "batched prompts (n > 1 prompts) are not supported by inference-sim".into(),
            )
        };
        match self {
            Prompt::Text(t) => Ok(PromptInput::Text(t)),
            Prompt::Tokens(t) => Ok(PromptInput::Tokens(t)),
            Prompt::Texts(mut v) if v.len() == 1 => Ok(PromptInput::Text(v.remove(0))),
            Prompt::TokenLists(mut v) if v.len() == 1 => Ok(PromptInput::Tokens(v.remove(0))),
            _ => Err(batched()),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
}

impl Message {
    pub fn turn(&self) -> ChatTurn {
        let content = match &self.content {
            None => String::new(),
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => parts.iter().filter_map(|p| p.text.as_deref()).collect(),
        };
        ChatTurn {
            role: self.role.clone(),
            content,
        }
    }
}

/// The fields of `/v1/completions` and `/v1/chat/completions` the simulator uses.
#[derive(Debug, Deserialize)]
pub struct InferenceRequest {
    pub model: Option<String>,
    pub prompt: Option<Prompt>,
    pub messages: Option<Vec<Message>>,
    pub max_tokens: Option<usize>,
    pub max_completion_tokens: Option<usize>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<usize>,
    pub cache_salt: Option<String>,
    pub add_generation_prompt: Option<bool>,
    /// vLLM's KV-connector parameters (prefill/decode split; see `http::inference`).
    pub kv_transfer_params: Option<Value>,
}

/// `/tokenize` and `/detokenize` bodies.
#[derive(Debug, Deserialize)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<Message>>,
    pub add_generation_prompt: Option<bool>,
    pub tokens: Option<Vec<TokenId>>,
}

/// `/v1/load_lora_adapter` and `/v1/unload_lora_adapter` bodies.
#[derive(Debug, Deserialize)]
pub struct LoraRequest {
    pub lora_name: String,
    #[serde(default)]
    pub lora_path: Option<String>,
}

pub use super::apis::Api;

/// Identity fields shared by every chunk of one response.
#[derive(Clone, Debug)]
pub struct ResponseMeta {
    pub api: Api,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub prompt_tokens_details: bool,
}

fn finish_str(reason: Option<FinishReason>) -> Value {
    reason.map_or(Value::Null, |r| Value::String(r.as_str().into()))
}

impl ResponseMeta {
    pub fn usage(&self, u: &Usage) -> Value {
        let mut usage = json!({
            "prompt_tokens": u.prompt_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "completion_tokens": u.completion_tokens,
        });
        if self.prompt_tokens_details {
            usage["prompt_tokens_details"] = json!({"cached_tokens": u.cached_tokens});
        }
        usage
    }

    /// The whole non-streaming response.
    pub fn full(&self, text: &str, usage: &Usage) -> Value {
        let reason = finish_str(Some(usage.reason));
        let (object, choice) = if self.api.is_chat() {
            (
                "chat.completion",
                json!({"index": 0, "message": {"role": "assistant",
                "content": text, "tool_calls": []}, "logprobs": null, "finish_reason": reason, "stop_reason": null}),
            )
        } else {
            (
                "text_completion",
                json!({"index": 0, "text": text, "logprobs": null,
                "finish_reason": reason, "stop_reason": null, "prompt_logprobs": null}),
            )
        };
        json!({"id": self.id, "object": object, "created": self.created, "model": self.model,
            "choices": [choice], "usage": self.usage(usage), "prompt_logprobs": null, "kv_transfer_params": null})
    }

    /// One SSE chunk carrying `text` (and the finish reason on the last one).
    pub fn chunk(&self, text: &str, reason: Option<FinishReason>, first: bool) -> Value {
        let (object, choice) = if self.api.is_chat() {
            let delta = if first {
                json!({"role": "assistant", "content": text})
            } else {
                json!({"content": text})
            };
            (
                "chat.completion.chunk",
                json!({"index": 0, "delta": delta, "logprobs": null,
                "finish_reason": finish_str(reason)}),
            )
        } else {
            (
                "text_completion",
                json!({"index": 0, "text": text, "logprobs": null,
                "finish_reason": finish_str(reason), "stop_reason": null}),
            )
        };
        json!({"id": self.id, "object": object, "created": self.created, "model": self.model, "choices": [choice]})
    }

    /// The final `stream_options.include_usage` chunk.
    pub fn usage_chunk(&self, usage: &Usage) -> Value {
        let object = if self.api.is_chat() {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        json!({"id": self.id, "object": object, "created": self.created, "model": self.model,
            "choices": [], "usage": self.usage(usage)})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_may_be_text_tokens_or_single_element_lists() {
        let parse = |s: &str| serde_json::from_str::<Prompt>(s).unwrap().single();
        assert_eq!(parse(r#""hi""#).unwrap(), PromptInput::Text("hi".into()));
        assert_eq!(parse("[1, 2]").unwrap(), PromptInput::Tokens(vec![1, 2]));
        assert_eq!(parse(r#"["hi"]"#).unwrap(), PromptInput::Text("hi".into()));
        assert_eq!(parse("[[3]]").unwrap(), PromptInput::Tokens(vec![3]));
        assert!(parse(r#"["a", "b"]"#).is_err());
    }

    #[test]
    fn errors_map_to_openai_statuses_and_bodies() {
        let e = ApiError::ModelNotFound("x".into());
        assert_eq!(e.status(), StatusCode::NOT_FOUND);
        assert_eq!(e.body()["error"]["type"], "NotFoundError");
        let e = ApiError::ContextTooLong {
            max: 10,
            total: 12,
            prompt: 8,
            output: 4,
        };
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            ApiError::Injected(StatusCode::TOO_MANY_REQUESTS).body()["error"]["code"],
            429
        );
    }

    #[test]
    fn chat_content_parts_are_joined() {
        let m: Message = serde_json::from_str(
            r#"{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}"#,
        )
        .unwrap();
        assert_eq!(m.turn().content, "ab");
    }
}

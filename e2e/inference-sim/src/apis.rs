//! The request APIs besides completions and chat completions, each mapped onto the one engine
//! request the simulator runs, and each answer shaped as its API shapes it.
//!
//! | path | API | served by vLLM? |
//! |---|---|---|
//! | `POST /v1/responses` | OpenAI Responses (`input`, `instructions`, `max_output_tokens`) | yes |
//! | `POST /inference/v1/generate` | vLLM's token-in generate (`token_ids`, `sampling_params`) | yes (≥ 0.11) |
//! | `POST /v1/messages` | Anthropic Messages (`system`, `messages`, `max_tokens`) | no: served here so a router's Anthropic parser can be tested against a pod; llm-d-inference-sim serves it too |
//!
//! Each renders its prompt as chat completions do (the chat template of
//! [`crate::tokenizer`]), or takes the token ids as given (generate), and then queues, batches
//! and caches like any other request. Simplified (honestly): these three answer whole JSON
//! bodies only; `"stream": true` is a 400 naming the API.

use serde::Deserialize;
use serde_json::{json, Value};

use super::engine::{FinishReason, Usage};
use super::openai::{ApiError, Content, InferenceRequest, Message, Prompt};
use super::tokenizer::TokenId;

/// Which API a request came in on, which decides how it is read and answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Completions,
    Chat,
    /// OpenAI Responses.
    Responses,
    /// Anthropic Messages.
    Messages,
    /// vLLM token-in generate.
    Generate,
}

impl Api {
    /// Whether the prompt is a rendered conversation (else text or token ids).
    pub fn is_chat(self) -> bool {
        matches!(self, Api::Chat | Api::Responses | Api::Messages)
    }

    /// The prefix of response ids.
    pub fn id_prefix(self) -> &'static str {
        match self {
            Api::Completions => "cmpl",
            Api::Chat => "chatcmpl",
            Api::Responses => "resp",
            Api::Messages => "msg",
            Api::Generate => "gen",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Api::Completions => "completions",
            Api::Chat => "chat completions",
            Api::Responses => "the Responses API",
            Api::Messages => "Anthropic Messages",
            Api::Generate => "token-in generate",
        }
    }

    /// The body as the engine request the simulator runs.
    pub fn parse(self, body: &[u8]) -> Result<InferenceRequest, ApiError> {
        let request = match self {
            Api::Completions | Api::Chat => serde_json::from_slice(body)?,
            Api::Responses => serde_json::from_slice::<ResponsesRequest>(body)?.into_inference(),
            Api::Messages => serde_json::from_slice::<MessagesRequest>(body)?.into_inference(),
            Api::Generate => serde_json::from_slice::<GenerateRequest>(body)?.into_inference()?,
        };
        if request.stream && !matches!(self, Api::Completions | Api::Chat) {
            return Err(ApiError::BadRequest(format!(
                "inference-sim answers {} without streaming only",
                self.name()
            )));
        }
        Ok(request)
    }
}

fn empty_request(model: Option<String>) -> InferenceRequest {
    InferenceRequest {
        model,
        prompt: None,
        messages: None,
        max_tokens: None,
        max_completion_tokens: None,
        stream: false,
        stream_options: None,
        n: None,
        cache_salt: None,
        add_generation_prompt: None,
        kv_transfer_params: None,
    }
}

fn message(role: &str, content: Content) -> Message {
    Message {
        role: role.to_owned(),
        content: Some(content),
    }
}

/// `POST /v1/responses`.
#[derive(Debug, Deserialize)]
struct ResponsesRequest {
    model: Option<String>,
    input: ResponsesInput,
    instructions: Option<String>,
    max_output_tokens: Option<usize>,
    #[serde(default)]
    stream: bool,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ResponsesInput {
    Text(String),
    /// Input items; those with a role are messages (`input_text` parts carry `text`).
    Items(Vec<Message>),
}

impl ResponsesRequest {
    fn into_inference(self) -> InferenceRequest {
        let mut messages = Vec::new();
        if let Some(instructions) = self.instructions {
            messages.push(message("system", Content::Text(instructions)));
        }
        match self.input {
            ResponsesInput::Text(text) => messages.push(message("user", Content::Text(text))),
            ResponsesInput::Items(items) => messages.extend(items),
        }
        InferenceRequest {
            messages: Some(messages),
            max_tokens: self.max_output_tokens,
            stream: self.stream,
            ..empty_request(self.model)
        }
    }
}

/// `POST /v1/messages` (Anthropic).
#[derive(Debug, Deserialize)]
struct MessagesRequest {
    model: Option<String>,
    system: Option<Content>,
    messages: Vec<Message>,
    max_tokens: usize,
    #[serde(default)]
    stream: bool,
}

impl MessagesRequest {
    fn into_inference(self) -> InferenceRequest {
        let mut messages = Vec::with_capacity(self.messages.len() + 1);
        if let Some(system) = self.system {
            messages.push(message("system", system));
        }
        messages.extend(self.messages);
        InferenceRequest {
            messages: Some(messages),
            max_tokens: Some(self.max_tokens),
            stream: self.stream,
            ..empty_request(self.model)
        }
    }
}

/// `POST /inference/v1/generate` (vLLM token-in).
#[derive(Debug, Deserialize)]
struct GenerateRequest {
    model: Option<String>,
    token_ids: Vec<TokenId>,
    #[serde(default)]
    sampling_params: SamplingParams,
    #[serde(default)]
    stream: bool,
}

#[derive(Debug, Default, Deserialize)]
struct SamplingParams {
    max_tokens: Option<usize>,
}

impl GenerateRequest {
    fn into_inference(self) -> Result<InferenceRequest, ApiError> {
        if self.token_ids.is_empty() {
            return Err(ApiError::BadRequest("`token_ids` must not be empty".into()));
        }
        Ok(InferenceRequest {
            prompt: Some(Prompt::Tokens(self.token_ids)),
            max_tokens: self.sampling_params.max_tokens,
            stream: self.stream,
            ..empty_request(self.model)
        })
    }
}

/// The whole answer of a Responses, Messages or generate request (`None` for the OpenAI
/// completions APIs, which `ResponseMeta::full` shapes).
pub fn full(
    api: Api,
    id: &str,
    created: u64,
    model: &str,
    text: &str,
    tokens: &[TokenId],
    usage: &Usage,
) -> Option<Value> {
    let body = match api {
        Api::Completions | Api::Chat => return None,
        Api::Responses => json!({
            "id": id, "object": "response", "created_at": created, "model": model,
            "status": "completed", "incomplete_details": incomplete(usage.reason),
            "output": [{"type": "message", "id": format!("msg_{id}"), "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}],
            "usage": {"input_tokens": usage.prompt_tokens,
                "input_tokens_details": {"cached_tokens": usage.cached_tokens},
                "output_tokens": usage.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage.prompt_tokens + usage.completion_tokens},
        }),
        Api::Messages => json!({
            "id": id, "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": match usage.reason {
                FinishReason::Length => "max_tokens",
                FinishReason::Stop | FinishReason::Abort => "end_turn",
            },
            "stop_sequence": null,
            "usage": {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens,
                "cache_read_input_tokens": usage.cached_tokens},
        }),
        Api::Generate => json!({
            "request_id": id,
            "choices": [{"index": 0, "logprobs": null, "finish_reason": usage.reason.as_str(),
                "token_ids": tokens}],
            "prompt_logprobs": null, "kv_transfer_params": null,
        }),
    };
    Some(body)
}

fn incomplete(reason: FinishReason) -> Value {
    match reason {
        FinishReason::Length => json!({"reason": "max_output_tokens"}),
        FinishReason::Stop | FinishReason::Abort => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_input_becomes_a_conversation_after_the_instructions() {
        let body = br#"{"model":"m","instructions":"be brief","input":[{"role":"user",
            "content":[{"type":"input_text","text":"hi"}]}],"max_output_tokens":4}"#;
        let r = Api::Responses.parse(body).unwrap();
        let turns: Vec<_> = r.messages.unwrap().iter().map(Message::turn).collect();
        assert_eq!(
            turns
                .iter()
                .map(|t| (t.role.as_str(), t.content.as_str()))
                .collect::<Vec<_>>(),
            [("system", "be brief"), ("user", "hi")]
        );
        assert_eq!(r.max_tokens, Some(4));
    }

    #[test]
    fn anthropic_messages_need_max_tokens_and_take_a_system_prompt() {
        assert!(Api::Messages
            .parse(br#"{"model":"m","messages":[]}"#)
            .is_err());
        let r = Api::Messages
            .parse(br#"{"model":"m","max_tokens":2,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":"q"}]}"#)
            .unwrap();
        assert_eq!(r.messages.unwrap()[0].turn().content, "s");
    }

    #[test]
    fn generate_takes_token_ids_and_refuses_none_or_a_stream() {
        let r = Api::Generate
            .parse(br#"{"token_ids":[1,2],"sampling_params":{"max_tokens":3}}"#)
            .unwrap();
        assert!(matches!(r.prompt, Some(Prompt::Tokens(ref t)) if t == &[1, 2]));
        assert_eq!(r.max_tokens, Some(3));
        let empty = Api::Generate.parse(br#"{"token_ids":[]}"#).unwrap_err();
        assert!(empty.to_string().contains("token_ids"), "{empty}");
        assert!(Api::Generate
            .parse(br#"{"token_ids":[1],"stream":true}"#)
            .is_err());
    }
}

//! The OpenAI-style request fields the stand-in reads, and the bodies it answers with: a JSON
//! object, or SSE events for `"stream": true`. Token counts are whitespace-separated words, which
//! is enough for a stand-in whose numbers only need to be consistent.

use bytes::Bytes;
use serde_json::{json, Value};

/// The inference APIs the stand-in serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Completions,
    ChatCompletions,
    Embeddings,
    Responses,
}

impl Api {
    pub fn from_path(path: &str) -> Option<Self> {
        match path {
            "/v1/completions" => Some(Self::Completions),
            "/v1/chat/completions" => Some(Self::ChatCompletions),
            "/v1/embeddings" => Some(Self::Embeddings),
            "/v1/responses" => Some(Self::Responses),
            _ => None,
        }
    }
}

/// What the stand-in needs from a request body.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    pub model: String,
    pub stream: bool,
    pub include_usage: bool,
    pub prompt_tokens: u64,
    pub max_tokens: Option<u64>,
}

/// Parses the request body; the error text becomes a 400 message.
pub fn parse(api: Api, body: &[u8]) -> Result<Parsed, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    let model = v["model"].as_str().ok_or("missing \"model\"")?.to_owned();
    let prompt = match api {
        Api::Completions => &v["prompt"],
        Api::ChatCompletions => &v["messages"],
        Api::Embeddings | Api::Responses => &v["input"],
    };
    let max_tokens = ["max_tokens", "max_completion_tokens", "max_output_tokens"]
        .iter()
        .find_map(|k| v[*k].as_u64());
    Ok(Parsed {
        model,
        stream: api != Api::Embeddings && v["stream"].as_bool() == Some(true),
        include_usage: v["stream_options"]["include_usage"].as_bool() == Some(true),
        prompt_tokens: count_words(prompt).max(1),
        max_tokens,
    })
}

/// Words in every string inside `v` (prompts, message contents, content parts).
fn count_words(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.split_whitespace().count() as u64,
        Value::Array(items) => items.iter().map(count_words).sum(),
        Value::Object(map) => map
            .iter()
            .filter(|(k, _)| *k == "content" || *k == "text")
            .map(|(_, v)| count_words(v))
            .sum(),
        _ => 0,
    }
}

/// Everything a reply body names.
#[derive(Debug, Clone)]
pub struct Reply<'a> {
    pub api: Api,
    pub id: String,
    pub pod: &'a str,
    pub model: &'a str,
    pub created: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

impl Reply<'_> {
    fn usage(&self) -> Value {
        let (p, c) = (self.prompt_tokens, self.completion_tokens);
        match self.api {
            Api::Responses => json!({"input_tokens": p, "output_tokens": c, "total_tokens": p + c,
                                     "input_tokens_details": {"cached_tokens": 0}}),
            Api::Embeddings => json!({"prompt_tokens": p, "total_tokens": p}),
            _ => json!({"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
                        "prompt_tokens_details": {"cached_tokens": 0}}),
        }
    }

    fn text(&self) -> String {
        (0..self.completion_tokens).map(token).collect()
    }

    /// The non-streaming JSON body.
    pub fn full(&self) -> Bytes {
        let (id, model, created, text) = (&self.id, self.model, self.created, self.text());
        let body = match self.api {
            Api::Completions => {
                json!({"id": id, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": "stop"}]})
            }
            Api::ChatCompletions => {
                json!({"id": id, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]})
            }
            Api::Embeddings => {
                json!({"id": id, "object": "list", "created": created, "model": model,
                "data": [{"object": "embedding", "index": 0, "embedding": [0.0, 0.25, 0.5, 0.75]}]})
            }
            Api::Responses => {
                json!({"id": id, "object": "response", "created_at": created, "model": model,
                "status": "completed", "output": [{"type": "message", "role": "assistant",
                "content": [{"type": "output_text", "text": text}]}]})
            }
        };
        self.finish(body)
    }

    fn finish(&self, mut body: Value) -> Bytes {
        body["usage"] = self.usage();
        body["served_by"] = json!(self.pod);
        Bytes::from(body.to_string())
    }

    /// The SSE events, one per generated token, then (if asked) a usage event, then the end
    /// marker (`data: [DONE]`, or `response.completed` for the Responses API).
    pub fn events(&self, include_usage: bool) -> Vec<Bytes> {
        let n = self.completion_tokens;
        let mut events: Vec<Bytes> = (0..n).map(|i| self.token_event(i, i + 1 == n)).collect();
        if self.api == Api::Responses {
            let done = json!({"type": "response.completed", "response": {"id": self.id, "object": "response",
                "model": self.model, "status": "completed", "usage": self.usage()}});
            events.push(sse(Some("response.completed"), &done));
            return events;
        }
        if include_usage {
            let usage = json!({"id": self.id, "object": self.chunk_object(), "created": self.created,
                "model": self.model, "choices": [], "usage": self.usage()});
            events.push(sse(None, &usage));
        }
        events.push(Bytes::from_static(b"data: [DONE]\n\n"));
        events
    }

    fn chunk_object(&self) -> &'static str {
        match self.api {
            Api::ChatCompletions => "chat.completion.chunk",
            _ => "text_completion",
        }
    }

    fn token_event(&self, i: u64, last: bool) -> Bytes {
        let finish = if last { json!("stop") } else { Value::Null };
        let (id, model, created, object) =
            (&self.id, self.model, self.created, self.chunk_object());
        match self.api {
            Api::ChatCompletions => {
                let delta = if i == 0 {
                    json!({"role": "assistant", "content": token(i)})
                } else {
                    json!({"content": token(i)})
                };
                sse(
                    None,
                    &json!({"id": id, "object": object, "created": created, "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
                )
            }
            Api::Responses => sse(
                Some("response.output_text.delta"),
                &json!({"type": "response.output_text.delta", "item_id": id, "delta": token(i)}),
            ),
            _ => sse(
                None,
                &json!({"id": id, "object": object, "created": created, "model": model,
                "choices": [{"index": 0, "text": token(i), "logprobs": null, "finish_reason": finish}]}),
            ),
        }
    }
}

/// The `i`-th generated token.
fn token(i: u64) -> String {
    format!("t{i} ")
}

fn sse(event: Option<&str>, data: &Value) -> Bytes {
    let mut out = String::new();
    if let Some(name) = event {
        out.push_str("event: ");
        out.push_str(name);
        out.push('\n');
    }
    out.push_str("data: ");
    out.push_str(&data.to_string());
    out.push_str("\n\n");
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_chat_messages_and_stream_options() {
        let body = br#"{"model":"m","stream":true,"stream_options":{"include_usage":true},
            "messages":[{"role":"user","content":"one two three"},{"role":"user","content":[{"type":"text","text":"four"}]}]}"#;
        let p = parse(Api::ChatCompletions, body).unwrap();
        assert_eq!(p.model, "m");
        assert!(p.stream && p.include_usage);
        assert_eq!(p.prompt_tokens, 4);
    }

    #[test]
    fn rejects_a_body_without_model() {
        assert!(parse(Api::Completions, br#"{"prompt":"x"}"#).is_err());
    }

    #[test]
    fn streams_one_event_per_token_then_done() {
        let reply = Reply {
            api: Api::Completions,
            id: "cmpl-a-1".into(),
            pod: "a",
            model: "m",
            created: 1,
            prompt_tokens: 2,
            completion_tokens: 3,
        };
        let events = reply.events(true);
        assert_eq!(events.len(), 5);
        assert!(events[0].starts_with(b"data: {"));
        assert!(events[3].windows(7).any(|w| w == b"\"usage\""));
        assert_eq!(&events[4][..], b"data: [DONE]\n\n");
    }

    #[test]
    fn a_full_reply_reports_usage_and_the_pod() {
        let reply = Reply {
            api: Api::Completions,
            id: "cmpl-a-1".into(),
            pod: "a",
            model: "m",
            created: 1,
            prompt_tokens: 2,
            completion_tokens: 3,
        };
        let v: Value = serde_json::from_slice(&reply.full()).unwrap();
        assert_eq!(v["usage"]["total_tokens"], 5);
        assert_eq!(v["model"], "m");
        assert_eq!(v["served_by"], "a");
    }
}

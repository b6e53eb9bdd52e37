//! `vertexai-parser` (llm-d v0.10): Vertex AI's prediction service over gRPC, whose
//! `ChatCompletions`, `RawPredict` and `StreamRawPredict` requests carry an OpenAI-compatible
//! JSON body in a `google.api.HttpBody`. As upstream, the gRPC frame is opened (uncompressed
//! only), the request message's `http_body` (field 2) and its `data` (field 2) are read, and
//! the JSON is parsed as an OpenAI chat completion (`ChatCompletions`) or a Responses request
//! (the raw predictions). The body is forwarded as it came: the model is read, never
//! rewritten (a rewrite would change the lengths the frame and messages declare), so as
//! upstream a body without a string `model` is routed with none.

use super::grpc::{last_field, unframe};
use super::{openai, ApiKind, LlmRequest, RequestError};

/// Which Vertex AI request a body is, by the OpenAI API its JSON follows.
fn message_name(api: ApiKind) -> &'static str {
    match api {
        ApiKind::VertexChatCompletions => "ChatCompletionsRequest",
        _ => "RawPredictRequest",
    }
}

/// Parses a Vertex AI request body (`api` is `VertexChatCompletions` or `VertexRawPredict`).
pub(crate) fn request(api: ApiKind, body: &[u8], cap: usize) -> Result<LlmRequest, RequestError> {
    let name = message_name(api);
    let message = unframe(body)?;
    let http_body = last_field(message, 2)
        .map_err(|_| RequestError::Proto(name))?
        .ok_or(RequestError::NoHttpBody(name))?;
    let data = last_field(http_body, 2)
        .map_err(|_| RequestError::Proto(name))?
        .unwrap_or(&[]);
    let inner = match api {
        ApiKind::VertexChatCompletions => ApiKind::ChatCompletions,
        _ => ApiKind::Responses,
    };
    let mut parsed = openai(inner, data, cap, false).map_err(|e| RequestError::Vertex {
        message: name,
        source: Box::new(e),
    })?;
    parsed.api = api;
    Ok(parsed)
}

/// A Vertex AI request body: `json` in an `HttpBody` in a request message (with an `endpoint`
/// string first, as clients send it), in one gRPC frame. For tests and the differential suite.
pub fn frame(json: &[u8]) -> Vec<u8> {
    fn field(number: u8, bytes: &[u8], out: &mut Vec<u8>) {
        out.push(number << 3 | 2);
        let mut len = bytes.len();
        while len >= 0x80 {
            out.push((len as u8) | 0x80);
            len >>= 7;
        }
        out.push(len as u8);
        out.extend_from_slice(bytes);
    }
    let mut http_body = Vec::new();
    field(1, b"application/json", &mut http_body);
    field(2, json, &mut http_body);
    let mut message = Vec::new();
    field(1, b"projects/p/locations/l/endpoints/e", &mut message);
    field(2, &http_body, &mut message);
    let mut out = vec![0];
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(&message);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Prompt;

    const CHAT: &[u8] = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

    #[test]
    fn a_chat_completions_request_is_read_from_its_http_body() {
        let body = frame(CHAT);
        let r = request(ApiKind::VertexChatCompletions, &body, 1 << 20).unwrap();
        assert_eq!(
            (r.api, r.model.as_str()),
            (ApiKind::VertexChatCompletions, "m")
        );
        assert!(matches!(r.prompt, Prompt::Text(ref t) if t.contains("hi")));
        assert_eq!(r.model_span, 0..0, "never rewritten");
        let raw = frame(br#"{"model":"m","input":"hello"}"#);
        let r = request(ApiKind::VertexRawPredict, &raw, 1 << 20).unwrap();
        assert_eq!(r.model, "m");
    }

    #[test]
    fn bad_frames_messages_and_bodies_are_refused_as_upstream() {
        let cases: [(&[u8], &str); 4] = [
            (b"\x00\x00", "invalid or unsupported gRPC payload"),
            (
                b"\x01\x00\x00\x00\x00",
                "compressed gRPC payload is not supported",
            ),
            (
                b"\x00\x00\x00\x00\x02\x0a\x05",
                "unmarshaling ChatCompletionsRequest",
            ),
            (
                b"\x00\x00\x00\x00\x00",
                "ChatCompletionsRequest has no HttpBody",
            ),
        ];
        for (body, says) in cases {
            let e = request(ApiKind::VertexChatCompletions, body, 64).unwrap_err();
            assert!(e.to_string().contains(says), "{e}");
        }
        let no_messages = frame(br#"{"model":"m"}"#);
        let e = request(ApiKind::VertexChatCompletions, &no_messages, 64).unwrap_err();
        assert_eq!(
            e.to_string(),
            "parsing ChatCompletionsRequest: field `messages` is required for this API"
        );
        // Upstream reads a string `model` when there is one (it never rewrites it here).
        let no_model = frame(br#"{"model":7,"messages":[{"role":"user","content":"hi"}]}"#);
        let r = request(ApiKind::VertexChatCompletions, &no_model, 64).unwrap();
        assert_eq!(r.model, "");
    }
}

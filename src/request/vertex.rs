//! `vertexai-parser` (llm-d v0.10): Vertex AI's prediction service over gRPC, whose
//! `ChatCompletions`, `RawPredict` and `StreamRawPredict` requests carry an OpenAI-compatible
//! JSON body in a `google.api.HttpBody`. As upstream, the gRPC frame is opened (uncompressed
//! only), the request message's `http_body` (field 2) and its `data` (field 2) are read, and
//! the JSON is parsed as an OpenAI chat completion (`ChatCompletions`) or a Responses request
//! (the raw predictions). The body is forwarded as it came: the model is read, never
//! rewritten (a rewrite would change the lengths the frame and messages declare), so as
//! upstream a body without a string `model` is routed with none.
//!
//! Only the few protobuf wire rules these messages need are read here (varints and
//! length-delimited fields; fixed-width fields are skipped); a malformed message is refused.

use super::{openai, ApiKind, LlmRequest, RequestError};
use std::ops::Range;

/// The gRPC message header: a compression flag and a big-endian length.
const FRAME_HEADER: usize = 5;

/// Which Vertex AI request a body is, by the OpenAI API its JSON follows.
fn message_name(api: ApiKind) -> &'static str {
    match api {
        ApiKind::VertexChatCompletions => "ChatCompletionsRequest",
        _ => "RawPredictRequest",
    }
}

/// Parses a Vertex AI request body (`api` is `VertexChatCompletions` or `VertexRawPredict`).
pub fn request(api: ApiKind, body: &[u8], cap: usize) -> Result<LlmRequest, RequestError> {
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

/// The JSON a Vertex AI response carries (an `HttpBody` in the first gRPC frame), for its
/// usage; `None` when the bytes are not that.
pub fn response_json(body: &[u8]) -> Option<&[u8]> {
    let message = unframe(body).ok()?;
    last_field(message, 2).ok().flatten()
}

/// The first gRPC message of `body` (upstream's `ParseGrpcPayload`).
fn unframe(body: &[u8]) -> Result<&[u8], RequestError> {
    let header = body
        .get(..FRAME_HEADER)
        .ok_or(RequestError::GrpcFrame("shorter than the 5-byte header"))?;
    if header[0] == 1 {
        return Err(RequestError::GrpcFrame(
            "compressed gRPC payload is not supported",
        ));
    }
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    body.get(FRAME_HEADER..FRAME_HEADER.saturating_add(len))
        .ok_or(RequestError::GrpcFrame("incomplete gRPC payload"))
}

/// A protobuf message that does not follow the wire format.
#[derive(Debug)]
struct Malformed;

/// The last occurrence of length-delimited field `number` in `message` (protobuf: the last
/// value of a non-repeated field wins).
fn last_field(message: &[u8], number: u64) -> Result<Option<&[u8]>, Malformed> {
    let mut at = 0;
    let mut found = None;
    while at < message.len() {
        let key = varint(message, &mut at)?;
        let value = skip(message, &mut at, key & 7)?;
        if key >> 3 == number && key & 7 == 2 {
            found = Some(&message[value]);
        }
    }
    Ok(found)
}

/// Moves past one field's value of wire type `wire`; the range of a length-delimited one.
fn skip(message: &[u8], at: &mut usize, wire: u64) -> Result<Range<usize>, Malformed> {
    let start = *at;
    let end = match wire {
        0 => {
            varint(message, at)?;
            *at
        }
        1 => start + 8,
        2 => {
            let len = usize::try_from(varint(message, at)?).map_err(|_| Malformed)?;
            let from = *at;
            *at = from.checked_add(len).ok_or(Malformed)?;
            if *at > message.len() {
                return Err(Malformed);
            }
            return Ok(from..*at);
        }
        5 => start + 4,
        _ => return Err(Malformed),
    };
    if end > message.len() {
        return Err(Malformed);
    }
    *at = end;
    Ok(start..end)
}

fn varint(message: &[u8], at: &mut usize) -> Result<u64, Malformed> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *message.get(*at).ok_or(Malformed)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(Malformed)
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
        let mut response = vec![0, 0, 0, 0, 2 + CHAT.len() as u8, 0x12, CHAT.len() as u8];
        response.extend_from_slice(CHAT);
        assert_eq!(response_json(&response), Some(CHAT));
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

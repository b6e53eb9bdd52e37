//! `vllmgrpc-parser` (llm-d v0.10): vLLM's gRPC engine API (`vllm.grpc.engine.VllmEngine`).
//! As upstream: `Generate` takes its prompt from the request's `tokenized` input ids or its
//! `text` (whichever the oneof holds), and its `stream` flag; `Embed` needs `tokenized` input.
//! The messages name no model (routed with none) and are forwarded as they came. A response's
//! usage is read from `GenerateResponse` (a stream chunk's or the final message's prompt,
//! completion and cached tokens) or `EmbedResponse` (its prompt tokens).

use super::grpc::{fields, last_field, repeated_varints, unframe, varint_value, Malformed};
use super::{truncate, ApiKind, LlmRequest, Prompt, RequestError};

/// `GenerateRequest` fields.
const TOKENIZED: u64 = 2;
const TEXT: u64 = 3;
const STREAM: u64 = 5;
/// `TokenizedInput.input_ids`.
const INPUT_IDS: u64 = 2;

fn message_name(api: ApiKind) -> &'static str {
    match api {
        ApiKind::VllmGrpcEmbed => "EmbedRequest",
        _ => "GenerateRequest",
    }
}

/// Parses a `Generate` or `Embed` request body (`api` says which).
pub(crate) fn request(api: ApiKind, body: &[u8], cap: usize) -> Result<LlmRequest, RequestError> {
    let name = message_name(api);
    let message = unframe(body)?;
    let (prompt, stream) = read(api, message, cap)
        .map_err(|_| RequestError::Proto(name))?
        .ok_or(RequestError::NoInput(match api {
            ApiKind::VllmGrpcEmbed => "missing tokenized input in EmbedRequest",
            _ => "not supported request inputType",
        }))?;
    Ok(LlmRequest {
        api,
        model: String::new(),
        model_span: 0..0,
        stream,
        prompt,
        cache_salt: None,
    })
}

/// The prompt (`None`: no input the API takes) and the stream flag of a request message.
fn read(api: ApiKind, message: &[u8], cap: usize) -> Result<Option<(Prompt, bool)>, Malformed> {
    let mut prompt = None;
    let mut stream = false;
    for (number, wire, value) in fields(message)? {
        match (number, wire) {
            (TOKENIZED, 2) => {
                let ids = repeated_varints(value, INPUT_IDS)?;
                prompt = Some(Prompt::Tokens(ids.into_iter().map(|t| t as u32).collect()));
            }
            (TEXT, 2) if api == ApiKind::VllmGrpcGenerate => {
                let text = String::from_utf8_lossy(value).into_owned();
                prompt = Some(Prompt::Text(truncate(text, cap)));
            }
            (STREAM, 0) if api == ApiKind::VllmGrpcGenerate => {
                stream = varint_value(value)? != 0;
            }
            _ => {}
        }
    }
    Ok(prompt.map(|p| (p, stream)))
}

/// Token counts a response message reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub(crate) prompt: u64,
    pub(crate) completion: u64,
    pub(crate) cached: u64,
}

/// The usage in one response message (a `GenerateResponse` chunk or final message, else an
/// `EmbedResponse`); `None` when it reports none.
pub(crate) fn response_usage(message: &[u8]) -> Option<Usage> {
    let counts = |m: &[u8], first: u64| -> Option<Usage> {
        let mut u = Usage::default();
        for (number, wire, value) in fields(m).ok()? {
            let slot = match number.checked_sub(first) {
                Some(0) => &mut u.prompt,
                Some(1) => &mut u.completion,
                Some(2) => &mut u.cached,
                _ => continue,
            };
            if wire == 0 {
                *slot = varint_value(value).ok()?;
            }
        }
        (u.prompt > 0 || u.completion > 0).then_some(u)
    };
    let generate = [(1, 2), (2, 3)]
        .into_iter()
        .find_map(|(field, first)| counts(last_field(message, field).ok()??, first));
    generate.or_else(|| {
        let prompt = fields(message)
            .ok()?
            .into_iter()
            .find(|f| f.0 == 2 && f.1 == 0)?;
        let prompt = varint_value(prompt.2).ok()?;
        (prompt > 0).then_some(Usage {
            prompt,
            ..Usage::default()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(message: &[u8]) -> Vec<u8> {
        let mut out = vec![0];
        out.extend_from_slice(&(message.len() as u32).to_be_bytes());
        out.extend_from_slice(message);
        out
    }

    #[test]
    fn generate_reads_tokens_or_text_and_the_stream_flag() {
        // tokenized {input_ids: [1, 2, 300] packed}, stream: true.
        let tokens = frame(&[0x12, 0x06, 0x12, 0x04, 1, 2, 0xac, 0x02, 0x28, 0x01]);
        let r = request(ApiKind::VllmGrpcGenerate, &tokens, 64).unwrap();
        assert_eq!(r.prompt, Prompt::Tokens(vec![1, 2, 300]));
        assert!(r.stream);
        assert_eq!(r.model, "");
        let text = frame(&[0x1a, 0x02, b'h', b'i']);
        let r = request(ApiKind::VllmGrpcGenerate, &text, 64).unwrap();
        assert_eq!((r.prompt, r.stream), (Prompt::Text("hi".into()), false));
    }

    #[test]
    fn a_request_without_input_or_with_a_broken_message_is_refused() {
        let e = request(ApiKind::VllmGrpcGenerate, &frame(&[0x28, 0x01]), 64).unwrap_err();
        assert_eq!(e.to_string(), "not supported request inputType");
        let text_only = frame(&[0x1a, 0x02, b'h', b'i']);
        let e = request(ApiKind::VllmGrpcEmbed, &text_only, 64).unwrap_err();
        assert_eq!(e.to_string(), "missing tokenized input in EmbedRequest");
        let e = request(ApiKind::VllmGrpcGenerate, &frame(&[0x12, 0x09]), 64).unwrap_err();
        assert!(
            e.to_string().starts_with("unmarshaling GenerateRequest"),
            "{e}"
        );
    }

    #[test]
    fn usage_comes_from_chunks_final_messages_and_embeddings() {
        // complete {prompt_tokens: 7, completion_tokens: 3, cached_tokens: 4}.
        let complete = [0x12, 0x06, 0x18, 7, 0x20, 3, 0x28, 4];
        let u = Usage {
            prompt: 7,
            completion: 3,
            cached: 4,
        };
        assert_eq!(response_usage(&complete), Some(u));
        let chunk = [0x0a, 0x04, 0x10, 5, 0x18, 1];
        assert_eq!(
            response_usage(&chunk).map(|u| (u.prompt, u.completion)),
            Some((5, 1))
        );
        let embed = [0x10, 9];
        assert_eq!(response_usage(&embed).map(|u| u.prompt), Some(9));
        assert_eq!(response_usage(&[0x0a, 0x02, 0x08, 1]), None);
    }
}

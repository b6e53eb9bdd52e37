//! The response phase: pass the model server's answer through, chunk by chunk, restoring the
//! client-facing model name when the request's model was rewritten, and read token usage for
//! metrics on the way.
//!
//! Streaming (SSE) chunks are forwarded at once, so tokens reach the client as they are made.
//! A non-streaming body is forwarded at once too, unless the model name must be restored: then
//! it is held until its end so a name split across chunks is still replaced.
//!
//! For passive health it also notes when the headers and the first and last body chunks came,
//! the status, and whether the answer is the gateway's own connection-failure reply (Envoy's
//! `upstream connect error or disconnect/reset before headers`, response flag `UF`).

use super::wire;
use crate::director::ResponseSummary;
use envoy_types::pb::envoy::service::ext_proc::v3::ProcessingResponse;
use serde::Deserialize;
use std::time::Instant;

/// How Envoy's local reply starts when it could not reach the upstream (flags `UF`/`UC`/`URX`).
const ENVOY_CONNECT_FAILURE: &[u8] = b"upstream connect error or disconnect/reset before headers";

/// Bytes kept for usage parsing of a non-streaming body, and the longest SSE line considered.
const USAGE_WINDOW: usize = 4 << 20;

#[derive(Deserialize, Default)]
struct Details {
    cached_tokens: Option<u64>,
}

#[derive(Deserialize, Default)]
struct UsageWire {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    prompt_tokens_details: Option<Details>,
    prompt_token_details: Option<Details>,
    input_tokens_details: Option<Details>,
}

#[derive(Deserialize)]
struct Nested {
    usage: Option<UsageWire>,
}

#[derive(Deserialize)]
struct UsageDoc {
    usage: Option<UsageWire>,
    /// Responses API: `response.completed` carries `response.usage`.
    response: Option<Nested>,
}

/// Model-name restoration: the JSON patterns to find and their replacements.
#[derive(Debug)]
struct Restore {
    pairs: [(Vec<u8>, Vec<u8>); 2],
}

impl Restore {
    fn new(target: &str, incoming: &str) -> Self {
        let q = |s: &str| serde_json::Value::String(s.to_owned()).to_string();
        let (t, i) = (q(target), q(incoming));
        let pair = |sep: &str| {
            (
                format!("\"model\"{sep}{t}").into_bytes(),
                format!("\"model\"{sep}{i}").into_bytes(),
            )
        };
        Self {
            pairs: [pair(":"), pair(": ")],
        }
    }

    fn apply(&self, body: &[u8]) -> Vec<u8> {
        let mut out = body.to_vec();
        for (from, to) in &self.pairs {
            out = replace_all(&out, from, to);
        }
        out
    }
}

fn replace_all(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(hay.len());
    let mut last = 0;
    for at in memchr::memmem::find_iter(hay, from) {
        out.extend_from_slice(&hay[last..at]);
        out.extend_from_slice(to);
        last = at + from.len();
    }
    out.extend_from_slice(&hay[last..]);
    out
}

#[derive(Debug, Default)]
pub struct ResponseTracker {
    restore: Option<Restore>,
    streaming: bool,
    pub status: Option<u16>,
    held: Vec<u8>,
    window: Vec<u8>,
    summary: ResponseSummary,
    /// An upgraded connection's bytes (WebSocket frames after a 101): passed through at once,
    /// never held or read for usage, and not timed (a session is long and its frames are not
    /// an answer: passive health learns the handshake's latency, not the session's length).
    opaque: bool,
    /// A gRPC response (`application/grpc`): each message is read for usage (Vertex AI's
    /// `HttpBody` JSON, vLLM's `GenerateResponse` / `EmbedResponse`).
    grpc: bool,
    /// Bytes left of a gRPC message too long to read for usage.
    grpc_skip: usize,
}

impl ResponseTracker {
    /// `rewrite` is `(target, incoming)` when the request's model was rewritten.
    pub fn new(
        status: Option<u16>,
        content_type: Option<&str>,
        request_stream: bool,
        rewrite: Option<(&str, &str)>,
    ) -> Self {
        let sse = content_type.is_some_and(|c| c.contains("text/event-stream"));
        let summary = ResponseSummary {
            status,
            headers_at: Some(Instant::now()),
            ..Default::default()
        };
        Self {
            restore: rewrite.map(|(t, i)| Restore::new(t, i)),
            grpc: content_type.is_some_and(|c| c.starts_with("application/grpc")),
            streaming: sse || request_stream,
            status,
            summary,
            ..Default::default()
        }
    }

    /// The tracker of an upgraded connection (a WebSocket session after its 101): frames are
    /// timed and counted, and pass through unread.
    pub fn upgraded(status: Option<u16>) -> Self {
        Self {
            opaque: true,
            ..Self::new(status, None, false, None)
        }
    }

    /// Notes a body chunk's arrival (and, on the first, whether it is Envoy's connect failure).
    fn stamp(&mut self, chunk: &[u8]) {
        let now = Instant::now();
        let s = &mut self.summary;
        if s.first_body_at.is_none() {
            s.first_body_at = Some(now);
            s.connect_failure =
                matches!(s.status, Some(502..=504)) && chunk.starts_with(ENVOY_CONNECT_FAILURE);
        }
        s.last_body_at = Some(now);
    }

    /// Handles one duplex response-body chunk.
    pub fn on_chunk(
        &mut self,
        chunk: &[u8],
        end_of_stream: bool,
        out: &mut Vec<ProcessingResponse>,
    ) {
        // A session's frames are not an answer's tokens: its latency is the handshake's.
        if !chunk.is_empty() && !self.opaque {
            self.stamp(chunk);
        }
        self.summary.response_bytes += chunk.len();
        self.observe(chunk, end_of_stream);
        match (&self.restore, self.streaming) {
            (Some(r), true) => wire::streamed_body(&r.apply(chunk), end_of_stream, true, out),
            (Some(r), false) => {
                self.held.extend_from_slice(chunk);
                if end_of_stream {
                    wire::streamed_body(&r.apply(&self.held), true, true, out);
                }
            }
            (None, _) => wire::streamed_body(chunk, end_of_stream, true, out),
        }
    }

    /// The whole body at once (buffered response mode): the restored body if it changed.
    pub fn on_buffered(&mut self, body: &[u8]) -> Option<Vec<u8>> {
        self.stamp(body);
        self.summary.response_bytes += body.len();
        self.observe(body, true);
        self.restore
            .as_ref()
            .map(|r| r.apply(body))
            .filter(|b| b != body)
    }

    pub fn summary(&self, request_bytes: usize) -> ResponseSummary {
        ResponseSummary {
            request_bytes,
            ..self.summary
        }
    }

    fn observe(&mut self, chunk: &[u8], end_of_stream: bool) {
        if self.opaque {
            return;
        }
        if self.grpc {
            return self.observe_grpc(chunk);
        }
        if self.streaming {
            self.observe_sse(chunk);
        } else {
            if self.window.len() + chunk.len() <= USAGE_WINDOW {
                self.window.extend_from_slice(chunk);
            }
            if end_of_stream {
                let window = std::mem::take(&mut self.window);
                self.take_usage(&window);
            }
        }
    }

    /// Reads complete SSE lines straight from the chunk; only an unfinished last line is kept
    /// (in `window`) until its end arrives.
    fn observe_sse(&mut self, chunk: &[u8]) {
        let mut rest = chunk;
        if !self.window.is_empty() {
            let Some(nl) = memchr::memchr(b'\n', rest) else {
                self.window.extend_from_slice(rest);
                if self.window.len() > USAGE_WINDOW {
                    self.window.clear();
                }
                return;
            };
            let mut line = std::mem::take(&mut self.window);
            line.extend_from_slice(&rest[..nl]);
            self.sse_line(&line);
            line.clear();
            self.window = line;
            rest = &rest[nl + 1..];
        }
        while let Some(nl) = memchr::memchr(b'\n', rest) {
            self.sse_line(&rest[..nl]);
            rest = &rest[nl + 1..];
        }
        if rest.len() <= USAGE_WINDOW {
            self.window.extend_from_slice(rest);
        }
    }

    /// gRPC messages, which may span chunks: each complete one is read for usage; one longer
    /// than the usage window is skipped.
    fn observe_grpc(&mut self, mut chunk: &[u8]) {
        use crate::request::grpc::FRAME_HEADER;
        let frame_len = |w: &[u8]| u32::from_be_bytes([w[1], w[2], w[3], w[4]]) as usize;
        while !chunk.is_empty() {
            if self.grpc_skip > 0 {
                let n = self.grpc_skip.min(chunk.len());
                self.grpc_skip -= n;
                chunk = &chunk[n..];
                continue;
            }
            let len = self.window.get(..FRAME_HEADER).map(frame_len);
            if let Some(len) = len.filter(|l| *l > USAGE_WINDOW) {
                self.grpc_skip = FRAME_HEADER + len - self.window.len();
                self.window.clear();
                continue;
            }
            let want = FRAME_HEADER + len.unwrap_or(0) - self.window.len();
            let n = want.min(chunk.len());
            self.window.extend_from_slice(&chunk[..n]);
            chunk = &chunk[n..];
            let whole = self.window.len() >= FRAME_HEADER
                && self.window.len() == FRAME_HEADER + frame_len(&self.window);
            if whole {
                let frame = std::mem::take(&mut self.window);
                self.grpc_usage(&frame[FRAME_HEADER..]);
            }
        }
    }

    /// One gRPC response message's usage: Vertex AI's `HttpBody` JSON, else vLLM's counts.
    fn grpc_usage(&mut self, message: &[u8]) {
        let json = crate::request::grpc::last_field(message, 2).ok().flatten();
        if let Some(json) = json.filter(|j| j.first() == Some(&b'{')) {
            return self.take_usage(json);
        }
        if let Some(u) = crate::request::vllm_grpc::response_usage(message) {
            let s = &mut self.summary;
            s.prompt_tokens = Some(u.prompt);
            s.completion_tokens = Some(u.completion);
            s.cached_tokens = Some(u.cached);
        }
    }

    /// One SSE line (without its newline): a `data:` payload that mentions `"usage"` is parsed.
    fn sse_line(&mut self, line: &[u8]) {
        let Some(payload) = line.strip_prefix(b"data:") else {
            return;
        };
        let payload = payload.trim_ascii();
        if payload != b"[DONE]" && memchr::memmem::find(payload, b"\"usage\"").is_some() {
            self.take_usage(payload);
        }
    }

    fn take_usage(&mut self, json: &[u8]) {
        let Ok(doc) = serde_json::from_slice::<UsageDoc>(json) else {
            return;
        };
        let Some(u) = doc.usage.or(doc.response.and_then(|r| r.usage)) else {
            return;
        };
        let s = &mut self.summary;
        s.prompt_tokens = u.prompt_tokens.or(u.input_tokens).or(s.prompt_tokens);
        s.completion_tokens = u
            .completion_tokens
            .or(u.output_tokens)
            .or(s.completion_tokens);
        let details = u
            .prompt_tokens_details
            .or(u.prompt_token_details)
            .or(u.input_tokens_details);
        s.cached_tokens = details.and_then(|d| d.cached_tokens).or(s.cached_tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation;
    use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;

    fn bodies(out: &[ProcessingResponse]) -> Vec<u8> {
        let mut all = Vec::new();
        for r in out {
            let Some(Response::ResponseBody(b)) = &r.response else {
                panic!()
            };
            let Some(Mutation::StreamedResponse(s)) = &b
                .response
                .as_ref()
                .unwrap()
                .body_mutation
                .as_ref()
                .unwrap()
                .mutation
            else {
                panic!()
            };
            all.extend_from_slice(&s.body);
        }
        all
    }

    #[test]
    fn restores_the_model_name_across_chunks_when_not_streaming() {
        let mut t = ResponseTracker::new(
            Some(200),
            Some("application/json"),
            false,
            Some(("m-v2", "m")),
        );
        let mut out = Vec::new();
        t.on_chunk(br#"{"model":"m-"#, false, &mut out);
        assert!(out.is_empty(), "held until the end");
        t.on_chunk(br#"v2","usage":{"prompt_tokens":5,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}"#, true, &mut out);
        assert_eq!(bodies(&out), br#"{"model":"m","usage":{"prompt_tokens":5,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}"#.to_vec());
        let s = t.summary(10);
        assert_eq!(
            (s.prompt_tokens, s.completion_tokens, s.cached_tokens),
            (Some(5), Some(2), Some(4))
        );
    }

    #[test]
    fn reads_usage_from_grpc_messages_split_across_chunks() {
        // Vertex AI: an HttpBody whose data is the JSON.
        let json = br#"{"usage":{"prompt_tokens":6,"completion_tokens":2}}"#;
        let mut vertex = vec![0, 0, 0, 0, 2 + json.len() as u8, 0x12, json.len() as u8];
        vertex.extend_from_slice(json);
        // vLLM: a stream chunk, then the final message {prompt 7, completion 3, cached 4}.
        let vllm = [
            0, 0, 0, 0, 6, 0x0a, 0x04, 0x10, 7, 0x18, 1, 0, 0, 0, 0, 8, 0x12, 0x06, 0x18, 7, 0x20,
            3, 0x28, 4,
        ];
        for (body, want) in [(&vertex[..], (6, 2, None)), (&vllm[..], (7, 3, Some(4)))] {
            let mut t = ResponseTracker::new(Some(200), Some("application/grpc"), true, None);
            let mut out = Vec::new();
            for piece in body.chunks(3) {
                t.on_chunk(piece, false, &mut out);
            }
            t.on_chunk(b"", true, &mut out);
            let s = t.summary(0);
            let got = (s.prompt_tokens, s.completion_tokens, s.cached_tokens);
            assert_eq!(got, (Some(want.0), Some(want.1), want.2));
        }
    }

    #[test]
    fn passes_sse_through_at_once_and_reads_final_usage() {
        let mut t = ResponseTracker::new(Some(200), Some("text/event-stream"), true, None);
        let mut out = Vec::new();
        t.on_chunk(
            b"data: {\"choices\":[{\"text\":\"a\"}]}\n\n",
            false,
            &mut out,
        );
        assert_eq!(out.len(), 1, "forwarded without waiting");
        t.on_chunk(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":3,\"prompt_token_details\":{\"cached_tokens\":8}}}\n\ndata: [DONE]\n\n", true, &mut out);
        let s = t.summary(0);
        assert_eq!(
            (s.prompt_tokens, s.completion_tokens, s.cached_tokens),
            (Some(9), Some(3), Some(8))
        );
        assert_eq!(s.status, Some(200));
        let (h, f, l) = (
            s.headers_at.unwrap(),
            s.first_body_at.unwrap(),
            s.last_body_at.unwrap(),
        );
        assert!(
            h <= f && f <= l,
            "headers, first chunk, last chunk in order"
        );
        assert!(!s.connect_failure);
    }

    #[test]
    fn reads_usage_from_an_sse_line_split_across_chunks() {
        let line = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":4}}\r\n\r\ndata: [DONE]\r\n\r\n";
        for cuts in [(1, 2), (10, 30), (40, 41), (70, line.len() - 3)] {
            let mut t = ResponseTracker::new(Some(200), Some("text/event-stream"), true, None);
            let mut out = Vec::new();
            let first: &[u8] = b"data: {\"choices\":[{\"text\":\"usage\"}]}\n\n";
            t.on_chunk(first, false, &mut out);
            t.on_chunk(&line[..cuts.0], false, &mut out);
            t.on_chunk(&line[cuts.0..cuts.1], false, &mut out);
            t.on_chunk(&line[cuts.1..], true, &mut out);
            let s = t.summary(0);
            assert_eq!(
                (s.prompt_tokens, s.completion_tokens),
                (Some(12), Some(4)),
                "cut at {cuts:?}"
            );
            assert_eq!(
                bodies(&out),
                [first, &line[..]].concat(),
                "every byte forwarded"
            );
        }
    }

    #[test]
    fn recognises_envoys_connect_failure_reply_and_nothing_else() {
        let envoy = b"upstream connect error or disconnect/reset before headers. reset reason: remote connection failure";
        let mut t = ResponseTracker::new(Some(503), Some("text/plain"), false, None);
        t.on_chunk(envoy, true, &mut Vec::new());
        assert!(t.summary(0).connect_failure);
        let mut t = ResponseTracker::new(Some(503), Some("application/json"), false, None);
        t.on_chunk(br#"{"error":"overloaded"}"#, true, &mut Vec::new());
        assert!(
            !t.summary(0).connect_failure,
            "a pod's own 503 is a 5xx, not a connection failure"
        );
        let mut t = ResponseTracker::new(Some(200), Some("text/plain"), false, None);
        t.on_chunk(envoy, true, &mut Vec::new());
        assert!(
            !t.summary(0).connect_failure,
            "a 200 quoting the text is an answer"
        );
    }
}

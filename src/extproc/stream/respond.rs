//! The response phase of a stream, in one place: the served endpoint (fallbacks counted), the
//! headers epp adds (the conformance verifier's, the session token), the model server's answer
//! passed through chunk by chunk (usage read for metrics, the client-facing model name restored
//! when the request's model was rewritten), and the exchange recorded when it ends.
//!
//! Streaming (SSE) chunks are forwarded at once, so tokens reach the client as they are made.
//! A non-streaming body is forwarded at once too, unless the model name must be restored: then
//! it is held until its end so a name split across chunks is still replaced.
//!
//! For passive health it also notes when the headers and the first and last body chunks came,
//! the status, and whether the answer is the gateway's own connection-failure reply (Envoy's
//! `upstream connect error or disconnect/reset before headers`, response flag `UF`).

use super::{State, StreamMachine, SERVED_VERIFIER_HEADER};
use crate::director::{End, ResponseSummary};
use crate::extproc::wire;
use envoy_types::pb::envoy::service::ext_proc::v3::{HttpBody, HttpHeaders, ProcessingResponse};
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
    total_tokens: Option<u64>,
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
pub(crate) struct ResponseTracker {
    restore: Option<Restore>,
    streaming: bool,
    pub(crate) status: Option<u16>,
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
    pub(crate) fn new(
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
    pub(crate) fn upgraded(status: Option<u16>) -> Self {
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
    pub(crate) fn on_chunk(
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
    pub(crate) fn on_buffered(&mut self, body: &[u8]) -> Option<Vec<u8>> {
        self.stamp(body);
        self.summary.response_bytes += body.len();
        self.observe(body, true);
        self.restore
            .as_ref()
            .map(|r| r.apply(body))
            .filter(|b| b != body)
    }

    pub(crate) fn summary(&self, request_bytes: usize) -> ResponseSummary {
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
        s.total_tokens = u.total_tokens.or(s.total_tokens);
        let details = u
            .prompt_tokens_details
            .or(u.prompt_token_details)
            .or(u.input_tokens_details);
        s.cached_tokens = details.and_then(|d| d.cached_tokens).or(s.cached_tokens);
    }
}

impl StreamMachine {
    pub(super) fn on_response_headers(
        &mut self,
        h: HttpHeaders,
        out: &mut Vec<ProcessingResponse>,
    ) {
        let map = h.headers.as_ref();
        let status = wire::find_header(map, ":status").and_then(|s| s.parse().ok());
        if let Some(t) = &mut self.trace {
            t.response_started(status);
        }
        let routed = match &self.state {
            State::Routed(ex) => Some(&ex.routed),
            _ => None,
        };
        let rewrite = routed.and_then(|r| Some((r.rewritten_model.as_deref()?, r.model.as_str())));
        let stream = routed.is_some_and(|r| r.stream);
        let tracker = if self.meta.websocket && status == Some(101) {
            ResponseTracker::upgraded(status)
        } else {
            ResponseTracker::new(
                status,
                wire::find_header(map, "content-type"),
                stream,
                rewrite,
            )
        };
        if let (Some(served), Some(routed)) = (&self.served, routed) {
            if routed
                .destinations
                .first()
                .map(ToString::to_string)
                .as_deref()
                != Some(served.as_str())
            {
                tracing::debug!(served = %served, picked = %wire::destination_value(&routed.destinations), "gateway served a fallback endpoint");
                self.services.metrics.served_fallbacks.inc();
            }
        }
        let mut set = Vec::new();
        if self.services.config.load().served_verifier {
            let value = self
                .served
                .clone()
                .unwrap_or_else(|| "fail: missing destination endpoint served metadata".to_owned());
            set.push(wire::set_header(SERVED_VERIFIER_HEADER, &value));
        }
        for (name, value) in routed.iter().flat_map(|r| &r.client_headers) {
            set.push(wire::set_header(name, value));
        }
        self.response = Some(tracker);
        let common = (!set.is_empty()).then(|| wire::routing_common(set));
        out.push(wire::response_headers(common.map(|mut c| {
            c.clear_route_cache = false;
            c
        })));
        if h.end_of_stream || !self.modes.response.sends_body() {
            self.finish();
        }
    }

    pub(super) fn on_response_body(&mut self, b: HttpBody, out: &mut Vec<ProcessingResponse>) {
        if let State::Routed(ex) = &mut self.state {
            if !b.body.is_empty() {
                self.services.director.first_token(&mut ex.routed);
            }
        }
        let tracker = self.response.get_or_insert_with(ResponseTracker::default);
        if self.modes.response.duplex() {
            tracker.on_chunk(&b.body, b.end_of_stream, out);
        } else {
            match tracker.on_buffered(&b.body) {
                Some(body) => out.push(wire::replaced_body(body, Default::default(), true)),
                None => out.push(wire::response_body_continue()),
            }
        }
        if b.end_of_stream {
            self.attach_response_metadata(out);
            self.finish();
        }
    }

    /// The lifecycle plugins' dynamic metadata on the response's last body message, as
    /// upstream attaches it (an empty report attaches nothing).
    fn attach_response_metadata(&self, out: &mut [ProcessingResponse]) {
        let (State::Routed(_), Some(resp)) = (&self.state, self.response.as_ref()) else {
            return;
        };
        let md = self
            .services
            .director
            .response_metadata(&resp.summary(self.body_len));
        if let (false, Some(last)) = (md.is_empty(), out.last_mut()) {
            last.dynamic_metadata = Some(wire::numbers_metadata(&md));
        }
    }

    /// The response is complete: record it and release the endpoint.
    pub(super) fn finish(&mut self) {
        if let (State::Routed(ex), Some(resp)) = (&self.state, self.response.as_ref()) {
            let summary = resp.summary(self.body_len);
            self.services
                .director
                .finish(&ex.routed, End::Response(summary));
        }
        self.state = State::Done; // releases the endpoint
        self.trace = None; // ends the request's spans
    }
}

#[cfg(test)]
mod tests;

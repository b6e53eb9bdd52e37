//! The per-stream state machine: one ext_proc stream carries one HTTP request and its response.
//!
//! Input is each `ProcessingRequest` Envoy sends; output is the responses to send, in order.
//! Request side, duplex mode: headers are not answered until the routing decision; at the end of
//! the body (or at the request trailers) epp answers headers (destination header, `envoy.lb`
//! metadata, `clear_route_cache`), then the body in ≤ 62,000-byte chunks, then trailers.
//! Buffered mode: headers are answered at once and the decision rides on the body response.
//! Anything after the first end of stream is ignored (upstream bug #2988: a duplicate
//! end-of-stream chunk corrupted the body).
//!
//! Early decision (duplex mode, on by default): as soon as the model and the prompt prefix the
//! scorers read are known, epp routes, answers the headers and streams the rest of the body
//! through as it arrives ([`early`]). With flow control, the decision first waits for the
//! request's turn ([`crate::flowcontrol`]); the driver awaits it.
//!
//! Parsers (llm-d-router v0.10): the request's path chooses its parser
//! ([`crate::request::ParserSet`], from the configuration). A passthrough request (the fallback
//! parser, or Anthropic's `count_tokens`) and a WebSocket upgrade are routed at header time,
//! load-aware and without a prompt, and their body streams through unread; a path no parser
//! claims is refused (400) at header time. Steering headers are read under llm-d's names with
//! the GIE names as aliases ([`crate::request::headers`]).
//!
//! The destination is epp's alone: the routing mutation overwrites a client's
//! `x-gateway-destination-endpoint` and removes the other routing headers a client could
//! forge ([`wire::routing_common`]).

use super::response::ResponseTracker;
use super::status::{self, StreamError};
use super::wire;
use crate::director::{Director, Incoming, Routed};
use crate::metrics::ErrorLabels;
use crate::request::headers::Steering;
use crate::request::Handling;
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
};
use std::sync::Arc;
use std::time::Duration;

pub mod early;

/// Response header the conformance verifier writes.
pub const SERVED_VERIFIER_HEADER: &str = "x-conformance-test-served-endpoint";

/// Per-stream limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub body_timeout: Duration,
    /// Duplex mode: route once the model and the scored prompt prefix are known.
    pub early_decision: bool,
    /// ext_proc messages on the request side of one stream (headers, body chunks, trailers).
    pub max_request_messages: usize,
    /// Bytes of request header names and values.
    pub max_header_bytes: usize,
    /// Elements of a chat `messages` array.
    pub max_chat_messages: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 64 << 20,
            body_timeout: Duration::from_secs(60),
            early_decision: true,
            max_request_messages: 100_000,
            max_header_bytes: 64 << 10,
            max_chat_messages: 100_000,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the request headers.
    Start,
    /// Headers seen, collecting the body.
    Body,
    /// Routed; passing the response through.
    Routed,
    /// Response complete or rejected; nothing more to do.
    Done,
}

/// What the request headers said.
#[derive(Debug, Default)]
struct RequestMeta {
    path: String,
    /// The API the path's parser reads; `None` before the headers, for a passthrough request
    /// and a bodyless one.
    api: Option<crate::request::ApiKind>,
    /// `Prefer: if-available`.
    if_available: bool,
    has_request_id: bool,
    model_rewrite: Option<String>,
    test_selection: Option<String>,
    objective: Option<String>,
    subset: Option<Vec<String>>,
    session_token: Option<String>,
    /// The session id of the `session_id` affinity strategy (configured headers).
    session_id: Option<String>,
    content_length: Option<usize>,
    fairness_id: Option<String>,
    /// `x-llm-d-slo-ttft-ms` (or its alias `x-slo-ttft-ms`), milliseconds.
    slo_ttft_ms: Option<f64>,
}

pub struct StreamMachine {
    director: Arc<Director>,
    limits: Limits,
    request_duplex: bool,
    response_duplex: bool,
    /// Envoy will send the response body: its body mode is not NONE (assumed when Envoy does
    /// not say, since ending the stream early would stall a response that does come).
    response_body_expected: bool,
    phase: Phase,
    meta: RequestMeta,
    body: Vec<u8>,
    routed: Option<Routed>,
    response: Option<ResponseTracker>,
    /// `envoy.lb/x-gateway-destination-endpoint-served`, reported by gateways whose load
    /// balancer (`override_host`) may walk the fallback list.
    served: Option<String>,
    /// OpenTelemetry spans of this request (`None` when tracing is off).
    trace: Option<crate::telemetry::RequestTrace>,
    /// Request-side progress: the body scan, early decision, flow-control wait.
    req: early::RequestSide,
    /// Add every candidate's score to the routing metadata (`--emit-endpoint-scores`).
    emit_scores: bool,
}

impl StreamMachine {
    pub fn new(director: Arc<Director>, limits: Limits) -> Self {
        Self {
            director,
            limits,
            request_duplex: true,
            response_duplex: true,
            response_body_expected: true,
            phase: Phase::Start,
            meta: RequestMeta::default(),
            body: Vec::new(),
            routed: None,
            response: None,
            served: None,
            trace: None,
            req: early::RequestSide::default(),
            emit_scores: false,
        }
    }

    /// Adds `x-gateway-destination-endpoint-scores` to the routing metadata (upstream's
    /// `--emit-endpoint-scores`).
    pub fn emit_endpoint_scores(&mut self) {
        self.emit_scores = true;
    }

    /// Whether the routing decision is still pending (the body deadline applies).
    pub fn awaiting_decision(&self) -> bool {
        matches!(self.phase, Phase::Start | Phase::Body)
    }

    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// The gateway reset the stream before the exchange completed (client gone, gateway error).
    pub fn note_reset(&self) {
        self.director.metrics().stream_resets.inc();
        self.director
            .abandoned(self.routed.as_ref().filter(|_| self.response.is_none()));
    }

    /// The request body did not arrive in time.
    pub fn on_body_timeout(&mut self, out: &mut Vec<ProcessingResponse>) {
        self.fail(StreamError::BodyTimeout(self.limits.body_timeout), out);
    }

    /// Handles one message from Envoy, appending the responses to send.
    pub fn handle(&mut self, msg: ProcessingRequest, out: &mut Vec<ProcessingResponse>) {
        if let Some(pc) = &msg.protocol_config {
            self.request_duplex = pc.request_body_mode == BodySendMode::FullDuplexStreamed as i32;
            self.response_duplex = pc.response_body_mode == BodySendMode::FullDuplexStreamed as i32;
            self.response_body_expected = pc.response_body_mode != BodySendMode::None as i32;
        }
        let md = msg.metadata_context.as_ref();
        if matches!(msg.request, Some(Request::ResponseHeaders(_))) {
            self.served =
                wire::metadata_string(md, wire::LB_NAMESPACE, wire::SERVED_KEY).map(String::from);
        }
        let request_side = matches!(
            msg.request,
            Some(
                Request::RequestHeaders(_) | Request::RequestBody(_) | Request::RequestTrailers(_)
            )
        );
        if request_side && self.count_request_message(out) {
            return;
        }
        match msg.request {
            Some(Request::RequestHeaders(h)) => {
                self.meta.subset = wire::subset_hint(md);
                self.on_request_headers(h, out);
            }
            Some(Request::RequestBody(b)) => self.on_request_body(b, out),
            Some(Request::RequestTrailers(_)) => self.on_request_trailers(out),
            Some(Request::ResponseHeaders(h)) => self.on_response_headers(h, out),
            Some(Request::ResponseBody(b)) => self.on_response_body(b, out),
            Some(Request::ResponseTrailers(_)) => {
                out.push(wire::response_trailers());
                self.finish();
            }
            None => {}
        }
    }

    fn on_request_headers(&mut self, h: HttpHeaders, out: &mut Vec<ProcessingResponse>) {
        if self.phase != Phase::Start {
            return;
        }
        let map = h.headers.as_ref();
        let path = wire::find_header(map, ":path")
            .or_else(|| wire::find_header(map, "x-original-path"))
            .or_else(|| wire::find_header(map, "x-forwarded-path"));
        self.meta.path = path.unwrap_or("/v1/completions").to_owned();
        self.trace = crate::telemetry::RequestTrace::start(
            wire::find_header(map, "traceparent"),
            wire::find_header(map, "tracestate"),
        );
        self.meta.has_request_id = wire::find_header(map, "x-request-id").is_some();
        let steering = Steering::read(|k| wire::find_header(map, k), &self.meta.path);
        self.meta.model_rewrite = steering.model_rewrite;
        self.meta.if_available = steering.if_available;
        self.meta.test_selection =
            wire::find_header(map, "test-epp-endpoint-selection").map(String::from);
        self.meta.objective = steering.objective;
        self.meta.session_token =
            wire::find_header(map, crate::scheduling::scorer::SESSION_HEADER).map(String::from);
        self.meta.session_id = self.director.session_id(|h| wire::find_header(map, h));
        self.meta.content_length =
            wire::find_header(map, "content-length").and_then(|v| v.parse().ok());
        self.meta.fairness_id = steering.fairness_id;
        self.meta.slo_ttft_ms = steering.slo_ttft_ms;
        if let Err(e) = self.check_headers(map) {
            return self.fail(e, out);
        }
        self.phase = Phase::Body;
        if h.end_of_stream {
            return self.route_at_headers(false, out);
        }
        let handling = if steering.websocket {
            Ok(Handling::Passthrough)
        } else {
            self.director.runtime().parsers.handling(&self.meta.path)
        };
        match handling {
            Err(e) => self.fail(e.into(), out),
            Ok(Handling::Passthrough) => {
                self.req.raw = true;
                self.route_at_headers(true, out);
            }
            Ok(Handling::Parse(api)) => {
                self.meta.api = Some(api);
                if !self.request_duplex {
                    out.push(wire::request_headers(None, None));
                }
            }
        }
    }

    /// Routes before the body, load-aware and without a prompt: a bodyless request, or a
    /// `passthrough` one (its parser reads no body, or a WebSocket upgrade; admitted first, and
    /// its body then streams through unread).
    fn route_at_headers(&mut self, passthrough: bool, out: &mut Vec<ProcessingResponse>) {
        let mut inc = self.incoming(&[]);
        inc.if_available &= passthrough;
        match crate::telemetry::in_scope(self.trace.as_ref(), || {
            let rng = &mut rand::rng();
            if passthrough {
                self.director.route_passthrough(&inc, rng)
            } else {
                self.director.route_bodyless(&inc, rng)
            }
        }) {
            Ok(routed) => {
                let (common, md) = self.routing(&routed, None);
                out.push(wire::request_headers(Some(common), Some(md)));
                self.routed = Some(routed);
                self.phase = Phase::Routed;
            }
            Err(e) => self.fail(e.into(), out),
        }
    }

    /// The API the body is read as.
    fn api(&self) -> crate::request::ApiKind {
        self.meta
            .api
            .unwrap_or_else(|| crate::request::ApiKind::from_path(&self.meta.path))
    }

    fn on_request_body(&mut self, b: HttpBody, out: &mut Vec<ProcessingResponse>) {
        if self.req.raw {
            return self.forward_raw(b, out);
        }
        if self.request_open() {
            return self.forward_chunk(b, out);
        }
        if self.phase != Phase::Body || self.req.waiting() {
            return;
        }
        if let Err(e) = self.take_chunk(&b) {
            return self.fail(e, out);
        }
        self.body.extend_from_slice(&b.body);
        if b.end_of_stream {
            self.proceed(early::Pending::Whole { body_eos: true }, out);
        } else if !self.request_duplex {
            out.push(wire::request_body(None, None));
        } else {
            self.try_early(out);
        }
    }

    fn on_request_trailers(&mut self, out: &mut Vec<ProcessingResponse>) {
        if self.request_open() {
            self.close_request();
        } else if self.phase == Phase::Body && self.request_duplex && !self.req.waiting() {
            self.proceed(early::Pending::Whole { body_eos: false }, out);
        }
        if self.req.waiting() {
            return;
        }
        if self.phase != Phase::Done {
            out.push(wire::request_trailers());
        }
    }

    /// The body is complete: route and answer. `body_eos` is false when trailers end the body.
    fn route_whole(&mut self, body_eos: bool, out: &mut Vec<ProcessingResponse>) {
        let result = crate::telemetry::in_scope(self.trace.as_ref(), || {
            self.director
                .route(&self.incoming(&self.body), &mut rand::rng())
        });
        let routed = match result {
            Ok(r) => r,
            Err(e) => return self.fail(e.into(), out),
        };
        let new_body = routed.body.as_deref();
        let (mut common, md) = self.routing(&routed, new_body.map(<[u8]>::len));
        if self.request_duplex {
            out.push(wire::request_headers(Some(common), Some(md)));
            wire::streamed_body(new_body.unwrap_or(&self.body), body_eos, false, out);
        } else if let Some(b) = new_body {
            common.body_mutation = None;
            let mut r = wire::replaced_body(b.to_vec(), common, false);
            r.dynamic_metadata = Some(md);
            out.push(r);
        } else {
            out.push(wire::request_body(Some(common), Some(md)));
        }
        self.routed = Some(routed);
        self.phase = Phase::Routed;
    }

    fn incoming<'a>(&'a self, body: &'a [u8]) -> Incoming<'a> {
        Incoming {
            path: &self.meta.path,
            body,
            model_rewrite: self.meta.model_rewrite.as_deref(),
            subset: self.meta.subset.as_deref(),
            test_endpoint_selection: self.meta.test_selection.as_deref(),
            objective: self.meta.objective.as_deref(),
            session_token: self.meta.session_token.as_deref(),
            session_id: self.meta.session_id.as_deref(),
            api: self.meta.api,
            if_available: self.meta.if_available,
            slo_ttft_ms: self.meta.slo_ttft_ms,
        }
    }

    /// The routing mutation and metadata for a decision.
    fn routing(
        &self,
        routed: &Routed,
        new_len: Option<usize>,
    ) -> (
        envoy_types::pb::envoy::service::ext_proc::v3::CommonResponse,
        envoy_types::pb::google::protobuf::Struct,
    ) {
        let value = wire::destination_value(&routed.destinations);
        let mut set = vec![wire::set_header(wire::DESTINATION_HEADER, &value)];
        if let Some(len) = new_len {
            set.push(wire::set_header("content-length", &len.to_string()));
        }
        if !self.meta.has_request_id {
            set.push(wire::set_header("x-request-id", &request_id()));
        }
        let mut common = wire::request_routing(set);
        // The sidecar headers of a disaggregating handler: epp's value, or the client's removed.
        if let Some(m) = common.header_mutation.as_mut() {
            for (name, value) in &routed.headers {
                match value {
                    Some(v) => m.set_headers.push(wire::set_header(name, v)),
                    None => m.remove_headers.push((*name).to_owned()),
                }
            }
        }
        (
            common,
            if self.emit_scores {
                wire::destination_metadata_with_scores(&value, &routed.scores)
            } else {
                wire::destination_metadata(&value)
            },
        )
    }

    fn on_response_headers(&mut self, h: HttpHeaders, out: &mut Vec<ProcessingResponse>) {
        let map = h.headers.as_ref();
        let status = wire::find_header(map, ":status").and_then(|s| s.parse().ok());
        if let Some(t) = &mut self.trace {
            t.response_started(status);
        }
        let rewrite = self
            .routed
            .as_ref()
            .filter(|r| r.target_model != r.model)
            .map(|r| (r.target_model.as_str(), r.model.as_str()));
        let stream = self.routed.as_ref().is_some_and(|r| r.stream);
        self.response = Some(ResponseTracker::new(
            status,
            wire::find_header(map, "content-type"),
            stream,
            rewrite,
        ));
        if let (Some(served), Some(routed)) = (&self.served, &self.routed) {
            if routed
                .destinations
                .first()
                .map(ToString::to_string)
                .as_deref()
                != Some(served.as_str())
            {
                tracing::debug!(served = %served, picked = %wire::destination_value(&routed.destinations), "gateway served a fallback endpoint");
                self.director.metrics().served_fallbacks.inc();
            }
        }
        let mut set = Vec::new();
        if self.director.runtime().served_verifier {
            let value = self
                .served
                .clone()
                .unwrap_or_else(|| "fail: missing destination endpoint served metadata".to_owned());
            set.push(wire::set_header(SERVED_VERIFIER_HEADER, &value));
        }
        if let Some(token) = self
            .routed
            .as_ref()
            .and_then(|r| r.session_token.as_deref())
        {
            set.push(wire::set_header(
                crate::scheduling::scorer::SESSION_HEADER,
                token,
            ));
        }
        let common = (!set.is_empty()).then(|| wire::routing_common(set));
        out.push(wire::response_headers(common.map(|mut c| {
            c.clear_route_cache = false;
            c
        })));
        if h.end_of_stream || !self.response_body_expected {
            self.finish();
        }
    }

    fn on_response_body(&mut self, b: HttpBody, out: &mut Vec<ProcessingResponse>) {
        if let Some(routed) = self.routed.as_mut().filter(|_| !b.body.is_empty()) {
            routed.first_token();
        }
        let tracker = self.response.get_or_insert_with(ResponseTracker::default);
        if self.response_duplex {
            tracker.on_chunk(&b.body, b.end_of_stream, out);
        } else {
            match tracker.on_buffered(&b.body) {
                Some(body) => out.push(wire::replaced_body(body, Default::default(), true)),
                None => out.push(wire::response_body_continue()),
            }
        }
        if b.end_of_stream {
            self.finish();
        }
    }

    /// The response is complete: record it and release the endpoint.
    fn finish(&mut self) {
        if let (Some(routed), Some(resp)) = (self.routed.take(), self.response.as_ref()) {
            self.director
                .finish(&routed, &resp.summary(self.req.body_len));
        }
        self.trace = None; // ends the request's spans
        self.phase = Phase::Done;
    }

    fn fail(&mut self, err: StreamError, out: &mut Vec<ProcessingResponse>) {
        let code = err.code();
        if let Some(t) = &self.trace {
            t.fail(err.to_string());
        }
        tracing::debug!(error = %err, status = code.http_status(), "request rejected");
        let (model_name, target_model_name) = self.error_models();
        let labels = ErrorLabels {
            model_name,
            target_model_name,
            error_code: code.name().to_owned(),
        };
        self.director
            .metrics()
            .request_error_total
            .get_or_create(&labels)
            .inc();
        out.push(status::immediate(&err));
        self.phase = Phase::Done;
    }
}

impl StreamMachine {
    /// Model labels for an error: the requested and target model when the body names one.
    /// Re-parsing happens only on this failure path; a body never read (413, 408) has none.
    fn error_models(&self) -> (String, String) {
        match crate::request::parse(self.api(), &self.body, 0) {
            Ok(req) => {
                let target = self
                    .meta
                    .model_rewrite
                    .clone()
                    .filter(|m| !m.is_empty())
                    .unwrap_or_else(|| req.model.clone());
                (req.model, target)
            }
            Err(_) => (String::new(), String::new()),
        }
    }

    /// Whether the stream ended in the middle of an exchange: before the routing decision, or
    /// after it while a response was still due (started, or announced by a response body mode
    /// other than NONE). A gateway configured to send no response phases ends every stream
    /// after routing; that is not an interruption.
    pub fn interrupted(&self) -> bool {
        match self.phase {
            Phase::Start | Phase::Done => false,
            Phase::Body => true,
            Phase::Routed => self.response.is_some() || self.response_body_expected,
        }
    }
}

/// A random request id, as upstream generates when the gateway sent none.
fn request_id() -> String {
    let v: u128 = rand::random();
    let h = format!("{v:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

#[cfg(test)]
mod tests;

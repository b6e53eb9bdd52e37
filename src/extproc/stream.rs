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
//! The stream is a [`State`], and each message is one `match` on it: `Start` → (headers)
//! `Reading` → (whole body, or an early decision) → `Parked` while the render call
//! (`token-producer`'s `vllm` backend, [`super::render`]) and then flow control hold the
//! decision → `Routed` → (response end, or a rejection at any point) `Done`. Each state carries
//! what it needs (the body and its scan while reading, the parsed request while parked, the
//! decision while routed), so no flag can disagree with another. How Envoy sends each body is a
//! [`BodyMode`], read from its `protocol_config`.
//!
//! Early decision (duplex mode, on by default): as soon as the model and the prompt prefix the
//! scorers read are known, epp routes, answers the headers and streams the rest of the body
//! through as it arrives ([`early`]). With flow control, the decision first waits for the
//! request's turn ([`crate::director::flowcontrol`]); the driver awaits it. The body is parsed once
//! ([`crate::request::parse`] at its end, or the scan's early request) and the parsed request
//! is what routing, the flow-control ticket and error labels read.
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

use super::status::{self, StreamError};
use super::wire;
use crate::director::{Body, Director, End, Incoming, LiveConfig, Routed};
use crate::metrics::{ErrorLabels, Metrics};
use crate::request::headers::Steering;
use crate::request::scan::Scanner;
use crate::request::{Handling, LlmRequest};
use crate::scheduling::lifecycle::Headers;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
};
use respond::ResponseTracker;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) mod early;
mod mode;
mod respond;

use mode::Modes;

/// Response header the conformance verifier writes.
pub(crate) const SERVED_VERIFIER_HEADER: &str = "x-conformance-test-served-endpoint";

/// Per-stream limits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) max_body_bytes: usize,
    pub(crate) body_timeout: Duration,
    /// Duplex mode: route once the model and the scored prompt prefix are known.
    pub(crate) early_decision: bool,
    /// ext_proc messages on the request side of one stream (headers, body chunks, trailers).
    pub(crate) max_request_messages: usize,
    /// Bytes of request header names and values.
    pub(crate) max_header_bytes: usize,
    /// Elements of a chat `messages` array.
    pub(crate) max_chat_messages: usize,
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

/// What every stream of one server uses, handed over by `app`.
pub(crate) struct Services {
    /// Routes each request and records how it ended.
    pub(crate) director: Arc<Director>,
    /// The configuration in force: parsers by path, session-id headers, the served verifier.
    pub(crate) config: Arc<LiveConfig>,
    /// Stream resets, served fallbacks and errors are counted here.
    pub(crate) metrics: Arc<Metrics>,
    /// The render calls of `token-producer`'s `vllm` backend.
    pub(crate) render: super::render::RenderClient,
}

impl Services {
    /// The director and what its streams read beside it, from what `app` built.
    pub(crate) fn new(shared: &crate::director::Shared, director: Arc<Director>) -> Self {
        Self {
            director,
            config: Arc::clone(&shared.config),
            metrics: Arc::clone(&shared.metrics),
            render: Default::default(),
        }
    }
}

/// Where one stream's exchange is.
#[derive(Debug, Default)]
enum State {
    /// Waiting for the request headers.
    #[default]
    Start,
    /// Headers read, the body arriving; no decision yet.
    Reading(early::Reading),
    /// The decision waits for its flow-control turn.
    Parked(early::Parked),
    /// Routed: what is left of the request and the response pass through.
    Routed(Exchange),
    /// Response complete, or the request rejected; nothing more to do.
    Done,
}

/// A routed exchange.
#[derive(Debug)]
struct Exchange {
    routed: Routed,
    rest: Rest,
}

impl Exchange {
    /// The request ended after an early decision: `stream` is now known.
    fn close_request(&mut self) {
        if let Rest::Scanning(scanner) = &self.rest {
            if let Some(stream) = scanner.stream() {
                self.routed.stream = stream;
            }
            self.rest = Rest::Complete;
        }
    }
}

/// What is left of the request once it is routed.
#[derive(Debug)]
enum Rest {
    /// Nothing: the decision came at its end.
    Complete,
    /// Routed early: later chunks are scanned (limits, `stream`) and passed through.
    Scanning(Scanner),
    /// Routed at header time (passthrough, WebSocket): the body streams through unread and
    /// unlimited (a WebSocket session is long).
    Unread,
}

/// What the request headers said.
#[derive(Debug, Default)]
struct RequestMeta {
    path: String,
    /// A WebSocket upgrade (`Upgrade: websocket`, or a `/v1/realtime` path).
    websocket: bool,
    /// `Prefer: if-available`.
    if_available: bool,
    has_request_id: bool,
    model_rewrite: Option<String>,
    test_selection: Option<String>,
    objective: Option<String>,
    subset: Option<Vec<String>>,
    /// `x-session-token` as sent, and the endpoint name it encodes.
    session_token: Option<String>,
    session_endpoint: Option<String>,
    /// The headers the configured plugins read.
    captured: Headers,
    content_length: Option<usize>,
    fairness_id: Option<String>,
    /// `x-llm-d-slo-ttft-ms` (or its alias `x-slo-ttft-ms`), milliseconds.
    slo_ttft_ms: Option<f64>,
}

pub(crate) struct StreamMachine {
    services: Arc<Services>,
    limits: Limits,
    modes: Modes,
    state: State,
    meta: RequestMeta,
    /// The response, once its headers arrived.
    response: Option<ResponseTracker>,
    /// `envoy.lb/x-gateway-destination-endpoint-served`, reported by gateways whose load
    /// balancer (`override_host`) may walk the fallback list.
    served: Option<String>,
    /// OpenTelemetry spans of this request (`None` when tracing is off).
    trace: Option<crate::telemetry::RequestTrace>,
    /// Request-side messages and body bytes received.
    messages: usize,
    body_len: usize,
    /// Decisions wait for flow control (set once, by the server).
    flow: bool,
    /// Add every candidate's score to the routing metadata (`--emit-endpoint-scores`).
    emit_scores: bool,
    /// The request's seats in the gathering plugins' windows ([`Self::take_gather`]).
    seats: Vec<crate::scheduling::gather::Seat>,
}

impl StreamMachine {
    pub(crate) fn new(services: Arc<Services>, limits: Limits) -> Self {
        Self {
            services,
            limits,
            modes: Modes::default(),
            state: State::Start,
            meta: RequestMeta::default(),
            response: None,
            served: None,
            trace: None,
            messages: 0,
            body_len: 0,
            flow: false,
            emit_scores: false,
            seats: Vec::new(),
        }
    }

    /// Adds `x-gateway-destination-endpoint-scores` to the routing metadata (upstream's
    /// `--emit-endpoint-scores`).
    pub(crate) fn emit_endpoint_scores(&mut self) {
        self.emit_scores = true;
    }

    /// Makes routing decisions wait for a flow-control turn ([`Self::take_flow_ticket`]).
    pub(crate) fn use_flow_control(&mut self) {
        self.flow = true;
    }

    /// Whether the routing decision is still pending (the body deadline applies).
    pub(crate) fn awaiting_decision(&self) -> bool {
        matches!(
            self.state,
            State::Start | State::Reading(_) | State::Parked(_)
        )
    }

    pub(crate) fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Whether the stream ended in the middle of an exchange: before the routing decision, or
    /// after it while a response was still due (started, or announced by a response body mode
    /// other than NONE). A gateway configured to send no response phases ends every stream
    /// after routing; that is not an interruption.
    pub(crate) fn interrupted(&self) -> bool {
        match self.state {
            State::Start | State::Done => false,
            State::Reading(_) | State::Parked(_) => true,
            State::Routed(_) if self.upgraded() => false,
            State::Routed(_) => self.response.is_some() || self.modes.response.sends_body(),
        }
    }

    /// Whether the exchange is a WebSocket session the server accepted (101). Its HTTP stream
    /// has no end of stream: when either side closes the connection Envoy resets the stream
    /// (`upstream_reset_after_response_started{connection_termination}`, or a downstream
    /// disconnect), and the ext_proc stream ends with it. That end is the session's end.
    fn upgraded(&self) -> bool {
        self.meta.websocket && self.response.as_ref().and_then(|r| r.status) == Some(101)
    }

    /// The ext_proc stream is over without an interruption: an open WebSocket session ends
    /// here (recorded as a response, the endpoint released).
    pub(crate) fn closed(&mut self) {
        if matches!(self.state, State::Routed(_)) && self.upgraded() {
            self.finish();
        }
    }

    /// The gateway reset the stream before the exchange completed (client gone, gateway error).
    pub(crate) fn note_reset(&self) {
        self.services.metrics.stream_resets.inc();
        if let (State::Routed(ex), None) = (&self.state, &self.response) {
            self.services.director.finish(&ex.routed, End::Abandoned);
        }
    }

    /// The request body did not arrive in time.
    pub(crate) fn on_body_timeout(&mut self, out: &mut Vec<ProcessingResponse>) {
        self.fail(
            StreamError::BodyTimeout(self.limits.body_timeout),
            None,
            out,
        );
    }

    /// Handles one message from Envoy, appending the responses to send.
    pub(crate) fn handle(&mut self, msg: ProcessingRequest, out: &mut Vec<ProcessingResponse>) {
        if let Some(pc) = &msg.protocol_config {
            self.modes = Modes::from(pc);
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
        if !matches!(self.state, State::Start) {
            return;
        }
        let map = h.headers.as_ref();
        let websocket = self.read_headers(map);
        if let Err(e) = self.check_headers(map) {
            return self.fail(e, None, out);
        }
        if h.end_of_stream {
            return self.route_at_headers(Body::None, out);
        }
        let handling = if websocket {
            Ok(Handling::Passthrough)
        } else {
            self.services
                .config
                .load()
                .parsers
                .handling(&self.meta.path)
        };
        match handling {
            Err(e) => self.fail(e.into(), None, out),
            Ok(Handling::Passthrough) => self.route_at_headers(Body::Unread, out),
            Ok(Handling::Parse(api)) => {
                self.state = State::Reading(early::Reading::new(api));
                if !self.modes.request.duplex() {
                    out.push(wire::request_headers(None, None));
                }
            }
        }
    }

    /// Reads what the request headers say into [`RequestMeta`] and starts the request's trace;
    /// returns whether the request is a WebSocket upgrade.
    fn read_headers(
        &mut self,
        map: Option<&envoy_types::pb::envoy::config::core::v3::HeaderMap>,
    ) -> bool {
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
        let token = wire::find_header(map, wire::SESSION_HEADER);
        self.meta.session_endpoint = token.and_then(wire::decode_token);
        self.meta.session_token = token.map(String::from);
        let runtime = self.services.config.load();
        let names = runtime.scheduler.request_headers();
        self.meta.captured = Headers::capture(names, |h| wire::find_header(map, h));
        self.meta.content_length =
            wire::find_header(map, "content-length").and_then(|v| v.parse().ok());
        // An explicit fairness header wins; else `agent-identity`'s session header, if any.
        self.meta.fairness_id = steering
            .fairness_id
            .filter(|f| !f.is_empty())
            .or_else(|| runtime.agent_identity(|h| wire::find_header(map, h)));
        self.meta.slo_ttft_ms = steering.slo_ttft_ms;
        self.meta.websocket = steering.websocket;
        steering.websocket
    }

    /// Routes before the body, load-aware and without a prompt: a bodyless request
    /// ([`Body::None`]), or one whose body is not read ([`Body::Unread`]: its parser reads no
    /// body, or a WebSocket upgrade; admitted first, and its body then streams through).
    fn route_at_headers(&mut self, body: Body<'_>, out: &mut Vec<ProcessingResponse>) {
        let rest = match body {
            Body::Unread => Rest::Unread,
            _ => Rest::Complete,
        };
        let inc = Incoming {
            body,
            ..self.incoming()
        };
        let result = crate::telemetry::in_scope(self.trace.as_ref(), || {
            self.services.director.route(&inc, &mut rand::rng())
        });
        match result {
            Ok(routed) => {
                let (common, md) = self.routing(&routed, None);
                out.push(wire::request_headers(Some(common), Some(md)));
                self.state = State::Routed(Exchange { routed, rest });
            }
            Err(e) => self.fail(e.into(), None, out),
        }
    }

    fn on_request_body(&mut self, b: HttpBody, out: &mut Vec<ProcessingResponse>) {
        match self.state {
            State::Reading(_) => self.read_chunk(b, out),
            State::Routed(Exchange {
                rest: Rest::Scanning(_),
                ..
            }) => self.forward_chunk(b, out),
            State::Routed(Exchange {
                rest: Rest::Unread, ..
            }) => self.forward_unread(b, out),
            State::Routed(_) | State::Start | State::Parked(_) | State::Done => {}
        }
    }

    fn on_request_trailers(&mut self, out: &mut Vec<ProcessingResponse>) {
        match &mut self.state {
            State::Routed(ex) => ex.close_request(),
            State::Reading(_) if self.modes.request.duplex() => self.body_complete(false, out),
            State::Start | State::Reading(_) | State::Parked(_) | State::Done => {}
        }
        match self.state {
            // Answered once flow control admits the decision.
            State::Parked(_) | State::Done => {}
            _ => out.push(wire::request_trailers()),
        }
    }

    /// The routing decision on the parsed request; `bytes` is the body it was parsed from.
    fn route_parsed(
        &self,
        request: &LlmRequest,
        bytes: &[u8],
        started: Option<Instant>,
    ) -> Result<Routed, StreamError> {
        let inc = Incoming {
            body: Body::Parsed { request, bytes },
            started,
            ..self.incoming()
        };
        crate::telemetry::in_scope(self.trace.as_ref(), || {
            self.services.director.route(&inc, &mut rand::rng())
        })
        .map_err(StreamError::from)
    }

    /// The body is complete and routed: answer with the decision. `body_eos` is false when
    /// trailers ended the body.
    fn answer_whole(
        &mut self,
        routed: Routed,
        body: &[u8],
        body_eos: bool,
        out: &mut Vec<ProcessingResponse>,
    ) {
        let new_body = routed.body.as_deref();
        let (mut common, md) = self.routing(&routed, new_body.map(<[u8]>::len));
        if self.modes.request.duplex() {
            out.push(wire::request_headers(Some(common), Some(md)));
            wire::streamed_body(new_body.unwrap_or(body), body_eos, false, out);
        } else if let Some(b) = new_body {
            common.body_mutation = None;
            let mut r = wire::replaced_body(b.to_vec(), common, false);
            r.dynamic_metadata = Some(md);
            out.push(r);
        } else {
            out.push(wire::request_body(Some(common), Some(md)));
        }
        self.state = State::Routed(Exchange {
            routed,
            rest: Rest::Complete,
        });
    }

    /// The request as the director sees it, without its body.
    fn incoming(&self) -> Incoming<'_> {
        Incoming {
            body: Body::None,
            started: None,
            model_rewrite: self.meta.model_rewrite.as_deref(),
            subset: self.meta.subset.as_deref(),
            test_endpoint_selection: self.meta.test_selection.as_deref(),
            objective: self.meta.objective.as_deref(),
            session_token: self.meta.session_token.as_deref(),
            session_endpoint: self.meta.session_endpoint.as_deref(),
            headers: &self.meta.captured,
            fairness_id: self.meta.fairness_id.as_deref(),
            if_available: self.meta.if_available,
            slo_ttft_ms: self.meta.slo_ttft_ms,
            seats: &self.seats,
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

    /// Rejects the request; `request` names the models the error is counted against.
    fn fail(
        &mut self,
        err: StreamError,
        request: Option<&LlmRequest>,
        out: &mut Vec<ProcessingResponse>,
    ) {
        let code = err.code();
        if let Some(t) = &self.trace {
            t.fail(err.to_string());
        }
        tracing::debug!(error = %err, status = code.http_status(), "request rejected");
        let (model_name, target_model_name) = self.error_models(request);
        let metrics = &self.services.metrics;
        let labels = ErrorLabels {
            model_name: metrics.model(&model_name),
            target_model_name: metrics.model(&target_model_name),
            error_code: code.label(),
        };
        metrics.request_error_total.get_or_create(&labels).inc();
        out.push(status::immediate(&err));
        self.state = State::Done;
    }

    /// Model labels for an error: the requested model and the rewrite header's target (else
    /// the requested model), when the body was parsed; empty otherwise (413, 408, a body not
    /// JSON, a request routed without reading its body).
    fn error_models(&self, request: Option<&LlmRequest>) -> (String, String) {
        let Some(req) = request else {
            return (String::new(), String::new());
        };
        let target = self
            .meta
            .model_rewrite
            .clone()
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| req.model.clone());
        (req.model.clone(), target)
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

//! The request side of a stream beyond the headers: reading the body (limits, scan), the
//! decision (whole body, or early), the waits for the render call, for flow control and for
//! the gathering plugins' windows (the driver in `crate::extproc` makes each once:
//! [`StreamMachine::take_render_job`], [`StreamMachine::take_flow_ticket`], then
//! [`StreamMachine::take_gather`]), and passing the rest of the body through after an early
//! decision or unread.
//!
//! Why early: upstream buffers the whole body before deciding, which adds the body's transfer
//! time to TTFT (over a second for a 220 KB prompt, upstream #2928). The decision reads only the
//! model and a bounded prompt prefix, so in duplex mode epp routes once the scan
//! ([`crate::request::scan`]) has them and streams every later chunk through unchanged.
//!
//! Consequences, by design: a body that turns out invalid after the decision (bad JSON after
//! the prefix, a duplicate field) is forwarded and the model server answers the error; a
//! `cache_salt`, chat `tools` or responses `instructions` arriving after the decision point
//! are not part of the decision (see the scan's documentation). A model rewrite patches the
//! part already received (the model is always in it) and the content length is corrected.
//!
//! The body is parsed once: at its end by [`crate::request::parse`] (or, early, by the scan),
//! and the parsed request is what the decision, the flow-control ticket and error labels read.

use super::{Exchange, Rest, State, StreamMachine};
use crate::director::flowcontrol::{FlowError, Ticket};
use crate::director::{Body, Incoming};
use crate::extproc::render::RenderJob;
use crate::extproc::status::StreamError;
use crate::extproc::wire;
use crate::request::render::{RenderError, RenderParams};
use crate::request::scan::Scanner;
use crate::request::{ApiKind, LlmRequest, Prompt, RequestError};
use envoy_types::pb::envoy::config::core::v3::HeaderMap;
use envoy_types::pb::envoy::service::ext_proc::v3::{HttpBody, ProcessingResponse};
use std::sync::Arc;
use std::time::Instant;

/// The flow-control fairness key's default (upstream's name).
pub(crate) use crate::director::flowcontrol::DEFAULT_FLOW;

/// The body arriving, before the decision.
#[derive(Debug)]
pub(super) struct Reading {
    /// The API the path's parser reads.
    api: ApiKind,
    body: Vec<u8>,
    scanner: Scanner,
}

impl Reading {
    pub(super) fn new(api: ApiKind) -> Self {
        Self {
            api,
            body: Vec::new(),
            scanner: Scanner::default(),
        }
    }
}

/// A decision waiting for its flow-control turn.
#[derive(Debug)]
pub(super) struct Parked {
    reading: Reading,
    decision: Decision,
    /// The ticket was handed to the driver (one per request).
    ticketed: bool,
    /// The render call the decision waits for first (`token-producer`'s `vllm` backend),
    /// until the driver takes it.
    render: Option<Arc<RenderParams>>,
    /// The request still joins the gathering plugins' windows (after render and flow
    /// control), and then waits for them ([`StreamMachine::take_gather`]).
    gather: bool,
    /// Flow control admitted the decision.
    admitted: bool,
}

/// What a decision rides on.
#[derive(Debug)]
enum Decision {
    /// The whole body, parsed once; `body_eos` is false when trailers ended it.
    Whole {
        request: Result<LlmRequest, RequestError>,
        body_eos: bool,
        /// When the body was complete (the decision's latency counts from it).
        read_at: Instant,
    },
    /// The part of the body received so far, as the scan read it.
    Early(LlmRequest),
}

impl Decision {
    /// When the whole body was in (the decision's latency counts from it).
    fn read_at(&self) -> Option<Instant> {
        match self {
            Self::Whole { read_at, .. } => Some(*read_at),
            Self::Early(_) => None,
        }
    }

    fn request(&self) -> Option<&LlmRequest> {
        match self {
            Self::Whole { request, .. } => request.as_ref().ok(),
            Self::Early(req) => Some(req),
        }
    }
}

impl StreamMachine {
    /// Counts a request-side message; fails the stream past the limit (while the request is
    /// still arriving). Returns whether the stream failed.
    pub(super) fn count_request_message(&mut self, out: &mut Vec<ProcessingResponse>) -> bool {
        self.messages += 1;
        let arriving = match &self.state {
            State::Start | State::Reading(_) | State::Parked(_) => true,
            State::Routed(ex) => matches!(ex.rest, Rest::Scanning(_)),
            State::Done => false,
        };
        if arriving && self.messages > self.limits.max_request_messages {
            let limit = self.limits.max_request_messages;
            self.fail(StreamError::TooManyMessages { limit }, None, out);
            return true;
        }
        false
    }

    /// Header bytes (names and values) within the limit, and a declared body length within the
    /// body limit (refused before any byte of the body, so never after an early decision).
    pub(super) fn check_headers(&self, map: Option<&HeaderMap>) -> Result<(), StreamError> {
        let bytes: usize = map.map_or(0, |m| {
            m.headers
                .iter()
                .map(|h| h.key.len() + wire::header_value(h).len())
                .sum()
        });
        if bytes > self.limits.max_header_bytes {
            return Err(StreamError::HeadersTooLarge {
                limit: self.limits.max_header_bytes,
            });
        }
        if self
            .meta
            .content_length
            .is_some_and(|len| len > self.limits.max_body_bytes)
        {
            return Err(StreamError::BodyTooLarge {
                limit: self.limits.max_body_bytes,
            });
        }
        Ok(())
    }

    /// A body chunk before the decision: limits and scan, then the decision when the body is
    /// complete or (duplex) the scan has what an early decision reads.
    pub(super) fn read_chunk(&mut self, b: HttpBody, out: &mut Vec<ProcessingResponse>) {
        let State::Reading(r) = &mut self.state else {
            return;
        };
        let taken = take_chunk(&self.limits, &mut self.body_len, &mut r.scanner, &b.body);
        if let Err(e) = taken {
            return self.fail(e, None, out);
        }
        let eos = b.end_of_stream;
        if r.body.is_empty() {
            // The first chunk's buffer becomes the body: no copy (a whole body in one chunk is
            // never copied). Not reserved to the declared length: that is the client's claim.
            r.body = b.body;
        } else {
            r.body.extend_from_slice(&b.body);
        }
        if eos {
            self.body_complete(true, out);
        } else if !self.modes.request.duplex() {
            out.push(wire::request_body(None, None));
        } else {
            self.try_early(out);
        }
    }

    /// The body is complete: parse it (once) and decide. `body_eos` is false when trailers
    /// end the body.
    pub(super) fn body_complete(&mut self, body_eos: bool, out: &mut Vec<ProcessingResponse>) {
        let State::Reading(r) = &self.state else {
            return;
        };
        let cap = self.services.director.prompt_cap();
        let request = crate::telemetry::in_scope(self.trace.as_ref(), || {
            let _span = crate::telemetry::child("parse");
            let parsed = crate::request::parse(r.api, &r.body, cap);
            if let Ok(req) = &parsed {
                crate::telemetry::annotate(|| {
                    vec![
                        opentelemetry::KeyValue::new("epp.model", req.model.clone()),
                        opentelemetry::KeyValue::new("epp.stream", req.stream),
                    ]
                });
            }
            parsed
        });
        let decision = Decision::Whole {
            request,
            body_eos,
            read_at: Instant::now(),
        };
        self.decide(decision, out);
    }

    /// Routes early when the scan has what the decision reads (duplex mode only).
    fn try_early(&mut self, out: &mut Vec<ProcessingResponse>) {
        let State::Reading(r) = &self.state else {
            return;
        };
        if !self.limits.early_decision || !self.modes.request.duplex() {
            return;
        }
        let Some(cap) = self.services.director.early_prompt_bytes(r.api) else {
            return;
        };
        if let Some(req) = r.scanner.early_request(r.api, &r.body, cap) {
            self.decide(Decision::Early(req), out);
        }
    }

    /// Routes now, or parks the decision until flow control admits the request.
    fn decide(&mut self, decision: Decision, out: &mut Vec<ProcessingResponse>) {
        let reading = match std::mem::take(&mut self.state) {
            State::Reading(r) => r,
            other => {
                self.state = other;
                return;
            }
        };
        let render = self.render_for(&decision);
        let gather = decision.request().is_some() && self.services.director.gathers();
        if self.flow || render.is_some() || gather {
            self.state = State::Parked(Parked {
                reading,
                decision,
                ticketed: false,
                render,
                gather,
                admitted: false,
            });
            return;
        }
        let started = decision.read_at();
        self.route_decision(reading, decision, started, out);
    }

    /// The renderer a decision waits for: the configuration's, for a whole, parsed request of
    /// an API it renders whose prompt is text.
    fn render_for(&self, decision: &Decision) -> Option<Arc<RenderParams>> {
        let Decision::Whole {
            request: Ok(req), ..
        } = decision
        else {
            return None;
        };
        if !RenderParams::renders(req.api) || !matches!(req.prompt, Prompt::Text(_)) {
            return None;
        }
        self.services.config.load().render.clone()
    }

    /// The render call a parked decision waits for, once.
    pub(crate) fn take_render_job(&mut self) -> Option<RenderJob> {
        let State::Parked(p) = &mut self.state else {
            return None;
        };
        let params = p.render.take()?;
        let api = p.decision.request()?.api;
        Some(RenderJob {
            client: self.services.render.clone(),
            payload: params.payload(&p.reading.body),
            params,
            api,
        })
    }

    /// The render call's answer: the prompt becomes its token ids (a failure leaves the prompt
    /// to the in-process tokenizer, counted and logged); then the decision goes on (to flow
    /// control, or routed now).
    pub(crate) fn on_rendered(
        &mut self,
        result: Result<Vec<u32>, RenderError>,
        out: &mut Vec<ProcessingResponse>,
    ) {
        let mut parked = match std::mem::take(&mut self.state) {
            State::Parked(p) => p,
            other => {
                self.state = other;
                return;
            }
        };
        let outcome = match result {
            Ok(ids) => {
                if let Decision::Whole {
                    request: Ok(req), ..
                } = &mut parked.decision
                {
                    req.prompt = Prompt::Tokens(ids);
                }
                crate::metrics::Outcome::success
            }
            Err(e) => {
                self.services.render.log_failure(&e);
                crate::metrics::Outcome::failure
            }
        };
        self.services
            .metrics
            .renders
            .get_or_create(&crate::metrics::OutcomeLabels { outcome })
            .inc();
        if self.flow || parked.gather {
            self.state = State::Parked(parked);
            return;
        }
        let started = parked.decision.read_at();
        self.resume(parked, started, out);
    }

    /// Joins a parked decision to the gathering plugins' windows, once it is rendered and
    /// admitted: when the driver may route it (the latest seat's `until`, or now).
    pub(crate) fn take_gather(&mut self) -> Option<tokio::time::Instant> {
        let State::Parked(p) = &self.state else {
            return None;
        };
        if !p.gather || p.render.is_some() || (self.flow && !p.admitted) {
            return None;
        }
        let State::Parked(mut p) = std::mem::take(&mut self.state) else {
            return None;
        };
        p.gather = false;
        let seats = match p.decision.request() {
            Some(request) => {
                let inc = Incoming {
                    body: Body::Parsed {
                        request,
                        bytes: &p.reading.body,
                    },
                    ..self.incoming()
                };
                self.services.director.gather(&inc)
            }
            None => Vec::new(),
        };
        self.state = State::Parked(p);
        let until = seats.iter().map(|s| s.until).max();
        self.seats = seats;
        Some(until.map_or_else(tokio::time::Instant::now, tokio::time::Instant::from_std))
    }

    /// The windows closed: the parked decision is routed with its seats.
    pub(crate) fn on_gathered(&mut self, out: &mut Vec<ProcessingResponse>) {
        let parked = match std::mem::take(&mut self.state) {
            State::Parked(p) => p,
            other => {
                self.state = other;
                return;
            }
        };
        let started = parked.decision.read_at().filter(|_| !self.flow);
        self.resume(parked, started, out);
    }

    /// A parked decision goes on: routed, and trailers that ended the body answered after it.
    fn resume(&mut self, p: Parked, started: Option<Instant>, out: &mut Vec<ProcessingResponse>) {
        let trailers = matches!(
            p.decision,
            Decision::Whole {
                body_eos: false,
                ..
            }
        );
        self.route_decision(p.reading, p.decision, started, out);
        if trailers && !self.is_done() {
            out.push(wire::request_trailers());
        }
    }

    /// The routing decision, and the answer that carries it.
    fn route_decision(
        &mut self,
        reading: Reading,
        decision: Decision,
        started: Option<Instant>,
        out: &mut Vec<ProcessingResponse>,
    ) {
        match decision {
            Decision::Whole {
                request: Err(e), ..
            } => self.fail(e.into(), None, out),
            Decision::Whole {
                request: Ok(req),
                body_eos,
                ..
            } => match self.route_parsed(&req, &reading.body, started) {
                Ok(routed) => self.answer_whole(routed, &reading.body, body_eos, out),
                Err(e) => self.fail(e, Some(&req), out),
            },
            Decision::Early(req) => self.route_early(reading, req, out),
        }
    }

    /// Routes on the part of the body received so far; the rest streams through.
    fn route_early(
        &mut self,
        reading: Reading,
        req: LlmRequest,
        out: &mut Vec<ProcessingResponse>,
    ) {
        let body = &reading.body;
        crate::telemetry::in_scope(self.trace.as_ref(), || {
            crate::telemetry::parsed_early(&req.model, req.stream, body.len());
        });
        let routed = match self.route_parsed(&req, body, Some(Instant::now())) {
            Ok(r) => r,
            Err(e) => return self.fail(e, Some(&req), out),
        };
        let new_len = match (&routed.body, self.meta.content_length) {
            (Some(b), Some(len)) => Some((len + b.len()).saturating_sub(body.len())),
            _ => None,
        };
        let (common, md) = self.routing(&routed, new_len);
        out.push(wire::request_headers(Some(common), Some(md)));
        wire::streamed_body(routed.body.as_deref().unwrap_or(body), false, false, out);
        self.state = State::Routed(Exchange {
            routed,
            rest: Rest::Scanning(reading.scanner),
        });
    }

    /// The flow-control ticket of a parked decision, once.
    pub(crate) fn take_flow_ticket(&mut self) -> Option<Ticket> {
        let State::Parked(p) = &mut self.state else {
            return None;
        };
        if !self.flow || p.ticketed || p.render.is_some() {
            return None;
        }
        p.ticketed = true;
        let r = &p.reading;
        // A body that failed to parse still names its model to the scan, if it does.
        let model = match p.decision.request() {
            Some(req) => Some(req.model.clone()),
            None => r.scanner.early_request(r.api, &r.body, 0).map(|r| r.model),
        };
        let priority = self.services.director.priority(
            self.meta.objective.as_deref(),
            model.as_deref().unwrap_or(""),
        );
        let fairness_id = self
            .meta
            .fairness_id
            .clone()
            .filter(|f| !f.is_empty())
            .unwrap_or_else(|| DEFAULT_FLOW.to_owned());
        let bytes = self.meta.content_length.unwrap_or(self.body_len) as u64;
        let slo_deadline = self
            .meta
            .slo_ttft_ms
            .filter(|ms| ms.is_finite() && *ms >= 0.0)
            .map(|ms| {
                tokio::time::Instant::now() + std::time::Duration::from_secs_f64(ms.min(1e12) / 1e3)
            });
        Some(Ticket {
            priority,
            fairness_id,
            bytes,
            model_name: model.unwrap_or_default(),
            slo_deadline,
        })
    }

    /// Flow control's answer for the parked decision.
    pub(crate) fn on_admission(
        &mut self,
        result: Result<(), FlowError>,
        out: &mut Vec<ProcessingResponse>,
    ) {
        let parked = match std::mem::take(&mut self.state) {
            State::Parked(p) => Some(p),
            other => {
                self.state = other;
                None
            }
        };
        match (result, parked) {
            (Err(e), p) => {
                let request = p.as_ref().and_then(|p| p.decision.request());
                self.fail(StreamError::Flow(e), request, out);
            }
            (Ok(()), None) => {}
            (Ok(()), Some(mut p)) if p.gather => {
                p.admitted = true;
                self.state = State::Parked(p);
            }
            (Ok(()), Some(p)) => self.resume(p, None, out),
        }
    }

    /// A body chunk after an early decision: checked, scanned and passed through.
    pub(super) fn forward_chunk(&mut self, b: HttpBody, out: &mut Vec<ProcessingResponse>) {
        let State::Routed(ex) = &mut self.state else {
            return;
        };
        let Rest::Scanning(scanner) = &mut ex.rest else {
            return;
        };
        if let Err(e) = take_chunk(&self.limits, &mut self.body_len, scanner, &b.body) {
            return self.fail(e, None, out);
        }
        let eos = b.end_of_stream;
        wire::streamed_request_chunk(b.body, eos, out);
        if eos {
            ex.close_request();
        }
    }

    /// A body chunk of a request routed at header time: passed through as it is.
    pub(super) fn forward_unread(&mut self, b: HttpBody, out: &mut Vec<ProcessingResponse>) {
        self.body_len += b.body.len();
        if self.modes.request.duplex() {
            wire::streamed_request_chunk(b.body, b.end_of_stream, out);
        } else {
            out.push(wire::request_body(None, None));
        }
    }
}

/// Takes a body chunk before the request ends: the body limit, then the scan and its limits.
fn take_chunk(
    limits: &super::Limits,
    body_len: &mut usize,
    scanner: &mut Scanner,
    chunk: &[u8],
) -> Result<(), StreamError> {
    if *body_len + chunk.len() > limits.max_body_bytes {
        return Err(StreamError::BodyTooLarge {
            limit: limits.max_body_bytes,
        });
    }
    *body_len += chunk.len();
    scanner.feed(chunk);
    if scanner.too_deep() {
        return Err(RequestError::TooDeep {
            limit: crate::request::MAX_DEPTH,
        }
        .into());
    }
    if scanner.messages_seen() > limits.max_chat_messages {
        return Err(RequestError::TooManyMessages {
            limit: limits.max_chat_messages,
        }
        .into());
    }
    Ok(())
}

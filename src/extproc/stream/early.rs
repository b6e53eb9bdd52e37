//! The request side of a stream beyond the headers: the body scan (limits, early decision),
//! the wait for flow control, and passing the rest of the body through after an early decision.
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

use super::{early, Phase, StreamMachine};
use crate::extproc::status::StreamError;
use crate::extproc::wire;
use crate::flowcontrol::{FlowError, Ticket};
use crate::request::scan::Scanner;
use crate::request::{LlmRequest, RequestError};
use envoy_types::pb::envoy::config::core::v3::HeaderMap;
use envoy_types::pb::envoy::service::ext_proc::v3::{HttpBody, ProcessingResponse};
use std::time::Instant;

/// The flow-control fairness key header (its GIE name; llm-d's `x-llm-d-inference-fairness-id`
/// wins, [`crate::request::headers::FAIRNESS_ID`]) and its default (upstream's names).
pub const FAIRNESS_HEADER: &str = "x-gateway-inference-fairness-id";
pub const DEFAULT_FLOW: &str = "default-flow";

/// A decision waiting for its flow-control turn.
#[derive(Debug)]
pub(super) enum Pending {
    /// The whole body is in; `body_eos` as for the decision.
    Whole { body_eos: bool },
    /// Early: decided on the scanned part.
    Early(LlmRequest),
}

/// Request-side progress of one stream.
#[derive(Debug, Default)]
pub struct RequestSide {
    scanner: Scanner,
    /// Request body bytes received.
    pub(super) body_len: usize,
    messages: usize,
    /// Routed early: body chunks still arrive and are passed through.
    open: bool,
    /// Routed at header time (passthrough, WebSocket): the body streams through unread and
    /// unlimited (a WebSocket session is long).
    pub(super) raw: bool,
    /// Decisions wait for flow control.
    pub(super) flow: bool,
    pending: Option<Pending>,
    ticket_taken: bool,
    admitted: bool,
}

impl StreamMachine {
    /// Makes routing decisions wait for a flow-control turn ([`Self::take_flow_ticket`]).
    pub fn use_flow_control(&mut self) {
        self.req.flow = true;
    }

    /// Counts a request-side message; fails the stream past the limit (while the request is
    /// still arriving). Returns whether the stream failed.
    pub(super) fn count_request_message(&mut self, out: &mut Vec<ProcessingResponse>) -> bool {
        self.req.messages += 1;
        let arriving = matches!(self.phase, Phase::Start | Phase::Body) || self.req.open;
        let arriving = arriving && !self.req.raw;
        if arriving && self.req.messages > self.limits.max_request_messages {
            self.fail(
                StreamError::TooManyMessages {
                    limit: self.limits.max_request_messages,
                },
                out,
            );
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

    /// Takes a body chunk before the decision: limits, scan, then an early decision if due.
    /// Returns `Err` when a limit refused it.
    pub(super) fn take_chunk(&mut self, b: &HttpBody) -> Result<(), StreamError> {
        if self.req.body_len + b.body.len() > self.limits.max_body_bytes {
            return Err(StreamError::BodyTooLarge {
                limit: self.limits.max_body_bytes,
            });
        }
        self.req.body_len += b.body.len();
        self.req.scanner.feed(&b.body);
        if self.req.scanner.too_deep() {
            return Err(RequestError::TooDeep {
                limit: crate::request::MAX_DEPTH,
            }
            .into());
        }
        if self.req.scanner.messages_seen() > self.limits.max_chat_messages {
            return Err(RequestError::TooManyMessages {
                limit: self.limits.max_chat_messages,
            }
            .into());
        }
        Ok(())
    }

    /// Routes early when the scan has what the decision reads (duplex mode only).
    pub(super) fn try_early(&mut self, out: &mut Vec<ProcessingResponse>) {
        if !self.limits.early_decision || !self.request_duplex || self.req.pending.is_some() {
            return;
        }
        let api = self.api();
        let Some(cap) = self.director.early_prompt_bytes(api) else {
            return;
        };
        if let Some(req) = self.req.scanner.early_request(api, &self.body, cap) {
            self.proceed(Pending::Early(req), out);
        }
    }

    /// Routes now, or parks the decision until flow control admits the request.
    pub(super) fn proceed(&mut self, pending: Pending, out: &mut Vec<ProcessingResponse>) {
        if self.req.flow && !self.req.admitted {
            self.req.pending = Some(pending);
            return;
        }
        match pending {
            Pending::Whole { body_eos } => self.route_whole(body_eos, out),
            Pending::Early(req) => self.route_early(req, out),
        }
    }

    /// The flow-control ticket of a parked decision, once.
    pub fn take_flow_ticket(&mut self) -> Option<Ticket> {
        let pending = self
            .req
            .pending
            .as_ref()
            .filter(|_| !self.req.ticket_taken && self.phase == Phase::Body)?;
        self.req.ticket_taken = true;
        let model = match pending {
            Pending::Early(req) => Some(req.model.clone()),
            Pending::Whole { .. } => self.whole_body_model(),
        };
        let priority = self.director.priority(
            self.meta.objective.as_deref(),
            model.as_deref().unwrap_or(""),
        );
        let fairness_id = self
            .meta
            .fairness_id
            .clone()
            .filter(|f| !f.is_empty())
            .unwrap_or_else(|| DEFAULT_FLOW.to_owned());
        let bytes = self.meta.content_length.unwrap_or(self.req.body_len) as u64;
        Some(Ticket {
            priority,
            fairness_id,
            bytes,
            model_name: model.unwrap_or_default(),
        })
    }

    fn whole_body_model(&self) -> Option<String> {
        let api = self.api();
        match self.req.scanner.early_request(api, &self.body, 0) {
            Some(r) => Some(r.model),
            None => crate::request::parse(api, &self.body, 0)
                .ok()
                .map(|r| r.model),
        }
    }

    /// Flow control's answer for the parked decision.
    pub fn on_admission(
        &mut self,
        result: Result<(), FlowError>,
        out: &mut Vec<ProcessingResponse>,
    ) {
        match result {
            Err(e) => self.fail(StreamError::Flow(e), out),
            Ok(()) => {
                self.req.admitted = true;
                let trailers = matches!(self.req.pending, Some(Pending::Whole { body_eos: false }));
                if let Some(p) = self.req.pending.take() {
                    self.proceed(p, out);
                }
                if trailers && self.phase != Phase::Done {
                    out.push(wire::request_trailers());
                }
            }
        }
    }

    /// Routes on the part of the body received so far; the rest streams through.
    fn route_early(&mut self, req: LlmRequest, out: &mut Vec<ProcessingResponse>) {
        let started = Instant::now();
        let result = crate::telemetry::in_scope(self.trace.as_ref(), || {
            crate::telemetry::parsed_early(&req.model, req.stream, self.body.len());
            self.director
                .route_parsed(&self.incoming(&self.body), req, started, &mut rand::rng())
        });
        let routed = match result {
            Ok(r) => r,
            Err(e) => return self.fail(e.into(), out),
        };
        let new_len = match (&routed.body, self.meta.content_length) {
            (Some(b), Some(len)) => Some((len + b.len()).saturating_sub(self.body.len())),
            _ => None,
        };
        let (common, md) = self.routing(&routed, new_len);
        out.push(wire::request_headers(Some(common), Some(md)));
        wire::streamed_body(
            routed.body.as_deref().unwrap_or(&self.body),
            false,
            false,
            out,
        );
        self.routed = Some(routed);
        self.phase = Phase::Routed;
        self.req.open = true;
        self.body = Vec::new();
    }

    /// Whether body chunks still arrive after an early decision.
    pub(super) fn request_open(&self) -> bool {
        self.phase == Phase::Routed && self.req.open
    }

    /// A body chunk after an early decision: checked, scanned and passed through.
    pub(super) fn forward_chunk(&mut self, b: HttpBody, out: &mut Vec<ProcessingResponse>) {
        if let Err(e) = self.take_chunk(&b) {
            return self.fail(e, out);
        }
        wire::streamed_body(&b.body, b.end_of_stream, false, out);
        if b.end_of_stream {
            self.close_request();
        }
    }

    /// A body chunk of a request routed at header time: passed through as it is.
    pub(super) fn forward_raw(&mut self, b: HttpBody, out: &mut Vec<ProcessingResponse>) {
        if self.phase != Phase::Routed {
            return;
        }
        self.req.body_len += b.body.len();
        if self.request_duplex {
            wire::streamed_body(&b.body, b.end_of_stream, false, out);
        } else {
            out.push(wire::request_body(None, None));
        }
    }

    /// The request ended after an early decision: `stream` is now known.
    pub(super) fn close_request(&mut self) {
        self.req.open = false;
        if let (Some(routed), Some(stream)) = (self.routed.as_mut(), self.req.scanner.stream()) {
            routed.stream = stream;
        }
    }
}

impl early::RequestSide {
    /// Whether a decision is parked for flow control.
    pub fn waiting(&self) -> bool {
        self.pending.is_some()
    }
}

//! The response side of a stream: the served endpoint (fallbacks counted), the headers epp adds
//! (the conformance verifier's, the session token), the body passed through (usage read, the
//! model name restored after a rewrite), and the exchange recorded when it ends.

use super::{State, StreamMachine, SERVED_VERIFIER_HEADER};
use crate::director::End;
use crate::extproc::response::ResponseTracker;
use crate::extproc::wire;
use envoy_types::pb::envoy::service::ext_proc::v3::{HttpBody, HttpHeaders, ProcessingResponse};

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
                ex.routed.first_token();
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
            self.finish();
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

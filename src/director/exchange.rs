//! What crosses the director's boundary: the request an adapter hands over ([`Incoming`] with
//! its [`Body`]), the decision it gets back ([`Routed`], holding the endpoint's [`Lease`]), and
//! how the exchange ended ([`End`]).

use crate::admission;
use crate::datastore::{InflightGuard, PrefillGuard};
use crate::endpoint::EndpointId;
use crate::request::{LlmRequest, RequestError};
use crate::scheduling::gather::Seat;
use crate::scheduling::lifecycle::Headers;
use crate::scheduling::{self, ScheduleError};
use std::time::Instant;

/// A request as the ext_proc adapter hands it over.
#[derive(Clone, Copy, Debug, Default)]
pub struct Incoming<'a> {
    /// What the decision reads of the body.
    pub body: Body<'a>,
    /// When the request was read, if before the call (the scheduler's latency counts from it).
    pub started: Option<Instant>,
    /// `x-gateway-model-name-rewrite`.
    pub model_rewrite: Option<&'a str>,
    /// `envoy.lb.subset_hint` entries; `Some(&[])` means "present and empty".
    pub subset: Option<&'a [String]>,
    /// `test-epp-endpoint-selection`.
    pub test_endpoint_selection: Option<&'a str>,
    /// `x-gateway-inference-objective`: the InferenceObjective giving the request's priority.
    pub objective: Option<&'a str>,
    /// `x-session-token` as sent: the consistent-hash picker keys on it.
    pub session_token: Option<&'a str>,
    /// The endpoint name the session token encodes (the adapter decodes it).
    pub session_endpoint: Option<&'a str>,
    /// The request headers the configured plugins read (the adapter captures the names
    /// [`crate::scheduling::Scheduler::request_headers`] lists).
    pub headers: &'a Headers,
    /// `x-llm-d-slo-ttft-ms` (alias `x-slo-ttft-ms`): the request's TTFT SLO in milliseconds.
    pub slo_ttft_ms: Option<f64>,
    /// `Prefer: if-available`: refuse (412) unless the chosen endpoint caches the prompt.
    pub if_available: bool,
    /// The request's fairness key (the fairness header, or `agent-identity`'s session):
    /// flow control's accounting of what each key used reads it when the response ends.
    pub fairness_id: Option<&'a str>,
    /// The request's seats in the gathering plugins' windows ([`super::Director::gather`]),
    /// ready: the adapter waited until each one's `until`.
    pub seats: &'a [Seat],
}

/// What the decision reads of a request's body: the one thing that tells a bodyless, an unread
/// and a parsed request apart.
#[derive(Clone, Copy, Debug, Default)]
pub enum Body<'a> {
    /// No body (GET and friends): routed at once by load, never shed, never gated by
    /// `Prefer: if-available` (as upstream).
    #[default]
    None,
    /// A body its parser does not read (`passthrough-parser`, a WebSocket upgrade): admitted
    /// like any request (priority from the objective header alone), then routed by load
    /// without a prompt; `Prefer: if-available` is refused, nothing being cached.
    Unread,
    /// The request as [`crate::request`] parsed it, and the bytes it was parsed from: the whole
    /// body, or for an early decision the part received so far.
    Parsed {
        request: &'a LlmRequest,
        bytes: &'a [u8],
    },
}

#[derive(Debug, thiserror::Error)]
pub enum DirectorError {
    #[error(transparent)]
    BadRequest(#[from] RequestError),
    #[error("failed to find endpoint candidates: {0}")]
    NoCandidates(&'static str),
    /// The screening plugins left no candidate (503, and no drop reason: upstream's director
    /// refuses this itself, not flow control).
    #[error("screeners eliminated all endpoint candidates")]
    Screened,
    #[error(transparent)]
    Schedule(ScheduleError),
    #[error(transparent)]
    Shed(#[from] admission::Shed),
    #[error("scheduler chose endpoint {0} that is not in the datastore")]
    UnknownEndpoint(EndpointId),
    /// `Prefer: if-available` and the chosen endpoint holds none of the prompt (upstream's text).
    #[error("no decode worker has the requested KV cache")]
    NotCached,
    /// An admission plugin (`probabilistic-admitter`) refused the request: upstream answers 500.
    #[error("request cannot be admitted: {0}")]
    NotAdmitted(String),
}

/// Keeps a routed request counted (in-flight per endpoint, running per model) until dropped.
#[derive(Debug)]
pub struct Lease {
    pub(super) inflight: InflightGuard,
    pub(super) running: prometheus_client::metrics::gauge::Gauge,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.running.dec();
    }
}

/// A routing decision and what the response phase needs from it.
#[derive(Debug)]
pub struct Routed {
    /// Destinations in rank order; the first is the primary.
    pub destinations: Vec<EndpointId>,
    /// The body to forward when it changed (model rewrite); `None` forwards the original.
    pub(crate) body: Option<Vec<u8>>,
    /// The model the client asked for.
    pub(crate) model: String,
    /// The model the request was sent to when a rewrite changed it (`None`: [`Self::model`]).
    pub(crate) rewritten_model: Option<String>,
    pub(crate) stream: bool,
    pub(crate) started: Instant,
    pub(crate) lease: Lease,
    /// Headers the lifecycle plugins add to the response to the client (session tokens).
    pub(crate) client_headers: Vec<(String, String)>,
    /// The request headers the plugins read, for their response hooks.
    pub(crate) captured: Headers,
    /// The request's fairness key, when it named one (flow control's accounting).
    pub(crate) fairness_id: Option<String>,
    /// The disaggregating handler's name when the request was sent for a remote prefill
    /// (`epp_disagg_remote_prefill_responses_total`).
    pub(crate) remote_prefill: Option<std::sync::Arc<str>>,
    /// Every scored candidate's final score (`--emit-endpoint-scores`).
    pub(crate) scores: Vec<(EndpointId, f64)>,
    /// The request's prefill counted against the primary until its first token.
    pub(crate) prefill: Option<PrefillGuard>,
    /// What the primary faced at dispatch, for learning its TTFT rates from the response.
    pub(crate) dispatched: Option<scheduling::scorer::TtftInputs>,
    /// Request headers for the decode pod's sidecar (P/D): set to the value, or removed.
    pub(crate) headers: Vec<(&'static str, Option<String>)>,
    /// The model and target label values, looked up once when the request was routed.
    pub(crate) labels: crate::metrics::ModelLabels,
    /// The whole prompt counted in the approximate index's pseudo-tokens (`tokenizer:
    /// characters`): with the response's `usage.prompt_tokens`, teaches the index their ratio.
    pub(crate) pseudo_prompt_tokens: Option<u32>,
    /// The request's number, which its lifecycle points carry ([`Placed::id`]).
    ///
    /// [`Placed::id`]: crate::scheduling::lifecycle::Placed::id
    pub(crate) id: u64,
    /// A response body chunk arrived.
    pub(crate) first_seen: bool,
}

impl Routed {
    /// The model the request went to, after rewrites.
    #[cfg(test)]
    pub(crate) fn target_model(&self) -> &str {
        self.rewritten_model.as_deref().unwrap_or(&self.model)
    }

    /// The first response byte arrived: the prefill is done, stop counting it as work ahead.
    /// Returns whether this was the first (the lifecycle's `first_token` runs once).
    pub fn first_token(&mut self) -> bool {
        let first = !self.first_seen;
        self.first_seen = true;
        self.prefill = None;
        first
    }
}

/// How an exchange ended, for [`super::Director::finish`].
#[derive(Clone, Copy, Debug)]
pub enum End {
    /// The response completed.
    Response(ResponseSummary),
    /// The stream ended without response headers: a gateway reset, a client gone, or a pod
    /// that never answered. Counts as a local-origin failure of the endpoint.
    Abandoned,
}

/// Usage, size and timing figures of a finished response, for metrics and passive health.
#[derive(Clone, Copy, Debug, Default)]
pub struct ResponseSummary {
    pub request_bytes: usize,
    pub response_bytes: usize,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub total_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    /// `:status` of the response headers.
    pub status: Option<u16>,
    /// The answer is the gateway's own: it could not connect to the endpoint.
    pub connect_failure: bool,
    pub headers_at: Option<Instant>,
    pub first_body_at: Option<Instant>,
    pub last_body_at: Option<Instant>,
}

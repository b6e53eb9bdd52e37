//! routesim: epp's routing quality settled in virtual time.
//!
//! Why: on 2 shared cores a real-time run's TTFT moves 2× between identical runs (the router
//! under test, Envoy, the pods and the load generator compete for the CPU), so a 10% routing
//! gain is invisible. Here nothing competes: the clock is virtual, a run is deterministic for
//! its seed, and many seeds give a confidence interval.
//!
//! What runs is the real thing on both sides of the decision:
//! - **epp**: the director, scheduler, plugins and prefix index of the `epp` crate, built from
//!   an EndpointPickerConfig exactly as the binary builds them, on an
//!   [`epp::clock::VirtualClock`]; request bodies are the bytes the bench's clients send
//!   ([`traffic`]), parsed by epp's parser.
//! - **the pods**: inference-sim's engine (vLLM's continuous batching, chunked prefill, prefix
//!   cache with LRU eviction and preemption, the timing profile's step times), stepped by the
//!   event loop ([`sim`]) instead of sleeping ([`pod`]).
//! - **what epp sees of them**: a scrape every `--refresh-metrics-interval` of the gauges the
//!   engine last published (so the staleness a real poller has is here too), and epp's own
//!   accounting of what it dispatched since.
//!
//! Not simulated (yet): KV events (the precise index), flow control's queue (its admission is
//! asynchronous), the gateway's and the network's latency (zero here), P/D disaggregation.
//!
//! [`grid`] runs workloads × loads × routers × seeds, with 95% intervals and two bounds per
//! cell ([`bounds`]); [`stats`] holds the per-run figures.

pub mod bounds;
pub mod grid;
pub mod pod;
pub mod report;
pub mod sim;
pub mod stats;
pub mod traffic;

pub use sim::{Cluster, Router, Sim};

use inference_sim::engine::Usage;
use pod::InFlight;
use std::time::Duration;

/// What happened to one request (seconds of virtual time).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Record {
    pub id: usize,
    pub sent: f64,
    pub pod: Option<usize>,
    pub ttft: Option<f64>,
    pub e2e: f64,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub output_tokens: usize,
    pub error: Option<String>,
    /// Still unanswered when the run ended (its time so far counts as a lower bound).
    pub cut_off: bool,
    /// What the bounds say of this request (set when it was sent).
    pub bound: Option<bounds::Bound>,
}

impl Record {
    fn done(f: &InFlight, pod: usize, usage: &Usage, now: Duration) -> Self {
        Self {
            id: f.request,
            sent: f.sent.as_secs_f64(),
            pod: Some(pod),
            ttft: ttft(f),
            e2e: now.saturating_sub(f.sent).as_secs_f64(),
            prompt_tokens: usage.prompt_tokens,
            cached_tokens: usage.cached_tokens,
            output_tokens: usage.completion_tokens,
            error: None,
            cut_off: false,
            bound: None,
        }
    }

    fn failed(id: usize, sent: Duration, error: String) -> Self {
        Self {
            id,
            sent: sent.as_secs_f64(),
            error: Some(error),
            ..Self::default()
        }
    }

    fn cut(f: &InFlight, pod: usize, end: Duration) -> Self {
        Self {
            id: f.request,
            sent: f.sent.as_secs_f64(),
            pod: Some(pod),
            ttft: ttft(f),
            e2e: end.saturating_sub(f.sent).as_secs_f64(),
            error: Some("cut off".into()),
            cut_off: true,
            ..Self::default()
        }
    }

    pub fn ok(&self) -> bool {
        self.error.is_none()
    }
}

/// Seconds from sending `f` to its first token, if it had one.
fn ttft(f: &InFlight) -> Option<f64> {
    f.first_token
        .map(|t| t.saturating_sub(f.sent).as_secs_f64())
}

//! What a finished exchange teaches: the objective metrics, the served endpoint's passive
//! health (status, connection failure, latency), and its learned TTFT rates.

use super::exchange::{ResponseSummary, Routed};
use super::flowcontrol::DEFAULT_FLOW;
use super::Director;
use crate::datastore::{self as ds, ttft, Observation};
use crate::scheduling::lifecycle::Completed;
use std::time::Instant;

/// Records a finished response in the objective metrics and the endpoint's health.
pub(super) fn response(d: &Director, routed: &Routed, summary: &ResponseSummary) {
    let labels = &routed.labels;
    let m = &d.metrics;
    m.request_duration.get_or_create(labels).observe(
        d.clock
            .now()
            .saturating_duration_since(routed.started)
            .as_secs_f64(),
    );
    m.request_sizes
        .get_or_create(labels)
        .observe(summary.request_bytes as f64);
    m.response_sizes
        .get_or_create(labels)
        .observe(summary.response_bytes as f64);
    if let Some(t) = summary.prompt_tokens {
        m.input_tokens.get_or_create(labels).observe(t as f64);
    }
    if let Some(t) = summary.completion_tokens {
        m.output_tokens.get_or_create(labels).observe(t as f64);
    }
    if let Some(t) = summary.cached_tokens {
        m.prompt_cached_tokens
            .get_or_create(labels)
            .observe(t as f64);
    }
    record_outcome(d, routed, &observation(routed, summary));
    learn_ttft(d, routed, summary);
    let ok = summary.status.is_some_and(|c| (200..300).contains(&c));
    if let (Some(ours), Some(theirs), true) =
        (routed.pseudo_prompt_tokens, summary.prompt_tokens, ok)
    {
        d.indexes.approximate.scale.observe(ours, theirs);
    }
    let ok = !summary.connect_failure && summary.status.is_some_and(|c| (200..300).contains(&c));
    if let Some(handler) = &routed.remote_prefill {
        let outcome = if ok { "success" } else { "error" };
        super::disagg::record_remote_prefill(&d.metrics.disagg, handler, outcome);
    }
    complete(d, routed, ok);
    // `program-aware-fairness` counts each program's tokens (nothing without it).
    let program = routed.fairness_id.as_deref().unwrap_or(DEFAULT_FLOW);
    let flow = d.config.flow_control();
    flow.completed(program, summary.prompt_tokens, summary.completion_tokens);
}

/// The lifecycle plugins' `response_complete`.
fn complete(d: &Director, routed: &Routed, ok: bool) {
    let done = Completed {
        id: routed.id,
        headers: &routed.captured,
        served: routed.lease.inflight.endpoint().id(),
        started: routed.started,
        now: d.clock.now(),
        ok,
        stream: routed.stream,
    };
    d.config.load().scheduler.response_complete(&done);
}

/// The stream ended without response headers: a local-origin failure of the endpoint.
pub(super) fn abandoned(d: &Director, routed: &Routed) {
    let obs = Observation {
        failure: Some(ds::Failure::ResetBeforeHeaders),
        ..Default::default()
    };
    record_outcome(d, routed, &obs);
    if let Some(handler) = &routed.remote_prefill {
        super::disagg::record_remote_prefill(&d.metrics.disagg, handler, "abandoned");
    }
    complete(d, routed, false);
}

/// Teaches the served endpoint's TTFT model what this request cost: the work it faced at
/// dispatch (its own prefill corrected by the cached tokens the response reported) against
/// the TTFT measured. Only streamed successes measure a TTFT.
fn learn_ttft(d: &Director, routed: &Routed, s: &ResponseSummary) {
    let (Some(dispatched), Some(first)) = (routed.dispatched, s.first_body_at) else {
        return;
    };
    if !routed.stream || !s.status.is_some_and(|c| (200..300).contains(&c)) {
        return;
    }
    let own = match (s.prompt_tokens, s.cached_tokens) {
        (Some(p), Some(c)) => p.saturating_sub(c) as f64,
        (Some(p), None) => p as f64,
        _ => dispatched.own_tokens,
    };
    let features = ttft::Features {
        ahead_tokens: dispatched.ahead_tokens,
        own_tokens: own,
        running: dispatched.running,
        waiting: dispatched.waiting,
    };
    let seed = d.config.load().scheduler.ttft_seed();
    let prior = ttft::Coefficients {
        base: seed.base,
        per_token: seed.per_token,
        per_running: seed.per_running,
        per_waiting: seed.per_waiting,
    };
    let secs = first
        .saturating_duration_since(routed.started)
        .as_secs_f64();
    routed
        .lease
        .inflight
        .endpoint()
        .observe_ttft(&features, secs, &prior, d.clock.now());
}

fn record_outcome(d: &Director, routed: &Routed, obs: &Observation) {
    let served = routed.lease.inflight.endpoint();
    let transition = served.record(obs, &d.datastore.health_policy(), d.clock.now());
    let cause = if obs.failure.is_some() {
        "connection"
    } else {
        "5xx"
    };
    ds::report(&d.metrics, &served.endpoint, transition, cause);
}

/// What passive health learns from a finished response: status, connection failure, and
/// latency. Streaming: TTFT to the first body chunk, TPOT over the chunks after it. Not
/// streaming: the whole answer arrives at once, so time per output token covers everything
/// (TTFT when the token count is unknown).
fn observation(routed: &Routed, s: &ResponseSummary) -> Observation {
    let since = |t: Option<Instant>| t.map(|t| t.saturating_duration_since(routed.started));
    let failure = s.connect_failure.then_some(ds::Failure::Connect);
    let (ttft, tpot) = if routed.stream {
        let tpot = match (s.first_body_at, s.last_body_at, s.completion_tokens) {
            (Some(f), Some(l), Some(n)) if n > 1 => {
                Some(l.saturating_duration_since(f).div_f64((n - 1) as f64))
            }
            _ => None,
        };
        (since(s.first_body_at.or(s.headers_at)), tpot)
    } else {
        let total = since(s.last_body_at.or(s.headers_at));
        match s.completion_tokens.filter(|n| *n > 0) {
            Some(n) => (None, total.map(|t| t.div_f64(n as f64))),
            None => (total, None),
        }
    };
    Observation {
        status: s.status,
        failure,
        ttft,
        tpot,
    }
}

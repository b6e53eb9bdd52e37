//! What a disaggregating profile handler decided, counted under llm-d-router's names
//! ([`DisaggMetrics`]), and saturation per stage: which endpoints a prefill must not use, and
//! which endpoints' saturation admission and flow control weigh (the destinations).

use super::Runtime;
use crate::admission;
use crate::config::PluginKind;
use crate::datastore::EndpointState;
use crate::endpoint::{EndpointId, EndpointMetrics};
use crate::metrics::disagg::{
    DecisionLabels, LegacyDecisionLabels, RemotePrefillLabels, SkipLabels,
};
use crate::metrics::{DisaggMetrics, ModelLabel};
use crate::scheduling::disagg::DisaggOutcome;
use crate::scheduling::Scheduler;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Counts one request's outcome; `model` is the target model's capped label value.
pub(super) fn record(m: &DisaggMetrics, o: &DisaggOutcome, model: ModelLabel) {
    let (full, legacy) = match o.kind {
        PluginKind::PdProfileHandler => (&m.pd, &m.pd_legacy),
        _ => (&m.disagg, &m.disagg_legacy),
    };
    // The deprecated handler records the decider's verdict, the current one what ran.
    let decision = match (o.kind, o.prefill_approved) {
        (PluginKind::PdProfileHandler, Some(true)) => "prefill-decode",
        (PluginKind::PdProfileHandler, _) => "decode-only",
        _ => o.decision.as_str(),
    };
    let labels = DecisionLabels {
        plugin_name: o.handler.to_string(),
        plugin_type: o.kind.name().to_owned(),
        model_name: model,
        decision_type: decision.to_owned(),
    };
    full.get_or_create(&labels).inc();
    let legacy_labels = LegacyDecisionLabels {
        model_name: labels.model_name,
        decision_type: labels.decision_type,
    };
    legacy.get_or_create(&legacy_labels).inc();
    if let Some(reason) = o.skipped {
        let labels = SkipLabels {
            plugin_name: o.handler.to_string(),
            reason: reason.as_str().to_owned(),
        };
        m.prefill_skipped.get_or_create(&labels).inc();
    }
}

/// The endpoints a request can be routed to, over which admission and flow control measure
/// saturation: with a disaggregating handler, those the decode profile's label filters keep
/// (a prefill or encode pod is never the destination, and a pool saturated in prefill but
/// not in decode is not saturated for the request); with one profile, all of them (upstream).
pub(super) fn destinations<'s>(
    scheduler: &Scheduler,
    states: &[&'s Arc<EndpointState>],
) -> Vec<&'s Arc<EndpointState>> {
    states
        .iter()
        .copied()
        .filter(|s| scheduler.is_destination(&s.endpoint.labels))
        .collect()
}

/// The endpoints the saturation detector counts as saturated on their own (ratio ≥ 1), which
/// a prefill stage must not use; empty unless the handler has a prefill stage.
pub(super) fn saturated(
    runtime: &Runtime,
    states: &[&Arc<EndpointState>],
    staleness: Duration,
    now: Instant,
) -> Vec<EndpointId> {
    if !runtime.scheduler.reads_saturated() {
        return Vec::new();
    }
    states
        .iter()
        .filter(|s| endpoint_saturation(&runtime.thresholds, s, now, staleness) >= 1.0)
        .map(|s| s.id())
        .collect()
}

/// One endpoint's saturation as the configured detector measures it, counting the requests
/// epp sent since the last scrape as waiting (as flow control does: scrapes lag).
pub(super) fn endpoint_saturation(
    t: &admission::Thresholds,
    s: &EndpointState,
    now: Instant,
    staleness: Duration,
) -> f64 {
    if let Some(c) = &t.concurrency {
        return c.saturation(std::iter::once(super::candidates::inflight_load(s)));
    }
    let m = adjusted_metrics(s);
    admission::endpoint_saturation(m.as_ref(), now, t, staleness)
}

/// The endpoint's last scrape with the requests dispatched since added to its queue.
pub(super) fn adjusted_metrics(s: &EndpointState) -> Option<EndpointMetrics> {
    s.metrics().map(|m| EndpointMetrics {
        waiting: m.waiting + f64::from(s.dispatched_since_scrape()),
        ..(*m).clone()
    })
}

/// Counts the response to a request routed with a remote prefill (`handler` decided it).
pub(super) fn record_remote_prefill(m: &DisaggMetrics, handler: &str, outcome: &str) {
    let labels = RemotePrefillLabels {
        plugin_name: handler.to_owned(),
        outcome: outcome.to_owned(),
    };
    m.remote_prefill_responses.get_or_create(&labels).inc();
}

//! What a disaggregating profile handler decided, counted under llm-d-router's names
//! ([`DisaggMetrics`]).

use crate::config::PluginKind;
use crate::metrics::disagg::{DecisionLabels, LegacyDecisionLabels, SkipLabels};
use crate::metrics::DisaggMetrics;
use crate::scheduling::disagg::DisaggOutcome;

/// Counts one request's outcome; `model` is the target model ("unknown" when empty).
pub(super) fn record(m: &DisaggMetrics, o: &DisaggOutcome, model: &str) {
    let model = if model.is_empty() { "unknown" } else { model };
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
        model_name: model.to_owned(),
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

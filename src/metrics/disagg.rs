//! The disaggregating profile handlers' metrics, under llm-d-router v0.10's names
//! (`pkg/epp/framework/plugins/scheduling/profilehandler/disagg/metrics.go`): each family under
//! its `llm_d_epp_*` name with the plugin labels and, as upstream, under the deprecated
//! `llm_d_inference_scheduler_*` name without them. `disagg_decision_total` counts the
//! `disagg-profile-handler`'s decisions, `pd_decision_total` the deprecated
//! `pd-profile-handler`'s; `epp_disagg_prefill_skipped_total` and
//! `epp_disagg_remote_prefill_responses_total` are epp's own.

use super::ModelLabel;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DecisionLabels {
    pub(crate) plugin_name: String,
    pub(crate) plugin_type: String,
    pub(crate) model_name: ModelLabel,
    pub(crate) decision_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LegacyDecisionLabels {
    pub(crate) model_name: ModelLabel,
    pub(crate) decision_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SkipLabels {
    pub(crate) plugin_name: String,
    pub(crate) reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RemotePrefillLabels {
    pub(crate) plugin_name: String,
    /// `success` (2xx), `error` (any other status, or the gateway could not connect),
    /// `abandoned` (the exchange ended before response headers).
    pub(crate) outcome: String,
}

#[derive(Default)]
pub struct DisaggMetrics {
    pub(crate) disagg: Family<DecisionLabels, Counter>,
    pub(crate) disagg_legacy: Family<LegacyDecisionLabels, Counter>,
    pub(crate) pd: Family<DecisionLabels, Counter>,
    pub(crate) pd_legacy: Family<LegacyDecisionLabels, Counter>,
    /// Prefill stages that should have run and did not (no endpoint, all stale).
    pub(crate) prefill_skipped: Family<SkipLabels, Counter>,
    /// Responses to requests epp sent for remote prefill, by outcome: a sidecar that cannot
    /// reach the prefill pod answers with the prefill's error once its retries are spent.
    pub(crate) remote_prefill_responses: Family<RemotePrefillLabels, Counter>,
}

impl DisaggMetrics {
    pub(crate) fn register(&self, r: &mut Registry) {
        let help = "Total number of disaggregation routing decisions made";
        r.register("llm_d_epp_disagg_decision", help, self.disagg.clone());
        r.register(
            "llm_d_inference_scheduler_disagg_decision",
            "[Deprecated: Use llm_d_epp_disagg_decision_total] Total number of disaggregation routing decisions made",
            self.disagg_legacy.clone(),
        );
        let help = "Total number of P/D disaggregation decisions made";
        r.register("llm_d_epp_pd_decision", help, self.pd.clone());
        r.register(
            "llm_d_inference_scheduler_pd_decision",
            "[Deprecated: Use llm_d_epp_pd_decision_total] Total number of P/D disaggregation decisions made",
            self.pd_legacy.clone(),
        );
        r.register(
            "epp_disagg_prefill_skipped",
            "epp: requests served decode-only although their prefill decider approved, by reason (no_prefill_endpoint, prefill_endpoints_stale, prefill_endpoints_saturated)",
            self.prefill_skipped.clone(),
        );
        r.register(
            "epp_disagg_remote_prefill_responses",
            "epp: responses to requests routed with a remote prefill (x-prefiller-host-port), by outcome (success, error, abandoned)",
            self.remote_prefill_responses.clone(),
        );
    }
}

//! `llm_d_epp_prefix_cache_affinity_filter_decisions_total` (llm-d-router v0.11, #2494): the
//! `prefix-cache-affinity-filter`'s decisions by plugin instance and outcome, as upstream's
//! labels (`plugin_name`, `outcome`).
//!
//! One family for the process, as upstream's collector: the filter is decoded from the
//! configuration, where no registry is at hand, and counts into [`AFFINITY_FILTER_DECISIONS`];
//! [`crate::metrics::Metrics::register`] exposes it.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::sync::LazyLock;

/// What the filter did with one request (upstream's outcome names).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(crate) enum AffinityOutcome {
    /// Only the endpoints at or above the affinity threshold were kept.
    sticky,
    /// No endpoint met the threshold: all kept.
    no_match,
    /// The TTFT load gate reopened every endpoint: the sticky ones were too slow.
    load_override,
    /// The exploration draw skipped the filter.
    exploration,
    /// Nothing to decide: one candidate, or the threshold disabled.
    not_applicable,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AffinityLabels {
    pub(crate) plugin_name: String,
    pub(crate) outcome: AffinityOutcome,
}

/// The process's affinity-filter decisions.
pub(crate) static AFFINITY_FILTER_DECISIONS: LazyLock<Family<AffinityLabels, Counter>> =
    LazyLock::new(Family::default);

/// Counts one decision of the filter instance `plugin_name`.
pub(crate) fn record_affinity(plugin_name: &str, outcome: AffinityOutcome) {
    let labels = AffinityLabels {
        plugin_name: plugin_name.to_owned(),
        outcome,
    };
    AFFINITY_FILTER_DECISIONS.get_or_create(&labels).inc();
}

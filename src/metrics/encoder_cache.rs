//! The multimodal encoder cache's families (llm-d-router v0.10's `mm-embeddings-cache-producer`),
//! with upstream's names and labels: `llm_d_epp_encoder_cache_queries_total` (item lookups, by
//! modality), `llm_d_epp_encoder_cache_hits_total` (lookups an endpoint's cache answered, by
//! endpoint) and `llm_d_epp_encoder_cache_hit_ratio` (matched over requested items, one
//! observation per endpoint and request).
//!
//! Process-wide families, as the affinity filter's ([`super::affinity`]): the producer is
//! decoded from the configuration, where no registry is at hand.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{linear_buckets, Histogram};
use std::sync::LazyLock;

const PLUGIN_TYPE: &str = "mm-embeddings-cache-producer";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EncoderQueryLabels {
    pub(crate) plugin_type: &'static str,
    pub(crate) plugin_name: String,
    pub(crate) modality: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EncoderHitLabels {
    pub(crate) plugin_type: &'static str,
    pub(crate) plugin_name: String,
    pub(crate) pod: String,
    pub(crate) modality: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EncoderRatioLabels {
    pub(crate) plugin_type: &'static str,
    pub(crate) plugin_name: String,
}

pub(crate) static QUERIES: LazyLock<Family<EncoderQueryLabels, Counter>> =
    LazyLock::new(Family::default);
pub(crate) static HITS: LazyLock<Family<EncoderHitLabels, Counter>> =
    LazyLock::new(Family::default);
pub(crate) static HIT_RATIO: LazyLock<Family<EncoderRatioLabels, Histogram>> =
    LazyLock::new(|| Family::new_with_constructor(ratio_histogram));

fn ratio_histogram() -> Histogram {
    // Upstream's buckets: 0.0, 0.1, … 1.0.
    Histogram::new(linear_buckets(0.0, 0.1, 11))
}

/// Counts one item lookup of producer `plugin_name`.
pub(crate) fn query(plugin_name: &str, modality: &'static str) {
    QUERIES
        .get_or_create(&EncoderQueryLabels {
            plugin_type: PLUGIN_TYPE,
            plugin_name: plugin_name.to_owned(),
            modality,
        })
        .inc();
}

/// Counts one lookup endpoint `pod`'s cache answered.
pub(crate) fn hit(plugin_name: &str, pod: String, modality: &'static str) {
    HITS.get_or_create(&EncoderHitLabels {
        plugin_type: PLUGIN_TYPE,
        plugin_name: plugin_name.to_owned(),
        pod,
        modality,
    })
    .inc();
}

/// Observes one endpoint's share of a request's items.
pub(crate) fn ratio(plugin_name: &str, matched: usize, total: usize) {
    if total == 0 {
        return;
    }
    HIT_RATIO
        .get_or_create(&EncoderRatioLabels {
            plugin_type: PLUGIN_TYPE,
            plugin_name: plugin_name.to_owned(),
        })
        .observe(matched as f64 / total as f64);
}

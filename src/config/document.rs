//! The document's shape: `EndpointPickerConfig` and its sections, decoded strictly (an unknown
//! field is an error that names it), with the references upstream resolves and the deprecations
//! it logs.

use super::{API_VERSION, API_VERSION_GIE, KIND};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EndpointPickerConfig {
    /// Omitted: defaulted to [`API_VERSION`], as upstream's decoder does.
    #[serde(default = "default_api_version")]
    pub(crate) api_version: String,
    #[serde(default = "default_kind")]
    pub(crate) kind: String,
    #[serde(default)]
    pub(crate) feature_gates: Vec<String>,
    #[serde(default)]
    pub(crate) plugins: Vec<PluginSpec>,
    #[serde(default)]
    pub(crate) scheduling_profiles: Vec<ProfileSpec>,
    /// Deprecated in llm-d-router v0.10 (moved to `flowControl.saturationDetector`; the new
    /// field wins when both are set).
    #[serde(default)]
    pub(crate) saturation_detector: Option<PluginRef>,
    #[serde(default)]
    pub(crate) data_layer: Option<DataLayer>,
    #[serde(default)]
    pub(crate) flow_control: Option<FlowControlSpec>,
    /// Deprecated in llm-d-router v0.10 (moved to `requestHandler.parsers`).
    #[serde(default)]
    pub(crate) parser: Option<PluginRef>,
    #[serde(default)]
    pub(crate) request_handler: Option<RequestHandler>,
}

fn default_api_version() -> String {
    API_VERSION.to_owned()
}

fn default_kind() -> String {
    KIND.to_owned()
}

/// `dataLayer` (GIE v1.5 and llm-d-router v0.10). epp scrapes every endpoint itself; the
/// references are checked, and a `discovery` plugin must be one epp supports.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DataLayer {
    #[serde(default)]
    #[allow(
        dead_code,
        reason = "v1's dataLayer.injectDefaults: decoded so that upstream documents load; epp always scrapes every endpoint itself"
    )]
    pub(crate) inject_defaults: Option<bool>,
    #[serde(default)]
    pub(crate) sources: Vec<DataSourceSpec>,
    #[serde(default)]
    pub(crate) discovery: Option<Discovery>,
    /// v1alpha1's cross-replica syncer (v1: `crossReplica.syncerPluginRef`).
    #[serde(default)]
    pub(crate) cross_replica_syncer_plugin_ref: Option<String>,
    /// v1alpha1's sync interval (v1: `crossReplica.syncInterval`).
    #[serde(default)]
    pub(crate) cross_replica_sync_interval: Option<String>,
    /// `crossReplica` (llm-d.ai/v1).
    #[serde(default)]
    pub(crate) cross_replica: Option<CrossReplica>,
}

/// `dataLayer.discovery`: v1alpha1's `{pluginRef}` (the endpoint discovery), v1's
/// `{endpoints: {pluginRef}, peers: {pluginRef}}`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Discovery {
    #[serde(default)]
    pub(crate) plugin_ref: Option<String>,
    #[serde(default)]
    pub(crate) endpoints: Option<PluginRef>,
    #[serde(default)]
    pub(crate) peers: Option<PluginRef>,
}

impl Discovery {
    /// The endpoint-discovery plugin: v1's `endpoints.pluginRef`, else v1alpha1's `pluginRef`.
    pub(crate) fn endpoints_ref(&self) -> Option<&str> {
        (self.endpoints.as_ref())
            .map(|r| r.plugin_ref.as_str())
            .or(self.plugin_ref.as_deref())
    }
}

/// `dataLayer.crossReplica` (llm-d.ai/v1): publishing per-endpoint state to the other
/// replicas. Durations are Go durations.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CrossReplica {
    #[serde(default)]
    pub(crate) syncer_plugin_ref: Option<String>,
    #[serde(default)]
    pub(crate) sync_interval: Option<String>,
    #[serde(default)]
    pub(crate) publish_timeout: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DataSourceSpec {
    pub(crate) plugin_ref: String,
    #[serde(default)]
    pub(crate) extractors: Vec<PluginRef>,
}

/// `flowControl` (GIE v1.5 and llm-d-router v0.10). Quantities are kept as YAML values
/// (`10Gi`, `500`) and read by the flow-control module.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FlowControlSpec {
    #[serde(default)]
    pub(crate) max_bytes: Option<serde_norway::Value>,
    #[serde(default)]
    pub(crate) max_requests: Option<serde_norway::Value>,
    #[serde(default, rename = "defaultRequestTTL")]
    pub(crate) default_request_ttl: Option<String>,
    /// How long a request may wait while the pool has no endpoint (follows
    /// `defaultRequestTTL` when omitted).
    #[serde(default, rename = "noEndpointRequestTTL")]
    pub(crate) no_endpoint_request_ttl: Option<String>,
    #[serde(default)]
    pub(crate) default_priority_band: Option<PriorityBandSpec>,
    #[serde(default)]
    pub(crate) default_negative_priority_band: Option<PriorityBandSpec>,
    #[serde(default)]
    pub(crate) priority_bands: Vec<PriorityBandSpec>,
    #[serde(default)]
    pub(crate) usage_limit_policy_plugin_ref: Option<String>,
    #[serde(default)]
    pub(crate) saturation_detector: Option<PluginRef>,
    #[serde(default)]
    #[allow(
        dead_code,
        reason = "decoded so that upstream documents load; epp does not evict in-flight requests (docs/migration/llm-d-v1.md)"
    )]
    pub(crate) enable_eviction: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PriorityBandSpec {
    #[serde(default)]
    pub(crate) priority: Option<i64>,
    #[serde(default)]
    pub(crate) max_bytes: Option<serde_norway::Value>,
    #[serde(default)]
    #[allow(
        dead_code,
        reason = "a band's maxRequests: decoded so that upstream documents load; epp limits a band by maxBytes"
    )]
    pub(crate) max_requests: Option<serde_norway::Value>,
    #[serde(default)]
    pub(crate) fairness_policy_ref: Option<String>,
    #[serde(default)]
    pub(crate) ordering_policy_ref: Option<String>,
    /// The band's own queue-wait budget (overrides `flowControl.defaultRequestTTL`).
    #[serde(default, rename = "defaultRequestTTL")]
    pub(crate) default_request_ttl: Option<String>,
}

/// `requestHandler` (llm-d-router v0.10): the parsers, chosen by request path.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RequestHandler {
    #[serde(default)]
    pub(crate) parsers: Vec<PluginRef>,
    /// llm-d.ai/v1: write the resolved priority into the forwarded body's top-level
    /// `priority` (off by default: the body is forwarded unchanged).
    #[serde(default)]
    pub(crate) propagate_priority: bool,
}

impl EndpointPickerConfig {
    /// The saturation detector reference: `flowControl.saturationDetector`, else the
    /// deprecated top-level one.
    pub(crate) fn saturation_detector_ref(&self) -> Option<&str> {
        self.flow_control
            .as_ref()
            .and_then(|f| f.saturation_detector.as_ref())
            .or(self.saturation_detector.as_ref())
            .map(|r| r.plugin_ref.as_str())
    }

    /// The parser references: `requestHandler.parsers`, else the deprecated `parser`.
    pub(crate) fn parser_refs(&self) -> Vec<&str> {
        match &self.request_handler {
            Some(h) if !h.parsers.is_empty() => {
                h.parsers.iter().map(|r| r.plugin_ref.as_str()).collect()
            }
            _ => self.parser.iter().map(|r| r.plugin_ref.as_str()).collect(),
        }
    }

    /// Deprecations upstream logs at load (one line each).
    pub(crate) fn deprecations(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.api_version == API_VERSION_GIE {
            out.push(format!(
                "DEPRECATION: apiVersion {API_VERSION_GIE}/EndpointPickerConfig is deprecated; replacement: {API_VERSION}/EndpointPickerConfig"
            ));
        }
        if self.saturation_detector.is_some() {
            out.push("DEPRECATION: top-level saturationDetector is deprecated, use flowControl.saturationDetector instead. If both are set, the new field is used.".to_owned());
        }
        if self.parser.is_some() {
            out.push("DEPRECATION: top-level parser is deprecated, use requestHandler.parsers instead. If both are set, the new field is used.".to_owned());
        }
        for p in &self.plugins {
            let kind = super::PluginKind::from_name(&p.plugin_type);
            out.extend(kind.and_then(|k| k.replacement(p.name())));
        }
        out
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginSpec {
    /// Instance name; defaults to the type name.
    #[serde(default)]
    pub name: Option<String>,
    #[serde(rename = "type")]
    pub plugin_type: String,
    #[serde(default)]
    pub parameters: Option<serde_norway::Value>,
}

impl PluginSpec {
    pub(crate) fn name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.plugin_type)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileSpec {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) plugins: Vec<ProfilePluginRef>,
    /// llm-d.ai/v1 (default true): upstream adds its saturation detector to the profile as a
    /// filter when the detector is one. epp's detectors gate admission (shed or queue) and are
    /// never filters, so epp keeps every profile as written either way.
    #[serde(default, rename = "injectSaturationFilter")]
    #[allow(
        dead_code,
        reason = "decoded so that upstream documents load; epp's saturation detectors are never profile filters, so every profile stays as written (docs/migration/llm-d-v1.md)"
    )]
    pub(crate) inject_saturation_filter: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProfilePluginRef {
    pub(crate) plugin_ref: String,
    /// Scorer weight; upstream defaults a missing weight to 1.
    #[serde(default)]
    pub(crate) weight: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PluginRef {
    pub(crate) plugin_ref: String,
}

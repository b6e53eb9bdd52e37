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
    pub api_version: String,
    #[serde(default = "default_kind")]
    pub kind: String,
    #[serde(default)]
    pub feature_gates: Vec<String>,
    #[serde(default)]
    pub plugins: Vec<PluginSpec>,
    #[serde(default)]
    pub scheduling_profiles: Vec<ProfileSpec>,
    /// Deprecated in llm-d-router v0.10 (moved to `flowControl.saturationDetector`; the new
    /// field wins when both are set).
    #[serde(default)]
    pub saturation_detector: Option<PluginRef>,
    #[serde(default)]
    pub data_layer: Option<DataLayer>,
    #[serde(default)]
    pub flow_control: Option<FlowControlSpec>,
    /// Deprecated in llm-d-router v0.10 (moved to `requestHandler.parsers`).
    #[serde(default)]
    pub parser: Option<PluginRef>,
    #[serde(default)]
    pub request_handler: Option<RequestHandler>,
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
    pub inject_defaults: Option<bool>,
    #[serde(default)]
    pub sources: Vec<DataSourceSpec>,
    #[serde(default)]
    pub discovery: Option<PluginRef>,
    #[serde(default)]
    pub cross_replica_syncer_plugin_ref: Option<String>,
    #[serde(default)]
    pub cross_replica_sync_interval: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DataSourceSpec {
    pub plugin_ref: String,
    #[serde(default)]
    pub extractors: Vec<PluginRef>,
}

/// `flowControl` (GIE v1.5 and llm-d-router v0.10). Quantities are kept as YAML values
/// (`10Gi`, `500`) and read by the flow-control module.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FlowControlSpec {
    #[serde(default)]
    pub max_bytes: Option<serde_norway::Value>,
    #[serde(default)]
    pub max_requests: Option<serde_norway::Value>,
    #[serde(default, rename = "defaultRequestTTL")]
    pub default_request_ttl: Option<String>,
    #[serde(default)]
    pub default_priority_band: Option<PriorityBandSpec>,
    #[serde(default)]
    pub default_negative_priority_band: Option<PriorityBandSpec>,
    #[serde(default)]
    pub priority_bands: Vec<PriorityBandSpec>,
    #[serde(default)]
    pub usage_limit_policy_plugin_ref: Option<String>,
    #[serde(default)]
    pub saturation_detector: Option<PluginRef>,
    #[serde(default)]
    pub enable_eviction: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PriorityBandSpec {
    #[serde(default)]
    pub priority: Option<i64>,
    #[serde(default)]
    pub max_bytes: Option<serde_norway::Value>,
    #[serde(default)]
    pub max_requests: Option<serde_norway::Value>,
    #[serde(default)]
    pub fairness_policy_ref: Option<String>,
    #[serde(default)]
    pub ordering_policy_ref: Option<String>,
}

/// `requestHandler` (llm-d-router v0.10): the parsers, chosen by request path.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RequestHandler {
    #[serde(default)]
    pub parsers: Vec<PluginRef>,
}

impl EndpointPickerConfig {
    /// The saturation detector reference: `flowControl.saturationDetector`, else the
    /// deprecated top-level one.
    pub fn saturation_detector_ref(&self) -> Option<&str> {
        self.flow_control
            .as_ref()
            .and_then(|f| f.saturation_detector.as_ref())
            .or(self.saturation_detector.as_ref())
            .map(|r| r.plugin_ref.as_str())
    }

    /// The parser references: `requestHandler.parsers`, else the deprecated `parser`.
    pub fn parser_refs(&self) -> Vec<&str> {
        match &self.request_handler {
            Some(h) if !h.parsers.is_empty() => {
                h.parsers.iter().map(|r| r.plugin_ref.as_str()).collect()
            }
            _ => self.parser.iter().map(|r| r.plugin_ref.as_str()).collect(),
        }
    }

    /// Deprecations upstream logs at load (one line each).
    pub fn deprecations(&self) -> Vec<String> {
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
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.plugin_type)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileSpec {
    pub name: String,
    #[serde(default)]
    pub plugins: Vec<ProfilePluginRef>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProfilePluginRef {
    pub plugin_ref: String,
    /// Scorer weight; upstream defaults a missing weight to 1.
    #[serde(default)]
    pub weight: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PluginRef {
    pub plugin_ref: String,
}

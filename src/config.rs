//! The upstream `EndpointPickerConfig` document, decoded strictly: an unknown field is an error
//! that names it, as upstream's strict decoder. Both API groups are accepted: llm-d-router
//! v0.10's `llm-d.ai/v1alpha1` and GIE's `inference.networking.x-k8s.io/v1alpha1` (which
//! llm-d-router still accepts, with a deprecation notice).
//!
//! This module owns the document's shape, the checks that need no plugin parameters
//! (apiVersion, kind, names, references, types, feature gates) and the one decode of every
//! plugin into its typed parameters ([`plugin`]) and of the whole document into the value the
//! rest of epp reads ([`Config`]). The plugin registry ([`PluginKind`]) is vocabulary
//! (`crate::plugin`). Problems are collected and reported together.

use serde::Deserialize;
use std::collections::HashSet;
use std::fmt;

mod datalayer;
mod decoded;
mod flow;
pub mod plugin;
pub use crate::plugin::{Category, PluginKind, Stability, Support};
pub use datalayer::MetricsSettings;
pub use decoded::{scheduler, Config};
pub use flow::FlowSettings;

/// llm-d-router v0.10's API group (the one its charts render).
pub const API_VERSION: &str = "llm-d.ai/v1alpha1";
/// GIE v1.5's API group, still accepted by llm-d-router v0.10 (deprecated there).
pub const API_VERSION_GIE: &str = "inference.networking.x-k8s.io/v1alpha1";
pub const KIND: &str = "EndpointPickerConfig";

/// How a configuration is loaded: what the command line allows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// `--allow-experimental-plugins`: alpha plugins may be configured.
    pub allow_experimental: bool,
}

/// The feature gates of `featureGates` (`name` or `name=true|false`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FeatureGates {
    /// `flowControl` (default off): requests wait in epp while the pool is saturated.
    pub flow_control: bool,
    /// `haPopulateNonLeaderDatastore` (default on upstream): epp's replicas always watch.
    pub ha_populate_non_leader_datastore: bool,
}

impl Default for FeatureGates {
    fn default() -> Self {
        Self {
            flow_control: false,
            ha_populate_non_leader_datastore: true,
        }
    }
}

impl FeatureGates {
    /// Parses the `featureGates` list. GIE v1.5's gates that llm-d-router removed
    /// (`dataLayer`, `enableLegacyMetrics`, `prepareDataPlugins`) are accepted and change
    /// nothing: epp always has a data layer and emits both metric name sets.
    pub fn parse(list: &[String]) -> Result<Self, Vec<Problem>> {
        let mut gates = Self::default();
        let mut problems = Vec::new();
        for (i, entry) in list.iter().enumerate() {
            let (name, value) = match entry.split_once('=') {
                None => (entry.trim(), Some(true)),
                Some((n, v)) => (n.trim(), v.trim().parse::<bool>().ok()),
            };
            let Some(value) = value else {
                problems.push(Problem::FeatureGate(format!(
                    "featureGates[{i}] {entry:?}: the value must be true or false"
                )));
                continue;
            };
            match name {
                "flowControl" => gates.flow_control = value,
                "haPopulateNonLeaderDatastore" => gates.ha_populate_non_leader_datastore = value,
                "dataLayer" | "enableLegacyMetrics" | "prepareDataPlugins" => {}
                _ => problems.push(Problem::FeatureGate(format!(
                    "featureGates[{i}]: unknown feature gate {name:?} (known: flowControl, haPopulateNonLeaderDatastore)"
                ))),
            }
        }
        if problems.is_empty() {
            Ok(gates)
        } else {
            Err(problems)
        }
    }
}

/// The built-in configuration, identical to upstream's default and its Helm ConfigMap.
pub const DEFAULT_CONFIG: &str = "\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
";

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
    pub max_bytes: Option<serde_yaml::Value>,
    #[serde(default)]
    pub max_requests: Option<serde_yaml::Value>,
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
    pub max_bytes: Option<serde_yaml::Value>,
    #[serde(default)]
    pub max_requests: Option<serde_yaml::Value>,
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
    pub parameters: Option<serde_yaml::Value>,
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

/// One thing wrong with a configuration.
#[derive(Debug, Clone, PartialEq)]
pub enum Problem {
    Syntax(String),
    ApiVersion(String),
    Kind(String),
    DuplicatePlugin(String),
    UnknownPluginRef {
        profile: String,
        plugin: String,
    },
    UnknownPluginType {
        plugin: String,
        plugin_type: String,
    },
    UnsupportedPlugin {
        plugin: String,
        kind: PluginKind,
        why: &'static str,
    },
    Experimental {
        plugin: String,
        kind: PluginKind,
    },
    FeatureGate(String),
    Reference {
        path: String,
        plugin: String,
    },
    Parameters {
        plugin: String,
        message: String,
    },
    Weight {
        profile: String,
        plugin: String,
    },
    Profile(String),
    Conflict(String),
    /// A value outside the plugins, by its path (`flowControl.maxBytes`).
    Field {
        path: String,
        message: String,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Syntax(m) => write!(f, "{m}"),
            Self::ApiVersion(v) => write!(
                f,
                "apiVersion {v:?} is not {API_VERSION:?} or {API_VERSION_GIE:?}"
            ),
            Self::Kind(k) => write!(f, "kind {k:?} is not {KIND:?}"),
            Self::DuplicatePlugin(n) => write!(f, "plugin name {n:?} is defined twice"),
            Self::UnknownPluginRef { profile, plugin } => {
                write!(
                    f,
                    "profile {profile:?} references undefined plugin {plugin:?}"
                )
            }
            Self::UnknownPluginType {
                plugin,
                plugin_type,
            } => {
                write!(f, "plugin {plugin:?} has unknown type {plugin_type:?}")
            }
            Self::UnsupportedPlugin { plugin, kind, why } => {
                write!(
                    f,
                    "plugin {plugin:?}: type {:?} is not supported by epp ({why})",
                    kind.name()
                )
            }
            Self::Experimental { plugin, kind } => write!(
                f,
                "plugin '{plugin}' (type: '{}') has Alpha stability level, but command line flag --allow-experimental-plugins is not set",
                kind.name()
            ),
            Self::FeatureGate(m) => write!(f, "{m}"),
            Self::Reference { path, plugin } => {
                write!(f, "{path} references undefined plugin {plugin:?}")
            }
            Self::Parameters { plugin, message } => {
                write!(f, "plugin {plugin:?} parameters: {message}")
            }
            Self::Weight { profile, plugin } => {
                write!(
                    f,
                    "profile {profile:?} plugin {plugin:?}: weight must be a finite number >= 0"
                )
            }
            Self::Profile(m) | Self::Conflict(m) => write!(f, "{m}"),
            Self::Field { path, message } => write!(f, "{path}: {message}"),
        }
    }
}

/// Every problem found in one configuration.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct ConfigError {
    pub problems: Vec<Problem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid EndpointPickerConfig: ")?;
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                write!(f, "; ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl From<Vec<Problem>> for ConfigError {
    fn from(problems: Vec<Problem>) -> Self {
        Self { problems }
    }
}

/// Parses the YAML text and checks the structure that needs no plugin knowledge.
pub fn parse(text: &str) -> Result<EndpointPickerConfig, ConfigError> {
    let doc = parse_document(text)?;
    let problems = check(&doc);
    if problems.is_empty() {
        Ok(doc)
    } else {
        Err(problems.into())
    }
}

/// Decodes the YAML strictly, without the structural checks.
pub fn parse_document(text: &str) -> Result<EndpointPickerConfig, ConfigError> {
    serde_yaml::from_str(text).map_err(|e| ConfigError::from(vec![Problem::Syntax(e.to_string())]))
}

/// The structural problems of a decoded document (apiVersion, kind, names, references, feature
/// gates). Plugin types and parameters are checked where plugins are decoded ([`plugin`]).
pub fn check(doc: &EndpointPickerConfig) -> Vec<Problem> {
    let mut problems = Vec::new();
    if doc.api_version != API_VERSION && doc.api_version != API_VERSION_GIE {
        problems.push(Problem::ApiVersion(doc.api_version.clone()));
    }
    if let Err(p) = FeatureGates::parse(&doc.feature_gates) {
        problems.extend(p);
    }
    let mut names = HashSet::new();
    for p in &doc.plugins {
        if !names.insert(p.name()) {
            problems.push(Problem::DuplicatePlugin(p.name().to_owned()));
        }
    }
    for profile in &doc.scheduling_profiles {
        for r in &profile.plugins {
            if !names.contains(r.plugin_ref.as_str()) {
                problems.push(Problem::UnknownPluginRef {
                    profile: profile.name.clone(),
                    plugin: r.plugin_ref.clone(),
                });
            }
            if r.weight.is_some_and(|w| !w.is_finite() || w < 0.0) {
                problems.push(Problem::Weight {
                    profile: profile.name.clone(),
                    plugin: r.plugin_ref.clone(),
                });
            }
        }
    }
    // (path, plugin, whether upstream instantiates a missing plugin by its type name, as it
    // does for parsers and the saturation detector).
    let mut refs: Vec<(String, &str, bool)> = Vec::new();
    if let Some(r) = doc.saturation_detector_ref() {
        refs.push(("saturationDetector".to_owned(), r, true));
    }
    for (i, r) in doc.parser_refs().into_iter().enumerate() {
        refs.push((format!("requestHandler.parsers[{i}]"), r, true));
    }
    if let Some(dl) = &doc.data_layer {
        for (i, src) in dl.sources.iter().enumerate() {
            refs.push((format!("dataLayer.sources[{i}]"), &src.plugin_ref, false));
            for (j, e) in src.extractors.iter().enumerate() {
                let path = format!("dataLayer.sources[{i}].extractors[{j}]");
                refs.push((path, &e.plugin_ref, false));
            }
        }
        if let Some(d) = &dl.discovery {
            refs.push(("dataLayer.discovery".to_owned(), &d.plugin_ref, false));
        }
    }
    for (path, plugin, by_type) in refs {
        let known = names.contains(plugin) || by_type && PluginKind::from_name(plugin).is_some();
        if !known {
            problems.push(Problem::Reference {
                path,
                plugin: plugin.to_owned(),
            });
        }
    }
    if doc.kind != KIND {
        problems.push(Problem::Kind(doc.kind.clone()));
    }
    problems
}

/// The plugin's kind, or the problem with its `type:` (unknown, unsupported by epp, or alpha
/// without `--allow-experimental-plugins`).
pub fn check_type(spec: &PluginSpec, load: LoadOptions) -> Result<PluginKind, Problem> {
    let plugin = spec.name().to_owned();
    let Some(kind) = PluginKind::from_name(&spec.plugin_type) else {
        return Err(Problem::UnknownPluginType {
            plugin,
            plugin_type: spec.plugin_type.clone(),
        });
    };
    if let Support::Unsupported(why) = kind.support() {
        return Err(Problem::UnsupportedPlugin { plugin, kind, why });
    }
    if kind.stability() == Stability::Alpha && !load.allow_experimental {
        return Err(Problem::Experimental { plugin, kind });
    }
    Ok(kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_examples_build() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/config/examples");
        for name in ["default.yaml", "prefix-absolute.yaml", "conformance.yaml"] {
            let text = std::fs::read_to_string(format!("{dir}/{name}")).unwrap();
            let doc = parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
            crate::scheduling::build(&doc).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        }
        assert_eq!(
            std::fs::read_to_string(format!("{dir}/default.yaml"))
                .unwrap()
                .split_once("apiVersion")
                .unwrap()
                .1,
            DEFAULT_CONFIG.split_once("apiVersion").unwrap().1
        );
    }

    #[test]
    fn default_config_parses() {
        let c = parse(DEFAULT_CONFIG).unwrap();
        assert_eq!(c.plugins.len(), 3);
        assert_eq!(c.scheduling_profiles[0].plugins[2].weight, Some(3.0));
    }

    #[test]
    fn unknown_fields_are_named() {
        let text = DEFAULT_CONFIG.replace(
            "kind: EndpointPickerConfig",
            "kind: EndpointPickerConfig\nschedulingProfile: []",
        );
        let err = parse(&text).unwrap_err().to_string();
        assert!(err.contains("unknown field `schedulingProfile`"), "{err}");
        let text = DEFAULT_CONFIG.replace(
            "- type: queue-scorer",
            "- type: queue-scorer\n  paramters: {}",
        );
        assert!(parse(&text)
            .unwrap_err()
            .to_string()
            .contains("`paramters`"));
    }

    #[test]
    fn reports_every_structural_problem_at_once() {
        let text = "apiVersion: v1\nkind: Foo\nplugins:\n- type: a\n- type: a\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: b\n    weight: -1\n";
        let err = parse(text).unwrap_err();
        assert_eq!(err.problems.len(), 5, "{err}");
    }

    fn build(text: &str, load: LoadOptions) -> Result<crate::scheduling::Scheduler, Vec<Problem>> {
        let doc = parse(text).map_err(|e| e.problems)?;
        crate::scheduling::build_with(&doc, load)
    }

    #[test]
    fn both_api_groups_load_and_the_old_one_is_noted() {
        let llmd = DEFAULT_CONFIG.replace(API_VERSION_GIE, API_VERSION);
        assert!(parse(&llmd).unwrap().deprecations().is_empty());
        let gie = parse(DEFAULT_CONFIG).unwrap();
        assert_eq!(gie.deprecations().len(), 1, "{:?}", gie.deprecations());
        let other = DEFAULT_CONFIG.replace(API_VERSION_GIE, "example.com/v1");
        let err = parse(&other).unwrap_err().to_string();
        assert!(
            err.contains("llm-d.ai/v1alpha1") && err.contains("example.com/v1"),
            "{err}"
        );
        let bare = "plugins:\n- type: queue-scorer\n";
        assert_eq!(parse(bare).unwrap().api_version, API_VERSION);
    }

    #[test]
    fn known_but_unsupported_plugins_name_themselves() {
        let text = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: mm-embeddings-cache-scorer\n- type: no-such-scorer\n- type: queue-scorer\n";
        let problems = build(text, LoadOptions::default()).unwrap_err();
        assert_eq!(problems.len(), 2, "{problems:?}");
        let all = ConfigError::from(problems).to_string();
        assert!(
            all.contains("\"mm-embeddings-cache-scorer\" is not supported by epp"),
            "{all}"
        );
        assert!(all.contains("unknown type \"no-such-scorer\""), "{all}");
    }

    #[test]
    fn alpha_plugins_need_the_experimental_flag() {
        let text = "plugins:\n- type: session-affinity-scorer\n";
        let err = ConfigError::from(build(text, LoadOptions::default()).unwrap_err()).to_string();
        assert!(
            err.contains("plugin 'session-affinity-scorer' (type: 'session-affinity-scorer') has Alpha stability level, but command line flag --allow-experimental-plugins is not set"),
            "{err}"
        );
        let allow = LoadOptions {
            allow_experimental: true,
        };
        build(text, allow).unwrap();
    }

    #[test]
    fn feature_gates_take_values_and_unknown_gates_are_errors() {
        let on = |list: &[&str]| {
            FeatureGates::parse(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        };
        assert!(on(&["flowControl"]).unwrap().flow_control);
        assert!(
            !on(&["flowControl", "flowControl=false"])
                .unwrap()
                .flow_control
        );
        assert!(
            !on(&["haPopulateNonLeaderDatastore=false"])
                .unwrap()
                .ha_populate_non_leader_datastore
        );
        assert!(on(&["dataLayer"]).is_ok(), "GIE v1.5's gates are accepted");
        assert_eq!(
            on(&["flowControl=maybe", "warpDrive"]).unwrap_err().len(),
            2
        );
    }

    #[test]
    fn llm_d_structure_loads_and_its_references_are_checked() {
        let text = "apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl=true]
plugins:
- type: queue-scorer
- type: utilization-detector
  parameters: {queueDepthThreshold: 7}
- type: openai-parser
- type: metrics-data-source
  parameters: {scheme: http, path: /metrics, insecureSkipVerify: true}
- type: core-metrics-extractor
requestHandler:
  parsers: [{pluginRef: openai-parser}, {pluginRef: anthropic-parser}]
dataLayer:
  sources: [{pluginRef: metrics-data-source, extractors: [{pluginRef: core-metrics-extractor}]}]
flowControl:
  maxBytes: 10Gi
  defaultRequestTTL: 30s
  priorityBands: [{priority: 1, maxRequests: 500, orderingPolicyRef: fcfs-ordering-policy}]
  saturationDetector: {pluginRef: utilization-detector}
";
        let doc = parse(text).unwrap();
        assert_eq!(doc.saturation_detector_ref(), Some("utilization-detector"));
        assert_eq!(doc.parser_refs(), ["openai-parser", "anthropic-parser"]);
        build(text, LoadOptions::default()).unwrap();
        let bad = text
            .replace(
                "{pluginRef: core-metrics-extractor}]}]",
                "{pluginRef: nope}]}]",
            )
            .replace(
                "saturationDetector: {pluginRef: utilization-detector}",
                "saturationDetector: {pluginRef: missing}",
            )
            .replace("maxBytes: 10Gi", "maxBytes: 10Gi\n  maxBites: 1");
        let err = parse(&bad).unwrap_err().to_string();
        assert!(err.contains("maxBites"), "{err}");
        let bad = bad.replace("\n  maxBites: 1", "");
        let problems = parse(&bad).unwrap_err().problems;
        assert_eq!(problems.len(), 2, "{problems:?}");
        let err = ConfigError::from(problems).to_string();
        assert!(
            err.contains("dataLayer.sources[0].extractors[0] references undefined plugin \"nope\""),
            "{err}"
        );
        assert!(
            err.contains("saturationDetector references undefined plugin \"missing\""),
            "{err}"
        );
    }
}

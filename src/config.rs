//! The upstream `EndpointPickerConfig` document, decoded strictly: an unknown field is an error
//! that names it, as upstream's strict decoder. Three apiVersions are accepted: llm-d v1.0's
//! `llm-d.ai/v1` (whose removed fields are errors naming where they moved, [`version`]),
//! llm-d-router v0.10's `llm-d.ai/v1alpha1` and GIE's `inference.networking.x-k8s.io/v1alpha1`
//! (which llm-d-router still accepts, with a deprecation notice).
//!
//! This module owns the document's shape, the checks that need no plugin parameters
//! (apiVersion, kind, names, references, types, feature gates) and the one decode of every
//! plugin into its typed parameters ([`plugin`]) and of the whole document into the value the
//! rest of epp reads ([`Config`]). The plugin registry ([`PluginKind`]) is vocabulary
//! (`crate::plugin`). Problems are collected and reported together.

use std::collections::HashSet;

mod custom_metrics;
mod datalayer;
mod decoded;
mod document;
mod flow;
mod multicluster;
pub mod plugin;
mod problem;
pub mod tool;
pub mod usage_limit;
mod version;
pub use crate::plugin::{Category, PluginKind, Stability, Support};
pub(crate) use custom_metrics::CustomMetrics;
#[cfg(test)]
pub(crate) use custom_metrics::SeriesSpec;
pub use datalayer::{FileDiscovery, MetricsSettings};
pub use decoded::{scheduler, Config};
pub use document::{
    CrossReplica, DataLayer, DataSourceSpec, Discovery, EndpointPickerConfig, FlowControlSpec,
    PluginRef, PluginSpec, PriorityBandSpec, ProfilePluginRef, ProfileSpec, RequestHandler,
};
pub(crate) use flow::{BandPolicy, Fairness, FlowSettings, Las, QueueOrder};
pub(crate) use multicluster::{
    ClusterExtractor, ClusterMetrics, ClusterSource, MetricSpec, Scheme, MAX_ANSWER_BYTES,
};
pub use problem::{ConfigError, Problem};
pub(crate) use usage_limit::UsageLimit;

/// llm-d v1.0's configuration API (`apix/config/v1`).
pub(crate) const API_VERSION_V1: &str = "llm-d.ai/v1";
/// llm-d-router v0.10's API group (the one its charts render).
pub(crate) const API_VERSION: &str = "llm-d.ai/v1alpha1";
/// GIE v1.5's API group, still accepted by llm-d-router v0.10 (deprecated there).
pub(crate) const API_VERSION_GIE: &str = "inference.networking.x-k8s.io/v1alpha1";
pub(crate) const KIND: &str = "EndpointPickerConfig";

/// How a configuration is loaded: what the command line allows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// `--allow-experimental-plugins`: alpha plugins may be configured.
    pub allow_experimental: bool,
}

/// The feature gates of `featureGates` (`name` or `name=true|false`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FeatureGates {
    /// `flowControl` (default off): requests wait in epp while the pool is saturated.
    pub(crate) flow_control: bool,
    /// `haPopulateNonLeaderDatastore` (default on upstream): epp's replicas always watch.
    pub(crate) ha_populate_non_leader_datastore: bool,
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
    pub(crate) fn parse(list: &[String]) -> Result<Self, Vec<Problem>> {
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

/// The built-in configuration (and `config/examples/default.yaml`, the chart's default ConfigMap,
/// `hack/bench/epp-default.yaml`): `prefix-cache-affinity-filter` (llm-d's optimized-baseline
/// thresholds) in front of epp's estimated-TTFT scorer, pricing the prefixes a placement would
/// evict at weight 3 (its own default 0.25), over the approximate prefix index sized to the pods'
/// caches. In the routing simulator's grid it is no worse than the best of six other
/// configurations in 15 of 20 cells, seed by seed (BENCHMARKS.md, "The grid"); upstream's default
/// is one config away ([`UPSTREAM_DEFAULT_CONFIG`], `config/examples/upstream-default.yaml`).
pub const DEFAULT_CONFIG: &str = "\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
  parameters:
    maxPrefixTokensToMatch: 32768
- type: prefix-cache-affinity-filter
  parameters:
    affinityThreshold: 0.80
    maxTTFTPenaltyMs: 18000
    peakPrefillThroughput: 15928
- type: estimated-ttft-scorer
  parameters:
    evictionCostWeight: 3
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-affinity-filter
  - pluginRef: estimated-ttft-scorer
  - pluginRef: max-score-picker
";

/// Upstream's default configuration (GIE's `pkg/epp/config/loader/defaults.go` and its Helm
/// chart's `default-plugins.yaml`): queue 2, kv-cache 2, prefix 3, max-score picker.
pub const UPSTREAM_DEFAULT_CONFIG: &str = "\
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

/// Parses the YAML text and checks the structure that needs no plugin knowledge.
#[cfg(test)]
pub(crate) fn parse(text: &str) -> Result<EndpointPickerConfig, ConfigError> {
    let doc = parse_document(text)?;
    let problems = check(&doc);
    if problems.is_empty() {
        Ok(doc)
    } else {
        Err(problems.into())
    }
}

/// Decodes the YAML strictly, without the structural checks.
pub(crate) fn parse_document(text: &str) -> Result<EndpointPickerConfig, ConfigError> {
    serde_norway::from_str(text)
        .map_err(|e| ConfigError::from(vec![Problem::Syntax(e.to_string())]))
}

/// The structural problems of a decoded document (apiVersion, kind, names, references, feature
/// gates). Plugin types and parameters are checked where plugins are decoded ([`plugin`]).
pub(crate) fn check(doc: &EndpointPickerConfig) -> Vec<Problem> {
    let mut problems = Vec::new();
    if ![API_VERSION_V1, API_VERSION, API_VERSION_GIE].contains(&doc.api_version.as_str()) {
        problems.push(Problem::ApiVersion(doc.api_version.clone()));
    }
    problems.extend(version::problems(doc));
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
        refs.extend(data_layer_refs(dl));
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

/// The plugin references of `dataLayer`: (path, plugin, false: none is instantiated by type).
fn data_layer_refs(dl: &DataLayer) -> Vec<(String, &str, bool)> {
    let mut refs: Vec<(String, &str, bool)> = Vec::new();
    for (i, src) in dl.sources.iter().enumerate() {
        refs.push((format!("dataLayer.sources[{i}]"), &src.plugin_ref, false));
        for (j, e) in src.extractors.iter().enumerate() {
            let path = format!("dataLayer.sources[{i}].extractors[{j}]");
            refs.push((path, &e.plugin_ref, false));
        }
    }
    if let Some(d) = &dl.discovery {
        if let Some(r) = &d.plugin_ref {
            refs.push(("dataLayer.discovery".to_owned(), r, false));
        }
        if let Some(r) = &d.endpoints {
            let path = "dataLayer.discovery.endpoints".to_owned();
            refs.push((path, &r.plugin_ref, false));
        }
        if let Some(r) = &d.peers {
            refs.push(("dataLayer.discovery.peers".to_owned(), &r.plugin_ref, false));
        }
    }
    let syncer = (dl.cross_replica.as_ref())
        .and_then(|c| c.syncer_plugin_ref.as_deref())
        .map(|r| ("dataLayer.crossReplica.syncerPluginRef", r))
        .or_else(|| {
            (dl.cross_replica_syncer_plugin_ref.as_deref())
                .map(|r| ("dataLayer.crossReplicaSyncerPluginRef", r))
        });
    if let Some((path, r)) = syncer {
        refs.push((path.to_owned(), r, false));
    }
    refs
}

/// The plugin's kind, or the problem with its `type:` (unknown, unsupported by epp, or alpha
/// without `--allow-experimental-plugins`).
pub(crate) fn check_type(spec: &PluginSpec, load: LoadOptions) -> Result<PluginKind, Problem> {
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
mod tests;

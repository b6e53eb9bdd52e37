//! The upstream `EndpointPickerConfig` document (`inference.networking.x-k8s.io/v1alpha1`),
//! decoded strictly: an unknown field is an error that names it, as upstream's strict decoder.
//!
//! This module owns the document's shape and the checks that need no plugin knowledge
//! (apiVersion, kind, names, references). Each plugin validates its own `parameters` where it is
//! built (`scheduling::build`). Problems are collected and reported together.

use serde::Deserialize;
use std::collections::HashSet;
use std::fmt;

pub const API_VERSION: &str = "inference.networking.x-k8s.io/v1alpha1";
pub const KIND: &str = "EndpointPickerConfig";

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
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub feature_gates: Vec<String>,
    #[serde(default)]
    pub plugins: Vec<PluginSpec>,
    #[serde(default)]
    pub scheduling_profiles: Vec<ProfileSpec>,
    #[serde(default)]
    pub saturation_detector: Option<PluginRef>,
    #[serde(default)]
    pub data_layer: Option<serde_yaml::Value>,
    #[serde(default)]
    pub flow_control: Option<serde_yaml::Value>,
    #[serde(default)]
    pub parser: Option<PluginRef>,
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
    UnknownPluginRef { profile: String, plugin: String },
    UnknownPluginType { plugin: String, plugin_type: String },
    Parameters { plugin: String, message: String },
    Weight { profile: String, plugin: String },
    Profile(String),
    Conflict(String),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Syntax(m) => write!(f, "{m}"),
            Self::ApiVersion(v) => write!(f, "apiVersion {v:?} is not {API_VERSION:?}"),
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

/// The structural problems of a decoded document (apiVersion, kind, names, references).
pub fn check(doc: &EndpointPickerConfig) -> Vec<Problem> {
    let mut problems = Vec::new();
    if doc.api_version != API_VERSION {
        problems.push(Problem::ApiVersion(doc.api_version.clone()));
    }
    if doc.kind != KIND {
        problems.push(Problem::Kind(doc.kind.clone()));
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
    problems
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
}

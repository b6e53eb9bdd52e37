//! What can be wrong with a configuration ([`Problem`]) and all of it at once ([`ConfigError`]).

use super::{PluginKind, API_VERSION, API_VERSION_GIE, API_VERSION_V1, KIND};
use std::fmt;

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
    /// A v1alpha1 field in an `llm-d.ai/v1` document: where it moved.
    Moved {
        field: &'static str,
        to: &'static str,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Syntax(m) => write!(f, "{m}"),
            Self::ApiVersion(v) => write!(
                f,
                "apiVersion {v:?} is not {API_VERSION_V1:?}, {API_VERSION:?} or {API_VERSION_GIE:?}"
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
            Self::Moved { field, to } => write!(
                f,
                "{field} is not a field of {API_VERSION_V1} (removed in llm-d v1.0): it moved to {to}"
            ),
        }
    }
}

/// Every problem found in one configuration.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct ConfigError {
    pub(crate) problems: Vec<Problem>,
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

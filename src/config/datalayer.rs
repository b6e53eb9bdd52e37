//! The parameters of the data-layer plugins upstream configurations carry:
//! `metrics-data-source` (where each endpoint's metrics are) and `core-metrics-extractor`
//! (which engine's metric names apply). epp scrapes every endpoint itself; these settings tell
//! it the scheme, path, port and default engine, as upstream's plugins do.
//!
//! Decoded strictly (upstream v0.10 rejects unknown parameter keys); what epp cannot do (https
//! scraping with client certificates, custom `engineConfigs`) is a load error naming it.

use super::{EndpointPickerConfig, PluginKind, PluginSpec, Problem};
use crate::endpoint::EngineType;
use serde::Deserialize;

/// What the data-layer plugins of one configuration say.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsSettings {
    /// `metrics-data-source` `path`, when it is not the default `/metrics` (the engine's own
    /// path applies then: trtllm-serve serves `/prometheus/metrics`).
    pub path: Option<String>,
    /// `metrics-data-source` `port` (otherwise the serving port).
    pub port: Option<u16>,
    /// `core-metrics-extractor` `defaultEngine`: the engine of endpoints without an engine label.
    pub default_engine: Option<EngineType>,
    /// `core-metrics-extractor` `engineLabelKey` (otherwise `llm-d.ai/engine-type`, then the GIE
    /// key).
    pub engine_label_key: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SourceParams {
    scheme: Option<String>,
    path: Option<String>,
    port: Option<i64>,
    insecure_skip_verify: Option<bool>,
    interval: Option<String>,
    ca_cert_path: Option<String>,
    client_cert_path: Option<String>,
    client_key_path: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ExtractorParams {
    engine_label_key: Option<String>,
    default_engine: Option<String>,
    engine_configs: Option<serde_yaml::Value>,
}

impl MetricsSettings {
    /// Reads every `metrics-data-source` and `core-metrics-extractor` plugin (the last one of a
    /// kind wins, as one instance of each is all upstream's charts configure).
    pub fn from_config(doc: &EndpointPickerConfig) -> Result<Self, Vec<Problem>> {
        let mut out = Self::default();
        let mut problems = Vec::new();
        for spec in &doc.plugins {
            let result = match PluginKind::from_name(&spec.plugin_type) {
                Some(PluginKind::MetricsDataSource) => out.source(spec),
                Some(PluginKind::CoreMetricsExtractor) => out.extractor(spec),
                _ => continue,
            };
            problems.extend(result.err().into_iter().flatten());
        }
        if problems.is_empty() {
            Ok(out)
        } else {
            Err(problems)
        }
    }

    fn source(&mut self, spec: &PluginSpec) -> Result<(), Vec<Problem>> {
        let p: SourceParams = decode(spec)?;
        let problem = |message: &str| Problem::Parameters {
            plugin: spec.name().to_owned(),
            message: message.to_owned(),
        };
        let mut problems = Vec::new();
        match p.scheme.as_deref() {
            None | Some("http") => {}
            Some("https") => problems.push(problem(
                "scheme \"https\" is not supported by epp (it scrapes over http)",
            )),
            Some(other) => problems.push(problem(&format!(
                "scheme must be \"http\" or \"https\", got {other:?}"
            ))),
        }
        if p.ca_cert_path.is_some() || p.client_cert_path.is_some() || p.client_key_path.is_some() {
            problems.push(problem(
                "caCertPath/clientCertPath/clientKeyPath (mTLS scraping) are not supported by epp",
            ));
        }
        match p.port {
            None => {}
            Some(port @ 1..=65535) => self.port = u16::try_from(port).ok(),
            Some(port) => problems.push(problem(&format!("port must be in 1..65535, got {port}"))),
        }
        // `insecureSkipVerify` only matters for https; `interval` is --refresh-metrics-interval
        // in epp (one scrape loop per endpoint).
        let _ = (p.insecure_skip_verify, p.interval);
        self.path = p.path.filter(|path| path != "/metrics" && !path.is_empty());
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    fn extractor(&mut self, spec: &PluginSpec) -> Result<(), Vec<Problem>> {
        let p: ExtractorParams = decode(spec)?;
        let problem = |message: String| Problem::Parameters {
            plugin: spec.name().to_owned(),
            message,
        };
        let mut problems = Vec::new();
        if let Some(engine) = p.default_engine.as_deref() {
            match EngineType::from_label(engine) {
                Some(e) => self.default_engine = Some(e),
                None => problems.push(problem(format!(
                    "defaultEngine {engine:?} is not one of vllm, sglang, trtllm-serve, triton-tensorrt-llm"
                ))),
            }
        }
        if p.engine_configs.as_ref().is_some_and(|v| !v.is_null()) {
            problems.push(problem(
                "engineConfigs is not supported by epp; its built-in engines are vllm, sglang, trtllm-serve and triton-tensorrt-llm, and the --total-queued-requests-metric family of flags overrides their names".to_owned(),
            ));
        }
        self.engine_label_key = p.engine_label_key.filter(|k| !k.is_empty());
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

fn decode<T: Default + serde::de::DeserializeOwned>(spec: &PluginSpec) -> Result<T, Vec<Problem>> {
    match &spec.parameters {
        None | Some(serde_yaml::Value::Null) => Ok(T::default()),
        Some(v) => serde_yaml::from_value(v.clone()).map_err(|e| {
            vec![Problem::Parameters {
                plugin: spec.name().to_owned(),
                message: e.to_string(),
            }]
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(plugins: &str) -> Result<MetricsSettings, Vec<Problem>> {
        let text = format!(
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n{plugins}"
        );
        MetricsSettings::from_config(&super::super::parse(&text).unwrap())
    }

    #[test]
    fn the_charts_data_layer_plugins_load() {
        let s = settings("- type: metrics-data-source\n  parameters:\n    scheme: \"http\"\n    path: \"/metrics\"\n    insecureSkipVerify: true\n- type: core-metrics-extractor\n  parameters: {defaultEngine: \"sglang\"}\n").unwrap();
        assert_eq!(
            s,
            MetricsSettings {
                default_engine: Some(EngineType::Sglang),
                ..MetricsSettings::default()
            }
        );
        let s = settings(
            "- type: metrics-data-source\n  parameters: {path: /prometheus/metrics, port: 9100}\n",
        )
        .unwrap();
        assert_eq!(
            (s.path.as_deref(), s.port),
            (Some("/prometheus/metrics"), Some(9100))
        );
    }

    #[test]
    fn what_epp_cannot_do_is_named() {
        let problems = settings("- type: metrics-data-source\n  parameters: {scheme: https, port: 0, clientCertPath: /c}\n- type: core-metrics-extractor\n  parameters: {defaultEngine: tgi, engineConfigs: [{name: x}]}\n").unwrap_err();
        assert_eq!(problems.len(), 5, "{problems:?}");
        let typo = settings("- type: metrics-data-source\n  parameters: {pth: /m}\n").unwrap_err();
        assert!(format!("{typo:?}").contains("pth"), "{typo:?}");
    }
}

//! The parameters of the data-layer plugins upstream configurations carry:
//! `metrics-data-source` (where each endpoint's metrics are) and `core-metrics-extractor`
//! (which engine's metric names apply). epp scrapes every endpoint itself; these settings tell
//! it the scheme, path, port and default engine, as upstream's plugins do. And llm-d-router's
//! `file-discovery` (endpoints from a file instead of Kubernetes), when `dataLayer.discovery`
//! names it ([`FileDiscovery`]; the file itself is read by [`crate::discovery::file`]).
//!
//! Decoded strictly (upstream v0.10 rejects unknown parameter keys); what epp cannot do (https
//! scraping with client certificates, `engineConfigs` that rename an engine's series or add an
//! engine) is a load error naming it. `engineConfigs` `customMetrics` are read
//! ([`super::custom_metrics`]).

use super::plugin::{NamedPlugin, Plugin};
use crate::endpoint::EngineType;
use crate::plugin::Invalid;
use serde::Deserialize;
use std::path::PathBuf;

/// What the data-layer plugins of one configuration say.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsSettings {
    /// `metrics-data-source` `path`, when it is not the default `/metrics` (the engine's own
    /// path applies then: trtllm-serve serves `/prometheus/metrics`).
    pub(crate) path: Option<String>,
    /// `metrics-data-source` `port` (otherwise the serving port).
    pub(crate) port: Option<u16>,
    /// `core-metrics-extractor` `defaultEngine`: the engine of endpoints without an engine label.
    pub default_engine: Option<EngineType>,
    /// `core-metrics-extractor` `engineLabelKey` (otherwise `llm-d.ai/engine-type`, then the GIE
    /// key).
    pub(crate) engine_label_key: Option<String>,
    /// A hub's scrape of its spokes (`multicluster-metrics-data-source` and its extractor):
    /// every endpoint is then a cluster, scraped for its pool aggregates.
    pub(crate) clusters: Option<super::multicluster::ClusterMetrics>,
    /// `core-metrics-extractor`'s `engineConfigs` `customMetrics`: the endpoint attributes.
    pub(crate) custom: super::CustomMetrics,
}

/// `metrics-data-source` parameters.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SourceParams {
    scheme: Option<String>,
    path: Option<String>,
    port: Option<i64>,
    insecure_skip_verify: Option<bool>,
    interval: Option<String>,
    ca_cert_path: Option<String>,
    client_cert_path: Option<String>,
    client_key_path: Option<String>,
}

/// `core-metrics-extractor` parameters.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExtractorParams {
    engine_label_key: Option<String>,
    default_engine: Option<String>,
    engine_configs: Option<Vec<super::custom_metrics::EngineConfig>>,
    /// Their `customMetrics`, checked.
    #[serde(skip)]
    custom: super::CustomMetrics,
}

impl SourceParams {
    /// Every value epp cannot honour.
    pub(crate) fn validate(self) -> Result<Self, Vec<Invalid>> {
        let mut problems = Vec::new();
        match self.scheme.as_deref() {
            None | Some("http") => {}
            Some("https") => problems.push(Invalid::new(
                "scheme",
                "scheme \"https\" is not supported by epp (it scrapes over http)",
            )),
            Some(other) => problems.push(Invalid::new(
                "scheme",
                format!("scheme must be \"http\" or \"https\", got {other:?}"),
            )),
        }
        if self.ca_cert_path.is_some()
            || self.client_cert_path.is_some()
            || self.client_key_path.is_some()
        {
            problems.push(Invalid::new(
                "caCertPath/clientCertPath/clientKeyPath",
                "caCertPath/clientCertPath/clientKeyPath (mTLS scraping) are not supported by epp",
            ));
        }
        if let Some(port) = self.port.filter(|p| !(1..=65535).contains(p)) {
            problems.push(Invalid::new(
                "port",
                format!("port must be in 1..65535, got {port}"),
            ));
        }
        // `insecureSkipVerify` only matters for https; `interval` is --refresh-metrics-interval
        // in epp (one scrape loop per endpoint).
        let _ = (self.insecure_skip_verify, &self.interval);
        if problems.is_empty() {
            Ok(self)
        } else {
            Err(problems)
        }
    }
}

impl ExtractorParams {
    /// Every value epp cannot honour.
    pub(crate) fn validate(self) -> Result<Self, Vec<Invalid>> {
        let mut problems = Vec::new();
        if let Some(engine) = self.default_engine.as_deref() {
            if EngineType::from_label(engine).is_none() {
                problems.push(Invalid::new(
                    "defaultEngine",
                    format!("defaultEngine {engine:?} is not one of vllm, sglang, trtllm-serve, triton-tensorrt-llm"),
                ));
            }
        }
        let mut this = self;
        match super::custom_metrics::engine_configs(this.engine_configs.as_deref().unwrap_or(&[])) {
            Ok(custom) => this.custom = custom,
            Err(more) => problems.extend(more),
        }
        if problems.is_empty() {
            Ok(this)
        } else {
            Err(problems)
        }
    }
}

/// `file-discovery` (llm-d-router v0.10): the endpoints file and whether it is followed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileDiscovery {
    /// `path`: the endpoints file (llm-d's format: `endpoints:` with `name`, `namespace`,
    /// `address`, `port`, `labels`).
    pub(crate) path: PathBuf,
    /// `watchFile`: re-read the file when it changes (otherwise it is read once, at start-up).
    pub(crate) watch_file: bool,
    /// `multicluster-file-discovery`: the entries are clusters (an address may be a host
    /// name; `metricsAddress`/`metricsPort` labels say where the spoke EPP's metrics are).
    pub(crate) clusters: bool,
}

/// `file-discovery` parameters, decoded strictly like upstream's.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileDiscoveryParams {
    #[serde(default)]
    path: String,
    #[serde(default)]
    watch_file: bool,
}

impl FileDiscoveryParams {
    /// The path is required.
    pub(crate) fn validate(self) -> Result<FileDiscovery, Invalid> {
        if self.path.trim().is_empty() {
            return Err(Invalid::new(
                "path",
                "'file-discovery' requires a path (the endpoints file)",
            ));
        }
        Ok(FileDiscovery {
            path: PathBuf::from(self.path),
            watch_file: self.watch_file,
            clusters: false,
        })
    }
}

/// The `file-discovery` plugin `dataLayer.discovery` names, if it names one (another discovery
/// plugin, or none, means Kubernetes or the static-endpoint flags).
pub(crate) fn file_discovery(
    data_layer: Option<&super::DataLayer>,
    plugins: &[NamedPlugin],
) -> Option<FileDiscovery> {
    let name = data_layer?.discovery.as_ref()?.endpoints_ref()?;
    plugins.iter().find_map(|p| match &p.plugin {
        Plugin::FileDiscovery(f) if p.name == name => Some(f.clone()),
        _ => None,
    })
}

impl MetricsSettings {
    /// Reads every `metrics-data-source` and `core-metrics-extractor` plugin (the last one of a
    /// kind wins, as one instance of each is all upstream's charts configure).
    pub(crate) fn from_plugins(plugins: &[NamedPlugin]) -> Self {
        let mut out = Self {
            clusters: super::multicluster::cluster_metrics(plugins),
            ..Self::default()
        };
        for p in plugins {
            match &p.plugin {
                Plugin::MetricsDataSource(s) => {
                    out.port = s.port.and_then(|p| u16::try_from(p).ok());
                    out.path = s
                        .path
                        .clone()
                        .filter(|path| path != "/metrics" && !path.is_empty());
                }
                Plugin::CoreMetricsExtractor(e) => {
                    out.default_engine =
                        e.default_engine.as_deref().and_then(EngineType::from_label);
                    out.engine_label_key = e.engine_label_key.clone().filter(|k| !k.is_empty());
                    out.custom = e.custom.clone();
                }
                _ => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(plugins: &str) -> Result<MetricsSettings, Vec<super::super::Problem>> {
        let text = format!(
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n{plugins}"
        );
        let doc = super::super::parse(&text).unwrap();
        super::super::Config::decode(&doc, Default::default())
            .map(|c| c.metrics_settings)
            .map_err(|e| e.problems)
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

    fn discovery(text: &str) -> Result<Option<FileDiscovery>, String> {
        let text = format!("apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n{text}");
        let doc = super::super::parse(&text).map_err(|e| e.to_string())?;
        super::super::Config::decode(&doc, Default::default())
            .map(|c| c.file_discovery)
            .map_err(|e| e.to_string())
    }

    /// llm-d's `file-discovery` counts when `dataLayer.discovery` names it.
    #[test]
    fn file_discovery_is_the_plugin_data_layer_discovery_names() {
        let plugins = "plugins:\n- type: file-discovery\n  name: files\n  parameters: {path: /etc/epp/endpoints.yaml, watchFile: true}\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins: [{pluginRef: queue-scorer}]\n";
        assert_eq!(
            discovery(&format!(
                "{plugins}dataLayer:\n  discovery: {{pluginRef: files}}\n"
            )),
            Ok(Some(FileDiscovery {
                path: "/etc/epp/endpoints.yaml".into(),
                watch_file: true,
                clusters: false
            }))
        );
        assert_eq!(discovery(plugins), Ok(None), "declared, not named: unused");
        let unnamed = "plugins:\n- type: file-discovery\n  parameters: {path: /e.json}\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins: [{pluginRef: queue-scorer}]\ndataLayer:\n  discovery: {pluginRef: file-discovery}\n";
        assert_eq!(
            discovery(unnamed),
            Ok(Some(FileDiscovery {
                path: "/e.json".into(),
                watch_file: false,
                clusters: false
            })),
            "named by its type; watchFile defaults to false"
        );
        let bad =
            discovery(&unnamed.replace("{path: /e.json}", "{watchFile: yes-please}")).unwrap_err();
        assert!(bad.contains("watchFile") || bad.contains("bool"), "{bad}");
        let no_path =
            discovery(&unnamed.replace("{path: /e.json}", "{watchFile: true}")).unwrap_err();
        assert!(no_path.contains("requires a path"), "{no_path}");
        let typo = discovery(&unnamed.replace("{path: /e.json}", "{path: /e.json, watch: true}"))
            .unwrap_err();
        assert!(typo.contains("watch"), "{typo}");
    }

    /// llm-d's `models-data-source` + `models-data-extractor` load (no v0.10 plugin reads what
    /// they collect), their parameters checked as strictly as upstream's.
    #[test]
    fn the_models_data_source_is_accepted_with_its_parameters_checked() {
        let doc = |params: &str| {
            format!("- type: models-data-source\n  name: vllm-models-source\n  parameters: {params}\n- type: models-data-extractor\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins: [{{pluginRef: queue-scorer}}]\ndataLayer:\n  sources:\n  - pluginRef: vllm-models-source\n    extractors: [{{pluginRef: models-data-extractor}}]\n")
        };
        assert!(settings(&doc(
            "{scheme: https, path: /v1/models, insecureSkipVerify: false, interval: 5s}"
        ))
        .is_ok());
        let typo = settings(&doc("{pth: /v1/models}")).unwrap_err();
        assert!(format!("{typo:?}").contains("pth"), "{typo:?}");
    }

    /// llm-d's documented form: the engine's built-in specifications repeated, plus
    /// `customMetrics`; a renamed series or a bad custom metric is refused, naming it.
    #[test]
    fn engine_configs_give_custom_metrics_over_the_builtin_series() {
        let vllm = "{name: vllm, queuedRequestsSpec: 'vllm:num_requests_waiting', runningRequestsSpec: 'vllm:num_requests_running', kvUsageSpec: 'vllm:kv_cache_usage_perc', loraSpec: 'vllm:lora_requests_info', cacheInfoSpec: 'vllm:cache_config_info'";
        let triton = "{name: triton-tensorrt-llm, queuedRequestsSpec: 'nv_trt_llm_request_metrics{request_type=\"waiting\"}', runningRequestsSpec: 'nv_trt_llm_request_metrics{request_type=scheduled}', kvUsageSpec: 'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}', cacheBlockSizeSpec: 'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=tokens_per}', cacheNumBlocksSpec: 'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max}'}";
        let doc = |configs: String| {
            format!(
                "- type: core-metrics-extractor\n  parameters:\n    engineConfigs: [{configs}]\n"
            )
        };
        let custom = format!("{vllm}, customMetrics: [{{attributeKey: slots, metricSpec: 'free_slots{{kind=gpu}}'}}]}}");
        let s = settings(&doc(format!("{custom}, {triton}"))).unwrap();
        let keys: Vec<&str> = s.custom.of(EngineType::Vllm).map(|(k, _)| k).collect();
        assert_eq!(keys, ["slots"]);
        assert_eq!(s.custom.names(EngineType::TritonTrtllm).count(), 0);
        let cases = [
            (format!("{vllm}}}"), None),
            (
                format!("{}}}", vllm.replace("kv_cache_usage_perc", "gpu_cache_usage_perc")),
                Some("engineConfigs[0].kvUsageSpec \"vllm:gpu_cache_usage_perc\" is not supported by epp"),
            ),
            ("{name: vllm}".to_owned(), Some("engineConfigs[0].queuedRequestsSpec \"\" is not supported")),
            ("{name: tgi}".to_owned(), Some("engineConfigs[0].name \"tgi\" is not supported by epp")),
            (format!("{vllm}, customMetrics: [{{attributeKey: a, metricSpec: 'x y'}}]}}"), Some("failed to create mapping for engine \"vllm\": custom metric \"a\": not a valid metric specification")),
            (format!("{vllm}, customMetrics: [{{attributeKey: a, metricSpec: q}}, {{attributeKey: a, metricSpec: r}}]}}"), Some("custom metric attributeKey \"a\" is duplicated")),
            (format!("{vllm}, customMetrics: [{{metricSpec: q}}]}}"), Some("custom metric attributeKey cannot be empty")),
        ];
        for (config, want) in cases {
            let got = settings(&doc(config.clone())).map_err(|p| {
                p.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            });
            match want {
                None => assert!(got.is_ok(), "{config}: {got:?}"),
                Some(w) => assert!(
                    got.as_ref().is_err_and(|e| e.contains(w)),
                    "{config}: {got:?}"
                ),
            }
        }
    }

    #[test]
    fn what_epp_cannot_do_is_named() {
        let problems = settings("- type: metrics-data-source\n  parameters: {scheme: https, port: 0, clientCertPath: /c}\n- type: core-metrics-extractor\n  parameters: {defaultEngine: tgi, engineConfigs: [{name: x}]}\n").unwrap_err();
        assert_eq!(problems.len(), 5, "{problems:?}");
        let typo = settings("- type: metrics-data-source\n  parameters: {pth: /m}\n").unwrap_err();
        assert!(format!("{typo:?}").contains("pth"), "{typo:?}");
    }
}

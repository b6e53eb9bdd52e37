//! The whole document decoded once ([`Config`]): the typed plugins and what the rest of epp
//! takes from them — the scheduler with its profiles, the health policy, the saturation
//! detector's thresholds, the parsers, the served verifier, the data-layer settings and the
//! feature gates. Every problem of the document is reported together.

use super::datalayer::{file_discovery, FileDiscovery};
use super::plugin::{NamedPlugin, Plugin};
use super::{
    check, ConfigError, EndpointPickerConfig, FeatureGates, FlowSettings, LoadOptions,
    MetricsSettings, PluginKind, Problem, Support,
};
use crate::admission;
use crate::datastore::ejection::HealthPolicy;
use crate::request::{ParserKind, ParserSet};
use crate::scheduling::{self, BuildError, Profile, Scheduler};

/// A configuration decoded and validated.
#[derive(Clone, Debug)]
pub struct Config {
    /// Every configured plugin, typed, in configuration order.
    pub(crate) plugins: Vec<NamedPlugin>,
    pub(crate) scheduler: Scheduler,
    /// Outlier detection and slow start (`outlier-detection`, `slow-start` plugins).
    pub(crate) health: HealthPolicy,
    /// The saturation detector's thresholds (`saturationDetector`, else the first
    /// `utilization-detector`, else upstream's defaults).
    pub(crate) thresholds: admission::Thresholds,
    /// Which parser reads a request, by path (`requestHandler.parsers`; upstream's default).
    pub(crate) parsers: ParserSet,
    /// `destination-endpoint-served-verifier` is configured.
    pub(crate) served_verifier: bool,
    /// `agent-identity`'s session headers, in the order they are read, when configured.
    pub(crate) agent_identity: Option<Vec<String>>,
    /// The `probabilistic-admitter`s, in configuration order (each may refuse a sheddable
    /// request before scheduling).
    pub(crate) admitters: Vec<admission::probabilistic::Probabilistic>,
    /// Flow control: the `flowControl` gate and the limits of the `flowControl` section.
    pub(crate) flow: FlowSettings,
    /// What the data-layer plugins say about scraping.
    pub(crate) metrics_settings: MetricsSettings,
    /// The `file-discovery` plugin `dataLayer.discovery` names: endpoints from its file, not
    /// from Kubernetes.
    pub(crate) file_discovery: Option<FileDiscovery>,
    /// `requestHandler.propagatePriority` (llm-d.ai/v1): the resolved priority is written into
    /// the forwarded body's top-level `priority`.
    pub(crate) propagate_priority: bool,
}

impl Config {
    /// Decodes a parsed document: the structural checks, every plugin, then the profiles.
    pub(crate) fn decode(
        doc: &EndpointPickerConfig,
        load: LoadOptions,
    ) -> Result<Self, ConfigError> {
        let mut problems = check(doc);
        let gates = FeatureGates::parse(&doc.feature_gates).unwrap_or_default();
        let plugins = decode_plugins(doc, load, &mut problems);
        let scheduler = assemble(doc, &plugins).map_err(|p| problems.extend(p)).ok();
        let parsers = parsers(doc, &plugins, &mut problems);
        let flow =
            FlowSettings::decode(gates, doc.flow_control.as_ref(), &plugins).unwrap_or_else(|p| {
                problems.extend(p);
                FlowSettings::default()
            });
        match scheduler {
            Some(scheduler) if problems.is_empty() => Ok(Self {
                scheduler,
                health: health(&plugins),
                thresholds: thresholds(doc, &plugins),
                parsers,
                served_verifier: plugins
                    .iter()
                    .any(|p| matches!(p.plugin, Plugin::ServedVerifier)),
                agent_identity: plugins.iter().find_map(|p| match &p.plugin {
                    Plugin::AgentIdentity(h) => Some(h.clone()),
                    _ => None,
                }),
                admitters: plugins
                    .iter()
                    .filter_map(|p| match p.plugin {
                        Plugin::ProbabilisticAdmitter(a) => Some(a),
                        _ => None,
                    })
                    .collect(),
                flow,
                metrics_settings: MetricsSettings::from_plugins(&plugins),
                file_discovery: file_discovery(doc.data_layer.as_ref(), &plugins),
                propagate_priority: doc
                    .request_handler
                    .as_ref()
                    .is_some_and(|h| h.propagate_priority),
                plugins,
            }),
            _ => Err(problems.into()),
        }
    }
}

/// The scheduler of a parsed document (its plugins and profiles; no structural checks).
pub fn scheduler(doc: &EndpointPickerConfig, load: LoadOptions) -> Result<Scheduler, Vec<Problem>> {
    let mut problems = Vec::new();
    let plugins = decode_plugins(doc, load, &mut problems);
    match assemble(doc, &plugins) {
        Ok(s) if problems.is_empty() => Ok(s),
        Ok(_) => Err(problems),
        Err(p) => {
            problems.extend(p);
            Err(problems)
        }
    }
}

/// Every plugin that decodes; the problems of the others go to `problems`.
fn decode_plugins(
    doc: &EndpointPickerConfig,
    load: LoadOptions,
    problems: &mut Vec<Problem>,
) -> Vec<NamedPlugin> {
    let mut plugins = Vec::with_capacity(doc.plugins.len());
    for spec in &doc.plugins {
        match NamedPlugin::decode(spec, load) {
            Ok(p) => plugins.push(p),
            Err(p) => problems.extend(p),
        }
    }
    plugins
}

/// The scheduler from the scheduling plugins and the document's profiles.
fn assemble(
    doc: &EndpointPickerConfig,
    plugins: &[NamedPlugin],
) -> Result<Scheduler, Vec<Problem>> {
    let sched: Vec<(&str, &scheduling::Plugin)> = plugins
        .iter()
        .filter_map(|p| Some((p.name.as_str(), p.scheduling()?)))
        .collect();
    let profiles: Vec<Profile<'_>> = doc
        .scheduling_profiles
        .iter()
        .map(|p| Profile {
            name: &p.name,
            plugins: p
                .plugins
                .iter()
                .map(|r| (r.plugin_ref.as_str(), r.weight.unwrap_or(1.0)))
                .collect(),
        })
        .collect();
    scheduling::assemble(&sched, &profiles)
        .map_err(|errors| errors.into_iter().map(problem).collect())
}

/// A profile problem as the configuration reports it.
fn problem(e: BuildError) -> Problem {
    match e {
        BuildError::NotADecider { ref handler, .. } => Problem::Parameters {
            plugin: handler.clone(),
            message: e.to_string(),
        },
        BuildError::UnknownDecider {
            handler,
            field,
            plugin,
        } => Problem::Reference {
            path: format!("plugin {handler:?} parameters {field}"),
            plugin,
        },
        e => Problem::Profile(e.to_string()),
    }
}

/// Listing `outlier-detection` or `slow-start` turns it on (they need no profile entry).
fn health(plugins: &[NamedPlugin]) -> HealthPolicy {
    let mut policy = HealthPolicy::default();
    for p in plugins {
        match &p.plugin {
            Plugin::OutlierDetection(o) => policy.outlier = Some(o.clone()),
            Plugin::SlowStart(s) => policy.slow_start = Some(s.clone()),
            _ => {}
        }
    }
    policy
}

/// The thresholds of the saturation detector: the plugin `saturationDetector.pluginRef` names
/// (a type name not configured as a plugin is that type with its defaults, as upstream
/// instantiates it), else the first `utilization-detector`, else the defaults.
fn thresholds(doc: &EndpointPickerConfig, plugins: &[NamedPlugin]) -> admission::Thresholds {
    let detector = match doc.saturation_detector_ref() {
        Some(name) => plugins.iter().find(|p| p.name == name),
        None => plugins
            .iter()
            .find(|p| matches!(p.plugin, Plugin::UtilizationDetector(_))),
    };
    let by_type = doc
        .saturation_detector_ref()
        .filter(|_| detector.is_none())
        .and_then(PluginKind::from_name);
    match (detector.map(|p| &p.plugin), by_type) {
        (Some(Plugin::UtilizationDetector(t)), _) => *t,
        (Some(Plugin::ConcurrencyDetector(c)), _) => admission::Thresholds {
            concurrency: Some(*c),
            ..admission::Thresholds::default()
        },
        (None, Some(PluginKind::ConcurrencyDetector)) => admission::Thresholds {
            concurrency: Some(admission::concurrency::Concurrency::default()),
            ..admission::Thresholds::default()
        },
        _ => admission::Thresholds::default(),
    }
}

/// The parsers `requestHandler.parsers` (or the deprecated top-level `parser`) names, in
/// order; upstream's default when none is named. A reference to a parser type that is not
/// configured as a plugin instantiates that type, as upstream does.
fn parsers(
    doc: &EndpointPickerConfig,
    plugins: &[NamedPlugin],
    problems: &mut Vec<Problem>,
) -> ParserSet {
    let mut kinds: Vec<ParserKind> = Vec::new();
    for r in doc.parser_refs() {
        if let Some(p) = plugins.iter().find(|p| p.name == r) {
            if let Plugin::Parser(k) = p.plugin {
                kinds.push(k);
            }
            continue;
        }
        let Some(kind) = PluginKind::from_name(r) else {
            continue; // an undefined reference: `check` reported it
        };
        if let Support::Unsupported(why) = kind.support() {
            problems.push(Problem::UnsupportedPlugin {
                plugin: r.to_owned(),
                kind,
                why,
            });
        } else if let Some(k) = ParserKind::of(kind) {
            kinds.push(k);
        }
    }
    ParserSet::from_kinds(kinds)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every EndpointPickerConfig shipped for epp (examples and benchmark configs; not the
    /// `hack/bench/llmd-*.yaml` the llm-d peer runs with) decodes, alpha plugins allowed as
    /// their docs say to run them.
    #[test]
    fn every_shipped_configuration_decodes() {
        let root = env!("CARGO_MANIFEST_DIR");
        let mut seen = 0;
        for dir in ["config/examples", "hack/bench"] {
            let mut paths: Vec<_> = std::fs::read_dir(format!("{root}/{dir}"))
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
                .filter(|p| {
                    !p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("llmd-"))
                })
                .collect();
            paths.sort();
            for path in paths {
                // The bench fills these in per run (`e2e/loadgen/src/bench/upstream.rs`).
                let text = std::fs::read_to_string(&path)
                    .unwrap()
                    .replace("${RENDER_URL}", "http://127.0.0.1:8000")
                    .replace("${KV_EVENTS_ENDPOINT}", "tcp://127.0.0.1:5557");
                if !text.contains("kind: EndpointPickerConfig") {
                    continue;
                }
                let doc = super::super::parse_document(&text)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                let load = LoadOptions {
                    allow_experimental: true,
                };
                Config::decode(&doc, load).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                seen += 1;
            }
        }
        assert!(seen >= 20, "{seen} configurations");
    }
}

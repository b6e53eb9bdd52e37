//! Every `plugins[]` entry decoded once, strictly, into the typed value of the module that owns
//! it: a [`NamedPlugin`] whose [`Plugin`] carries the plugin's validated parameters (a
//! scheduling filter, scorer or picker, a saturation detector's thresholds, a health policy,
//! a data-layer setting, a parser), ready to use.
//!
//! This is where a `type:` name meets its parameters. Each owner keeps its parameter type next
//! to what it does with it (one plugin per file) and checks its values, returning [`Invalid`]
//! for each parameter it cannot take. Filters, scorers and pickers build themselves
//! (`Filter::from_plugin`, `Scorer::from_plugin`, `Picker::from_plugin`) from the parameters
//! handed over as [`Parameters`], so a new one needs no arm here; the other kinds have theirs
//! in `typed`. The decoder reports every problem of every plugin together, each naming the
//! plugin and the parameter. An unknown parameter is a decoding error naming it
//! (`deny_unknown_fields`, as upstream's strict decoder).

use super::{check_type, LoadOptions, PluginSpec, Problem};
use crate::admission::{self, concurrency::Concurrency};
use crate::datastore::ejection::{OutlierParams, SlowStartParams};
use crate::plugin::{Invalid, Parameters, PluginKind, Support};
use crate::request::ParserKind;
use crate::scheduling::disagg::{self, cost::CostBasedPdDecider, p2p::P2pSourceProducer, Decider};
use crate::scheduling::filter::Filter;
use crate::scheduling::inflight_load::InflightLoadParams;
use crate::scheduling::picker::Picker;
use crate::scheduling::scorer::{self, Scorer};
use crate::scheduling::Plugin as Sched;
use serde_norway::Value;

pub use super::datalayer::{ExtractorParams, FileDiscovery, FileDiscoveryParams, SourceParams};
use super::multicluster::{
    ClusterExtractor, ClusterExtractorParams, ClusterSource, ClusterSourceParams,
};

/// One configured plugin: its instance name, its kind and what it decoded to.
#[derive(Clone, Debug)]
pub struct NamedPlugin {
    pub(crate) name: String,
    pub kind: PluginKind,
    pub plugin: Plugin,
}

/// A plugin's typed, validated parameters, as the module that uses them takes them.
#[derive(Clone, Debug)]
pub enum Plugin {
    /// A filter, scorer, picker, decider, profile handler or prefix producer
    /// ([`crate::scheduling::assemble`] builds the profiles from them).
    Scheduling(Sched),
    /// `outlier-detection`: passive health.
    OutlierDetection(OutlierParams),
    /// `slow-start`: the share of a new or restored endpoint ramps up.
    SlowStart(SlowStartParams),
    /// `utilization-detector`: the saturation thresholds.
    UtilizationDetector(admission::Thresholds),
    /// `concurrency-detector`: saturation from epp's own in-flight load.
    ConcurrencyDetector(Concurrency),
    /// `metrics-data-source`: where the endpoints' metrics are.
    MetricsDataSource(SourceParams),
    /// `core-metrics-extractor`: which engine's metric names apply.
    CoreMetricsExtractor(ExtractorParams),
    /// `file-discovery` or `multicluster-file-discovery`: endpoints (or a hub's clusters) from
    /// a file (used when `dataLayer.discovery` names it).
    FileDiscovery(FileDiscovery),
    /// `multicluster-metrics-data-source`: how a hub scrapes its spokes' EPPs.
    ClusterMetricsSource(ClusterSource),
    /// `multicluster-metrics-extractor`: which series carry a spoke's pool aggregates.
    ClusterMetricsExtractor(ClusterExtractor),
    /// A request parser (`requestHandler.parsers` names it).
    Parser(ParserKind),
    /// `destination-endpoint-served-verifier`: the conformance echo of the served endpoint.
    ServedVerifier,
    /// `program-aware-fairness`: its least-attained-service strategy (a band's
    /// `fairnessPolicyRef` names it).
    ProgramAware(super::flow::Las),
    /// `priority-holdback-policy` or `soft-reflective-ceiling-policy`
    /// (`flowControl.usageLimitPolicyPluginRef` names it).
    UsageLimit(super::UsageLimit),
    /// `agent-identity`: the session headers (`additionalSessionHeaders` first, then
    /// upstream's four) whose first non-empty value is the fairness key of a request that
    /// names none.
    AgentIdentity(Vec<String>),
    /// `probabilistic-admitter`: sheddable requests refused with a probability rising with
    /// the candidates' saturation.
    ProbabilisticAdmitter(admission::probabilistic::Probabilistic),
    /// `token-producer` (or its legacy name `tokenizer`): the render backend, `None` for
    /// upstream's `estimate` backend (epp's in-process tokenizer).
    TokenProducer(Option<crate::request::render::RenderParams>),
    /// Accepted; epp does this itself without a plugin (the registry says where).
    BuiltIn,
}

impl NamedPlugin {
    /// Decodes one entry: its type (unknown, unsupported and alpha types refused), then its
    /// parameters. Every problem with the entry is returned.
    pub fn decode(spec: &PluginSpec, load: LoadOptions) -> Result<Self, Vec<Problem>> {
        let kind = check_type(spec, load).map_err(|p| vec![p])?;
        let params = spec.parameters.as_ref().unwrap_or(&Value::Null);
        let mut plugin = typed(kind, params).map_err(|r| r.problems(spec.name()))?;
        match &mut plugin {
            Plugin::Scheduling(Sched::Filter(f)) => f.name_instance(spec.name()),
            Plugin::Scheduling(Sched::Producer(p)) => p.name_instance(spec.name()),
            _ => {}
        }
        Ok(Self {
            name: spec.name().to_owned(),
            kind,
            plugin,
        })
    }

    /// The scheduling plugin, if this is one.
    pub(crate) fn scheduling(&self) -> Option<&Sched> {
        match &self.plugin {
            Plugin::Scheduling(s) => Some(s),
            _ => None,
        }
    }
}

/// Why a plugin's parameters were refused.
#[derive(Debug)]
enum Refused {
    /// Not the parameter type's shape: an unknown parameter, a wrong type.
    Decode(serde_norway::Error),
    /// Values the plugin cannot take, every one of them.
    Invalid(Vec<Invalid>),
}

impl Refused {
    fn problems(self, plugin: &str) -> Vec<Problem> {
        let problem = |message: String| Problem::Parameters {
            plugin: plugin.to_owned(),
            message,
        };
        match self {
            Self::Decode(e) => vec![problem(e.to_string())],
            Self::Invalid(all) => all.iter().map(|i| problem(i.to_string())).collect(),
        }
    }
}

impl From<serde_norway::Error> for Refused {
    fn from(e: serde_norway::Error) -> Self {
        Self::Decode(e)
    }
}

impl From<Invalid> for Refused {
    fn from(e: Invalid) -> Self {
        Self::Invalid(vec![e])
    }
}

impl From<Vec<Invalid>> for Refused {
    fn from(e: Vec<Invalid>) -> Self {
        Self::Invalid(e)
    }
}

/// Test support: a plugin's parameters from YAML text, decoded as [`params`] does; the error
/// as text.
#[cfg(test)]
pub(crate) fn params_yaml<T: serde::de::DeserializeOwned + Default>(
    yaml: &str,
) -> Result<T, String> {
    let v: Value = serde_norway::from_str(yaml).map_err(|e| e.to_string())?;
    params(&v).map_err(|e| e.to_string())
}

/// Decodes parameters strictly; absent (null) parameters mean the type's defaults.
pub(crate) fn params<T: serde::de::DeserializeOwned + Default>(
    v: &Value,
) -> Result<T, serde_norway::Error> {
    if v.is_null() {
        Ok(T::default())
    } else {
        serde_norway::from_value(v.clone())
    }
}

/// A plugin's YAML `parameters`, handed to the module that decodes its own plugins.
struct Yaml<'a>(&'a Value);

impl Parameters for Yaml<'_> {
    type Error = Refused;

    fn decode<T: serde::de::DeserializeOwned + Default>(&self) -> Result<T, Refused> {
        Ok(params(self.0)?)
    }

    fn names(&self, key: &str) -> bool {
        self.0.get(key).is_some()
    }
}

/// `agent-identity` (llm-d v0.10) parameters.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
struct AgentIdentityParams {
    additional_session_headers: Vec<String>,
}

pub(crate) use crate::request::headers::AGENT_SESSION_HEADERS;

/// `models-data-source` (llm-d v0.10) parameters, checked strictly as upstream decodes them;
/// nothing reads them (no v0.10 plugin consumes the models it collects).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
#[allow(dead_code)] // decoded for the check only
struct ModelsSourceParams {
    scheme: String,
    path: String,
    insecure_skip_verify: bool,
    ca_cert_path: String,
    client_cert_path: String,
    client_key_path: String,
    interval: String,
}

/// `session-id-producer` (llm-d v0.10): exactly one of a header or a cookie names the session.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
struct SessionIdProducerParams {
    header_name: String,
    cookie_name: String,
}

impl SessionIdProducerParams {
    /// Upstream's check and message.
    fn validate(self) -> Result<(), Invalid> {
        let (header, cookie) = (self.header_name.trim(), self.cookie_name.trim());
        match (header.is_empty(), cookie.is_empty()) {
            (false, true) | (true, false) => Ok(()),
            (true, true) => Err(Invalid::new(
                "headerName, cookieName",
                "'session-id-producer' requires exactly one of headerName or cookieName to be set",
            )),
            (false, false) => Err(Invalid::new(
                "headerName, cookieName",
                "'session-id-producer' requires exactly one of headerName or cookieName to be set, not both",
            )),
        }
    }
}

/// The typed value of a `kind` plugin with parameters `v`.
fn typed(kind: PluginKind, v: &Value) -> Result<Plugin, Refused> {
    use PluginKind as K;
    let plugin = match kind {
        K::OutlierDetection => Plugin::OutlierDetection(params::<OutlierParams>(v)?.validate()?),
        K::SlowStart => Plugin::SlowStart(params::<SlowStartParams>(v)?.validate()?),
        K::UtilizationDetector => {
            Plugin::UtilizationDetector(admission::Thresholds::from_params(params(v)?)?)
        }
        K::ConcurrencyDetector => {
            Plugin::ConcurrencyDetector(Concurrency::from_params(params(v)?)?)
        }
        K::MetricsDataSource => Plugin::MetricsDataSource(params::<SourceParams>(v)?.validate()?),
        K::CoreMetricsExtractor => {
            Plugin::CoreMetricsExtractor(params::<ExtractorParams>(v)?.validate()?)
        }
        K::FileDiscovery => Plugin::FileDiscovery(params::<FileDiscoveryParams>(v)?.validate()?),
        K::MulticlusterFileDiscovery => Plugin::FileDiscovery(FileDiscovery {
            clusters: true,
            ..params::<FileDiscoveryParams>(v)?.validate()?
        }),
        K::MulticlusterMetricsDataSource => {
            Plugin::ClusterMetricsSource(params::<ClusterSourceParams>(v)?.validate()?)
        }
        K::MulticlusterMetricsExtractor => {
            Plugin::ClusterMetricsExtractor(params::<ClusterExtractorParams>(v)?.validate()?)
        }
        K::DestinationEndpointServedVerifier => Plugin::ServedVerifier,
        K::ProgramAwareFairness => {
            Plugin::ProgramAware(params::<super::flow::ProgramAwareParams>(v)?.validate()?)
        }
        K::PriorityHoldbackPolicy => Plugin::UsageLimit(super::UsageLimit::Holdback(
            params::<super::usage_limit::HoldbackParams>(v)?.validate()?,
        )),
        K::SoftReflectiveCeilingPolicy => {
            params::<super::usage_limit::NoParams>(v)?;
            Plugin::UsageLimit(super::UsageLimit::SoftReflective)
        }
        K::AgentIdentity => {
            let p = params::<AgentIdentityParams>(v)?;
            let headers = p
                .additional_session_headers
                .iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .filter(|h| !h.is_empty())
                .chain(AGENT_SESSION_HEADERS.iter().map(|h| (*h).to_owned()))
                .collect();
            Plugin::AgentIdentity(headers)
        }
        K::ProbabilisticAdmitter => Plugin::ProbabilisticAdmitter(
            params::<admission::probabilistic::ProbabilisticParams>(v)?.validate()?,
        ),
        K::TokenProducer | K::Tokenizer => Plugin::TokenProducer(
            params::<crate::request::render::TokenProducerParams>(v)?.render()?,
        ),
        K::SessionIdProducer => {
            params::<SessionIdProducerParams>(v)?.validate()?;
            Plugin::BuiltIn
        }
        K::InflightLoadProducer => {
            params::<InflightLoadParams>(v)?.validate()?;
            Plugin::BuiltIn
        }
        K::ModelsDataSource => {
            params::<ModelsSourceParams>(v)?;
            Plugin::BuiltIn
        }
        _ => match (ParserKind::of(kind), scheduling_plugin(kind, v)?) {
            (Some(parser), _) => Plugin::Parser(parser),
            (None, Some(s)) => Plugin::Scheduling(s),
            (None, None) => Plugin::BuiltIn,
        },
    };
    debug_assert!(
        !matches!(plugin, Plugin::BuiltIn) || kind.support() != Support::Plugin,
        "{kind} is a plugin of epp's but decoded to nothing"
    );
    Ok(plugin)
}

/// The scheduling plugin of `kind`, `None` for a kind that is none.
fn scheduling_plugin(kind: PluginKind, v: &Value) -> Result<Option<Sched>, Refused> {
    use PluginKind as K;
    Ok(Some(match kind {
        // The hub's producer is this one (llm-d: "delegates without change"): a hub's candidates
        // are its clusters, so the index records (cluster, block).
        K::ApproxPrefixCacheProducer | K::MulticlusterApproxPrefixCacheProducer => {
            Sched::Prefix(scorer::prefix_params(&Yaml(v))?)
        }
        K::PrecisePrefixCacheProducer => Sched::PreciseProducer(Box::new(
            params::<scorer::PrecisePrefixParams>(v)?.validate()?,
        )),
        K::P2pSourceProducer => Sched::P2p(params::<P2pSourceProducer>(v)?.validate()?),
        K::DisaggProfileHandler => Sched::Handler(kind, disagg::HandlerParams::disagg(v)?),
        K::PdProfileHandler => Sched::Handler(kind, disagg::HandlerParams::pd(v)?),
        K::DataParallelProfileHandler => Sched::DataParallel(
            params::<crate::scheduling::data_parallel::DataParallel>(v)?.validate()?,
        ),
        K::HeaderProfileHandler => Sched::HeaderHandler(
            params::<crate::scheduling::header_profile::HeaderProfileParams>(v)?.validate()?,
        ),
        K::PrefixBasedPdDecider => Sched::Decider(Decider::PrefixBased(
            params::<disagg::PrefixBasedPdDecider>(v)?.validate()?,
        )),
        // As upstream, the two `always-*` deciders ignore whatever parameters they are given.
        K::AlwaysDisaggPdDecider => Sched::Decider(Decider::AlwaysPd),
        K::AlwaysDisaggMultimodalDecider => Sched::Decider(Decider::AlwaysMultimodal),
        K::CostBasedPdDecider => Sched::Decider(Decider::CostBased(Box::new(
            params::<CostBasedPdDecider>(v)?.validate()?,
        ))),
        _ => {
            if let Some(f) = Filter::from_plugin(kind, &Yaml(v))? {
                Sched::Filter(f)
            } else if let Some(s) = Scorer::from_plugin(kind, &Yaml(v))? {
                Sched::Scorer(s)
            } else if let Some(p) = Picker::from_plugin(kind, &Yaml(v))? {
                Sched::Picker(p)
            } else if let Some(p) = crate::scheduling::producer::from_plugin(kind, &Yaml(v))? {
                Sched::Producer(p)
            } else if let Some(t) = crate::scheduling::topology::from_plugin(kind, &Yaml(v))? {
                Sched::Topology(t)
            } else {
                return Ok(None);
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::Category;

    #[test]
    fn every_plugin_of_epps_decodes_to_something_it_uses() {
        // Parameters a plugin cannot go without; every other one decodes from its defaults.
        let required = |k: PluginKind| {
            match k {
            K::ByLabel => "{label: tier, validValues: [a]}",
            K::UtilizationFilter => "{conditions: [{metric: waiting-queue, maxValue: 4}]}",
            K::ActiveRequestFilter => "{maxRequests: 4}",
            K::RequestAttributeReporter => "{attributes: [{key: {name: cost}, expression: usage.total_tokens}]}",
            K::FileDiscovery | K::MulticlusterFileDiscovery => "{path: /etc/epp/endpoints.yaml}",
            K::HeaderLabelAffinityScorer => "{headerName: x-zone, labelKey: zone}",
            K::PriorityHoldbackPolicy => "{minCeiling: 0.5}",
            K::EndpointAttributeFilter => {
                "{attribute: a, algorithm: {type: threshold, threshold: {operator: Equal, value: 1}}}"
            }
            K::EndpointAttributeScorer => "{attributeKey: a, algorithm: {type: linear_lower_is_better}}",
            K::DisaggregatedsetRolloutScreener => {
                "{scope: {labelSelector: a=b}, revisionGating: {mode: disabled}}"
            }
            _ => "",
        }
        };
        use PluginKind as K;
        for &k in PluginKind::ALL {
            if k.support() != Support::Plugin {
                continue;
            }
            let v: Value = serde_norway::from_str(required(k)).unwrap();
            let plugin = typed(k, &v).unwrap_or_else(|e| panic!("{k}: {e:?}"));
            let used = matches!(
                (&plugin, k.category()),
                (Plugin::Scheduling(Sched::Filter(_)), Category::Filter)
                    | (Plugin::Scheduling(Sched::Scorer(_)), Category::Scorer)
                    | (Plugin::Scheduling(Sched::Picker(_)), Category::Picker)
                    | (
                        Plugin::Scheduling(
                            Sched::Handler(..) | Sched::HeaderHandler(_) | Sched::DataParallel(_)
                        ),
                        Category::ProfileHandler
                    )
                    | (Plugin::Scheduling(Sched::Decider(_)), Category::Decider)
                    | (
                        Plugin::Scheduling(
                            Sched::Prefix(_)
                                | Sched::PreciseProducer(_)
                                | Sched::P2p(_)
                                | Sched::Producer(_)
                        ),
                        Category::DataProducer
                    )
                    | (
                        Plugin::OutlierDetection(_) | Plugin::SlowStart(_),
                        Category::Health
                    )
                    | (
                        Plugin::UtilizationDetector(_) | Plugin::ConcurrencyDetector(_),
                        Category::Saturation
                    )
                    | (
                        Plugin::Scheduling(Sched::Producer(_)),
                        Category::RequestControl
                    )
                    | (
                        Plugin::ServedVerifier
                            | Plugin::ProbabilisticAdmitter(_)
                            | Plugin::AgentIdentity(_),
                        Category::RequestControl
                    )
                    | (Plugin::TokenProducer(_), Category::DataProducer)
                    | (Plugin::Scheduling(Sched::Topology(_)), Category::DataLayer)
                    | (Plugin::Parser(_), Category::Parser)
                    | (
                        Plugin::FileDiscovery(_)
                            | Plugin::ClusterMetricsSource(_)
                            | Plugin::ClusterMetricsExtractor(_),
                        Category::DataLayer
                    )
                    | (
                        Plugin::ProgramAware(_) | Plugin::UsageLimit(_),
                        Category::FlowControl
                    )
            );
            assert!(used, "{k} decoded to {plugin:?}");
        }
    }

    #[test]
    fn every_invalid_parameter_is_reported_with_the_plugin_and_the_parameter() {
        let spec: PluginSpec = serde_norway::from_str(
            "{name: s, type: slow-start, parameters: {aggression: 0, minWeightPercent: 200}}",
        )
        .unwrap();
        let problems = NamedPlugin::decode(&spec, LoadOptions::default()).unwrap_err();
        let all: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(
            all,
            [
                "plugin \"s\" parameters: aggression must be a number greater than zero",
                "plugin \"s\" parameters: minWeightPercent must be in 0..=100",
            ]
        );
        let spec: PluginSpec =
            serde_norway::from_str("{type: queue-scorer, parameters: {depth: 3}}").unwrap();
        let err = NamedPlugin::decode(&spec, LoadOptions::default()).unwrap_err();
        assert_eq!(err.len(), 1);
        let text = err[0].to_string();
        assert!(
            text.starts_with("plugin \"queue-scorer\" parameters: unknown field `depth`"),
            "{text}"
        );
    }

    #[test]
    fn the_session_id_producer_is_accepted_with_exactly_one_source() {
        let decode = |params: &str| {
            let spec: PluginSpec = serde_norway::from_str(&format!(
                "{{type: session-id-producer, parameters: {params}}}"
            ))
            .unwrap();
            NamedPlugin::decode(&spec, LoadOptions::default())
                .map(|p| p.plugin)
                .map_err(|e| {
                    e.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ")
                })
        };
        assert!(matches!(
            decode("{headerName: x-session-id}"),
            Ok(Plugin::BuiltIn)
        ));
        assert!(matches!(
            decode("{cookieName: llm-d-session}"),
            Ok(Plugin::BuiltIn)
        ));
        for (bad, says) in [
            ("{}", "exactly one of headerName or cookieName"),
            (
                "{headerName: ' '}",
                "exactly one of headerName or cookieName",
            ),
            ("{headerName: a, cookieName: b}", "not both"),
            ("{header: a}", "unknown field `header`"),
        ] {
            let e = decode(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}

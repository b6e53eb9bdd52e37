//! Flow control as the document configures it: `featureGates: [flowControl]` turns it on (as
//! upstream), and the `flowControl` section's limits override the command line's
//! (`--flow-control-*`). Both reload: the extproc adapter reads `enabled` per stream, and the
//! live configuration hands the limits to the queue when it is swapped.
//!
//! Quantities are Kubernetes quantities as upstream reads them (`500`, `10Gi`, `1G`); the TTL is
//! a Go duration (`30s`, `1m30s`). Each band's policies (`fairnessPolicyRef` and
//! `orderingPolicyRef` of `defaultPriorityBand` and of each `priorityBands` entry) are read:
//! upstream's default `global-strict-fairness-policy` or `round-robin-fairness-policy`
//! ([`Fairness`]); `fcfs-ordering-policy` (the default), `edf-ordering-policy` or
//! `slo-deadline-ordering-policy` ([`QueueOrder`]). What epp's queue does not model (a listed
//! band's own limits, eviction) is accepted and not read.

use super::plugin::NamedPlugin;
use super::{FeatureGates, FlowControlSpec, PluginKind, Problem};
use std::time::Duration;

/// How a priority band chooses the next request among its fairness keys
/// (`x-gateway-inference-fairness-id`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) enum Fairness {
    /// `global-strict-fairness-policy`, upstream's default: the band's first request by its
    /// ordering, whatever its key (one queue; a burst from one key delays the others).
    #[default]
    GlobalStrict,
    /// `round-robin-fairness-policy`: the keys with waiting requests take turns.
    RoundRobin,
    /// `program-aware-fairness` (llm-d v0.10, strategy `las`): the key (program) with the
    /// least attained service, in weighted tokens decayed over time, and the longest-waiting
    /// first request, by the weighted sum of both range-normalised over the waiting keys.
    ProgramAware(Las),
}

/// `program-aware-fairness`'s least-attained-service strategy (upstream's parameters).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Las {
    /// `lasWeightService` (0.8): weight of the inverted attained service.
    pub(crate) weight_service: f64,
    /// `lasWeightHeadWait` (0.2): weight of the first request's wait.
    pub(crate) weight_head_wait: f64,
    /// `lasHalfLifeSeconds` (60; 0: no decay).
    pub(crate) half_life_s: f64,
    /// `evictionTtlSeconds` (3600): a program with no completion for this long is forgotten.
    pub(crate) eviction_ttl: Duration,
    /// `evictionSweepSeconds` (300): how often forgotten programs are looked for.
    pub(crate) eviction_sweep: Duration,
}

/// `program-aware-fairness` parameters, as configured.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub(crate) struct ProgramAwareParams {
    strategy: String,
    eviction_ttl_seconds: f64,
    eviction_sweep_seconds: f64,
    las_weight_service: f64,
    las_weight_head_wait: f64,
    las_half_life_seconds: f64,
}

impl Default for ProgramAwareParams {
    fn default() -> Self {
        Self {
            strategy: "las".into(),
            eviction_ttl_seconds: 3600.0,
            eviction_sweep_seconds: 300.0,
            las_weight_service: 0.8,
            las_weight_head_wait: 0.2,
            las_half_life_seconds: 60.0,
        }
    }
}

impl ProgramAwareParams {
    /// Upstream's checks and messages, every failing one reported.
    pub(crate) fn validate(self) -> Result<Las, Vec<crate::plugin::Invalid>> {
        use crate::plugin::Invalid;
        let mut problems = Vec::new();
        let mut check = |name: &'static str, v: f64, strict: bool| {
            let ok = v.is_finite() && if strict { v > 0.0 } else { v >= 0.0 };
            if !ok {
                let op = if strict { ">" } else { ">=" };
                problems.push(Invalid::new(
                    name,
                    format!("{name} must be {op} 0, got {v}"),
                ));
            }
        };
        check("evictionTtlSeconds", self.eviction_ttl_seconds, false);
        check("evictionSweepSeconds", self.eviction_sweep_seconds, true);
        check("lasWeightService", self.las_weight_service, false);
        check("lasWeightHeadWait", self.las_weight_head_wait, false);
        check("lasHalfLifeSeconds", self.las_half_life_seconds, false);
        if !matches!(self.strategy.as_str(), "las" | "") {
            problems.push(Invalid::new(
                "strategy",
                format!(
                    "unknown strategy {:?} (only \"las\" is supported)",
                    self.strategy
                ),
            ));
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Las {
            weight_service: self.las_weight_service,
            weight_head_wait: self.las_weight_head_wait,
            half_life_s: self.las_half_life_seconds,
            eviction_ttl: Duration::from_secs_f64(self.eviction_ttl_seconds.min(1e9)),
            eviction_sweep: Duration::from_secs_f64(self.eviction_sweep_seconds.min(1e9)),
        })
    }
}

/// How the requests of one fairness key are ordered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum QueueOrder {
    /// `fcfs-ordering-policy`, upstream's default, and `edf-ordering-policy`: upstream's
    /// deadline is a request's arrival plus its TTL, and epp gives every request the same TTL,
    /// so the earliest deadline is the earliest arrival.
    #[default]
    Fcfs,
    /// `slo-deadline-ordering-policy`: the earliest arrival plus `x-llm-d-slo-ttft-ms` (or
    /// `x-slo-ttft-ms`) first; requests without one after those with one, first come first.
    SloDeadline,
}

/// A priority band's policies.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct BandPolicy {
    pub(crate) fairness: Fairness,
    pub(crate) order: QueueOrder,
}

/// Whether requests wait in epp while the pool is saturated, and the limits the document sets
/// (`None`: the command line's value applies).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct FlowSettings {
    /// The `flowControl` feature gate.
    pub(crate) enabled: bool,
    /// `flowControl.maxRequests`.
    pub(crate) max_requests: Option<u64>,
    /// `flowControl.maxBytes`.
    pub(crate) max_bytes: Option<u64>,
    /// `flowControl.defaultPriorityBand.maxBytes`.
    pub(crate) band_max_bytes: Option<u64>,
    /// `flowControl.defaultRequestTTL`.
    pub(crate) ttl: Option<Duration>,
    /// The policies of bands `priorityBands` does not list (`defaultPriorityBand`).
    pub(crate) default_band: BandPolicy,
    /// The policies of the bands `priorityBands` lists, by priority.
    pub(crate) bands: Vec<(i64, BandPolicy)>,
    /// The usage limit policy `usageLimitPolicyPluginRef` names.
    pub(crate) usage_limit: super::UsageLimit,
}

impl FlowSettings {
    /// The settings of a document's gates and `flowControl` section; every bad value reported.
    /// `plugins` are the document's, which a `fairnessPolicyRef` names.
    pub(crate) fn decode(
        gates: FeatureGates,
        spec: Option<&FlowControlSpec>,
        plugins: &[NamedPlugin],
    ) -> Result<Self, Vec<Problem>> {
        let mut out = Self {
            enabled: gates.flow_control,
            ..Self::default()
        };
        let Some(spec) = spec else {
            return Ok(out);
        };
        let mut problems = Vec::new();
        let mut read = |path: &str, v: Option<&serde_norway::Value>| -> Option<u64> {
            let v = v?;
            quantity(v)
                .map_err(|e| {
                    problems.push(Problem::Field {
                        path: format!("flowControl.{path}"),
                        message: e.to_string(),
                    })
                })
                .ok()
        };
        out.max_requests = read("maxRequests", spec.max_requests.as_ref());
        out.max_bytes = read("maxBytes", spec.max_bytes.as_ref());
        let band = spec.default_priority_band.as_ref();
        out.band_max_bytes = read(
            "defaultPriorityBand.maxBytes",
            band.and_then(|b| b.max_bytes.as_ref()),
        );
        if let Some(ttl) = &spec.default_request_ttl {
            match crate::duration::parse(ttl) {
                Ok(d) if !d.is_zero() => out.ttl = Some(d),
                Ok(_) => problems.push(Problem::Field {
                    path: "flowControl.defaultRequestTTL".into(),
                    message: "must be greater than zero".into(),
                }),
                Err(e) => problems.push(Problem::Field {
                    path: "flowControl.defaultRequestTTL".into(),
                    message: e.to_string(),
                }),
            }
        }
        problems.extend(unread_ttls(spec));
        // As upstream, the references are resolved when the flow-control layer is built: with
        // the gate on.
        if out.enabled {
            let mut policy = |path: &str, b: Option<&super::PriorityBandSpec>| {
                let fairness = b.and_then(|b| b.fairness_policy_ref.as_deref()).map(|r| {
                    let path = format!("{path}.fairnessPolicyRef");
                    reported(&mut problems, path, fairness_named(r, plugins))
                });
                let order = b.and_then(|b| b.ordering_policy_ref.as_deref()).map(|r| {
                    let path = format!("{path}.orderingPolicyRef");
                    reported(&mut problems, path, order_named(r, plugins))
                });
                BandPolicy {
                    fairness: fairness.flatten().unwrap_or_default(),
                    order: order.flatten().unwrap_or_default(),
                }
            };
            out.default_band = policy("flowControl.defaultPriorityBand", band);
            for (i, b) in spec.priority_bands.iter().enumerate() {
                let p = policy(&format!("flowControl.priorityBands[{i}]"), Some(b));
                out.bands.push((b.priority.unwrap_or(0), p));
            }
            out.usage_limit = usage_limit(spec, plugins, &mut problems);
        }
        if problems.is_empty() {
            Ok(out)
        } else {
            Err(problems)
        }
    }
}

/// The waits epp's queue does not model (`noEndpointRequestTTL`, a band's own
/// `defaultRequestTTL`): checked as Go durations, not read.
fn unread_ttls(spec: &FlowControlSpec) -> Vec<Problem> {
    let band = |b: &super::PriorityBandSpec| b.default_request_ttl.clone();
    let mut fields = vec![
        (
            "flowControl.noEndpointRequestTTL".to_owned(),
            spec.no_endpoint_request_ttl.clone(),
        ),
        (
            "flowControl.defaultPriorityBand.defaultRequestTTL".to_owned(),
            spec.default_priority_band.as_ref().and_then(band),
        ),
        (
            "flowControl.defaultNegativePriorityBand.defaultRequestTTL".to_owned(),
            spec.default_negative_priority_band.as_ref().and_then(band),
        ),
    ];
    for (i, b) in spec.priority_bands.iter().enumerate() {
        let path = format!("flowControl.priorityBands[{i}].defaultRequestTTL");
        fields.push((path, band(b)));
    }
    fields
        .into_iter()
        .filter_map(|(path, text)| {
            let message = crate::duration::parse(&text?).err()?.to_string();
            Some(Problem::Field { path, message })
        })
        .collect()
}

/// `r`'s value, or `None` with its message recorded as the problem of `path`.
fn reported<T>(problems: &mut Vec<Problem>, path: String, r: Result<T, PolicyError>) -> Option<T> {
    r.map_err(|e| {
        problems.push(Problem::Field {
            path,
            message: e.to_string(),
        })
    })
    .ok()
}

/// Why a band's policy reference names no policy of its kind (upstream's messages).
#[derive(Debug, thiserror::Error)]
enum PolicyError {
    #[error("no fairness policy registered for name {0:?}")]
    NoFairness(String),
    #[error("plugin {name:?} is not a fairness policy (type: {kind})")]
    NotFairness { name: String, kind: PluginKind },
    #[error("no ordering policy registered for name {0:?}")]
    NoOrdering(String),
    #[error("plugin {name:?} is not an ordering policy (type: {kind})")]
    NotOrdering { name: String, kind: PluginKind },
    #[error("no usage limit policy registered for name {0:?}")]
    NoUsageLimit(String),
    #[error("plugin {name:?} is not a usage limit policy (type: {kind})")]
    NotUsageLimit { name: String, kind: PluginKind },
}

/// Why a `flowControl` limit is not a quantity.
#[derive(Debug, thiserror::Error)]
enum QuantityError {
    #[error("expected a quantity such as 500 or 10Gi, got {0}")]
    NotText(String),
    #[error("invalid quantity {0:?} (expected e.g. 500, 512Mi, 10Gi, 1G)")]
    Invalid(String),
}

/// The fairness policy `name` refers to: a plugin of the document by that name, else upstream's
/// default by its type name (registered whether declared or not); upstream's message otherwise.
fn fairness_named(name: &str, plugins: &[NamedPlugin]) -> Result<Fairness, PolicyError> {
    use PluginKind as K;
    match plugins.iter().find(|p| p.name == name) {
        None if name == K::GlobalStrictFairnessPolicy.name() => Ok(Fairness::GlobalStrict),
        None => Err(PolicyError::NoFairness(name.to_owned())),
        Some(p) => match (p.kind, &p.plugin) {
            (K::GlobalStrictFairnessPolicy, _) => Ok(Fairness::GlobalStrict),
            (K::RoundRobinFairnessPolicy, _) => Ok(Fairness::RoundRobin),
            (_, super::plugin::Plugin::ProgramAware(las)) => Ok(Fairness::ProgramAware(*las)),
            (kind, _) => Err(PolicyError::NotFairness {
                name: name.to_owned(),
                kind,
            }),
        },
    }
}

/// The usage limit policy `usageLimitPolicyPluginRef` names (upstream's static one without).
fn usage_limit(
    spec: &FlowControlSpec,
    plugins: &[NamedPlugin],
    problems: &mut Vec<Problem>,
) -> super::UsageLimit {
    let Some(r) = spec.usage_limit_policy_plugin_ref.as_deref() else {
        return super::UsageLimit::Static;
    };
    let path = "flowControl.usageLimitPolicyPluginRef".to_owned();
    reported(problems, path, limit_named(r, plugins)).unwrap_or_default()
}

/// The usage limit policy `name` refers to, found as [`fairness_named`] finds a fairness policy
/// (`static-usage-limit-policy` is upstream's default, registered whether declared or not).
fn limit_named(name: &str, plugins: &[NamedPlugin]) -> Result<super::UsageLimit, PolicyError> {
    use PluginKind as K;
    match plugins.iter().find(|p| p.name == name) {
        None if name == K::StaticUsageLimitPolicy.name() => Ok(super::UsageLimit::Static),
        None => Err(PolicyError::NoUsageLimit(name.to_owned())),
        Some(p) => match (p.kind, &p.plugin) {
            (K::StaticUsageLimitPolicy, _) => Ok(super::UsageLimit::Static),
            (_, super::plugin::Plugin::UsageLimit(limit)) => Ok(*limit),
            (kind, _) => Err(PolicyError::NotUsageLimit {
                name: name.to_owned(),
                kind,
            }),
        },
    }
}

/// The ordering policy `name` refers to, found as [`fairness_named`] finds a fairness policy.
fn order_named(name: &str, plugins: &[NamedPlugin]) -> Result<QueueOrder, PolicyError> {
    use PluginKind as K;
    match plugins.iter().find(|p| p.name == name).map(|p| p.kind) {
        None if name == K::FcfsOrderingPolicy.name() => Ok(QueueOrder::Fcfs),
        None => Err(PolicyError::NoOrdering(name.to_owned())),
        Some(K::FcfsOrderingPolicy | K::EdfOrderingPolicy) => Ok(QueueOrder::Fcfs),
        Some(K::SloDeadlineOrderingPolicy) => Ok(QueueOrder::SloDeadline),
        Some(kind) => Err(PolicyError::NotOrdering {
            name: name.to_owned(),
            kind,
        }),
    }
}

/// A non-negative Kubernetes quantity without fractions: an integer, optionally with a binary
/// (`Ki` … `Ei`) or decimal (`k` … `E`) suffix.
fn quantity(v: &serde_norway::Value) -> Result<u64, QuantityError> {
    if let Some(n) = v.as_u64() {
        return Ok(n);
    }
    let text = match v {
        serde_norway::Value::String(s) => s.trim(),
        other => return Err(QuantityError::NotText(format!("{other:?}"))),
    };
    let invalid = || QuantityError::Invalid(text.to_owned());
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let n: u64 = digits.parse().map_err(|_| invalid())?;
    let scale: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        _ => return Err(invalid()),
    };
    n.checked_mul(scale).ok_or_else(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(yaml: &str) -> Result<FlowSettings, Vec<Problem>> {
        let doc = super::super::parse(yaml).map_err(|e| e.problems)?;
        let gates = FeatureGates::parse(&doc.feature_gates)?;
        let plugins: Vec<NamedPlugin> = doc
            .plugins
            .iter()
            .map(|spec| NamedPlugin::decode(spec, Default::default()).unwrap())
            .collect();
        FlowSettings::decode(gates, doc.flow_control.as_ref(), &plugins)
    }

    #[test]
    fn the_gate_turns_it_on_and_the_section_sets_the_limits() {
        assert_eq!(settings("plugins: []").unwrap(), FlowSettings::default());
        let s = settings("featureGates: [flowControl]\nflowControl: {maxRequests: 500, maxBytes: 10Gi, defaultRequestTTL: 1m30s, defaultPriorityBand: {maxBytes: \"512Mi\"}}").unwrap();
        assert_eq!(
            s,
            FlowSettings {
                enabled: true,
                max_requests: Some(500),
                max_bytes: Some(10 << 30),
                band_max_bytes: Some(512 << 20),
                ttl: Some(Duration::from_secs(90)),
                ..FlowSettings::default()
            }
        );
        let off =
            settings("featureGates: [flowControl=false]\nflowControl: {maxBytes: 1G}").unwrap();
        assert_eq!((off.enabled, off.max_bytes), (false, Some(1_000_000_000)));
    }

    /// Each band's `fairnessPolicyRef` and `orderingPolicyRef`: upstream's defaults without one
    /// or by their type names, a declared plugin by its name; what names no policy of the kind
    /// is upstream's error, read only with the gate on (as upstream builds the layer only then).
    #[test]
    fn each_bands_policies_are_read() {
        let s = settings("featureGates: [flowControl]\nplugins:\n- {name: rr, type: round-robin-fairness-policy}\n- {type: global-strict-fairness-policy}\n- {name: slo, type: slo-deadline-ordering-policy}\n- {type: edf-ordering-policy}\nflowControl:\n  defaultPriorityBand: {fairnessPolicyRef: rr, orderingPolicyRef: slo}\n  priorityBands:\n  - {priority: 100, fairnessPolicyRef: global-strict-fairness-policy, orderingPolicyRef: edf-ordering-policy}\n  - {priority: -5, fairnessPolicyRef: rr, orderingPolicyRef: fcfs-ordering-policy}\n  - {priority: 7}\n").unwrap();
        let policy = |fairness, order| BandPolicy { fairness, order };
        use Fairness::{GlobalStrict, RoundRobin};
        use QueueOrder::{Fcfs, SloDeadline};
        assert_eq!(s.default_band, policy(RoundRobin, SloDeadline));
        assert_eq!(
            s.bands,
            vec![
                (100, policy(GlobalStrict, Fcfs)),
                (-5, policy(RoundRobin, Fcfs)),
                (7, BandPolicy::default())
            ]
        );
        let s = settings("featureGates: [flowControl]\nflowControl: {defaultPriorityBand: {fairnessPolicyRef: global-strict-fairness-policy}}").unwrap();
        assert_eq!((s.default_band, s.bands.len()), (BandPolicy::default(), 0));
        let problems = settings("featureGates: [flowControl]\nplugins:\n- {name: q, type: queue-scorer}\n- {name: rr, type: round-robin-fairness-policy}\nflowControl:\n  defaultPriorityBand: {fairnessPolicyRef: round-robin-fairness-policy, orderingPolicyRef: rr}\n  priorityBands: [{priority: 1, fairnessPolicyRef: q, orderingPolicyRef: slo-deadline-ordering-policy}]\n").unwrap_err();
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 4, "{text:?}");
        for (t, want) in text.iter().zip([
            "defaultPriorityBand.fairnessPolicyRef: no fairness policy registered for name \"round-robin-fairness-policy\"",
            "defaultPriorityBand.orderingPolicyRef: plugin \"rr\" is not an ordering policy",
            "priorityBands[0].fairnessPolicyRef: plugin \"q\" is not a fairness policy",
            "priorityBands[0].orderingPolicyRef: no ordering policy registered for name \"slo-deadline-ordering-policy\"",
        ]) {
            assert!(t.contains(want), "{t} lacks {want}");
        }
        assert!(
            settings("flowControl: {defaultPriorityBand: {fairnessPolicyRef: nowhere}}").is_ok(),
            "gate off: not read"
        );
    }

    /// `program-aware-fairness`: declared with its parameters (upstream's defaults otherwise),
    /// named by a band; its checks are upstream's.
    #[test]
    fn program_aware_fairness_is_read_with_its_parameters() {
        let s = settings("featureGates: [flowControl]\nplugins:\n- {type: program-aware-fairness, parameters: {lasHalfLifeSeconds: 30}}\nflowControl:\n  defaultPriorityBand: {fairnessPolicyRef: program-aware-fairness}\n").unwrap();
        let Fairness::ProgramAware(las) = s.default_band.fairness else {
            panic!("{s:?}")
        };
        assert_eq!(
            (las.weight_service, las.weight_head_wait, las.half_life_s),
            (0.8, 0.2, 30.0)
        );
        assert_eq!(las.eviction_sweep, Duration::from_secs(300));
        let doc = super::super::parse("plugins:\n- {type: program-aware-fairness, parameters: {evictionSweepSeconds: 0, lasWeightService: -1, strategy: fifo}}\n").unwrap();
        let err = super::super::plugin::NamedPlugin::decode(&doc.plugins[0], Default::default())
            .unwrap_err();
        let text: Vec<String> = err.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 3, "{text:?}");
        assert!(
            text.iter()
                .any(|t| t.contains("evictionSweepSeconds must be > 0, got 0")),
            "{text:?}"
        );
        assert!(
            text.iter()
                .any(|t| t.contains("lasWeightService must be >= 0, got -1")),
            "{text:?}"
        );
        assert!(
            text.iter().any(|t| t.contains("unknown strategy \"fifo\"")),
            "{text:?}"
        );
    }

    #[test]
    fn every_bad_value_is_named_by_its_path() {
        let problems =
            settings("flowControl: {maxRequests: -1, maxBytes: 10Gb, defaultRequestTTL: soon}")
                .unwrap_err();
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 3, "{text:?}");
        for (t, path) in text.iter().zip([
            "flowControl.maxRequests: ",
            "flowControl.maxBytes: ",
            "flowControl.defaultRequestTTL: ",
        ]) {
            assert!(t.starts_with(path), "{t}");
        }
    }
}

//! Profiles: the scheduler assembled from the configured plugins (`crate::config` decodes
//! them) and the document's `schedulingProfiles`, with upstream's defaulting.

use super::filter::Filter;
use super::picker::Picker;
use super::scorer::{
    GatheredScorer, PrecisePrefixParams, PrecisePrefixScorer, PrefixParams, Scorer,
};
use super::{disagg, Scheduler};
use crate::plugin::PluginKind;

/// A configured plugin the scheduler is built from: `crate::config` decodes each one, with its
/// validated parameters, from the configuration's `plugins`.
#[derive(Clone, Debug)]
pub enum Plugin {
    Filter(Filter),
    Scorer(Scorer),
    Picker(Picker),
    /// `approx-prefix-cache-producer`: the prefix parameters when no prefix scorer sets them.
    Prefix(PrefixParams),
    /// `precise-prefix-cache-producer` (llm-d v0.10): the precise index a `prefix-cache-scorer`
    /// scores when its `prefixMatchInfoProducerName` names this instance.
    PreciseProducer(Box<PrecisePrefixParams>),
    Decider(disagg::Decider),
    /// A disaggregating profile handler (`disagg-profile-handler`, `pd-profile-handler`).
    Handler(PluginKind, disagg::HandlerParams),
    P2p(disagg::p2p::P2pSourceProducer),
    /// A data producer taking part in the request lifecycle ([`super::producer`]).
    Producer(std::sync::Arc<dyn super::lifecycle::Lifecycle>),
    /// `topology-extractor`: the labels the topology-affinity filter and scorer naming this
    /// instance read ([`super::topology`]).
    Topology(super::topology::TopologyExtractor),
    /// `header-profile-handler`: a request header names the one profile it runs.
    HeaderHandler(super::header_profile::HeaderProfileParams),
    /// `data-parallel-profile-handler`: the one profile's pick sent to the primary port.
    DataParallel(super::data_parallel::DataParallel),
}

/// One `schedulingProfiles` entry: its name and its plugin references with their weights
/// (upstream defaults a missing weight to 1).
#[derive(Clone, Debug)]
pub(crate) struct Profile<'a> {
    pub(crate) name: &'a str,
    pub(crate) plugins: Vec<(&'a str, f64)>,
}

/// Why profiles could not be assembled from the configured plugins.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BuildError {
    #[error("more than one disaggregating profile handler is configured")]
    SeveralHandlers,
    #[error("several scheduling profiles need a profile handler that runs them (disagg-profile-handler); single-profile-handler runs one")]
    SeveralProfiles,
    #[error(
        "plugin {handler:?} ({kind}): no scheduling profile named {profile:?} (its decode profile)"
    )]
    NoDecodeProfile {
        handler: String,
        kind: PluginKind,
        profile: String,
    },
    /// A handler's decider reference names a plugin that is not a decider.
    #[error("{field}: plugin {plugin:?} is not a decider")]
    NotADecider {
        handler: String,
        field: &'static str,
        plugin: String,
    },
    /// A session-affinity instance's `profileName` that cannot be pinned
    /// ([`disagg::session`]).
    #[error("session affinity profileName {profile:?}: {message}")]
    SessionPin { profile: String, message: String },
    /// A `prefix-cache-scorer`'s `prefixMatchInfoProducerName` names no prefix producer.
    #[error("plugin {scorer:?} parameters prefixMatchInfoProducerName: {producer:?} is not a configured approx-prefix-cache-producer, precise-prefix-cache-producer or burst-prefix-cache-producer")]
    UnknownProducer { scorer: String, producer: String },
    /// A scorer that reads a producer's learned state (`mrl-scorer-hub`,
    /// `latency-observation-scorer-hub`) without that producer configured.
    #[error("plugin {scorer:?} reads what a {kind} learns, and {}", match named {
        Some(n) => format!("no {kind} named {n:?} is configured"),
        None => format!("none is configured: declare a {kind} plugin"),
    })]
    NoObserver {
        scorer: String,
        kind: PluginKind,
        named: Option<String>,
    },
    /// A handler's decider reference names no configured plugin.
    #[error("plugin {handler:?} parameters {field} references undefined plugin {plugin:?}")]
    UnknownDecider {
        handler: String,
        field: &'static str,
        plugin: String,
    },
}

/// The configured scheduling plugins by instance name, in configuration order.
type Plugins<'a> = [(&'a str, &'a Plugin)];

/// Builds the scheduler from the configured plugins and profiles, reporting every problem.
///
/// Upstream defaulting applies: with no profile, one profile holds every configured plugin; a
/// profile without a picker gets the first configured picker or a `max-score-picker`. Without
/// a profile handler (or with `single-profile-handler`) there is one profile;
/// `disagg-profile-handler` and `pd-profile-handler` run several ([`disagg`]).
pub(crate) fn assemble(
    plugins: &Plugins<'_>,
    profiles: &[Profile<'_>],
) -> Result<Scheduler, Vec<BuildError>> {
    let mut problems = Vec::new();
    let resolved = resolve_producers(plugins, &mut problems);
    let plugins: Vec<(&str, &Plugin)> = plugins
        .iter()
        .zip(&resolved)
        .map(|(&(n, p), r)| (n, r.as_ref().unwrap_or(p)))
        .collect();
    let plugins = plugins.as_slice();
    let handlers: Vec<(&str, PluginKind, &disagg::HandlerParams)> = plugins
        .iter()
        .filter_map(|(n, b)| match b {
            Plugin::Handler(k, p) => Some((*n, *k, p)),
            _ => None,
        })
        .collect();
    let by_header = plugins.iter().find_map(|(_, b)| match b {
        Plugin::HeaderHandler(p) => Some(p),
        _ => None,
    });
    let data_parallel = plugins.iter().find_map(|(_, b)| match b {
        Plugin::DataParallel(p) => Some(*p),
        _ => None,
    });
    let others = usize::from(by_header.is_some()) + usize::from(data_parallel.is_some());
    if handlers.len() + others > 1 {
        problems.push(BuildError::SeveralHandlers);
    }
    let mut sched = match (handlers.first(), by_header) {
        (Some(&(name, kind, params)), _) => {
            build_disagg(plugins, profiles, (name, kind, params), &mut problems)
        }
        (None, Some(params)) if profiles.len() > 1 => build_by_header(plugins, profiles, params),
        (None, _) => {
            if profiles.len() > 1 && data_parallel.is_none() {
                problems.push(BuildError::SeveralProfiles);
            }
            build_profile(plugins, profiles.first())
        }
    };
    sched.data_parallel = data_parallel.map(|dp| super::data_parallel::DataParallel {
        several_profiles: profiles.len() > 1,
        ..dp
    });
    disagg::session::pin(&mut sched, &mut problems);
    sched.p2p = plugins.iter().find_map(|(_, b)| match b {
        Plugin::P2p(p) => Some(p.clone()),
        _ => None,
    });
    sched.precise = plugins.iter().find_map(|(_, b)| match b {
        Plugin::PreciseProducer(p) => Some(Box::new(p.scored_by(&PrefixParams::default()))),
        _ => None,
    });
    let producer = plugins.iter().find_map(|(_, b)| match b {
        Plugin::Prefix(p) => Some(p.clone()),
        _ => None,
    });
    sched.prefix = producer.or_else(|| sched.default_prefix());
    let producers = plugins.iter().filter_map(|(_, b)| match b {
        Plugin::Producer(p) => Some(std::sync::Arc::clone(p)),
        _ => None,
    });
    sched.attach_hooks(producers.collect());
    if problems.is_empty() {
        Ok(sched)
    } else {
        Err(problems)
    }
}

/// Per plugin, its replacement when a `prefix-cache-scorer` scores a precise producer's
/// matches (llm-d v0.10's `prefixMatchInfoProducerName`): the precise scorer with that
/// producer's index; or a gathering producer's placements ([`super::gather`]). A name that is
/// no prefix producer is a problem; the approximate producer's own type name is accepted
/// unconfigured (llm-d creates it for its consumers).
fn resolve_producers(plugins: &Plugins<'_>, problems: &mut Vec<BuildError>) -> Vec<Option<Plugin>> {
    plugins
        .iter()
        .map(|&(name, plugin)| {
            if let Some(resolved) = with_topology(plugins, plugin) {
                return Some(resolved);
            }
            if let Plugin::Scorer(scorer) = plugin {
                if let Some((kind, named)) = scorer.reads_producer() {
                    return with_observer(plugins, (name, scorer), kind, named, problems);
                }
            }
            let Plugin::Scorer(Scorer::Prefix(scorer)) = plugin else {
                return None;
            };
            let producer = scorer.params.prefix_match_info_producer_name.as_deref()?;
            match plugins.iter().find(|(n, _)| *n == producer).map(|(_, p)| p) {
                Some(Plugin::PreciseProducer(precise)) => {
                    Some(Plugin::Scorer(Scorer::PrecisePrefix(Box::new(
                        PrecisePrefixScorer::new(precise.scored_by(&scorer.params)),
                    ))))
                }
                // A producer that places requests jointly (a window of them): its placements.
                Some(Plugin::Producer(p)) if p.gathers() => {
                    Some(Plugin::Scorer(Scorer::Gathered(GatheredScorer {
                        instance: p.instance(),
                        blend: scorer.params.blend(),
                    })))
                }
                Some(Plugin::Prefix(_)) => None,
                None if producer == PluginKind::ApproxPrefixCacheProducer.name() => None,
                _ => {
                    problems.push(BuildError::UnknownProducer {
                        scorer: name.to_owned(),
                        producer: producer.to_owned(),
                    });
                    None
                }
            }
        })
        .collect()
}

/// A scorer bound to the producer whose learned state it reads: the instance it names, or
/// without a name the one named after its type, else the first of that kind. A scorer
/// without its producer is a problem (its scores would never change).
fn with_observer(
    plugins: &Plugins<'_>,
    (name, scorer): (&str, &Scorer),
    kind: PluginKind,
    named: Option<&str>,
    problems: &mut Vec<BuildError>,
) -> Option<Plugin> {
    let observers: Vec<(&str, super::producer::Observer)> = plugins
        .iter()
        .filter_map(|(n, p)| match p {
            Plugin::Producer(p) => p.observer().map(|o| (*n, o)),
            _ => None,
        })
        .filter(|(_, o)| o.kind() == kind)
        .collect();
    let found = match named {
        Some(wanted) => observers.iter().find(|(n, _)| *n == wanted),
        None => observers
            .iter()
            .find(|(n, _)| *n == kind.name())
            .or(observers.first()),
    };
    let bound = found.and_then(|(_, o)| scorer.bind(o));
    if bound.is_none() {
        problems.push(BuildError::NoObserver {
            scorer: name.to_owned(),
            kind,
            named: named.map(str::to_owned),
        });
    }
    bound.map(Plugin::Scorer)
}

/// A topology-affinity filter or scorer with the `topology-extractor` its
/// `topologyProducerName` names (left without one, and logged, when none has that name).
fn with_topology(plugins: &Plugins<'_>, plugin: &Plugin) -> Option<Plugin> {
    let find = |r: &super::topology::ExtractorRef| {
        let found = plugins.iter().find_map(|(n, p)| match p {
            Plugin::Topology(t) if *n == r.name => Some(t.clone()),
            _ => None,
        });
        if found.is_none() {
            tracing::warn!(producer = %r.name, "no topology-extractor of this name: the topology-affinity plugin reads no topology");
        }
        super::topology::ExtractorRef {
            name: r.name.clone(),
            extractor: found,
        }
    };
    match plugin {
        Plugin::Filter(Filter::TopologyAffinity(f)) => {
            let mut f = f.clone();
            f.extractor = find(&f.extractor);
            Some(Plugin::Filter(Filter::TopologyAffinity(f)))
        }
        Plugin::Scorer(Scorer::TopologyAffinity(s)) => {
            let mut s = s.clone();
            s.extractor = find(&s.extractor);
            Some(Plugin::Scorer(Scorer::TopologyAffinity(s)))
        }
        _ => None,
    }
}

impl Scheduler {
    /// Without a producer: the prefix scorers' parameters, or upstream's default producer for
    /// the consumers of prefix match information (llm-d creates `approx-prefix-cache-producer`
    /// for them; the disaggregating handlers consume it through their prefill decider).
    fn default_prefix(&self) -> Option<PrefixParams> {
        let consumer = self.has_no_hit_lru()
            || self
                .filters
                .iter()
                .any(|f| matches!(f, Filter::PrefixCacheAffinity(_)))
            || self.p2p.is_some()
            || self
                .disagg
                .as_ref()
                .and_then(|d| d.prefill.as_ref())
                .is_some_and(|s| s.decider.is_some());
        let stages = self.stages();
        let from_scorers = std::iter::once(self)
            .chain(stages)
            .flat_map(|s| s.scorers.iter())
            .find_map(|(s, _)| s.prefix_params().cloned());
        // With the precise index the consumers read its matches (llm-d: they name its producer).
        let consumer = consumer && self.precise_params().is_none();
        from_scorers.or_else(|| consumer.then(PrefixParams::default))
    }
}

/// One profile from its plugin references (or, without a profile, every configured plugin).
fn build_profile(plugins: &Plugins<'_>, profile: Option<&Profile<'_>>) -> Scheduler {
    let refs: Vec<(&str, f64)> = match profile {
        Some(p) => p.plugins.clone(),
        None => plugins.iter().map(|(n, _)| (*n, 1.0)).collect(),
    };
    let mut sched = Scheduler {
        filters: Vec::new(),
        scorers: Vec::new(),
        picker: Picker::default(),
        prefix: None,
        precise: None,
        disagg: None,
        p2p: None,
        by_header: None,
        data_parallel: None,
        hooks: Vec::new(),
        headers: Vec::new(),
    };
    let mut picker = None;
    for (name, weight) in &refs {
        match plugins.iter().find(|(n, _)| n == name).map(|(_, b)| b) {
            Some(Plugin::Filter(f)) => sched.filters.push(f.clone()),
            Some(Plugin::Scorer(s)) => {
                // A scorer that is also a filter (`context-length-aware`) filters in profile order.
                sched.filters.extend(s.as_filter());
                sched.scorers.push((s.clone(), *weight));
            }
            Some(Plugin::Picker(p)) => picker = picker.or(Some(p.clone())),
            _ => {}
        }
    }
    sched.picker = picker
        .or_else(|| {
            plugins.iter().find_map(|(_, b)| match b {
                Plugin::Picker(p) => Some(p.clone()),
                _ => None,
            })
        })
        .unwrap_or_default();
    sched
}

/// The decode profile carrying the disaggregating handler and its other stages.
fn build_disagg(
    plugins: &Plugins<'_>,
    profiles: &[Profile<'_>],
    (name, kind, params): (&str, PluginKind, &disagg::HandlerParams),
    problems: &mut Vec<BuildError>,
) -> Scheduler {
    let profile = |n: &str| profiles.iter().find(|p| p.name == n);
    let decider = |field: &'static str, plugin: &Option<String>, problems: &mut Vec<BuildError>| {
        let plugin = plugin.as_deref()?;
        let (handler, plugin_name) = (name.to_owned(), plugin.to_owned());
        match plugins.iter().find(|(n, _)| *n == plugin).map(|(_, b)| b) {
            Some(Plugin::Decider(d)) => return Some(d.clone()),
            Some(_) => problems.push(BuildError::NotADecider {
                handler,
                field,
                plugin: plugin_name,
            }),
            None => problems.push(BuildError::UnknownDecider {
                handler,
                field,
                plugin: plugin_name,
            }),
        }
        None
    };
    let Some(decode) = profile(&params.decode) else {
        problems.push(BuildError::NoDecodeProfile {
            handler: name.to_owned(),
            kind,
            profile: params.decode.clone(),
        });
        return build_profile(plugins, None);
    };
    let mut sched = build_profile(plugins, Some(decode));
    let mut d = disagg::Disagg::new(name, &params.decode, kind, params.order);
    let prefill_decider = decider("deciders.prefill", &params.prefill_decider, problems);
    let encode_decider = decider("deciders.encode", &params.encode_decider, problems);
    if params.prefill_decider.is_none() && params.order == disagg::StageOrder::DecodeFirst {
        tracing::info!(
            handler = name,
            "No deciders.prefill configured, P/D disaggregation disabled"
        );
    }
    d.prefill = profile(&params.prefill).map(|p| disagg::Stage {
        name: p.name.to_owned(),
        profile: build_profile(plugins, Some(p)),
        decider: prefill_decider,
    });
    d.encode = profile(&params.encode)
        .filter(|_| kind == PluginKind::DisaggProfileHandler)
        .map(|p| disagg::Stage {
            name: p.name.to_owned(),
            profile: build_profile(plugins, Some(p)),
            decider: encode_decider,
        });
    sched.disagg = Some(Box::new(d));
    sched
}

/// `header-profile-handler` over several profiles: each built on its own; the default one
/// (else the first) answers the configuration's questions as the primary profile.
fn build_by_header(
    plugins: &Plugins<'_>,
    profiles: &[Profile<'_>],
    params: &super::header_profile::HeaderProfileParams,
) -> Scheduler {
    let built: Vec<(String, Scheduler)> = profiles
        .iter()
        .map(|p| (p.name.to_owned(), build_profile(plugins, Some(p))))
        .collect();
    let primary = profiles
        .iter()
        .find(|p| p.name == params.default_profile)
        .or(profiles.first());
    let mut sched = build_profile(plugins, primary);
    sched.by_header = Some(Box::new(super::header_profile::HeaderProfiles {
        params: params.clone(),
        profiles: built,
    }));
    sched
}

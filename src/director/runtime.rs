//! What a configuration becomes ([`Runtime`]) and the live configuration every part of epp reads
//! ([`LiveConfig`]): `app` owns it, config reload swaps it, requests in progress finish with the
//! one they started with.

use super::flowcontrol::{FlowConfig, FlowControl};
use crate::admission;
use crate::config::{self, ConfigError, Problem};
use crate::datastore::ejection::HealthPolicy;
use crate::datastore::Datastore;
use crate::prefix::source::Config as PrefixConfig;
use crate::request;
use crate::request::tokenize::Tokenizer;
use crate::scheduling::Scheduler;
use arc_swap::{ArcSwap, Guard};
use std::sync::{Arc, Weak};
use std::time::Instant;

/// What a configuration becomes: the scheduler plus the tokenizer its prefix scorer needs.
pub struct Runtime {
    pub scheduler: Scheduler,
    pub tokenizer: Option<Tokenizer>,
    /// `token-producer` with the `vllm` backend: prompts' token ids from the model server's
    /// render endpoint ([`request::render`]), when a prefix index reads them.
    pub(crate) render: Option<Arc<request::render::RenderParams>>,
    /// The prefix index the scorers read, with its parameters (`None`: no prefix scorer, and
    /// the director skips tokenization entirely). The precise scorer's wins when both are
    /// configured.
    pub(crate) prefix: Option<PrefixConfig>,
    /// Bytes of prompt text the approximate scorer reads even when the precise index is the
    /// one looked up (both configured): parsing keeps at least this much.
    pub(crate) prompt_text_floor: usize,
    /// The conformance hook `destination-endpoint-served-verifier` is configured: echo the
    /// endpoint the gateway reports as served into `x-conformance-test-served-endpoint`.
    pub(crate) served_verifier: bool,
    /// Outlier detection and slow start (`outlier-detection`, `slow-start` plugins).
    pub(crate) health: HealthPolicy,
    /// The saturation detector's thresholds (`utilization-detector` parameters).
    pub(crate) thresholds: admission::Thresholds,
    /// `agent-identity`'s session headers, in the order they are read, when configured.
    pub(crate) agent_identity: Option<Vec<String>>,
    /// The `probabilistic-admitter`s, in configuration order.
    pub(crate) admitters: Vec<admission::probabilistic::Probabilistic>,
    /// Which parser reads a request, by path (`requestHandler.parsers`; upstream's default).
    pub(crate) parsers: request::ParserSet,
    /// Flow control: on with the `flowControl` gate; the `flowControl` section's limits.
    pub(crate) flow: config::FlowSettings,
    /// The load options it was built with (a reload keeps them).
    pub(crate) load: config::LoadOptions,
    /// `requestHandler.propagatePriority` (llm-d v1.0): the resolved priority is written into
    /// the forwarded body's top-level `priority`.
    pub(crate) propagate_priority: bool,
    /// The text it was built from (shown by `/debug/snapshot`).
    pub(crate) source: String,
}

/// What a configuration says that only start-up reads: the endpoint pollers, the KV-event
/// sockets and the endpoint source are started once, so a reload cannot apply these. They are
/// kept apart from [`Runtime`] (the value a reload swaps), and a reload that changes one says
/// so ([`LiveConfig::restart_needed`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Startup {
    /// What the data-layer plugins say about scraping.
    pub metrics_settings: config::MetricsSettings,
    /// The `file-discovery` plugin `dataLayer.discovery` names.
    pub(crate) file_discovery: Option<config::FileDiscovery>,
    /// Where the precise index's KV events come from (its `kvEventsConfig`).
    pub(crate) kv_event_sockets: Option<crate::scheduling::scorer::KvEventSockets>,
}

/// A configuration built: what a reload swaps, and what only start-up reads.
pub struct Configured {
    pub(crate) runtime: Runtime,
    pub startup: Startup,
}

impl Startup {
    /// The settings `new` changes from `self`, named as the configuration names them.
    pub(crate) fn changed_by(&self, new: &Startup) -> Vec<&'static str> {
        let mut changed = Vec::new();
        if self.metrics_settings != new.metrics_settings {
            changed.push("dataLayer metrics source (metrics-data-source, core-metrics-extractor)");
        }
        if self.file_discovery != new.file_discovery {
            changed.push("dataLayer.discovery (file-discovery)");
        }
        if self.kv_event_sockets != new.kv_event_sockets {
            changed.push("kvEventsConfig (the precise prefix scorer's KV-event sockets)");
        }
        changed
    }
}

impl Runtime {
    /// Parses, validates and builds a configuration. A tokenizer already built for the same
    /// vocabulary is reused (building one costs 0.1–0.2 s).
    pub fn build(text: &str, previous: Option<&Runtime>) -> Result<Self, ConfigError> {
        let load = previous.map(|p| p.load).unwrap_or_default();
        Self::build_with(text, previous, load)
    }

    /// [`Runtime::build`] with the command line's load options.
    pub fn build_with(
        text: &str,
        previous: Option<&Runtime>,
        load: config::LoadOptions,
    ) -> Result<Self, ConfigError> {
        Ok(Self::configure(text, previous, load)?.runtime)
    }

    /// [`Runtime::build_with`], with the start-up-only settings the configuration gives.
    pub fn configure(
        text: &str,
        previous: Option<&Runtime>,
        load: config::LoadOptions,
    ) -> Result<Configured, ConfigError> {
        let doc = config::parse_document(text)?;
        for note in doc.deprecations() {
            tracing::warn!("{note}");
        }
        let decoded = config::Config::decode(&doc, load)?;
        let tokenizer = tokenizer(&decoded.scheduler, previous)?;
        let (prefix, prompt_text_floor) = decoded.scheduler.prefix_index();
        let render = render(&decoded, prefix.is_some());
        let startup = Startup {
            metrics_settings: decoded.metrics_settings.clone(),
            file_discovery: decoded.file_discovery.clone(),
            kv_event_sockets: decoded.scheduler.kv_event_sockets(),
        };
        let runtime = Self {
            tokenizer,
            render,
            prefix,
            prompt_text_floor,
            served_verifier: decoded.served_verifier,
            health: decoded.health,
            thresholds: decoded.thresholds,
            agent_identity: decoded.agent_identity,
            admitters: decoded.admitters,
            parsers: decoded.parsers,
            flow: decoded.flow,
            load,
            propagate_priority: decoded.propagate_priority,
            scheduler: decoded.scheduler,
            source: text.to_owned(),
        };
        Ok(Configured { runtime, startup })
    }

    /// With `agent-identity` configured, the first of its session headers with a non-empty
    /// (trimmed) value: the fairness key of a request that names none (llm-d v0.10).
    pub(crate) fn agent_identity<'h>(
        &self,
        header: impl Fn(&str) -> Option<&'h str>,
    ) -> Option<String> {
        self.agent_identity.as_ref()?.iter().find_map(|h| {
            header(h)
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        })
    }
}

/// The tokenizer the prefix scorers need, reusing `previous`'s when it is the same vocabulary.
/// A local tokenizer.json (precise scorer) must win: its block keys must equal the pods'.
fn tokenizer(
    scheduler: &Scheduler,
    previous: Option<&Runtime>,
) -> Result<Option<Tokenizer>, ConfigError> {
    let source = scheduler.tokenizer_source();
    let Some(source) = source else {
        return Ok(None);
    };
    if let Some(t) = previous
        .and_then(|r| r.tokenizer.clone())
        .filter(|t| t.is_built_from(&source))
    {
        return Ok(Some(t));
    }
    Tokenizer::from_source(&source)
        .map(Some)
        .map_err(|e| ConfigError::from(vec![Problem::Conflict(e.to_string())]))
}

/// The render backend of the configuration's `token-producer` (`vllm`). Without a prefix index
/// nothing reads token ids, so nothing is rendered.
fn render(decoded: &config::Config, prefix: bool) -> Option<Arc<request::render::RenderParams>> {
    let params = decoded.plugins.iter().find_map(|p| match &p.plugin {
        config::plugin::Plugin::TokenProducer(Some(r)) => Some(r),
        _ => None,
    })?;
    if !prefix {
        tracing::info!(
            url = params.url,
            "token-producer: no prefix scorer reads token ids; the render endpoint is not called"
        );
        return None;
    }
    Some(Arc::new(params.clone()))
}

/// The configuration in force. `app` owns it and hands it to whoever reads it (the director,
/// ext_proc, the metrics port) and to config reload, its one writer. The passive-health policy
/// the datastore applies and the flow-control queue's limits are part of it, so they are
/// swapped together; the flow-control queue itself is built with it (its release reads the
/// configuration's saturation detector), so nothing is attached after construction.
pub struct LiveConfig {
    current: ArcSwap<Runtime>,
    /// The start-up-only settings epp started with, and those the configuration in force
    /// changes from them (applied at the next start).
    startup: Startup,
    restart_needed: ArcSwap<Vec<&'static str>>,
    datastore: Arc<Datastore>,
    /// The flow-control queue and the command line's limits, which the configuration's
    /// `flowControl` section overrides.
    flow: Arc<FlowControl>,
    flow_base: FlowConfig,
}

/// What the flow-control queue is built with: the command line's limits, the pool's name for
/// its metrics, and the metrics age beyond which saturation counts an endpoint as stale.
#[derive(Clone, Debug, Default)]
pub struct FlowSetup {
    pub(crate) base: FlowConfig,
    pub(crate) pool: String,
    pub(crate) staleness: std::time::Duration,
}

impl LiveConfig {
    /// The configuration `configured` over `datastore`, with its flow-control queue.
    pub(crate) fn new(
        configured: Configured,
        datastore: Arc<Datastore>,
        metrics: Arc<crate::metrics::Metrics>,
        setup: FlowSetup,
    ) -> Arc<Self> {
        let Configured { runtime, startup } = configured;
        datastore.set_health_policy(runtime.health.clone());
        let limits = setup.base.clone().with_settings(&runtime.flow);
        Arc::new_cyclic(|me: &Weak<LiveConfig>| {
            let (me, ds, staleness) = (me.clone(), Arc::clone(&datastore), setup.staleness);
            // Released by the pool's saturation as the configuration in force measures it.
            let saturation = move || {
                me.upgrade().map_or(0.0, |c| {
                    super::pool_saturation(&ds, &c.load(), staleness, Instant::now())
                })
            };
            Self {
                current: ArcSwap::from_pointee(runtime),
                startup,
                restart_needed: ArcSwap::default(),
                flow: FlowControl::new(limits, saturation, metrics, setup.pool),
                flow_base: setup.base,
                datastore,
            }
        })
    }

    /// The flow-control queue (it always exists; the `flowControl` gate decides whether
    /// decisions wait in it).
    pub(crate) fn flow_control(&self) -> &Arc<FlowControl> {
        &self.flow
    }

    /// The configuration now (cheap; hold it no longer than one request).
    pub(crate) fn load(&self) -> Guard<Arc<Runtime>> {
        self.current.load()
    }

    /// The configuration now, to keep.
    pub(crate) fn load_full(&self) -> Arc<Runtime> {
        self.current.load_full()
    }

    /// The start-up-only settings epp started with (what the pollers, the KV-event sockets and
    /// the endpoint source read).
    pub(crate) fn startup(&self) -> &Startup {
        &self.startup
    }

    /// The start-up-only settings the configuration in force changes, which apply only after a
    /// restart (empty when it changes none).
    pub(crate) fn restart_needed(&self) -> Arc<Vec<&'static str>> {
        self.restart_needed.load_full()
    }

    /// Swaps in a reloaded configuration; returns the start-up-only settings it changes from
    /// those epp started with, which it cannot apply (and which `/debug/snapshot` shows).
    pub(crate) fn reload(&self, configured: Configured) -> Arc<Vec<&'static str>> {
        let changed = Arc::new(self.startup.changed_by(&configured.startup));
        self.store(configured.runtime);
        self.restart_needed.store(Arc::clone(&changed));
        changed
    }

    /// Swaps in a new configuration; requests in progress finish with the old one.
    pub(crate) fn store(&self, runtime: Runtime) {
        self.datastore.set_health_policy(runtime.health.clone());
        let limits = self.flow_base.clone().with_settings(&runtime.flow);
        self.flow.reconfigure(limits);
        self.current.store(Arc::new(runtime));
    }
}

//! Every plugin `type:` an upstream `EndpointPickerConfig` can name, as one enum, and the one
//! error a plugin's parameter check returns.
//!
//! The registry is the union of GIE v1.5.0's and llm-d-router v0.10.0's in-tree plugins
//! (`cmd/epp/runner/runner.go`, `registerInTreePlugins`), v0.11's traffic-learned hub plugins
//! (the latency and sojourn observers and their scorers) and epp's own. Each kind carries its
//! upstream stability level (llm-d-router #2073: alpha plugins need
//! `--allow-experimental-plugins`; every other upstream plugin is registered Beta there, and
//! epp's own plugins are Stable) and what epp does with it:
//! - [`Support::Plugin`]: a plugin of epp's, built from its parameters;
//! - [`Support::BuiltIn`]: accepted, because epp does the same thing without a plugin (and
//!   says where);
//! - [`Support::Unsupported`]: refused at load with a message naming the plugin as not
//!   supported by epp, never silently ignored.
//!
//! A `type:` outside this table is an unknown plugin type. Nothing else in the crate compares
//! type-name strings: `crate::config` turns the name into a [`PluginKind`] once, and decodes
//! its parameters into the owning module's typed value in the same step.
//!
//! Vocabulary (layer 0) because every module that owns a plugin names its kind or reports an
//! [`Invalid`] parameter, and the configuration decoder sits above all of them.

use std::fmt;

/// What a plugin is for (upstream's plugin interfaces).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Category {
    Filter,
    Scorer,
    Picker,
    ProfileHandler,
    Decider,
    DataProducer,
    Parser,
    DataLayer,
    FlowControl,
    Saturation,
    RequestControl,
    Health,
}

/// Upstream stability level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stability {
    Alpha,
    Beta,
    Stable,
}

/// What epp does with a plugin of this kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    /// A plugin of epp's, built from its parameters.
    Plugin,
    /// Accepted; epp does this without a plugin (the text says where).
    BuiltIn(&'static str),
    /// Refused at load (the text says why).
    Unsupported(&'static str),
}

macro_rules! kinds {
    ($($variant:ident = $name:literal, $cat:ident, $stab:ident, $support:expr;)*) => {
        /// One upstream (or epp) plugin type.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum PluginKind { $($variant),* }

        impl PluginKind {
            /// Every kind, in registry order.
            pub const ALL: &'static [PluginKind] = &[$(PluginKind::$variant),*];

            /// The `type:` name.
            pub fn name(self) -> &'static str {
                match self { $(PluginKind::$variant => $name),* }
            }

            pub fn category(self) -> Category {
                match self { $(PluginKind::$variant => Category::$cat),* }
            }

            pub fn stability(self) -> Stability {
                match self { $(PluginKind::$variant => Stability::$stab),* }
            }

            pub fn support(self) -> Support {
                match self { $(PluginKind::$variant => $support),* }
            }

            /// The kind a `type:` name denotes.
            pub fn from_name(name: &str) -> Option<Self> {
                match name { $($name => Some(PluginKind::$variant),)* _ => None }
            }
        }
    };
}

use Support::{BuiltIn, Plugin, Unsupported};

const HEADERS: Support =
    BuiltIn("epp's disaggregating profile handlers set the sidecar headers themselves");
const LATENCY_PREDICTOR: Support = Unsupported("needs upstream's latency predictor: predicted-latency-producer sends every request's features to its Python training and prediction servers (TRAINING_SERVER_URL, PREDICTION_SERVER_URL: separate containers retraining models online), whose predicted TTFT/TPOT this plugin reads; epp runs no such server and speaks no client of it");
const PROFILE: Support =
    BuiltIn("epp runs one scheduling profile unless a disaggregating handler is configured");
const METRICS: Support =
    BuiltIn("epp scrapes each endpoint's /metrics itself (--refresh-metrics-interval)");
const DISCOVERY: Support = BuiltIn("epp discovers endpoints from its flags (Kubernetes or static)");
/// What `models-data-source` and `models-data-extractor` collect, nothing in llm-d-router v0.10
/// reads.
const MODELS: &str = "accepted: no filter or scorer of llm-d-router v0.10 reads the models it collects from /v1/models, so epp does not poll it";
/// The in-flight eviction policies: configurable, and read by nothing in llm-d-router v0.10.
const EVICTION: Support = BuiltIn("accepted, as llm-d-router v0.10 accepts it (no parameters): its in-flight evictor (flowControl.enableEviction) builds its own sheddable-eviction-filter and priority-then-time-eviction-order-policy, so nothing reads a configured instance; epp does not evict in-flight requests (enableEviction is accepted and not read)");
/// The GIE v1.5 names of the eviction policies.
const EVICTION_RENAMED: Support = BuiltIn("the GIE v1.5 name of an eviction policy llm-d-router v0.10 renamed (sheddable-eviction-filter, priority-then-time-eviction-order-policy) and no longer registers; epp accepts it as the new name, which nothing reads either (epp does not evict in-flight requests)");
/// What the endpoint-attribute plugins read.
const FLOW: Support =
    BuiltIn("epp's flow control serves each fairness key first come, first served");

kinds! {
    // Filters.
    DecodeFilter = "decode-filter", Filter, Beta, Plugin;
    PrefillFilter = "prefill-filter", Filter, Beta, Plugin;
    EncodeFilter = "encode-filter", Filter, Beta, Plugin;
    LabelSelectorFilter = "label-selector-filter", Filter, Beta, Plugin;
    ByLabel = "by-label", Filter, Beta, Plugin;
    ByLabelSelector = "by-label-selector", Filter, Beta, Plugin;
    PrefixCacheAffinityFilter = "prefix-cache-affinity-filter", Filter, Beta, Plugin;
    SloHeadroomTierFilter = "slo-headroom-tier-filter", Filter, Beta, LATENCY_PREDICTOR;
    SessionAffinityFilter = "session-affinity-filter", Filter, Alpha, Plugin;
    EndpointAttributeFilter = "endpoint-attribute-filter", Filter, Alpha, Plugin;
    TopologyAffinityFilter = "topology-affinity-filter", Filter, Alpha, Plugin;
    UtilizationFilter = "utilization-filter", Filter, Alpha, Plugin;
    ActiveRequestFilter = "active-request-filter", Filter, Alpha, Plugin;
    MulticlusterSessionAffinityFilter = "multicluster-session-affinity-filter", Filter, Alpha, Plugin;
    HeaderBasedTestingFilter = "header-based-testing-filter", Filter, Beta, Plugin;
    GpuMemoryFilter = "gpu-memory-filter", Filter, Stable, Plugin;

    // Scorers.
    QueueScorer = "queue-scorer", Scorer, Beta, Plugin;
    KvCacheUtilizationScorer = "kv-cache-utilization-scorer", Scorer, Beta, Plugin;
    PrefixCacheScorer = "prefix-cache-scorer", Scorer, Beta, Plugin;
    RunningRequestsSizeScorer = "running-requests-size-scorer", Scorer, Beta, Plugin;
    LoraAffinityScorer = "lora-affinity-scorer", Scorer, Beta, Plugin;
    TokenLoadScorer = "token-load-scorer", Scorer, Beta, Plugin;
    LatencyScorer = "latency-scorer", Scorer, Beta, Plugin;
    LoadAwareScorer = "load-aware-scorer", Scorer, Beta, Plugin;
    ActiveRequestScorer = "active-request-scorer", Scorer, Beta, Plugin;
    NoHitLruScorer = "no-hit-lru-scorer", Scorer, Beta, Plugin;
    ContextLengthAware = "context-length-aware", Scorer, Beta, Plugin;
    PrecisePrefixCacheScorer = "precise-prefix-cache-scorer", Scorer, Beta, Plugin;
    MmEmbeddingsCacheScorer = "mm-embeddings-cache-scorer", Scorer, Beta, Plugin;
    SessionAffinityScorer = "session-affinity-scorer", Scorer, Alpha, Plugin;
    HeaderLabelAffinityScorer = "header-label-affinity-scorer", Scorer, Alpha, Plugin;
    EndpointAttributeScorer = "endpoint-attribute-scorer", Scorer, Alpha, Plugin;
    TopologyAffinityScorer = "topology-affinity-scorer", Scorer, Alpha, Plugin;
    MulticlusterQueueScorer = "multicluster-queue-scorer", Scorer, Alpha, Plugin;
    MulticlusterKvCacheUtilizationScorer = "multicluster-kv-cache-utilization-scorer", Scorer, Alpha, Plugin;
    MulticlusterPrefixCacheScorer = "multicluster-prefix-cache-scorer", Scorer, Alpha, Plugin;
    GpuUtilizationScorer = "gpu-utilization-scorer", Scorer, Stable, Plugin;
    EstimatedTtftScorer = "estimated-ttft-scorer", Scorer, Stable, Plugin;
    LatencyObservationScorerHub = "latency-observation-scorer-hub", Scorer, Alpha, Plugin;
    MrlScorerHub = "mrl-scorer-hub", Scorer, Alpha, Plugin;
    NetworkCostScorer = "network-cost-scorer", Scorer, Stable, Plugin;

    // Pickers.
    MaxScorePicker = "max-score-picker", Picker, Beta, Plugin;
    RandomPicker = "random-picker", Picker, Beta, Plugin;
    WeightedRandomPicker = "weighted-random-picker", Picker, Beta, Plugin;
    RoundRobinPicker = "round-robin-picker", Picker, Stable, Plugin;
    WeightedRoundRobinPicker = "weighted-round-robin-picker", Picker, Stable, Plugin;
    P2cPicker = "p2c", Picker, Stable, Plugin;
    WeightedLeastRequestPicker = "weighted-least-request-picker", Picker, Stable, Plugin;
    PowerOfTwoChoicesPicker = "power-of-two-choices-picker", Picker, Stable, Plugin;
    ConsistentHashPicker = "consistent-hash-picker", Picker, Stable, Plugin;

    // Profile handlers and P/D deciders.
    SingleProfileHandler = "single-profile-handler", ProfileHandler, Beta, PROFILE;
    DisaggProfileHandler = "disagg-profile-handler", ProfileHandler, Beta, Plugin;
    HeaderProfileHandler = "header-profile-handler", ProfileHandler, Alpha, Plugin;
    DataParallelProfileHandler = "data-parallel-profile-handler", ProfileHandler, Beta, Plugin;
    PdProfileHandler = "pd-profile-handler", ProfileHandler, Beta, Plugin;
    DisaggHeadersHandler = "disagg-headers-handler", ProfileHandler, Beta, HEADERS;
    PrefillHeaderHandler = "prefill-header-handler", ProfileHandler, Beta, HEADERS;
    PrefixBasedPdDecider = "prefix-based-pd-decider", Decider, Beta, Plugin;
    AlwaysDisaggPdDecider = "always-disagg-pd-decider", Decider, Beta, Plugin;
    AlwaysDisaggMultimodalDecider = "always-disagg-multimodal-decider", Decider, Beta, Plugin;
    CostBasedPdDecider = "cost-based-pd-decider", Decider, Stable, Plugin;

    // Data producers.
    ApproxPrefixCacheProducer = "approx-prefix-cache-producer", DataProducer, Beta, Plugin;
    InflightLoadProducer = "inflight-load-producer", DataProducer, Beta, BuiltIn("epp counts in-flight requests and tokens per endpoint itself");
    PredictedLatencyProducer = "predicted-latency-producer", DataProducer, Beta, LATENCY_PREDICTOR;
    PrecisePrefixCacheProducer = "precise-prefix-cache-producer", DataProducer, Beta, Plugin;
    TokenProducer = "token-producer", DataProducer, Beta, BuiltIn("epp tokenizes in-process (the prefix scorer's tokenizer)");
    Tokenizer = "tokenizer", DataProducer, Beta, BuiltIn("epp tokenizes in-process (the prefix scorer's tokenizer)");
    SessionStateProducer = "session-state-producer", DataProducer, Alpha, Plugin;
    SessionIdProducer = "session-id-producer", DataProducer, Beta, BuiltIn("accepted (parameters checked as upstream); no llm-d v0.10 plugin reads the SessionID it publishes (llm-d-router #1372: for future affinity plugins), and epp's session affinity reads its own sources");
    MmEmbeddingsCacheProducer = "mm-embeddings-cache-producer", DataProducer, Beta, Plugin;
    BurstPrefixCacheProducer = "burst-prefix-cache-producer", DataProducer, Alpha, Plugin;
    P2pSourceProducer = "p2p-source-producer", DataProducer, Alpha, Plugin;
    MulticlusterApproxPrefixCacheProducer = "multicluster-approx-prefix-cache-producer", DataProducer, Alpha, Plugin;
    LatencyObserverProducerHub = "latency-observer-producer-hub", DataProducer, Alpha, Plugin;
    SojournTimeObserverHub = "sojourn-time-observer-hub", DataProducer, Alpha, Plugin;

    // Request parsers.
    OpenaiParser = "openai-parser", Parser, Beta, BuiltIn("epp parses OpenAI requests by path");
    VllmgrpcParser = "vllmgrpc-parser", Parser, Beta, Plugin;
    PassthroughParser = "passthrough-parser", Parser, Beta, BuiltIn("epp routes bodies it cannot parse by load");
    AnthropicParser = "anthropic-parser", Parser, Beta, BuiltIn("epp parses Anthropic Messages requests by path");
    VllmhttpParser = "vllmhttp-parser", Parser, Beta, BuiltIn("epp parses vLLM token-in requests by path");
    SglanghttpParser = "sglanghttp-parser", Parser, Beta, BuiltIn("epp parses SGLang /generate requests by path");
    VertexaiParser = "vertexai-parser", Parser, Beta, Plugin;

    // Data layer.
    MetricsDataSource = "metrics-data-source", DataLayer, Beta, METRICS;
    CoreMetricsExtractor = "core-metrics-extractor", DataLayer, Beta, METRICS;
    ModelsDataSource = "models-data-source", DataLayer, Beta, BuiltIn(MODELS);
    ModelsDataExtractor = "models-data-extractor", DataLayer, Beta, BuiltIn(MODELS);
    K8sNotificationSource = "k8s-notification-source", DataLayer, Beta, DISCOVERY;
    EndpointNotificationSource = "endpoint-notification-source", DataLayer, Beta, DISCOVERY;
    FileDiscovery = "file-discovery", DataLayer, Beta, Plugin;
    TopologyExtractor = "topology-extractor", DataLayer, Alpha, Plugin;
    DcgmDataSource = "dcgm-data-source", DataLayer, Alpha, BuiltIn("epp reads DCGM series from --gpu-metrics-url or the pods' /metrics");
    DcgmExtractor = "dcgm-extractor", DataLayer, Alpha, BuiltIn("epp reads DCGM series from --gpu-metrics-url or the pods' /metrics");
    MulticlusterMetricsDataSource = "multicluster-metrics-data-source", DataLayer, Alpha, Plugin;
    MulticlusterMetricsExtractor = "multicluster-metrics-extractor", DataLayer, Alpha, Plugin;
    MulticlusterFileDiscovery = "multicluster-file-discovery", DataLayer, Alpha, Plugin;

    // Flow control.
    GlobalStrictFairnessPolicy = "global-strict-fairness-policy", FlowControl, Beta, BuiltIn("a band's fairnessPolicyRef naming it serves the band's oldest request first, whatever its fairness key (upstream's default)");
    RoundRobinFairnessPolicy = "round-robin-fairness-policy", FlowControl, Beta, BuiltIn("a band's fairnessPolicyRef naming it serves the band's fairness keys in turn");
    ProgramAwareFairness = "program-aware-fairness", FlowControl, Beta, Plugin;
    FcfsOrderingPolicy = "fcfs-ordering-policy", FlowControl, Beta, FLOW;
    EdfOrderingPolicy = "edf-ordering-policy", FlowControl, Beta, BuiltIn("a band's orderingPolicyRef naming it orders by arrival plus TTL, which is arrival order here: epp gives every request the same TTL");
    SloDeadlineOrderingPolicy = "slo-deadline-ordering-policy", FlowControl, Beta, BuiltIn("a band's orderingPolicyRef naming it serves each key's earliest arrival plus x-llm-d-slo-ttft-ms first");
    StaticUsageLimitPolicy = "static-usage-limit-policy", FlowControl, Beta, BuiltIn("epp's flow control limits requests and bytes per band statically (maxRequests, maxBytes)");
    PriorityHoldbackPolicy = "priority-holdback-policy", FlowControl, Alpha, Plugin;
    SoftReflectiveCeilingPolicy = "soft-reflective-ceiling-policy", FlowControl, Alpha, Plugin;
    SheddableEvictionFilter = "sheddable-eviction-filter", FlowControl, Alpha, EVICTION;
    PriorityThenTimeEvictionOrderPolicy = "priority-then-time-eviction-order-policy", FlowControl, Alpha, EVICTION;
    EvictionSheddableFilter = "eviction-sheddable-filter", FlowControl, Beta, EVICTION_RENAMED;
    EvictionPriorityThenTimeOrdering = "eviction-priority-then-time-ordering", FlowControl, Beta, EVICTION_RENAMED;

    // Saturation detectors.
    UtilizationDetector = "utilization-detector", Saturation, Beta, Plugin;
    ConcurrencyDetector = "concurrency-detector", Saturation, Beta, Plugin;

    // Request control.
    LatencySloAdmitter = "latency-slo-admitter", RequestControl, Beta, LATENCY_PREDICTOR;
    ProbabilisticAdmitter = "probabilistic-admitter", RequestControl, Beta, Plugin;
    RequestAttributeReporter = "request-attribute-reporter", RequestControl, Beta, Plugin;
    DestinationEndpointServedVerifier = "destination-endpoint-served-verifier", RequestControl, Beta, Plugin;
    AgentIdentity = "agent-identity", RequestControl, Alpha, Plugin;
    DisaggregatedsetRolloutScreener = "disaggregatedset-rollout-screener", RequestControl, Alpha, Plugin;

    // Passive health (epp's own).
    OutlierDetection = "outlier-detection", Health, Stable, Plugin;
    SlowStart = "slow-start", Health, Stable, Plugin;
}

/// One parameter of a plugin that has a value the plugin cannot take. The message names the
/// parameter (in upstream's words where upstream has a check: `blockSizeTokens must be > 0`);
/// the configuration decoder reports it with the plugin's name:
/// `plugin "x" parameters: blockSizeTokens must be > 0`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub(crate) struct Invalid {
    /// The parameter as the configuration spells it (`blockSizeTokens`, `sessionIdConfig`),
    /// or several of them when only their combination is wrong.
    pub(crate) parameter: &'static str,
    /// What is wrong, naming the parameter.
    pub(crate) message: String,
}

impl Invalid {
    pub(crate) fn new(parameter: &'static str, message: impl Into<String>) -> Self {
        Self {
            parameter,
            message: message.into(),
        }
    }
}

/// A plugin's `parameters`, as the configuration decoder hands them to the module that owns
/// the plugin: that module names its parameter type and checks the values, the decoder supplies
/// the document format and its errors. So a module decodes its own plugins (the scorers in
/// `scheduling::scorer`) without knowing the configuration file, and the decoder needs no arm
/// per plugin.
pub(crate) trait Parameters {
    /// The decoder's error: a decoding failure, or the [`Invalid`] values a check returned.
    type Error: From<Invalid> + From<Vec<Invalid>>;

    /// The parameters, decoded strictly into `T` (an unknown parameter is an error); absent
    /// parameters are `T`'s defaults.
    fn decode<T: serde::de::DeserializeOwned + Default>(&self) -> Result<T, Self::Error>;

    /// Whether the parameters name `key` at all (a default and an explicit value may differ).
    fn names(&self, key: &str) -> bool;
}

impl fmt::Display for PluginKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl PluginKind {
    /// Plugins llm-d-router removed that epp still loads: the configuration that replaces the
    /// instance `name` (one line, for its deprecation notice).
    pub(crate) fn replacement(self, name: &str) -> Option<String> {
        match self {
            // llm-d-router v0.11 (#2844) split it into a data producer and the prefix scorer.
            Self::PrecisePrefixCacheScorer => Some(format!(
                "DEPRECATION: plugin {name:?} (type: precise-prefix-cache-scorer) was removed in llm-d-router v0.11, which refuses it; epp still loads it. Replacement: \
                 {{type: precise-prefix-cache-producer, parameters: <its parameters>}} listed as an extractor of a dataLayer source \
                 (e.g. {{pluginRef: endpoint-notification-source, extractors: [{{pluginRef: precise-prefix-cache-producer}}]}}), \
                 and {{name: {name}, type: prefix-cache-scorer, parameters: {{prefixMatchInfoProducerName: precise-prefix-cache-producer}}}} \
                 in its place in schedulingProfiles"
            )),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_round_trip_and_are_unique() {
        let mut seen = HashSet::new();
        for &k in PluginKind::ALL {
            assert!(seen.insert(k.name()), "{k} twice");
            assert_eq!(PluginKind::from_name(k.name()), Some(k));
        }
        assert_eq!(PluginKind::from_name("queue-scorers"), None);
    }

    #[test]
    fn every_refusal_says_why() {
        for &k in PluginKind::ALL {
            if let Support::Unsupported(why) | Support::BuiltIn(why) = k.support() {
                assert!(why.len() > 10, "{k}: {why:?}");
            }
        }
    }
}

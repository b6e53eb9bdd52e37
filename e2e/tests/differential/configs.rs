//! The configurations of the cases (`plugins:`, `schedulingProfiles:` and, for parsers,
//! `requestHandler:`), one per type. The runner adds llm-d's `file-discovery` and metrics data
//! layer; both EPPs load the result as it is.

/// A profile of `filter` then `random-picker`.
macro_rules! filtered {
    ($filter:literal) => {
        concat!(
            "plugins:\n- ",
            $filter,
            "\n- {type: random-picker}\nschedulingProfiles:\n- name: default\n  plugins: [{pluginRef: f}, {pluginRef: random-picker}]\n"
        )
    };
}

pub const FILTER_DECODE: &str = filtered!("{name: f, type: decode-filter}");
pub const FILTER_PREFILL: &str = filtered!("{name: f, type: prefill-filter}");
pub const FILTER_BY_LABEL: &str = filtered!(
    "{name: f, type: by-label, parameters: {label: tier, validValues: [gold], allowsNoLabel: false}}"
);
pub const FILTER_SELECTOR: &str = filtered!(
    "{name: f, type: label-selector-filter, parameters: {matchExpressions: [{key: tier, operator: NotIn, values: [silver]}]}}"
);
pub const FILTER_UTILIZATION: &str = filtered!(
    "{name: f, type: utilization-filter, parameters: {conditions: [{metric: kv-cache-utilization, maxValue: 0.5}]}}"
);
pub const FILTER_CONTEXT_LENGTH: &str =
    filtered!("{name: f, type: context-length-aware, parameters: {enableFiltering: true}}");
pub const FILTER_ENCODE: &str = filtered!("{name: f, type: encode-filter}");
pub const FILTER_BY_LABEL_SELECTOR: &str =
    filtered!("{name: f, type: by-label-selector, parameters: {matchLabels: {tier: gold}}}");
pub const FILTER_HEADER: &str = filtered!("{name: f, type: header-based-testing-filter}");

/// A profile of `scorer` (weight 1) then `max-score-picker`.
macro_rules! scored {
    ($scorer:literal) => {
        concat!(
            "plugins:\n- ",
            $scorer,
            "\n- {type: max-score-picker}\nschedulingProfiles:\n- name: default\n  plugins: [{pluginRef: s}, {pluginRef: max-score-picker}]\n"
        )
    };
}

pub const SCORER_QUEUE: &str = scored!("{name: s, type: queue-scorer}");
pub const SCORER_KV: &str = scored!("{name: s, type: kv-cache-utilization-scorer}");
pub const SCORER_RUNNING: &str = scored!("{name: s, type: running-requests-size-scorer}");
pub const SCORER_LOAD_AWARE: &str =
    scored!("{name: s, type: load-aware-scorer, parameters: {threshold: 10}}");
pub const SCORER_LORA: &str = scored!("{name: s, type: lora-affinity-scorer}");

pub const SCORER_PREFIX: &str = "
plugins:
- {type: queue-scorer}
- {type: prefix-cache-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 1}
  - {pluginRef: prefix-cache-scorer, weight: 3}
  - {pluginRef: max-score-picker}
";

pub const SCORER_SESSION: &str = "
plugins:
- {type: queue-scorer}
- {type: session-affinity-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 1}
  - {pluginRef: session-affinity-scorer, weight: 10}
  - {pluginRef: max-score-picker}
";

pub const PICKER_MAX_SCORE: &str = "
plugins:
- {type: queue-scorer}
- {type: kv-cache-utilization-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 1}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: max-score-picker}
";

pub const PICKER_RANDOM: &str = "
plugins:
- {type: queue-scorer}
- {type: random-picker}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: random-picker}]
";

pub const PICKER_WEIGHTED_RANDOM: &str = "
plugins:
- {type: queue-scorer}
- {type: weighted-random-picker}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: weighted-random-picker}]
";

pub const HANDLER_SINGLE: &str = "
plugins:
- {type: single-profile-handler}
- {type: queue-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
";

pub const PARSER_OPENAI: &str = "
plugins:
- {type: openai-parser}
- {type: queue-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
requestHandler:
  parsers: [{pluginRef: openai-parser}]
";

/// The prefix-affine profile (queue 1, prefix 3) over the approximate producer: its plugin
/// entries from the producer on, then its profile.
macro_rules! approx_prefix {
    () => {
        "- {type: approx-prefix-cache-producer, parameters: {maxPrefixTokensToMatch: 4096}}
- {type: queue-scorer}
- {type: prefix-cache-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 1}
  - {pluginRef: prefix-cache-scorer, weight: 3}
  - {pluginRef: max-score-picker}
"
    };
}

pub const PRODUCER_APPROX_PREFIX: &str = concat!("plugins:\n", approx_prefix!());

pub const PARSER_PASSTHROUGH: &str = "
plugins:
- {type: passthrough-parser}
- {type: queue-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
requestHandler:
  parsers: [{pluginRef: passthrough-parser}]
";

/// P/D with `handler` (naming the decider `d`) and the decider: the llm-d P/D guide's
/// profiles.
macro_rules! disagg {
    ($handler:literal, $decider:literal) => {
        concat!(
            "
plugins:
- {type: prefix-cache-scorer}
- {type: queue-scorer}
- {type: prefill-filter}
- {type: decode-filter}
- {type: max-score-picker}
- ",
            $handler,
            "
- ",
            $decider,
            "
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: max-score-picker
  - {pluginRef: prefix-cache-scorer, weight: 2}
  - {pluginRef: queue-scorer, weight: 1}
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: max-score-picker
  - {pluginRef: prefix-cache-scorer, weight: 2}
  - {pluginRef: queue-scorer, weight: 1}
"
        )
    };
}

pub const HANDLER_DISAGG: &str = disagg!(
    "{type: disagg-profile-handler, parameters: {deciders: {prefill: d}}}",
    "{name: d, type: always-disagg-pd-decider}"
);
pub const HANDLER_PD: &str = disagg!(
    "{type: pd-profile-handler, parameters: {deciderPluginName: d}}",
    "{name: d, type: always-disagg-pd-decider}"
);
pub const HEADERS_DISAGG: &str = disagg!(
    "{type: pd-profile-handler, parameters: {deciderPluginName: d}}\n- {type: disagg-headers-handler}",
    "{name: d, type: always-disagg-pd-decider}"
);
pub const HEADERS_PREFILL: &str = disagg!(
    "{type: pd-profile-handler, parameters: {deciderPluginName: d}}\n- {type: prefill-header-handler}",
    "{name: d, type: always-disagg-pd-decider}"
);
pub const DISCOVERY_FILE: &str = "
plugins:
- {type: random-picker}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: random-picker}]
";
pub const DECIDER_PREFIX: &str = disagg!(
    "{type: disagg-profile-handler, parameters: {deciders: {prefill: d}}}",
    "{name: d, type: prefix-based-pd-decider, parameters: {nonCachedTokens: 16}}"
);

/// `filter` first, then the queue scorer (weight 1) and `max-score-picker`, with the prefix
/// producer and the session scorer's sources configured as upstream needs them.
macro_rules! sticky {
    ($filter:literal) => {
        concat!(
            "plugins:\n- ",
            $filter,
            "\n- {type: queue-scorer}\n- {type: max-score-picker}\nschedulingProfiles:\n- name: default\n  plugins: [{pluginRef: f}, {pluginRef: queue-scorer}, {pluginRef: max-score-picker}]\n"
        )
    };
}

pub const FILTER_SESSION: &str = sticky!("{name: f, type: session-affinity-filter}");
pub const FILTER_PREFIX_AFFINITY: &str = concat!(
    "plugins:\n- {type: approx-prefix-cache-producer}\n- {name: f, type: prefix-cache-affinity-filter, parameters: {affinityThreshold: 0.5}}\n",
    "- {type: queue-scorer}\n- {type: max-score-picker}\nschedulingProfiles:\n- name: default\n  plugins: [{pluginRef: f}, {pluginRef: queue-scorer}, {pluginRef: max-score-picker}]\n"
);

/// The queue-scored profile with `parser` as the one request parser.
macro_rules! parsed {
    ($parser:literal) => {
        concat!(
            "plugins:\n- {type: ",
            $parser,
            "}\n- {type: queue-scorer}\n- {type: max-score-picker}\nschedulingProfiles:\n- name: default\n  plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]\nrequestHandler:\n  parsers: [{pluginRef: ",
            $parser,
            "}]\n"
        )
    };
}

pub const PARSER_ANTHROPIC: &str = parsed!("anthropic-parser");
pub const PARSER_VLLMHTTP: &str = parsed!("vllmhttp-parser");

/// A hub's data layer: its clusters from `CLUSTERS`, each spoke EPP's metrics over https
/// verified by `SPOKES_CA` (the runner writes both files), read by the extractor `EXTRACTOR`
/// names (its parameters).
macro_rules! hub {
    ($extractor:literal, $plugins:literal, $profile:literal) => {
        concat!(
            "plugins:
- {name: clusters, type: multicluster-file-discovery, parameters: {path: CLUSTERS}}
- {name: spokes, type: multicluster-metrics-data-source, parameters: {caCertPath: SPOKES_CA}}
- {name: pool, type: multicluster-metrics-extractor, parameters: ",
            $extractor,
            "}
",
            $plugins,
            "- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins: [",
            $profile,
            ", {pluginRef: max-score-picker}]
dataLayer:
  discovery: {pluginRef: clusters}
  sources: [{pluginRef: spokes, extractors: [{pluginRef: pool}]}]
"
        )
    };
}

pub const HUB_QUEUE: &str = hub!(
    "{}",
    "- {name: s, type: multicluster-queue-scorer}\n",
    "{pluginRef: s}"
);
pub const HUB_KV: &str = hub!(
    "{}",
    "- {name: s, type: multicluster-kv-cache-utilization-scorer}\n",
    "{pluginRef: s}"
);
/// The extractor told the spokes' series by name and label (the defaults, spelled out).
pub const HUB_EXTRACTOR: &str = hub!(
    "{kvCacheUtilizationMetric: 'llm_d_epp_average_kv_cache_utilization{name=spoke}', queueSizeMetric: 'llm_d_epp_average_queue_size{name=\"spoke\"}'}",
    "- {name: s, type: multicluster-queue-scorer}\n",
    "{pluginRef: s}"
);
pub const HUB_PREFIX: &str = hub!(
    "{}",
    "- {name: q, type: multicluster-queue-scorer}\n- {name: p, type: multicluster-prefix-cache-scorer}\n",
    "{pluginRef: q, weight: 1}, {pluginRef: p, weight: 3}"
);
pub const HUB_PRODUCER: &str = hub!(
    "{}",
    "- {type: multicluster-approx-prefix-cache-producer, parameters: {maxPrefixTokensToMatch: 4096}}\n- {name: q, type: multicluster-queue-scorer}\n- {name: p, type: multicluster-prefix-cache-scorer, parameters: {prefixMatchInfoProducerName: multicluster-approx-prefix-cache-producer}}\n",
    "{pluginRef: q, weight: 1}, {pluginRef: p, weight: 3}"
);
pub const HUB_SESSION: &str = hub!(
    "{}",
    "- {name: f, type: multicluster-session-affinity-filter}\n- {name: q, type: multicluster-queue-scorer}\n",
    "{pluginRef: f}, {pluginRef: q}"
);

/// P/D decode-first (always disaggregate) whose prefill profile adds `$prefill` (its plugins
/// listed in `$plugins`): the topology plugins compare the prefill pods with the decode pick.
macro_rules! topology {
    ($plugins:literal, $prefill:literal) => {
        concat!(
            "
plugins:
- {type: queue-scorer}
- {type: prefill-filter}
- {type: decode-filter}
- {type: max-score-picker}
- {type: disagg-profile-handler, parameters: {deciders: {prefill: d}}}
- {name: d, type: always-disagg-pd-decider}
",
            $plugins,
            "schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: max-score-picker
  - {pluginRef: queue-scorer, weight: 1}
",
            $prefill,
            "- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: max-score-picker
  - {pluginRef: queue-scorer, weight: 1}
"
        )
    };
}

pub const TOPOLOGY_FILTER: &str = topology!(
    "- {type: topology-extractor}\n- {name: t, type: topology-affinity-filter}\n",
    "  - pluginRef: t\n"
);
pub const TOPOLOGY_SCORER: &str = topology!(
    "- {type: topology-extractor}\n- {name: t, type: topology-affinity-scorer}\n",
    "  - {pluginRef: t, weight: 3}\n"
);
/// The extractor told to read the host from a label of the site's own (`node`).
pub const TOPOLOGY_EXTRACTOR: &str = topology!(
    "- {name: where, type: topology-extractor, parameters: {hostname: node}}\n- {name: t, type: topology-affinity-filter, parameters: {topologyProducerName: where, minAffinity: host}}\n",
    "  - pluginRef: t\n"
);

/// Queue-scored (weight 1), with a header-to-label preference (weight 2) over it.
pub const SCORER_HEADER_LABEL: &str = "
plugins:
- {type: queue-scorer}
- {name: zone, type: header-label-affinity-scorer, parameters: {headerName: X-Preferred-Zone, labelKey: zone}}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 1}
  - {pluginRef: zone, weight: 2}
  - {pluginRef: max-score-picker}
";

/// `core-metrics-extractor` with vLLM's built-in specifications and one custom metric, the
/// running requests as the endpoint attribute `running`; then `$rest` (plugins and profiles).
macro_rules! with_attribute {
    ($rest:literal) => {
        concat!(
            "plugins:
- type: core-metrics-extractor
  parameters:
    engineConfigs:
    - name: vllm
      queuedRequestsSpec: 'vllm:num_requests_waiting'
      runningRequestsSpec: 'vllm:num_requests_running'
      kvUsageSpec: 'vllm:kv_cache_usage_perc'
      loraSpec: 'vllm:lora_requests_info'
      cacheInfoSpec: 'vllm:cache_config_info'
      customMetrics: [{attributeKey: running, metricSpec: 'vllm:num_requests_running'}]
",
            $rest
        )
    };
}

/// Endpoints with fewer than 3 running requests (by the custom metric), then a random pick.
pub const FILTER_ENDPOINT_ATTRIBUTE: &str = with_attribute!(
    "- {name: f, type: endpoint-attribute-filter, parameters: {attribute: running, algorithm: {type: threshold, threshold: {operator: LessThan, value: 3}}}}
- {type: random-picker}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: f}, {pluginRef: random-picker}]
"
);

/// The fewest running requests (by the custom metric) is best.
pub const SCORER_ENDPOINT_ATTRIBUTE: &str = with_attribute!(
    "- {name: s, type: endpoint-attribute-scorer, parameters: {attributeKey: running, algorithm: {type: linear_lower_is_better}}}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: s}, {pluginRef: max-score-picker}]
"
);

/// `disaggregatedset-rollout-screener` (revision gating off) in front of the queue scorer.
pub const ROLLOUT_SCREENER: &str = "
plugins:
- name: screener
  type: disaggregatedset-rollout-screener
  parameters:
    scope: {labelSelector: 'app=x'}
    headerSelectors:
    - {name: revision, headerName: X-LLM-D-Revision, labelKey: rev, mode: strict}
    - {name: slice, headerName: x-llm-d-slice, labelKey: slice, mode: prefer}
    revisionGating: {mode: disabled}
- {type: queue-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
";

/// Two profiles, the request's `x-stage` header naming the one that runs (`decode` without).
pub const HANDLER_HEADER: &str = "
plugins:
- {type: header-profile-handler, parameters: {headerName: X-Stage}}
- {type: prefill-filter}
- {type: decode-filter}
- {type: queue-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
";

/// The eviction policies configured (nothing reads them in either EPP) beside a queue-scored
/// profile, under flow control with eviction on.
pub const EVICTION_POLICIES: &str = "
featureGates: [flowControl]
flowControl: {enableEviction: true}
plugins:
- {type: sheddable-eviction-filter}
- {type: priority-then-time-eviction-order-policy}
- {type: queue-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
";

/// Flow control with `policy` named by `usageLimitPolicyPluginRef`, saturation from the
/// utilization detector (queue threshold 10), a short queue TTL, a queue-scored profile.
macro_rules! usage_limited {
    ($policy:literal) => {
        concat!(
            "
featureGates: [flowControl]
flowControl:
  defaultRequestTTL: 1s
  usageLimitPolicyPluginRef: limit
  saturationDetector: {pluginRef: utilization-detector}
plugins:
- {type: utilization-detector, parameters: {queueDepthThreshold: 10}}
- ",
            $policy,
            "
- {type: queue-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
"
        )
    };
}

pub const LIMIT_HOLDBACK: &str = usage_limited!(
    "{name: limit, type: priority-holdback-policy, parameters: {minCeiling: 0.1, maxCeiling: 0.4}}"
);
pub const LIMIT_SOFT_REFLECTIVE: &str =
    usage_limited!("{name: limit, type: soft-reflective-ceiling-policy}");

/// `data-parallel-profile-handler` sending every pick to pod 0's port (`{port0}`), the rank
/// picked by queue in `x-data-parallel-host-port`.
pub const HANDLER_DATA_PARALLEL: &str = "
plugins:
- {type: data-parallel-profile-handler, parameters: {primaryPort: {port0}}}
- {type: queue-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
";

pub const PARSER_VERTEXAI: &str = parsed!("vertexai-parser");
pub const PARSER_VLLMGRPC: &str = parsed!("vllmgrpc-parser");

pub const LIMIT_STATIC: &str = usage_limited!("{name: limit, type: static-usage-limit-policy}");

/// Flow control with the utilization detector (queue threshold 10) and upstream's default
/// usage limit.
pub const DETECTOR_UTILIZATION: &str = "
featureGates: [flowControl]
flowControl:
  defaultRequestTTL: 1s
  saturationDetector: {pluginRef: utilization-detector}
plugins:
- {type: utilization-detector, parameters: {queueDepthThreshold: 10}}
- {type: queue-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
";

/// Flow control with the concurrency detector: one request at a time never saturates it.
pub const DETECTOR_CONCURRENCY: &str = "
featureGates: [flowControl]
flowControl:
  defaultRequestTTL: 1s
  saturationDetector: {pluginRef: concurrency-detector}
plugins:
- {type: concurrency-detector, parameters: {maxConcurrency: 2}}
- {type: queue-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
";

/// Flow control whose default band names `fairness` and `ordering` (declared as `fair` and
/// `order`), the utilization detector deciding.
macro_rules! band_policies {
    ($fairness:literal, $ordering:literal) => {
        concat!(
            "
featureGates: [flowControl]
flowControl:
  defaultRequestTTL: 1s
  saturationDetector: {pluginRef: utilization-detector}
  defaultPriorityBand: {fairnessPolicyRef: fair, orderingPolicyRef: order}
plugins:
- {type: utilization-detector, parameters: {queueDepthThreshold: 10}}
- {name: fair, type: ",
            $fairness,
            "}
- {name: order, type: ",
            $ordering,
            "}
- {type: queue-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
"
        )
    };
}

pub const FLOW_STRICT_FCFS: &str =
    band_policies!("global-strict-fairness-policy", "fcfs-ordering-policy");
pub const FLOW_ROUND_ROBIN_EDF: &str =
    band_policies!("round-robin-fairness-policy", "edf-ordering-policy");

/// `scorer` (weight 1) beside the queue scorer (weight 2), `max-score-picker`.
macro_rules! beside_queue {
    ($scorer:literal) => {
        concat!(
            "plugins:\n- {type: queue-scorer}\n- {name: s, type: ",
            $scorer,
            "}\n- {type: max-score-picker}\nschedulingProfiles:\n- name: default\n  plugins: [{pluginRef: queue-scorer, weight: 2}, {pluginRef: s}, {pluginRef: max-score-picker}]\n"
        )
    };
}

pub const SCORER_ACTIVE_REQUEST: &str = beside_queue!("active-request-scorer");
/// llm-d's token-load scorer reads the in-flight load producer's data (refused without it).
pub const SCORER_TOKEN_LOAD: &str = "
plugins:
- {type: inflight-load-producer}
- {type: queue-scorer}
- {name: s, type: token-load-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer, weight: 2}, {pluginRef: s}, {pluginRef: max-score-picker}]
";

pub const FLOW_STRICT_SLO_DEADLINE: &str = band_policies!(
    "global-strict-fairness-policy",
    "slo-deadline-ordering-policy"
);
pub const FLOW_PROGRAM_AWARE: &str =
    band_policies!("program-aware-fairness", "fcfs-ordering-policy");
pub const PRODUCER_SESSION_ID: &str =
    beside_queue!("session-id-producer, parameters: {headerName: x-session-id}");

/// The cold-request LRU scorer alone, over the approximate prefix producer's matches.
pub const SCORER_NO_HIT_LRU: &str =
    scored!("{type: approx-prefix-cache-producer}\n- {name: s, type: no-hit-lru-scorer}");
/// The queue-scored profile and the conformance verifier.
pub const VERIFIER_SERVED: &str =
    scored!("{type: destination-endpoint-served-verifier}\n- {name: s, type: queue-scorer}");
/// The queue-scored profile, and a reporter of the tokens a request used, when its prompt had
/// more than 3.
pub const ATTRIBUTE_REPORTER: &str = scored!(
    "{type: request-attribute-reporter, parameters: {attributes: [{key: {name: x-gateway-inference-request-cost}, expression: 'usage.prompt_tokens + usage.completion_tokens', condition: 'usage.prompt_tokens > 3.0'}]}}\n- {name: s, type: queue-scorer}"
);
/// The queue-scored profile behind the probabilistic admitter, tight thresholds.
pub const ADMITTER_PROBABILISTIC: &str = scored!(
    "{type: probabilistic-admitter, parameters: {queueDepthThreshold: 2, kvCacheUtilThreshold: 0.5}}\n- {name: s, type: queue-scorer}"
);
/// Encode/decode disaggregation: the encode stage runs for requests with multimodal content.
pub const DECIDER_MULTIMODAL: &str = "
plugins:
- {type: queue-scorer}
- {type: encode-filter}
- {type: decode-filter}
- {type: max-score-picker}
- {type: disagg-profile-handler, parameters: {deciders: {encode: d}}}
- {name: d, type: always-disagg-multimodal-decider}
schedulingProfiles:
- name: encode
  plugins: [{pluginRef: encode-filter}, {pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
";

/// `PRODUCER_APPROX_PREFIX`'s profile with the token producer in its estimate mode (upstream's
/// default backend: no tokenizer server), under `$kind`'s name.
macro_rules! tokenized {
    ($kind:literal) => {
        concat!(
            "plugins:\n- {type: ",
            $kind,
            ", parameters: {estimate: {}}}\n",
            approx_prefix!()
        )
    };
}
pub const TOKEN_PRODUCER: &str = tokenized!("token-producer");
pub const TOKENIZER: &str = tokenized!("tokenizer");
/// Load first (queue 3, prefix 1), with the P2P source producer naming the pod that holds the
/// prompt's cache when the pick is another one.
pub const PRODUCER_P2P_SOURCE: &str = "
plugins:
- {type: approx-prefix-cache-producer, parameters: {maxPrefixTokensToMatch: 4096}}
- {type: p2p-source-producer}
- {type: queue-scorer}
- {type: prefix-cache-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 3}
  - {pluginRef: prefix-cache-scorer, weight: 1}
  - {pluginRef: max-score-picker}
";

/// The profile of `scored!($plugins)` (which name the queue scorer `s`) with `$sources` as the data layer's
/// own sources (the runner puts the metrics source first).
macro_rules! sourced {
    ($plugins:literal, $sources:literal) => {
        concat!(scored!($plugins), "dataLayer:\n  sources: ", $sources, "\n")
    };
}
/// The pods' served models polled from `/v1/models`.
pub const SOURCE_MODELS: &str = sourced!(
    "{name: models, type: models-data-source}\n- {name: served, type: models-data-extractor}\n- {name: s, type: queue-scorer}",
    "[{pluginRef: models, extractors: [{pluginRef: served}]}]"
);
/// DCGM GPU series scraped from each pod's node exporter.
pub const SOURCE_DCGM: &str = sourced!(
    "{name: gpus, type: dcgm-data-source}\n- {name: gpu, type: dcgm-extractor}\n- {name: s, type: queue-scorer}",
    "[{pluginRef: gpus, extractors: [{pluginRef: gpu}]}]"
);
/// The queue-scored profile with `agent-identity` reading the coding agents' session headers.
pub const AGENT_IDENTITY: &str = scored!(
    "{type: agent-identity, parameters: {additionalSessionHeaders: [x-my-agent-session]}}\n- {name: s, type: queue-scorer}"
);
/// Encoder-cache affinity (weight 3) over load (weight 1).
pub const MM_EMBEDDINGS: &str = "
plugins:
- {type: mm-embeddings-cache-producer}
- {name: mm, type: mm-embeddings-cache-scorer}
- {name: q, type: queue-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: mm, weight: 3}, {pluginRef: q, weight: 1}, {pluginRef: max-score-picker}]
";

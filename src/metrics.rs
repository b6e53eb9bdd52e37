//! epp's own Prometheus metrics, as typed fields registered once and passed in.
//!
//! Names and labels follow the upstream EPP (`pkg/epp/metrics/metrics.go`) so dashboards and
//! alerts carry over; families prefixed `epp_` are ours and say so in their help text.
//! Label values are typed structs; nothing formats a metric name at request time. Closed sets
//! (outcomes, error codes, resources, kinds) are enums; model names are capped ([`model`]).

pub(crate) mod model;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

pub use model::{ModelLabel, ModelNames};
pub mod affinity;
pub mod disagg;
pub mod encoder_cache;
pub use affinity::AffinityLabels;
pub use disagg::DisaggMetrics;
pub use encoder_cache::{EncoderHitLabels, EncoderQueryLabels, EncoderRatioLabels};
mod labels;
pub use labels::*;

type GaugeF = Gauge<f64, AtomicU64>;

fn latency_buckets() -> Histogram {
    // 50 µs .. ~100 s, doubling.
    Histogram::new(exponential_buckets(0.00005, 2.0, 22))
}
fn size_buckets() -> Histogram {
    Histogram::new(exponential_buckets(64.0, 4.0, 12))
}
fn token_buckets() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 20))
}
fn ratio_buckets() -> Histogram {
    Histogram::new([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
}

type HistFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Every metric epp exports. Cheap to share behind an `Arc`.
pub struct Metrics {
    pub(crate) request_total: Family<RequestLabels, Counter>,
    pub(crate) request_error_total: Family<ErrorLabels, Counter>,
    pub(crate) request_duration: HistFamily<ModelLabels>,
    pub(crate) request_sizes: HistFamily<ModelLabels>,
    pub(crate) response_sizes: HistFamily<ModelLabels>,
    pub(crate) input_tokens: HistFamily<ModelLabels>,
    pub(crate) output_tokens: HistFamily<ModelLabels>,
    pub(crate) prompt_cached_tokens: HistFamily<ModelLabels>,
    pub(crate) running_requests: Family<RunningLabels, Gauge>,
    pub(crate) pool_avg_kv: Family<PoolLabels, GaugeF>,
    pub(crate) pool_avg_queue: Family<PoolLabels, GaugeF>,
    pub(crate) pool_avg_running: Family<PoolLabels, GaugeF>,
    pub(crate) pool_ready_pods: Family<PoolLabels, Gauge>,
    pub(crate) pool_per_pod_queue: Family<PodLabels, GaugeF>,
    pub(crate) scheduler_e2e: Histogram,
    pub(crate) scheduler_attempts: Family<AttemptLabels, Counter>,
    pub(crate) prefix_indexer_size: Gauge,
    /// Pseudo-tokens per model-server token the approximate index learned (`tokenizer:
    /// characters`; 1 until a response teaches it).
    pub(crate) prefix_token_scale: GaugeF,
    pub(crate) prefix_hit_ratio: Histogram,
    pub(crate) prefix_hit_bytes: Histogram,
    pub(crate) info: Family<InfoLabels, Gauge>,
    pub(crate) scrapes: Family<OutcomeLabels, Counter>,
    pub(crate) stale_endpoints: Gauge,
    pub(crate) config_reloads: Family<OutcomeLabels, Counter>,
    pub(crate) stream_resets: Counter,
    pub(crate) served_fallbacks: Counter,
    /// `token-producer` render calls (`vllm` backend), by outcome.
    pub(crate) renders: Family<OutcomeLabels, Counter>,
    /// Passive health (#7): ejections, restorations, whether an endpoint is out now, probes.
    pub(crate) outlier_ejections: Family<EndpointLabels, Counter>,
    pub(crate) outlier_restores: Family<EndpointLabels, Counter>,
    pub(crate) endpoint_ejected: Family<EndpointLabels, Gauge>,
    pub(crate) health_probes: Family<OutcomeLabels, Counter>,
    pub(crate) crd_validation_failures: Family<CrdRuleLabels, Counter>,
    /// API requests refused with 403 (RBAC), by resource and verb.
    pub(crate) kubernetes_forbidden: Family<ForbiddenLabels, Counter>,
    pub kv: KvEventMetrics,
    /// Placements shared with other replicas, by outcome.
    pub peer_messages: Family<PeerLabels, Counter>,
    pub(crate) flow: FlowControlMetrics,
    /// `/metrics` requests refused or failed by the endpoint's authentication, by outcome.
    pub(crate) metrics_auth: Family<MetricsAuthLabels, Counter>,
    /// The model names given label values so far (capped).
    pub(crate) models: ModelNames,
    /// The fairness keys (flow-control `fairness_id`, program-aware `program_id`) given label
    /// values so far: client-chosen like model names, capped the same way.
    pub(crate) fairness_keys: ModelNames,
    /// Disaggregated serving: the profile handlers' decisions.
    pub(crate) disagg: DisaggMetrics,
    /// `prefix-cache-affinity-filter`'s decisions (the process-wide family the filter counts
    /// into: [`affinity::AFFINITY_FILTER_DECISIONS`]).
    pub(crate) affinity_decisions: Family<AffinityLabels, Counter>,
    /// The multimodal encoder cache's lookups (process-wide: [`encoder_cache`]).
    pub(crate) encoder_cache_queries: Family<EncoderQueryLabels, Counter>,
    pub(crate) encoder_cache_hits: Family<EncoderHitLabels, Counter>,
    pub(crate) encoder_cache_hit_ratio: Family<EncoderRatioLabels, Histogram>,
}

/// The flow-control queue's metrics (`flowcontrol`).
pub(crate) struct FlowControlMetrics {
    /// Requests waiting now.
    pub(crate) queue_size: Family<FlowQueueLabels, Gauge>,
    /// Bytes of the requests waiting now.
    pub(crate) queue_bytes: Family<FlowQueueLabels, Gauge>,
    /// Time from arrival to the outcome, every request through flow control.
    pub(crate) queue_duration: HistFamily<FlowDurationLabels>,
    /// The saturation flow control last read (≥ 1.0: requests wait).
    pub(crate) pool_saturation: Family<FlowPoolLabels, GaugeF>,
    /// `program-aware-fairness`: each program's decayed attained service, weighted tokens, as
    /// of its last completion (llm-d's `llm_d_epp_program_aware_attained_service_tokens`).
    pub(crate) attained_service: Family<ProgramLabels, GaugeF>,
    /// `program-aware-fairness`: each program's mean wait in the queue, ms.
    pub(crate) avg_wait: Family<ProgramLabels, GaugeF>,
    /// `program-aware-fairness`: Jain's fairness index over the programs' mean waits.
    pub jains_index: GaugeF,
}

/// The KV-event subscribers' metrics (`kvevents`).
#[derive(Default)]
pub struct KvEventMetrics {
    /// Batches received, decodable or not.
    pub batches: Family<OutcomeLabels, Counter>,
    pub events: Family<KvEventLabels, Counter>,
    pub gaps: Family<KvGapLabels, Counter>,
    /// Publisher restarts and disconnects (the endpoint's entries are dropped).
    pub resets: Counter,
    /// 1 while an endpoint's subscription is connected, 0 while it retries.
    pub connected: Family<EndpointLabels, Gauge>,
    /// (endpoint, block) entries in the precise index.
    pub index_entries: Gauge,
}

impl Metrics {
    /// The label value for model `name`, capped at [`model::MODEL_LABEL_CAP`] distinct names.
    pub(crate) fn model(&self, name: &str) -> ModelLabel {
        self.models.label(name)
    }

    /// The label value for fairness key `key` (a client's header), capped like model names.
    pub fn fairness_key(&self, key: &str) -> ModelLabel {
        self.fairness_keys.label(key)
    }

    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::new();
        m.register_objective(registry);
        m.register_pool(registry);
        m.register_extension(registry);
        m.register_llm_d(registry);
        m.disagg.register(registry);
        m
    }

    /// llm-d-router v0.10's `llm_d_epp_*` names for the same families (upstream emits both
    /// sets; a family registered twice shares its values). The label sets stay GIE's: the
    /// request families have no `fairness_id` label here.
    fn register_llm_d(&self, r: &mut Registry) {
        const HELP: &str = "llm-d-router name of the GIE family";
        r.register("llm_d_epp_request", HELP, self.request_total.clone());
        r.register(
            "llm_d_epp_request_error",
            HELP,
            self.request_error_total.clone(),
        );
        r.register(
            "llm_d_epp_request_duration_seconds",
            HELP,
            self.request_duration.clone(),
        );
        r.register(
            "llm_d_epp_request_size_bytes",
            HELP,
            self.request_sizes.clone(),
        );
        r.register(
            "llm_d_epp_response_size_bytes",
            HELP,
            self.response_sizes.clone(),
        );
        r.register(
            "llm_d_epp_request_input_tokens",
            HELP,
            self.input_tokens.clone(),
        );
        r.register(
            "llm_d_epp_request_output_tokens",
            HELP,
            self.output_tokens.clone(),
        );
        r.register(
            "llm_d_epp_request_cached_tokens",
            HELP,
            self.prompt_cached_tokens.clone(),
        );
        r.register(
            "llm_d_epp_request_running",
            HELP,
            self.running_requests.clone(),
        );
        self.register_llm_d_pool(r);
    }

    /// llm-d-router's names of the pool and scheduler families.
    fn register_llm_d_pool(&self, r: &mut Registry) {
        const HELP: &str = "llm-d-router name of the GIE family";
        r.register(
            "llm_d_epp_average_kv_cache_utilization",
            HELP,
            self.pool_avg_kv.clone(),
        );
        r.register(
            "llm_d_epp_average_queue_size",
            HELP,
            self.pool_avg_queue.clone(),
        );
        r.register(
            "llm_d_epp_average_running_requests",
            HELP,
            self.pool_avg_running.clone(),
        );
        r.register(
            "llm_d_epp_ready_endpoints",
            HELP,
            self.pool_ready_pods.clone(),
        );
        r.register(
            "llm_d_epp_per_endpoint_queue_size",
            HELP,
            self.pool_per_pod_queue.clone(),
        );
        r.register(
            "llm_d_epp_scheduler_e2e_duration_seconds",
            HELP,
            self.scheduler_e2e.clone(),
        );
        r.register(
            "llm_d_epp_scheduler_attempts",
            HELP,
            self.scheduler_attempts.clone(),
        );
        r.register(
            "llm_d_epp_prefix_indexer_size",
            HELP,
            self.prefix_indexer_size.clone(),
        );
        r.register(
            "llm_d_epp_prefix_indexer_hit_ratio",
            HELP,
            self.prefix_hit_ratio.clone(),
        );
        r.register(
            "llm_d_epp_prefix_indexer_hit_bytes",
            HELP,
            self.prefix_hit_bytes.clone(),
        );
        r.register("llm_d_epp_info", HELP, self.info.clone());
        r.register(
            "llm_d_epp_prefix_cache_affinity_filter_decisions",
            "Prefix cache affinity filter decisions, by outcome.",
            self.affinity_decisions.clone(),
        );
        self.register_encoder_cache(r);
        self.register_llm_d_flow(r);
    }

    /// `mm-embeddings-cache-producer`'s families.
    fn register_encoder_cache(&self, r: &mut Registry) {
        r.register(
            "llm_d_epp_encoder_cache_queries",
            "Total number of multimodal item hash lookups made against the encoder-cache affinity LRU",
            self.encoder_cache_queries.clone(),
        );
        r.register(
            "llm_d_epp_encoder_cache_hits",
            "Total number of multimodal item hash lookups that found a match in the encoder-cache affinity LRU, by endpoint",
            self.encoder_cache_hits.clone(),
        );
        r.register(
            "llm_d_epp_encoder_cache_hit_ratio",
            "Ratio of matched multimodal items to total items per endpoint in an encoder-cache lookup",
            self.encoder_cache_hit_ratio.clone(),
        );
    }

    /// llm-d-router's flow-control and program-aware families.
    fn register_llm_d_flow(&self, r: &mut Registry) {
        const HELP: &str = "llm-d-router name of the GIE family";
        let f = &self.flow;
        r.register(
            "llm_d_epp_flow_control_queue_size",
            HELP,
            f.queue_size.clone(),
        );
        r.register(
            "llm_d_epp_flow_control_queue_bytes",
            HELP,
            f.queue_bytes.clone(),
        );
        r.register(
            "llm_d_epp_flow_control_request_queue_duration_seconds",
            HELP,
            f.queue_duration.clone(),
        );
        r.register(
            "llm_d_epp_flow_control_pool_saturation",
            HELP,
            f.pool_saturation.clone(),
        );
        r.register(
            "llm_d_epp_program_aware_attained_service_tokens",
            "Time-decayed attained service (weighted tokens consumed) per program.",
            f.attained_service.clone(),
        );
        r.register(
            "llm_d_epp_program_aware_avg_wait_time_milliseconds",
            "Cumulative running mean of flow-control queue wait time per program.",
            f.avg_wait.clone(),
        );
        r.register(
            "llm_d_epp_program_aware_jains_fairness_index",
            "Jain's Fairness Index over the average wait time per program.",
            f.jains_index.clone(),
        );
    }

    fn new() -> Self {
        Self {
            request_total: Family::default(),
            request_error_total: Family::default(),
            request_duration: Family::new_with_constructor(latency_buckets),
            request_sizes: Family::new_with_constructor(size_buckets),
            response_sizes: Family::new_with_constructor(size_buckets),
            input_tokens: Family::new_with_constructor(token_buckets),
            output_tokens: Family::new_with_constructor(token_buckets),
            prompt_cached_tokens: Family::new_with_constructor(token_buckets),
            running_requests: Family::default(),
            pool_avg_kv: Family::default(),
            pool_avg_queue: Family::default(),
            pool_avg_running: Family::default(),
            pool_ready_pods: Family::default(),
            pool_per_pod_queue: Family::default(),
            scheduler_e2e: latency_buckets(),
            scheduler_attempts: Family::default(),
            prefix_indexer_size: Gauge::default(),
            prefix_token_scale: GaugeF::default(),
            prefix_hit_ratio: ratio_buckets(),
            prefix_hit_bytes: size_buckets(),
            info: Family::default(),
            scrapes: Family::default(),
            stale_endpoints: Gauge::default(),
            config_reloads: Family::default(),
            stream_resets: Counter::default(),
            served_fallbacks: Counter::default(),
            renders: Family::default(),
            outlier_ejections: Family::default(),
            outlier_restores: Family::default(),
            endpoint_ejected: Family::default(),
            health_probes: Family::default(),
            crd_validation_failures: Family::default(),
            kubernetes_forbidden: Family::default(),
            kv: KvEventMetrics::default(),
            peer_messages: Family::default(),
            metrics_auth: Family::default(),
            models: ModelNames::default(),
            fairness_keys: ModelNames::default(),
            disagg: DisaggMetrics::default(),
            affinity_decisions: affinity::AFFINITY_FILTER_DECISIONS.clone(),
            encoder_cache_queries: encoder_cache::QUERIES.clone(),
            encoder_cache_hits: encoder_cache::HITS.clone(),
            encoder_cache_hit_ratio: encoder_cache::HIT_RATIO.clone(),
            flow: FlowControlMetrics {
                queue_size: Family::default(),
                queue_bytes: Family::default(),
                queue_duration: Family::new_with_constructor(latency_buckets),
                pool_saturation: Family::default(),
                attained_service: Family::default(),
                avg_wait: Family::default(),
                jains_index: GaugeF::default(),
            },
        }
    }

    fn register_objective(&self, r: &mut Registry) {
        r.register(
            "inference_objective_request",
            "Counter of inference objective requests",
            self.request_total.clone(),
        );
        r.register(
            "inference_objective_request_error",
            "Counter of inference objective request errors",
            self.request_error_total.clone(),
        );
        r.register(
            "inference_objective_request_duration_seconds",
            "Inference objective response latency distribution in seconds",
            self.request_duration.clone(),
        );
        r.register(
            "inference_objective_request_sizes",
            "Inference objective requests size distribution in bytes",
            self.request_sizes.clone(),
        );
        r.register(
            "inference_objective_response_sizes",
            "Inference objective responses size distribution in bytes",
            self.response_sizes.clone(),
        );
        r.register(
            "inference_objective_input_tokens",
            "Inference objective input token count distribution",
            self.input_tokens.clone(),
        );
        r.register(
            "inference_objective_output_tokens",
            "Inference objective output token count distribution",
            self.output_tokens.clone(),
        );
        r.register(
            "inference_objective_prompt_cached_tokens",
            "Inference objective prompt cached token count distribution",
            self.prompt_cached_tokens.clone(),
        );
        r.register(
            "inference_objective_running_requests",
            "Inference objective number of running requests",
            self.running_requests.clone(),
        );
    }

    fn register_pool(&self, r: &mut Registry) {
        r.register(
            "inference_pool_average_kv_cache_utilization",
            "The average kv cache utilization for an inference server pool",
            self.pool_avg_kv.clone(),
        );
        r.register(
            "inference_pool_average_queue_size",
            "The average number of requests pending in the model server queue",
            self.pool_avg_queue.clone(),
        );
        r.register(
            "inference_pool_average_running_requests",
            "The average number of requests running in the model server",
            self.pool_avg_running.clone(),
        );
        r.register(
            "inference_pool_ready_pods",
            "The number of ready pods in the inference server pool",
            self.pool_ready_pods.clone(),
        );
        r.register("inference_pool_per_pod_queue_size", "The total number of requests pending in the model server queue for each underlying pod", self.pool_per_pod_queue.clone());
    }

    fn register_extension(&self, r: &mut Registry) {
        r.register(
            "inference_extension_scheduler_e2e_duration_seconds",
            "End-to-end scheduling latency distribution in seconds",
            self.scheduler_e2e.clone(),
        );
        r.register(
            "inference_extension_scheduler_attempts",
            "Total number of scheduling attempts",
            self.scheduler_attempts.clone(),
        );
        r.register(
            "inference_extension_prefix_indexer_size",
            "Size of the prefix indexer (blocks across all endpoints)",
            self.prefix_indexer_size.clone(),
        );
        r.register(
            "inference_extension_prefix_indexer_hit_ratio",
            "Ratio of prefix length matched to total prefix length",
            self.prefix_hit_ratio.clone(),
        );
        r.register(
            "inference_extension_prefix_indexer_hit_bytes",
            "Length of the prefix match in bytes (tokens x 4)",
            self.prefix_hit_bytes.clone(),
        );
        r.register(
            "inference_extension_info",
            "General information of the current build",
            self.info.clone(),
        );
        self.register_epp(r);
        self.register_kv(r);
        self.register_flow(r);
    }

    /// epp's own families (`epp_*`): what upstream has no name for.
    fn register_epp(&self, r: &mut Registry) {
        r.register(
            "epp_metrics_scrapes",
            "epp: model-server metric scrapes by outcome",
            self.scrapes.clone(),
        );
        r.register(
            "epp_prefix_token_scale",
            "epp: pseudo-tokens (tokenizer: characters) per model-server token, learned from responses' usage; sizes the approximate index",
            self.prefix_token_scale.clone(),
        );
        r.register(
            "epp_stale_endpoints",
            "epp: endpoints whose metrics are older than the staleness threshold",
            self.stale_endpoints.clone(),
        );
        r.register(
            "epp_config_reloads",
            "epp: EndpointPickerConfig reloads by outcome (a failure keeps the last good config)",
            self.config_reloads.clone(),
        );
        r.register(
            "epp_extproc_stream_resets",
            "epp: ext_proc streams reset by the gateway before the request finished",
            self.stream_resets.clone(),
        );
        r.register(
            "epp_served_fallbacks",
            "epp: responses the gateway served from an endpoint other than the primary pick",
            self.served_fallbacks.clone(),
        );
        r.register(
            "epp_tokenizer_renders",
            "epp: token-producer render calls to the model server's render endpoint, by outcome (a failure tokenizes in-process)",
            self.renders.clone(),
        );
        r.register("epp_outlier_ejections", "epp: endpoints ejected by outlier detection (consecutive 5xx or local-origin failures)", self.outlier_ejections.clone());
        r.register(
            "epp_outlier_restores",
            "epp: ejected endpoints restored after a successful half-open request",
            self.outlier_restores.clone(),
        );
        r.register(
            "epp_endpoint_ejected",
            "epp: 1 while an endpoint is ejected or half-open, else 0",
            self.endpoint_ejected.clone(),
        );
        r.register(
            "epp_health_probes",
            "epp: active /health probes by outcome (--health-check-interval)",
            self.health_probes.clone(),
        );
        r.register(
            "epp_crd_validation_failures",
            "epp: watched objects ignored because they break their CRD's validation rule",
            self.crd_validation_failures.clone(),
        );
        r.register(
            "epp_metrics_auth_requests",
            "epp: requests to the metrics port by authentication outcome (--metrics-endpoint-auth)",
            self.metrics_auth.clone(),
        );
        r.register(
            "epp_kubernetes_forbidden",
            "epp: Kubernetes API requests refused as forbidden (RBAC), by resource and verb",
            self.kubernetes_forbidden.clone(),
        );
    }

    fn register_flow(&self, r: &mut Registry) {
        let f = &self.flow;
        r.register(
            "inference_extension_flow_control_queue_size",
            "Number of requests waiting in the flow control queue",
            f.queue_size.clone(),
        );
        r.register(
            "inference_extension_flow_control_queue_bytes",
            "Bytes of the requests waiting in the flow control queue",
            f.queue_bytes.clone(),
        );
        r.register(
            "inference_extension_flow_control_request_queue_duration_seconds",
            "Time a request spent in flow control, by outcome",
            f.queue_duration.clone(),
        );
        r.register(
            "inference_extension_flow_control_pool_saturation",
            "Pool saturation as flow control last read it (>= 1: requests wait)",
            f.pool_saturation.clone(),
        );
    }

    fn register_kv(&self, r: &mut Registry) {
        let kv = &self.kv;
        r.register(
            "epp_kv_event_batches",
            "epp: KV-event batches received, by decode outcome",
            kv.batches.clone(),
        );
        r.register(
            "epp_kv_events",
            "epp: KV events applied to the precise index, by kind",
            kv.events.clone(),
        );
        r.register(
            "epp_kv_event_gaps",
            "epp: KV-event sequence gaps, by how they were repaired",
            kv.gaps.clone(),
        );
        r.register(
            "epp_kv_event_resets",
            "epp: KV-event publisher restarts and disconnects (entries dropped)",
            kv.resets.clone(),
        );
        r.register(
            "epp_kv_event_subscription_connected",
            "epp: 1 while the endpoint's KV-event subscription is connected",
            kv.connected.clone(),
        );
        r.register(
            "epp_kv_event_index_entries",
            "epp: (endpoint, block) entries in the precise prefix index",
            kv.index_entries.clone(),
        );
        r.register(
            "epp_speculative_peer_messages",
            "epp: speculative placements shared with other epp replicas, by outcome",
            self.peer_messages.clone(),
        );
    }
}

#[cfg(test)]
mod tests;

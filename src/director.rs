//! One request's control flow, free of transport: parse → rewrite → candidates → prefix lookup →
//! schedule → record. The ext_proc adapter calls [`Director::route`] once per request and holds
//! the returned [`Routed`] until the response ends.

use crate::admission;
use crate::config::{self, ConfigError, Problem};
use crate::datastore::health::HealthPolicy;
use crate::datastore::{
    self as ds, ttft, Datastore, EndpointState, InflightGuard, Observation, PrefillGuard,
};
use crate::endpoint::EndpointId;
use crate::metrics::{AttemptLabels, Metrics, ModelLabels, RequestLabels, RunningLabels};
use crate::objectives::Priority;
use crate::prefix::{
    self, index::PrefixIndex, precise::home::HomeCandidate, precise::PreciseIndex,
};
use crate::request::tokenize::{Tokenizer, TokenizerSource};
use crate::request::{self, ApiKind, LlmRequest, Prompt, RequestError};
use crate::scheduling::scorer::PrecisePrefixParams;
use crate::scheduling::{self, Candidate, ScheduleError, Scheduler, SchedulingRequest};
use arc_swap::ArcSwap;
use rand::Rng;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a configuration becomes: the scheduler plus the tokenizer its prefix scorer needs.
pub struct Runtime {
    pub scheduler: Scheduler,
    pub tokenizer: Option<Tokenizer>,
    /// The conformance hook `destination-endpoint-served-verifier` is configured: echo the
    /// endpoint the gateway reports as served into `x-conformance-test-served-endpoint`.
    pub served_verifier: bool,
    /// Outlier detection and slow start (`outlier-detection`, `slow-start` plugins).
    pub health: HealthPolicy,
    /// The saturation detector's thresholds (`utilization-detector` parameters).
    pub thresholds: admission::Thresholds,
    /// Which parser reads a request, by path (`requestHandler.parsers`; upstream's default).
    pub parsers: request::ParserSet,
    /// The configuration's `featureGates`.
    pub gates: config::FeatureGates,
    /// The load options it was built with (a reload keeps them).
    pub load: config::LoadOptions,
    /// What the data-layer plugins say about scraping (read at start-up).
    pub metrics_settings: config::MetricsSettings,
    /// The text it was built from (shown by `/debug/snapshot`).
    pub source: String,
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
        let doc = config::parse_document(text)?;
        for note in doc.deprecations() {
            tracing::info!("{note}");
        }
        let mut problems = config::check(&doc);
        let built = scheduling::build_with(&doc, load);
        if let Err(p) = &built {
            problems.extend(p.iter().cloned());
        }
        let health = HealthPolicy::from_plugins(
            doc.plugins
                .iter()
                .map(|p| (p.name(), p.plugin_type.as_str(), p.parameters.as_ref())),
        );
        if let Err(p) = &health {
            problems.extend(p.iter().map(|(plugin, message)| Problem::Parameters {
                plugin: plugin.clone(),
                message: message.clone(),
            }));
        }
        let health = health.unwrap_or_default();
        let metrics_settings = config::MetricsSettings::from_config(&doc).unwrap_or_else(|p| {
            problems.extend(p);
            config::MetricsSettings::default()
        });
        let thresholds = admission::Thresholds::from_config(&doc).unwrap_or_else(|p| {
            problems.extend(p);
            admission::Thresholds::default()
        });
        let scheduler = match built {
            Ok(s) if problems.is_empty() => s,
            _ => return Err(problems.into()),
        };
        // A local tokenizer.json (precise scorer) must win: its block keys must equal the pods'.
        let precise_hf = scheduler
            .precise_params()
            .map(|p| p.tokenizer_source())
            .filter(|s| matches!(s, TokenizerSource::HuggingFace(_)));
        let source = precise_hf
            .or_else(|| {
                scheduler
                    .prefix_params()
                    .map(|p| TokenizerSource::Tiktoken(p.tokenizer))
            })
            .or_else(|| scheduler.precise_params().map(|p| p.tokenizer_source()));
        let tokenizer = match source {
            None => None,
            Some(s) => match previous
                .and_then(|r| r.tokenizer.clone())
                .filter(|t| t.is_built_from(&s))
            {
                Some(t) => Some(t),
                None => Some(
                    Tokenizer::from_source(&s)
                        .map_err(|e| ConfigError::from(vec![Problem::Conflict(e.to_string())]))?,
                ),
            },
        };
        let served_verifier = doc.plugins.iter().any(|p| {
            config::PluginKind::from_name(&p.plugin_type)
                == Some(config::PluginKind::DestinationEndpointServedVerifier)
        });
        let gates = config::FeatureGates::parse(&doc.feature_gates).unwrap_or_default();
        Ok(Self {
            scheduler,
            tokenizer,
            served_verifier,
            health,
            thresholds,
            parsers: parser_set(&doc),
            gates,
            load,
            metrics_settings,
            source: text.to_owned(),
        })
    }
}

/// The parsers `requestHandler.parsers` (or the deprecated top-level `parser`) names, by plugin
/// type, in order; upstream's default when none is named. The configuration check has already
/// refused references to unknown plugins and parser types epp does not implement.
fn parser_set(doc: &config::EndpointPickerConfig) -> request::ParserSet {
    let types: Vec<&str> = doc
        .parser_refs()
        .into_iter()
        .filter_map(|r| doc.plugins.iter().find(|p| p.name() == r))
        .map(|p| p.plugin_type.as_str())
        .collect();
    request::ParserSet::from_type_names(types).unwrap_or_default()
}

#[derive(Clone, Debug)]
pub struct DirectorOptions {
    pub pool_name: String,
    /// Metrics older than this make an endpoint a last resort.
    pub staleness: Duration,
    /// Honour the gateway's subset hint (`--disable-endpoint-subset-filter` turns it off).
    pub subset_filter: bool,
}

/// A request as the ext_proc adapter hands it over.
#[derive(Clone, Copy, Debug, Default)]
pub struct Incoming<'a> {
    pub path: &'a str,
    pub body: &'a [u8],
    /// `x-gateway-model-name-rewrite`.
    pub model_rewrite: Option<&'a str>,
    /// `envoy.lb.subset_hint` entries; `Some(&[])` means "present and empty".
    pub subset: Option<&'a [String]>,
    /// `test-epp-endpoint-selection`.
    pub test_endpoint_selection: Option<&'a str>,
    /// `x-gateway-inference-objective`: the InferenceObjective giving the request's priority.
    pub objective: Option<&'a str>,
    /// `x-session-token`: the session's endpoint, as a previous response told the client.
    pub session_token: Option<&'a str>,
    /// The session id of the `session_id` affinity strategy: the first non-empty header of its
    /// sources ([`Director::session_id`]).
    pub session_id: Option<&'a str>,
    /// `x-llm-d-slo-ttft-ms` (alias `x-slo-ttft-ms`): the request's TTFT SLO in milliseconds.
    pub slo_ttft_ms: Option<f64>,
    /// The API its parser chose (`None`: the OpenAI API named by `path`).
    pub api: Option<ApiKind>,
    /// `Prefer: if-available`: refuse (412) unless the chosen endpoint caches the prompt.
    pub if_available: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum DirectorError {
    #[error(transparent)]
    BadRequest(#[from] RequestError),
    #[error("failed to find endpoint candidates: {0}")]
    NoCandidates(&'static str),
    #[error(transparent)]
    Schedule(ScheduleError),
    #[error(transparent)]
    Shed(#[from] admission::Shed),
    #[error("scheduler chose endpoint {0} that is not in the datastore")]
    UnknownEndpoint(EndpointId),
    /// `Prefer: if-available` and the chosen endpoint holds none of the prompt (upstream's text).
    #[error("no decode worker has the requested KV cache")]
    NotCached,
}

/// Keeps a routed request counted (in-flight per endpoint, running per model) until dropped.
#[derive(Debug)]
pub struct Lease {
    _inflight: InflightGuard,
    running: prometheus_client::metrics::gauge::Gauge,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.running.dec();
    }
}

/// A routing decision and what the response phase needs from it.
#[derive(Debug)]
pub struct Routed {
    /// Destinations in rank order; the first is the primary.
    pub destinations: Vec<EndpointId>,
    /// The body to forward when it changed (model rewrite); `None` forwards the original.
    pub body: Option<Vec<u8>>,
    pub model: String,
    pub target_model: String,
    pub stream: bool,
    pub started: Instant,
    pub lease: Lease,
    /// The `x-session-token` response header value (the primary's token) when a
    /// `session-affinity-scorer` is configured.
    pub session_token: Option<String>,
    /// Every scored candidate's final score (`--emit-endpoint-scores`).
    pub scores: Vec<(EndpointId, f64)>,
    /// The request's prefill counted against the primary until its first token.
    pub prefill: Option<PrefillGuard>,
    /// What the primary faced at dispatch, for learning its TTFT rates from the response.
    pub dispatched: Option<scheduling::scorer::TtftInputs>,
    /// Request headers for the decode pod's sidecar (P/D): set to the value, or removed.
    pub headers: Vec<(&'static str, Option<String>)>,
}

impl Routed {
    /// The first response byte arrived: the prefill is done, stop counting it as work ahead.
    pub fn first_token(&mut self) {
        self.prefill = None;
    }
}

/// Usage, size and timing figures of a finished response, for metrics and passive health.
#[derive(Clone, Copy, Debug, Default)]
pub struct ResponseSummary {
    pub request_bytes: usize,
    pub response_bytes: usize,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    /// `:status` of the response headers.
    pub status: Option<u16>,
    /// The answer is the gateway's own: it could not connect to the endpoint.
    pub connect_failure: bool,
    pub headers_at: Option<Instant>,
    pub first_body_at: Option<Instant>,
    pub last_body_at: Option<Instant>,
}

pub struct Director {
    datastore: Arc<Datastore>,
    runtime: ArcSwap<Runtime>,
    index: PrefixIndex,
    /// What the pods' KV-cache events say they hold (fed by `kvevents`).
    precise: Arc<PreciseIndex>,
    metrics: Arc<Metrics>,
    opts: DirectorOptions,
    /// Where this replica's speculative entries go besides its own index: the other replicas
    /// (`--speculative-peers`, [`crate::kvevents::peers`]).
    placements: Option<Box<dyn PlacementSink>>,
    /// The `no-hit-lru-scorer`'s order: endpoints by their last cold request (upstream's
    /// `PreRequest` state), read as a snapshot by each decision.
    lru: std::sync::Mutex<scheduling::scorer::LruOrder>,
    /// The session-affinity `session_id` strategy's bindings (upstream's `PreRequest` state).
    sessions: std::sync::Mutex<scheduling::scorer::SessionBindings>,
}

/// Told of every speculative entry the director records (precise prefix), so other epp replicas
/// can record it too. Must not block: it runs on the request path.
pub trait PlacementSink: Send + Sync {
    fn placed(&self, endpoint: EndpointId, keys: &[u64], ttl: Duration);
}

/// The prompt's block hashes and what the index believes about them.
struct PrefixLookup {
    hashes: Vec<u64>,
    /// Prompt tokens tokenized (up to the match cap): the request's prefill size.
    prompt_tokens: usize,
    /// The match cap in tokens: a prompt tokenized up to it is longer than `prompt_tokens`.
    token_cap: usize,
    block_size: usize,
    capacity: usize,
    auto_tune: bool,
    matches: Vec<(EndpointId, usize)>,
    /// Precise: the endpoint credited with the part of the prompt nobody holds, and the blocks
    /// credited ([`prefix::precise::home`]); scored as held, not reported as a hit.
    home: Option<(EndpointId, usize)>,
    /// From the precise index: the decision is recorded as speculative entries with this TTL
    /// (`Some(None)`: not recorded) instead of in the approximate index.
    precise: Option<Option<Duration>>,
}

impl Director {
    pub fn new(
        datastore: Arc<Datastore>,
        runtime: Runtime,
        metrics: Arc<Metrics>,
        opts: DirectorOptions,
    ) -> Self {
        datastore.set_health_policy(runtime.health.clone());
        Self {
            datastore,
            runtime: ArcSwap::from_pointee(runtime),
            index: PrefixIndex::new(),
            precise: Arc::default(),
            metrics,
            opts,
            placements: None,
            lru: Default::default(),
            sessions: Default::default(),
        }
    }

    /// Shares every speculative entry with `sink` as well (before the director is shared).
    #[must_use]
    pub fn with_placement_sink(mut self, sink: Box<dyn PlacementSink>) -> Self {
        self.placements = Some(sink);
        self
    }

    pub fn runtime(&self) -> Arc<Runtime> {
        self.runtime.load_full()
    }

    /// Swaps in a new configuration; requests in progress finish with the old one.
    pub fn set_runtime(&self, runtime: Runtime) {
        self.datastore.set_health_policy(runtime.health.clone());
        self.runtime.store(Arc::new(runtime));
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn prefix_index(&self) -> &PrefixIndex {
        &self.index
    }

    /// The KV-event-fed index, for the `kvevents` subscribers to write into.
    pub fn precise_index(&self) -> &Arc<PreciseIndex> {
        &self.precise
    }

    pub fn pool_name(&self) -> &str {
        &self.opts.pool_name
    }

    /// Routes a request with a body.
    pub fn route(&self, inc: &Incoming<'_>, rng: &mut impl Rng) -> Result<Routed, DirectorError> {
        let started = Instant::now();
        let parse_span = crate::telemetry::child("parse");
        let api = inc.api.unwrap_or_else(|| ApiKind::from_path(inc.path));
        let req = request::parse(api, inc.body, self.prompt_cap())?;
        crate::telemetry::annotate(|| {
            vec![
                opentelemetry::KeyValue::new("epp.model", req.model.clone()),
                opentelemetry::KeyValue::new("epp.stream", req.stream),
            ]
        });
        drop(parse_span);
        self.route_parsed(inc, req, started, rng)
    }

    /// The prompt text the prefix scorers read: what parsing keeps of it.
    pub fn prompt_cap(&self) -> usize {
        let runtime = self.runtime.load();
        let max_text = runtime.scheduler.prefix_params().map_or(0, |p| {
            p.max_blocks(p.block_size_tokens) * p.block_size_tokens * 8
        });
        let max_text = runtime.scheduler.precise_params().map_or(max_text, |p| {
            max_text.max(p.max_prefix_blocks_to_match * self.precise_block_size(p) * 8)
        });
        max_text.max(4096)
    }

    /// What an early decision (before the whole body) must have seen of the prompt: `Some(0)`
    /// when the model alone decides (no prefix scorer), `Some(n)` for the first `n` bytes of
    /// prompt text, `None` when only the whole body will do (the precise scorer renders the
    /// whole chat template; `token-load-scorer` and `context-length-aware` count the whole
    /// prompt, as upstream, which always reads the whole body).
    pub fn early_prompt_bytes(&self, api: ApiKind) -> Option<usize> {
        let runtime = self.runtime.load();
        if runtime.scheduler.reads_prompt_length() {
            return None;
        }
        let precise = runtime.scheduler.precise_params().is_some();
        if precise && api == ApiKind::ChatCompletions {
            return None;
        }
        let prefix = precise || runtime.scheduler.prefix_params().is_some();
        Some(if prefix { self.prompt_cap() } else { 0 })
    }

    /// The priority of a request for `model` under the named objective.
    pub fn priority(&self, objective: Option<&str>, model: &str) -> Priority {
        self.datastore.objectives().priority(objective, model)
    }

    /// The pool's saturation as flow control sees it: the detector's formula over every
    /// endpoint, counting the requests epp sent since an endpoint's last scrape as waiting
    /// there (scrapes lag, and a queue released on stale figures would herd).
    pub fn pool_saturation(&self) -> f64 {
        let runtime = self.runtime.load();
        let snapshot = self.datastore.snapshot();
        if let Some(c) = &runtime.thresholds.concurrency {
            return c.saturation(snapshot.iter().map(|s| inflight_load(s)));
        }
        let adjusted = |s: &Arc<EndpointState>| {
            s.metrics().map(|m| crate::endpoint::EndpointMetrics {
                waiting: m.waiting + f64::from(s.dispatched_since_scrape()),
                ..(*m).clone()
            })
        };
        let metrics: Vec<_> = snapshot.iter().map(adjusted).collect();
        admission::saturation(
            metrics.iter().map(Option::as_ref),
            Instant::now(),
            &runtime.thresholds,
            self.opts.staleness,
        )
    }

    /// Routes a parsed request; for an early decision `req` comes from the scan of the part of
    /// the body received so far, and `inc.body` is that part.
    pub fn route_parsed(
        &self,
        inc: &Incoming<'_>,
        req: LlmRequest,
        started: Instant,
        rng: &mut impl Rng,
    ) -> Result<Routed, DirectorError> {
        let runtime = self.runtime.load();
        let objectives = self.datastore.objectives();
        let target = if req.api.rewrites_model() {
            objectives.target(&req.model, inc.model_rewrite, rng)
        } else {
            req.model.clone()
        };
        let priority = objectives.priority(inc.objective, &req.model);
        let snapshot = self.datastore.snapshot();
        let states = self.candidate_states(&snapshot, inc.subset)?;
        self.admit(&runtime.thresholds, priority, &states)?;
        let tokenize_span = crate::telemetry::child("tokenize");
        let lookup = match runtime.scheduler.precise_params() {
            Some(p) => self.lookup_precise(&runtime, p, &req, inc.body, &target, &states),
            None => self.lookup_prefix(&runtime, &req, &target, &states),
        };
        drop(tokenize_span);
        let candidates =
            self.candidates(&states, lookup.as_ref(), runtime.scheduler.reads_labels());
        let lru = self.lru_snapshot(&runtime.scheduler);
        let bound = self.session_bound(&runtime.scheduler, inc.session_id);
        let sreq = SchedulingRequest {
            target_model: &target,
            prefix_total_blocks: lookup.as_ref().map_or(0, |l| l.hashes.len()),
            block_size: lookup.as_ref().map_or(16, |l| l.block_size),
            test_endpoint_selection: inc.test_endpoint_selection,
            session_token: inc.session_token,
            session_endpoint: session_endpoint(&states, inc.session_token),
            affinity_key: affinity_key(
                inc.session_token,
                lookup.as_ref().and_then(|l| l.hashes.first().copied()),
            ),
            prompt_tokens: prompt_tokens(lookup.as_ref(), &req, inc.body, self.prompt_cap()),
            slo_ttft_s: inc.slo_ttft_ms.filter(|v| *v > 0.0).map(|ms| ms / 1e3),
            sheddable: priority < 0,
            lru: &lru,
            session_bound: bound,
            multimodal: runtime
                .scheduler
                .disagg()
                .is_some_and(|d| d.reads_multimodal())
                && scheduling::disagg::has_multimodal(inc.body),
        };
        let schedule_span = crate::telemetry::child("schedule");
        let scheduling::Decision {
            endpoints: decision,
            scores,
            disagg,
            headers,
        } = self.schedule(&runtime.scheduler, &sreq, &candidates, rng, started)?;
        drop(schedule_span);
        let prefill_pod = disagg.as_ref().and_then(|o| o.prefill);
        if let Some(o) = &disagg {
            self.metrics.disagg.record(o, &target);
        }
        let primary = snapshot
            .get(&decision[0])
            .ok_or(DirectorError::UnknownEndpoint(decision[0]))?;
        if inc.if_available && !holds_prefix(lookup.as_ref(), decision[0]) {
            return Err(DirectorError::NotCached);
        }
        if let Some(l) = &lookup {
            self.record_prefix(l, primary);
            // The prefill pod computed the prompt too (upstream records both).
            if let Some(p) = prefill_pod.and_then(|p| snapshot.get(&p)) {
                self.record_prefix(l, p);
            }
        }
        self.record_no_hit(&runtime.scheduler, &candidates, primary.id());
        self.record_session(
            &runtime.scheduler,
            inc.session_id,
            bound,
            &candidates,
            primary.id(),
        );
        let dispatched = candidates.iter().find(|c| c.id == primary.id()).map(|c| {
            match runtime.scheduler.estimated_ttft() {
                Some(s) => s.inputs(&sreq, c),
                None => scheduling::scorer::EstimatedTtftScorer::default().inputs(&sreq, c),
            }
        });
        // With remote prefill the prefill pod does the prompt's work, and the decode pod's TTFT
        // (prefill elsewhere + transfer) must not teach it its own prefill rate.
        let (prefill, dispatched) = match prefill_pod.and_then(|p| snapshot.get(&p)) {
            Some(p) => {
                let own = candidates.iter().find(|c| c.id == p.id());
                let own = own.map(|c| sreq.uncached_tokens(c) as u64);
                (own.map(|t| p.start_prefill(t)), None)
            }
            None => (
                dispatched.map(|d| primary.start_prefill(d.own_tokens as u64)),
                dispatched,
            ),
        };
        let body = (target != req.model)
            .then(|| request::rewrite_model(inc.body, &req.model_span, &target));
        let labels = RequestLabels {
            model_name: req.model.clone(),
            target_model_name: target.clone(),
            priority: priority.to_string(),
        };
        self.metrics.request_total.get_or_create(&labels).inc();
        let lease = self.lease(primary, &req.model);
        let session_token = runtime
            .scheduler
            .session_affinity()
            .then(|| scheduling::scorer::encode_token(&primary.endpoint.name));
        Ok(Routed {
            destinations: decision,
            body,
            model: req.model,
            target_model: target,
            stream: req.stream,
            started,
            lease,
            session_token,
            scores,
            prefill,
            dispatched,
            headers,
        })
    }

    /// Routes a request its parser does not read (`passthrough-parser`, a WebSocket upgrade):
    /// as upstream, it is admitted first (a sheddable request meets a saturated pool with 429,
    /// its priority from the objective header alone), then routed by load without a prompt.
    pub fn route_passthrough(
        &self,
        inc: &Incoming<'_>,
        rng: &mut impl Rng,
    ) -> Result<Routed, DirectorError> {
        let runtime = self.runtime.load();
        let priority = self.datastore.objectives().priority(inc.objective, "");
        let snapshot = self.datastore.snapshot();
        let states = self.candidate_states(&snapshot, inc.subset)?;
        self.admit(&runtime.thresholds, priority, &states)?;
        self.route_bodyless(inc, rng)
    }

    /// Routes a request without a body (GET and friends): load-aware, no prompt.
    pub fn route_bodyless(
        &self,
        inc: &Incoming<'_>,
        rng: &mut impl Rng,
    ) -> Result<Routed, DirectorError> {
        let started = Instant::now();
        let runtime = self.runtime.load();
        let snapshot = self.datastore.snapshot();
        let states = self.candidate_states(&snapshot, inc.subset)?;
        let candidates = self.candidates(&states, None, runtime.scheduler.reads_labels());
        let lru = self.lru_snapshot(&runtime.scheduler);
        let bound = self.session_bound(&runtime.scheduler, inc.session_id);
        let sreq = SchedulingRequest {
            block_size: 16,
            lru: &lru,
            session_bound: bound,
            test_endpoint_selection: inc.test_endpoint_selection,
            session_token: inc.session_token,
            session_endpoint: session_endpoint(&states, inc.session_token),
            affinity_key: affinity_key(inc.session_token, None),
            ..Default::default()
        };
        let scheduling::Decision {
            endpoints: decision,
            scores,
            disagg,
            headers,
        } = self.schedule(&runtime.scheduler, &sreq, &candidates, rng, started)?;
        if let Some(o) = &disagg {
            self.metrics.disagg.record(o, "");
        }
        let primary = snapshot
            .get(&decision[0])
            .ok_or(DirectorError::UnknownEndpoint(decision[0]))?;
        // No prompt, so nothing can be cached: upstream answers a passthrough request 412 too
        // (the adapter clears `if_available` for a bodyless request, which upstream never gates).
        if inc.if_available {
            return Err(DirectorError::NotCached);
        }
        self.record_no_hit(&runtime.scheduler, &candidates, primary.id());
        self.record_session(
            &runtime.scheduler,
            inc.session_id,
            bound,
            &candidates,
            primary.id(),
        );
        let lease = self.lease(primary, "");
        let session_token = runtime
            .scheduler
            .session_affinity()
            .then(|| scheduling::scorer::encode_token(&primary.endpoint.name));
        Ok(Routed {
            destinations: decision,
            body: None,
            model: String::new(),
            target_model: String::new(),
            stream: false,
            started,
            lease,
            session_token,
            scores,
            prefill: None,
            dispatched: None,
            headers,
        })
    }

    /// Records a finished response in the objective metrics.
    pub fn finish(&self, routed: &Routed, summary: &ResponseSummary) {
        let labels = ModelLabels {
            model_name: routed.model.clone(),
            target_model_name: routed.target_model.clone(),
        };
        let m = &self.metrics;
        m.request_duration
            .get_or_create(&labels)
            .observe(routed.started.elapsed().as_secs_f64());
        m.request_sizes
            .get_or_create(&labels)
            .observe(summary.request_bytes as f64);
        m.response_sizes
            .get_or_create(&labels)
            .observe(summary.response_bytes as f64);
        if let Some(t) = summary.prompt_tokens {
            m.input_tokens.get_or_create(&labels).observe(t as f64);
        }
        if let Some(t) = summary.completion_tokens {
            m.output_tokens.get_or_create(&labels).observe(t as f64);
        }
        if let Some(t) = summary.cached_tokens {
            m.prompt_cached_tokens
                .get_or_create(&labels)
                .observe(t as f64);
        }
        self.record_outcome(routed, &observation(routed, summary));
        self.learn_ttft(routed, summary);
    }

    /// Teaches the served endpoint's TTFT model what this request cost: the work it faced at
    /// dispatch (its own prefill corrected by the cached tokens the response reported) against
    /// the TTFT measured. Only streamed successes measure a TTFT.
    fn learn_ttft(&self, routed: &Routed, s: &ResponseSummary) {
        let (Some(d), Some(first)) = (routed.dispatched, s.first_body_at) else {
            return;
        };
        if !routed.stream || !s.status.is_some_and(|c| (200..300).contains(&c)) {
            return;
        }
        let own = match (s.prompt_tokens, s.cached_tokens) {
            (Some(p), Some(c)) => p.saturating_sub(c) as f64,
            (Some(p), None) => p as f64,
            _ => d.own_tokens,
        };
        let features = ttft::Features {
            ahead_tokens: d.ahead_tokens,
            own_tokens: own,
            running: d.running,
            waiting: d.waiting,
        };
        let runtime = self.runtime.load();
        let seed = match runtime.scheduler.estimated_ttft() {
            Some(e) => e.seed(),
            None => scheduling::scorer::EstimatedTtftScorer::default().seed(),
        };
        let prior = ttft::Coefficients {
            base: seed.base,
            per_token: seed.per_token,
            per_running: seed.per_running,
            per_waiting: seed.per_waiting,
        };
        let secs = first
            .saturating_duration_since(routed.started)
            .as_secs_f64();
        routed
            .lease
            ._inflight
            .endpoint()
            .observe_ttft(&features, secs, &prior, Instant::now());
    }

    /// The stream ended without response headers for a routed request (`None`: nothing to
    /// record): a gateway reset, a client gone, or a pod that never answered. Counts as a
    /// local-origin failure of the endpoint.
    pub fn abandoned(&self, routed: Option<&Routed>) {
        if let Some(r) = routed {
            self.record_outcome(
                r,
                &Observation {
                    failure: Some(ds::Failure::ResetBeforeHeaders),
                    ..Default::default()
                },
            );
        }
    }

    fn record_outcome(&self, routed: &Routed, obs: &Observation) {
        let served = routed.lease._inflight.endpoint();
        let transition = served.record(obs, &self.datastore.health_policy(), Instant::now());
        ds::report(
            &self.metrics,
            &served.endpoint,
            transition,
            if obs.failure.is_some() {
                "connection"
            } else {
                "5xx"
            },
        );
    }

    /// Forgets prefix entries of endpoints that are gone.
    pub fn prune_index(&self) {
        let live: HashSet<EndpointId> = self.datastore.snapshot().iter().map(|s| s.id()).collect();
        self.index.retain(&live);
        self.precise.retain(&live);
    }

    fn candidate_states<'s>(
        &self,
        snapshot: &'s crate::datastore::EndpointSet,
        subset: Option<&[String]>,
    ) -> Result<Vec<&'s Arc<EndpointState>>, DirectorError> {
        if snapshot.is_empty() {
            return Err(DirectorError::NoCandidates(
                "no ready endpoints in the pool",
            ));
        }
        let states: Vec<&Arc<EndpointState>> = match subset.filter(|_| self.opts.subset_filter) {
            None => snapshot.iter().collect(),
            Some([]) => return Err(DirectorError::NoCandidates("the subset hint is empty")),
            Some(list) => snapshot
                .iter()
                .filter(|s| in_subset(s.id(), list))
                .collect(),
        };
        if states.is_empty() {
            return Err(DirectorError::NoCandidates(
                "no endpoint matches the subset hint",
            ));
        }
        Ok(self.without_ejected(states))
    }

    /// Drops endpoints that outlier detection ejected, unless that would drop them all: then
    /// every one stays (a degraded pool beats no pool) and a warning is logged.
    fn without_ejected<'s>(
        &self,
        states: Vec<&'s Arc<EndpointState>>,
    ) -> Vec<&'s Arc<EndpointState>> {
        let policy = self.datastore.health_policy();
        if policy.outlier.is_none() {
            return states;
        }
        let now = Instant::now();
        let available: Vec<&Arc<EndpointState>> = states
            .iter()
            .copied()
            .filter(|s| s.available(&policy, now))
            .collect();
        if available.is_empty() {
            tracing::warn!(
                candidates = states.len(),
                "every candidate endpoint is ejected; routing to them anyway"
            );
            return states;
        }
        available
    }

    /// Sheds a sheddable request (priority < 0) when the candidates are saturated.
    fn admit(
        &self,
        thresholds: &admission::Thresholds,
        priority: Priority,
        states: &[&Arc<EndpointState>],
    ) -> Result<(), DirectorError> {
        let saturation = || {
            if let Some(c) = &thresholds.concurrency {
                return c.saturation(states.iter().map(|s| inflight_load(s)));
            }
            let metrics: Vec<_> = states.iter().map(|s| s.metrics()).collect();
            admission::saturation(
                metrics.iter().map(|m| m.as_deref()),
                Instant::now(),
                thresholds,
                self.opts.staleness,
            )
        };
        Ok(admission::admit(priority, saturation)?)
    }

    fn lookup_prefix(
        &self,
        runtime: &Runtime,
        req: &LlmRequest,
        target: &str,
        states: &[&Arc<EndpointState>],
    ) -> Option<PrefixLookup> {
        let params = runtime.scheduler.prefix_params()?;
        let reported = states
            .iter()
            .find_map(|s| s.metrics().and_then(|m| m.cache));
        let tuned = reported.filter(|_| params.auto_tune);
        let block_size = tuned.map_or(params.block_size_tokens, |c| c.block_size as usize);
        let max_blocks = params.max_blocks(block_size);
        let tokens = match &req.prompt {
            Prompt::Tokens(t) => std::borrow::Cow::Borrowed(t.as_slice()),
            Prompt::Text(text) => std::borrow::Cow::Owned(
                runtime
                    .tokenizer
                    .as_ref()?
                    .encode_prefix(text, max_blocks * block_size),
            ),
        };
        let hashes = prefix::block_hashes(
            target,
            req.cache_salt.as_deref(),
            &tokens,
            block_size,
            max_blocks,
        );
        let matches = self.index.longest_prefix(&hashes);
        Some(PrefixLookup {
            hashes,
            prompt_tokens: tokens.len(),
            token_cap: max_blocks * block_size,
            block_size,
            capacity: params.lru_capacity_per_server,
            auto_tune: params.auto_tune,
            matches,
            home: None,
            precise: None,
        })
    }

    fn precise_block_size(&self, p: &PrecisePrefixParams) -> usize {
        match self.precise.block_size() {
            0 => p.block_size,
            announced => announced,
        }
    }

    /// Block keys of the tokens the pod will see (the prompt as-is, or the rendered chat
    /// template) and the longest prefix each endpoint actually holds.
    fn lookup_precise(
        &self,
        runtime: &Runtime,
        p: &PrecisePrefixParams,
        req: &LlmRequest,
        body: &[u8],
        target: &str,
        states: &[&Arc<EndpointState>],
    ) -> Option<PrefixLookup> {
        let block_size = self.precise_block_size(p);
        let max_tokens = p.max_prefix_blocks_to_match * block_size;
        let tokens = match (&req.prompt, req.api) {
            (Prompt::Tokens(t), _) => std::borrow::Cow::Borrowed(t.as_slice()),
            (_, ApiKind::ChatCompletions) => std::borrow::Cow::Owned(
                runtime
                    .tokenizer
                    .as_ref()?
                    .encode_prefix(&request::chat::render(body)?, max_tokens),
            ),
            (Prompt::Text(text), _) => {
                std::borrow::Cow::Owned(runtime.tokenizer.as_ref()?.encode_prefix(text, max_tokens))
            }
        };
        let hashes = prefix::block_hashes(
            target,
            None,
            &tokens,
            block_size,
            p.max_prefix_blocks_to_match,
        );
        let now = Instant::now();
        let matches = self.precise.longest_prefix(&hashes, now);
        // The part no endpoint holds goes to the same home in every replica (active-active).
        let shapes = self.precise.shapes(states.iter().map(|s| s.id()), now);
        let candidates = states.iter().zip(shapes).map(|(s, cache)| HomeCandidate {
            id: s.id(),
            load: s.metrics().map_or(0.0, |m| m.waiting + m.running),
            cache,
        });
        let home = prefix::precise::home::home(&hashes, &matches, candidates);
        let ttl = p.speculative_indexing.then_some(p.speculative_ttl);
        Some(PrefixLookup {
            hashes,
            prompt_tokens: tokens.len(),
            token_cap: max_tokens,
            block_size,
            capacity: 0,
            auto_tune: false,
            matches,
            home,
            precise: Some(ttl),
        })
    }

    fn candidates(
        &self,
        states: &[&Arc<EndpointState>],
        lookup: Option<&PrefixLookup>,
        labels: bool,
    ) -> Vec<Candidate> {
        let now = Instant::now();
        let policy = self.datastore.health_policy();
        let no_labels = Arc::default();
        states
            .iter()
            .map(|s| {
                let m = s.metrics();
                let fresh = m
                    .as_ref()
                    .is_some_and(|m| m.age(now) <= self.opts.staleness);
                let (waiting, running, kv) = m
                    .as_ref()
                    .map_or((0.0, 0.0, 0.0), |m| (m.waiting, m.running, m.kv_usage));
                let held = lookup
                    .and_then(|l| l.matches.iter().find(|(id, _)| *id == s.id()))
                    .map_or(0, |(_, n)| *n);
                let credited = lookup
                    .and_then(|l| l.home)
                    .filter(|(id, _)| *id == s.id())
                    .map_or(0, |(_, n)| n);
                let prefix_blocks = held.max(credited);
                Candidate {
                    id: s.id(),
                    weight: s.endpoint.weight,
                    metrics: m,
                    waiting: waiting + f64::from(s.dispatched_since_scrape()),
                    running: running.max(f64::from(s.inflight())),
                    inflight: f64::from(s.inflight()),
                    labels: if labels {
                        Arc::new(s.endpoint.labels.clone())
                    } else {
                        Arc::clone(&no_labels)
                    },
                    kv_usage: kv,
                    fresh,
                    prefix_blocks,
                    latency: Some(s.latency(now))
                        .filter(|l| l.0.is_some() || l.1.is_some())
                        .map(|(ttft, tpot)| scheduling::scorer::LatencyEstimate { ttft, tpot }),
                    ramp: s.ramp(&policy, now),
                    prefill: prefill_load(s),
                }
            })
            .collect()
    }

    fn schedule(
        &self,
        scheduler: &Scheduler,
        sreq: &SchedulingRequest<'_>,
        candidates: &[Candidate],
        rng: &mut impl Rng,
        started: Instant,
    ) -> Result<scheduling::Decision, DirectorError> {
        let result = scheduler.schedule(sreq, candidates, rng);
        if let Ok(d) = &result {
            crate::telemetry::annotate_decision(&d.endpoints, &d.scores);
        }
        self.metrics
            .scheduler_e2e
            .observe(started.elapsed().as_secs_f64());
        let (status, pod) = match &result {
            Ok(d) => (
                "success",
                d.endpoints
                    .first()
                    .map(|e| e.to_string())
                    .unwrap_or_default(),
            ),
            Err(_) => ("failure", String::new()),
        };
        let port = pod.rsplit(':').next().unwrap_or("").to_owned();
        let labels = AttemptLabels {
            status: status.into(),
            target_model_name: sreq.target_model.to_owned(),
            pod_name: pod,
            namespace: String::new(),
            port,
        };
        self.metrics.scheduler_attempts.get_or_create(&labels).inc();
        match result {
            Ok(d) if !d.endpoints.is_empty() => Ok(d),
            Ok(_) => Err(DirectorError::Schedule(ScheduleError::AllFiltered)),
            Err(e) => Err(DirectorError::Schedule(e)),
        }
    }

    fn record_prefix(&self, l: &PrefixLookup, primary: &Arc<EndpointState>) {
        let total = l.hashes.len();
        if total == 0 {
            return;
        }
        let matched = l
            .matches
            .iter()
            .find(|(id, _)| *id == primary.id())
            .map_or(0, |(_, n)| *n);
        self.metrics
            .prefix_hit_ratio
            .observe(matched as f64 / total as f64);
        self.metrics
            .prefix_hit_bytes
            .observe((matched * l.block_size * 4) as f64);
        if let Some(ttl) = l.precise {
            if let Some(ttl) = ttl {
                self.precise
                    .speculate(primary.id(), &l.hashes, Instant::now(), ttl);
                if let Some(sink) = &self.placements {
                    sink.placed(primary.id(), &l.hashes, ttl);
                }
            }
            return;
        }
        let reported = primary
            .metrics()
            .and_then(|m| m.cache)
            .filter(|_| l.auto_tune);
        let capacity = reported.map_or(l.capacity, |c| c.num_blocks as usize);
        self.index.record(primary.id(), &l.hashes, capacity);
    }

    /// The request's session id for the `session_id` affinity strategy: the first of its
    /// source headers with a non-empty (trimmed) value; `None` when no plugin uses it.
    pub fn session_id<'h>(&self, header: impl Fn(&str) -> Option<&'h str>) -> Option<String> {
        let runtime = self.runtime.load();
        let config = runtime.scheduler.session_id()?;
        config.sources.iter().find_map(|s| {
            header(&s.header)
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        })
    }

    fn session_bound(&self, scheduler: &Scheduler, session: Option<&str>) -> Option<EndpointId> {
        let (config, session) = (scheduler.session_id()?, session?);
        self.sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .bound(session, config, Instant::now())
    }

    /// Binds the session to the primary, refreshes the binding, or moves it when the bound
    /// endpoint was not a candidate (upstream's `PreRequest`).
    fn record_session(
        &self,
        scheduler: &Scheduler,
        session: Option<&str>,
        bound: Option<EndpointId>,
        candidates: &[Candidate],
        primary: EndpointId,
    ) {
        let (Some(_), Some(session)) = (scheduler.session_id(), session) else {
            return;
        };
        let present = bound.is_some_and(|b| candidates.iter().any(|c| c.id == b));
        self.sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .record(session, primary, present, Instant::now());
    }

    /// The no-hit LRU's order for this decision (empty without a `no-hit-lru-scorer`).
    fn lru_snapshot(&self, scheduler: &Scheduler) -> Vec<EndpointId> {
        if scheduler.no_hit_lru().is_none() {
            return Vec::new();
        }
        self.lru
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .snapshot()
    }

    /// A cold request (no candidate holds any of its blocks) makes its primary the most
    /// recently used endpoint of the no-hit LRU. Upstream decides coldness over the filtered
    /// candidates; here it is every candidate, which differs only when a filter drops each
    /// endpoint holding part of the prompt.
    fn record_no_hit(&self, scheduler: &Scheduler, candidates: &[Candidate], primary: EndpointId) {
        let Some(s) = scheduler.no_hit_lru() else {
            return;
        };
        let all: Vec<&Candidate> = candidates.iter().collect();
        if scheduling::scorer::is_cold(&all) {
            self.lru
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .touch(primary, s.capacity());
        }
    }

    fn lease(&self, primary: &Arc<EndpointState>, model: &str) -> Lease {
        let running = self
            .metrics
            .running_requests
            .get_or_create(&RunningLabels {
                model_name: model.to_owned(),
            })
            .clone();
        running.inc();
        Lease {
            _inflight: primary.acquire(),
            running,
        }
    }
}

/// The requests epp has in flight on `s` and their tokens still prefilling (llm-d's
/// `InFlightLoad`), for the `concurrency-detector`.
fn inflight_load(s: &EndpointState) -> (f64, f64) {
    (f64::from(s.inflight()), s.prefill_pending().0 as f64)
}

/// What epp sent `s` that is still prefilling, and its learned TTFT rates.
fn prefill_load(s: &EndpointState) -> scheduling::scorer::PrefillLoad {
    let (tokens, requests) = s.prefill_pending();
    scheduling::scorer::PrefillLoad {
        pending_tokens: tokens as f64,
        pending_requests: f64::from(requests),
        learned: s.ttft_learned().map(|l| scheduling::scorer::TtftRates {
            base: l.coefficients.base,
            per_token: l.coefficients.per_token,
            per_running: l.coefficients.per_running,
            per_waiting: l.coefficients.per_waiting,
            mean_tokens: l.mean_tokens,
        }),
    }
}

/// The request's prompt tokens: as the prefix lookup tokenized them, else (and past the
/// lookup's match cap) estimated at four bytes a token (llm-d's default `estimate` token
/// producer) from the prompt text, or from the whole body when parsing kept only the first
/// `cap` bytes of the prompt.
fn prompt_tokens(
    lookup: Option<&PrefixLookup>,
    req: &LlmRequest,
    body: &[u8],
    cap: usize,
) -> usize {
    let estimate = || match &req.prompt {
        Prompt::Tokens(t) => t.len(),
        Prompt::Text(t) if t.len() < cap => t.len().div_ceil(4),
        Prompt::Text(_) => body.len().div_ceil(4),
    };
    match lookup {
        Some(l) if l.prompt_tokens < l.token_cap => l.prompt_tokens,
        Some(l) => l.prompt_tokens.max(estimate()),
        None => estimate(),
    }
}

/// Whether the prefix lookup found any of the prompt's blocks held by `id` (upstream's
/// conditional-decode gate: a match of at least one block; no prefix scorer, no match).
fn holds_prefix(lookup: Option<&PrefixLookup>, id: EndpointId) -> bool {
    lookup.is_some_and(|l| l.matches.iter().any(|(e, n)| *e == id && *n > 0))
}

/// The candidate a session token names (the token is base64 of the endpoint name).
fn session_endpoint(states: &[&Arc<EndpointState>], token: Option<&str>) -> Option<EndpointId> {
    let name = scheduling::scorer::decode_token(token?)?;
    states
        .iter()
        .find(|s| s.endpoint.name == name)
        .map(|s| s.id())
}

/// The consistent-hash key: the session token's hash, else the first prompt block hash.
fn affinity_key(token: Option<&str>, first_block: Option<u64>) -> Option<u64> {
    match token.filter(|t| !t.is_empty()) {
        Some(t) => Some(xxhash_rust::xxh64::xxh64(t.as_bytes(), 0)),
        None => first_block,
    }
}

/// What passive health learns from a finished response: status, connection failure, and
/// latency. Streaming: TTFT to the first body chunk, TPOT over the chunks after it. Not
/// streaming: the whole answer arrives at once, so time per output token covers everything
/// (TTFT when the token count is unknown).
fn observation(routed: &Routed, s: &ResponseSummary) -> Observation {
    let since = |t: Option<Instant>| t.map(|t| t.saturating_duration_since(routed.started));
    let failure = s.connect_failure.then_some(ds::Failure::Connect);
    let (ttft, tpot) = if routed.stream {
        let tpot = match (s.first_body_at, s.last_body_at, s.completion_tokens) {
            (Some(f), Some(l), Some(n)) if n > 1 => {
                Some(l.saturating_duration_since(f).div_f64((n - 1) as f64))
            }
            _ => None,
        };
        (since(s.first_body_at.or(s.headers_at)), tpot)
    } else {
        let total = since(s.last_body_at.or(s.headers_at));
        match s.completion_tokens.filter(|n| *n > 0) {
            Some(n) => (None, total.map(|t| t.div_f64(n as f64))),
            None => (total, None),
        }
    };
    Observation {
        status: s.status,
        failure,
        ttft,
        tpot,
    }
}

/// Whether `id` is named by a subset entry: `ip:port` matches exactly, a bare IP matches every
/// port of that IP (upstream compares IPs only; a port, when given, is honoured here).
fn in_subset(id: EndpointId, list: &[String]) -> bool {
    list.iter()
        .map(|e| e.trim())
        .any(|e| match e.parse::<EndpointId>() {
            Ok(exact) => exact == id,
            Err(_) => e
                .trim_matches(['[', ']'])
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip == id.0.ip()),
        })
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_llmd;

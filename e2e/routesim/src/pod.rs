//! One simulated pod: inference-sim's engine (continuous batching, vLLM's prefix cache and
//! eviction, the profile's step times) stepped by the event loop instead of a tokio task, the
//! gauges it last published (what a scrape reads), and the requests in flight on it.

use epp::datastore::EndpointState;
use epp::director::{Director, Routed};
use epp::endpoint::{CacheInfo, EndpointMetrics};
use inference_sim::engine::{Engine, EngineGauges, KvTransfer, NewRequest, SeqOutput, Usage};
use inference_sim::engine::{FinishReason, StepPlan};
use inference_sim::tokenizer::TokenId;
use inference_sim::EngineConfig;
use rand::rngs::SmallRng;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// A request on a pod, from dispatch to its last token.
#[derive(Debug)]
pub struct InFlight {
    /// Index of the request in the run's plan.
    pub request: usize,
    /// epp's decision, held until the exchange ends (its lease counts the request in flight).
    pub routed: Option<Routed>,
    pub sent: Duration,
    pub first_token: Option<Duration>,
    /// Generated tokens, kept for chat turns (the next turn resends the answer).
    pub output: Vec<TokenId>,
    pub keep_output: bool,
    rx: mpsc::UnboundedReceiver<SeqOutput>,
}

/// What a request's stream said since the last look.
pub enum Progress {
    Running,
    Done(Usage),
    /// The engine refused or aborted it without an answer.
    Failed,
}

impl InFlight {
    /// Drains the engine's output for this request at `now`; the first token is reported to
    /// `director` (its lifecycle's `first_token`), when epp routes.
    pub fn poll(&mut self, now: Duration, director: Option<&Director>) -> Progress {
        while let Ok(out) = self.rx.try_recv() {
            match out {
                SeqOutput::Token(t) => self.token(t, now, director),
                SeqOutput::Last(t, usage) => {
                    self.token(t, now, director);
                    return Progress::Done(usage);
                }
                SeqOutput::Finished(usage) if usage.reason != FinishReason::Abort => {
                    self.first_token.get_or_insert(now);
                    return Progress::Done(usage);
                }
                SeqOutput::Finished(_) | SeqOutput::Rejected => return Progress::Failed,
            }
        }
        Progress::Running
    }

    fn token(&mut self, t: TokenId, now: Duration, director: Option<&Director>) {
        if self.first_token.is_none() {
            self.first_token = Some(now);
            match (self.routed.as_mut(), director) {
                (Some(r), Some(d)) => d.first_token(r),
                (Some(r), None) => {
                    r.first_token();
                }
                (None, _) => {}
            }
        }
        if self.keep_output {
            self.output.push(t);
        }
    }
}

/// One pod of the simulated cluster.
pub struct Pod {
    pub engine: Engine,
    /// The pod's entry in epp's datastore (`None` when no epp routes: round robin).
    pub state: Option<Arc<EndpointState>>,
    pub cfg: EngineConfig,
    /// A step is under way (its end is queued).
    pub busy: bool,
    /// The gauges as of the last step start, as the pod's `/metrics` shows them.
    published: EngineGauges,
    pub inflight: Vec<InFlight>,
}

impl Pod {
    pub fn new(cfg: EngineConfig, rng: SmallRng, vocabulary: Vec<TokenId>) -> Self {
        Self {
            engine: Engine::new(cfg.clone(), rng, vocabulary),
            state: None,
            cfg,
            busy: false,
            published: EngineGauges::default(),
            inflight: Vec::new(),
        }
    }

    /// Queues a request at `at` (the engine's clock reading) and tracks it.
    pub fn submit(&mut self, request: usize, tokens: Vec<TokenId>, max_output: usize, at: At) {
        let (output, rx) = mpsc::unbounded_channel();
        self.engine.add(NewRequest {
            prompt: tokens,
            max_output,
            reason_at_limit: FinishReason::Length,
            params_max_tokens: Some(max_output),
            lora: None,
            cache_salt: None,
            arrival: at.instant,
            output,
            kv: KvTransfer::None,
        });
        self.inflight.push(InFlight {
            request,
            routed: None,
            sent: at.offset,
            first_token: None,
            output: Vec::new(),
            keep_output: false,
            rx,
        });
    }

    /// Plans the next step at `at`, publishing the gauges first (as the engine task does):
    /// the step's simulated duration at this pod's speed, or `None` when idle.
    pub fn start_step(&mut self, at: At) -> Option<Duration> {
        self.published = self.engine.gauges();
        let plan: Option<StepPlan> = self.engine.schedule(at.instant);
        self.busy = plan.is_some();
        if plan.is_none() {
            self.drain_reports();
        }
        plan.map(|p| self.cfg.wall(p.duration))
    }

    /// Ends the step under way at `at`.
    pub fn end_step(&mut self, at: At) {
        self.engine.complete(at.instant);
        self.busy = false;
        self.drain_reports();
        if self.engine.is_idle() {
            self.published = self.engine.gauges();
        }
    }

    /// Empties what the engine accumulates for its metrics and KV events: the figures come
    /// from the requests' usage, and nothing reads KV events yet (no precise index here).
    fn drain_reports(&mut self) {
        drop(self.engine.take_report());
        drop(self.engine.take_events());
    }

    /// A scrape of this pod at `now`: what epp's poller would store.
    pub fn scrape(&self, now: Instant) -> EndpointMetrics {
        let g = &self.published;
        EndpointMetrics {
            waiting: g.waiting as f64,
            running: g.running as f64,
            kv_usage: g.kv_usage,
            lora: None,
            cache: Some(CacheInfo {
                block_size: self.cfg.block_size as u32,
                num_blocks: self.cfg.num_gpu_blocks as u64,
            }),
            gpu: None,
            pool: None,
            attributes: Vec::new(),
            updated: now,
        }
    }
}

/// A point of virtual time in the two forms the parts read: the offset from the run's start
/// and the engine's tokio instant.
#[derive(Clone, Copy, Debug)]
pub struct At {
    pub offset: Duration,
    pub instant: tokio::time::Instant,
}

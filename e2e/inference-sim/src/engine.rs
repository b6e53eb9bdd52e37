//! The engine: vLLM V1's continuous-batching scheduler as a pure, synchronous,
//! discrete-step simulation.
//!
//! Why: queueing, chunked prefill, prefix reuse and preemption are what make
//! one pod a better routing target than another; a fixed-latency fake hides
//! all of them. This module has no tokio in its logic: the async driver
//! (`runner`) calls [`Engine::schedule`], sleeps for the returned step time,
//! then calls [`Engine::complete`] with the clock reading.
//!
//! One step (as `vllm/v1/core/sched/scheduler.py`, FCFS policy):
//! 1. Running sequences first, in order: each asks for its remaining prompt
//!    (chunked to the token budget) or one decode token. If its blocks cannot
//!    be allocated, the *last* running sequence is preempted (blocks freed,
//!    progress lost, back to the front of the queue) until it fits.
//! 2. Then waiting sequences, FCFS, while fewer than `max_num_seqs` run and
//!    budget remains: a prefix-cache lookup (full blocks, at most `len - 1`
//!    tokens) skips cached tokens; the rest is prefilled, chunked to the budget.
//!    A sequence whose adapter would exceed `max_loras` is skipped; one that
//!    does not fit in free blocks stops the admission loop.
//! 3. Step time = overhead + prefill tokens × per-token cost + decoding
//!    sequences × per-sequence cost + context tokens × attention cost.
//! 4. After the step, a sequence whose tokens are all computed samples one
//!    token; it finishes at its output length.
//!
//! Simplified: no speculative decoding, no priority policy, no prompt
//! embeddings or multimodal inputs, a single KV-cache group, `n = 1`.

use std::collections::VecDeque;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::Rng;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::config::EngineConfig;
use super::hashing::{none_hash, BlockHasher, HashExtras};
use super::kv_cache::{BlockId, BlockPool, KvEvent};
use super::tokenizer::TokenId;

/// Why a sequence ended (`finished_reason` label values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    Abort,
}

impl FinishReason {
    pub const ALL: [FinishReason; 3] = [
        FinishReason::Stop,
        FinishReason::Length,
        FinishReason::Abort,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// A LoRA adapter as the engine sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoraRef {
    pub id: u64,
    pub name: String,
}

/// What the engine streams back to the HTTP handler of one request.
#[derive(Clone, Debug, PartialEq)]
pub enum SeqOutput {
    Token(TokenId),
    /// The final token, with the request's accounting.
    Last(TokenId, Usage),
    /// Ended without a final token (aborted).
    Finished(Usage),
    /// The waiting queue was full (`max_waiting`); nothing was generated.
    Rejected,
}

/// Final accounting of one request.
#[derive(Clone, Debug, PartialEq)]
pub struct Usage {
    pub reason: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
    /// The request's KV blocks, for a prefill whose decode runs elsewhere
    /// ([`KvTransfer::RemoteDecode`]: the `remote_block_ids` a decode pulls); else empty.
    pub block_ids: Vec<BlockId>,
}

/// The request's part in a prefill/decode split (vLLM's `kv_transfer_params` with the
/// NIXL connector).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvTransfer {
    #[default]
    None,
    /// `do_remote_decode`: prefill here, a decode pod will pull the KV.
    RemoteDecode,
    /// `do_remote_prefill`: the prompt was prefilled on another pod holding `blocks` blocks
    /// of it; the tokens this pod does not hold are pulled (at the configured bandwidth)
    /// instead of computed.
    RemotePrefill { blocks: usize },
}

/// A request admitted to the engine.
#[derive(Debug)]
pub struct NewRequest {
    pub prompt: Vec<TokenId>,
    /// Tokens to generate.
    pub max_output: usize,
    /// Reason reported when `max_output` is reached.
    pub reason_at_limit: FinishReason,
    /// The client's `max_tokens`, if any (for `request_params_max_tokens`).
    pub params_max_tokens: Option<usize>,
    pub lora: Option<LoraRef>,
    pub cache_salt: Option<String>,
    pub arrival: Instant,
    pub output: mpsc::UnboundedSender<SeqOutput>,
    pub kv: KvTransfer,
}

struct Seq {
    req: NewRequest,
    tokens: Vec<TokenId>,
    num_computed: usize,
    /// Tokens to compute in the step being run (0 if not scheduled).
    scheduled: usize,
    table: Vec<BlockId>,
    num_cached_blocks: usize,
    hasher: BlockHasher,
    cached_tokens: Option<usize>,
    first_scheduled: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    /// While the remote KV is in flight: when it lands (the sequence holds its blocks and
    /// is not scheduled until then).
    ready_at: Option<Instant>,
}

impl Seq {
    fn output_len(&self) -> usize {
        self.tokens.len() - self.req.prompt.len()
    }
}

/// A finished request, for the latency histograms (durations in simulated seconds).
#[derive(Clone, Debug, PartialEq)]
pub struct FinishedRecord {
    pub usage: Usage,
    pub params_max_tokens: Option<usize>,
    pub e2e: f64,
    pub queue: f64,
    pub inference: f64,
    pub prefill: f64,
    pub decode: f64,
}

/// What one step did, for metrics (durations in simulated seconds).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepReport {
    pub scheduled_tokens: usize,
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    pub preemptions: u64,
    pub prompt_tokens: u64,
    pub prompt_tokens_cached: u64,
    pub generation_tokens: u64,
    /// (TTFT, prompt tokens computed) per request that produced its first token.
    pub first_tokens: Vec<(f64, usize)>,
    /// (simulated seconds, bytes) per remote KV pull started.
    pub kv_transfers: Vec<(f64, f64)>,
    pub inter_token: Vec<f64>,
    pub finished: Vec<FinishedRecord>,
}

/// The plan of one step: its simulated duration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepPlan {
    pub duration: Duration,
    pub prefill_tokens: usize,
    pub decode_seqs: usize,
}

/// Gauges as vLLM's scheduler stats report them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineGauges {
    pub running: usize,
    pub waiting: usize,
    pub kv_usage: f64,
    pub running_loras: Vec<String>,
    pub waiting_loras: Vec<String>,
}

/// The simulated engine of one pod.
pub struct Engine {
    cfg: EngineConfig,
    pool: BlockPool,
    root: super::hashing::BlockHash,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    rng: SmallRng,
    vocab: Vec<TokenId>,
    report: StepReport,
    /// Simulated seconds per wall second (the time scale).
    scale: f64,
}

mod schedule;

impl Engine {
    /// A fresh engine with an empty KV cache; `vocab` feeds generated text.
    pub fn new(cfg: EngineConfig, rng: SmallRng, vocab: Vec<TokenId>) -> Self {
        let pool = BlockPool::new(cfg.num_gpu_blocks, cfg.block_size);
        let root = none_hash(&cfg.hash_seed);
        let scale = cfg.time_scale;
        let vocab = if vocab.is_empty() { vec![0] } else { vocab };
        Self {
            cfg,
            pool,
            root,
            waiting: VecDeque::new(),
            running: Vec::new(),
            rng,
            vocab,
            report: StepReport::default(),
            scale,
        }
    }

    /// Queues a request (it is scheduled at the next step).
    pub fn add(&mut self, req: NewRequest) {
        let extras = HashExtras {
            lora_name: req.lora.as_ref().map(|l| l.name.clone()),
            cache_salt: req.cache_salt.clone(),
        };
        let mut hasher = BlockHasher::new(self.root, self.cfg.block_size, extras);
        hasher.update(&req.prompt);
        let tokens = req.prompt.clone();
        self.waiting.push_back(Seq {
            req,
            tokens,
            num_computed: 0,
            scheduled: 0,
            table: Vec::new(),
            num_cached_blocks: 0,
            hasher,
            cached_tokens: None,
            first_scheduled: None,
            first_token: None,
            last_token: None,
            ready_at: None,
        });
    }

    /// When the earliest remote KV pull lands, if one is in flight (the driver sleeps until
    /// then when nothing else can run).
    pub fn next_ready(&self) -> Option<Instant> {
        self.running.iter().filter_map(|s| s.ready_at).min()
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Current gauges (`num_requests_*`, KV usage, LoRA adapters).
    pub fn gauges(&self) -> EngineGauges {
        EngineGauges {
            running: self.running.len(),
            waiting: self.waiting.len(),
            kv_usage: self.pool.usage(),
            running_loras: distinct_loras(self.running.iter()),
            waiting_loras: distinct_loras(self.waiting.iter()),
        }
    }

    /// `POST /reset_prefix_cache`: succeeds only when no block is in use.
    pub fn reset_prefix_cache(&mut self) -> bool {
        self.pool.reset()
    }

    /// KV events since the last call.
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.pool.take_events()
    }

    /// Metrics of the steps since the last call.
    pub fn take_report(&mut self) -> StepReport {
        std::mem::take(&mut self.report)
    }

    /// Applies a finished step at `now`: computes the scheduled tokens and
    /// samples one token for every sequence that has computed all its tokens.
    pub fn complete(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.running.len() {
            let seq = &mut self.running[i];
            seq.num_computed += std::mem::take(&mut seq.scheduled);
            if seq.num_computed < seq.tokens.len() {
                i += 1;
                continue;
            }
            let token = self.vocab[self.rng.random_range(0..self.vocab.len())];
            let seq = &mut self.running[i];
            seq.tokens.push(token);
            seq.hasher.update(&seq.tokens);
            Self::record_token(&mut self.report, seq, now, self.scale);
            if seq.output_len() >= seq.req.max_output {
                let seq = self.running.remove(i);
                let reason = seq.req.reason_at_limit;
                self.finish(seq, reason, now, Some(token));
            } else {
                let _ = seq.req.output.send(SeqOutput::Token(token));
                i += 1;
            }
        }
    }

    fn record_token(report: &mut StepReport, seq: &mut Seq, now: Instant, scale: f64) {
        report.generation_tokens += 1;
        match seq.last_token {
            None => {
                let ttft = now.duration_since(seq.req.arrival).as_secs_f64() * scale;
                let cached = seq.cached_tokens.unwrap_or(0);
                report
                    .first_tokens
                    .push((ttft, seq.req.prompt.len() - cached));
                report.prompt_tokens += seq.req.prompt.len() as u64;
                report.prompt_tokens_cached += cached as u64;
                seq.first_token = Some(now);
            }
            Some(last) => report
                .inter_token
                .push(now.duration_since(last).as_secs_f64() * scale),
        }
        seq.last_token = Some(now);
    }

    /// Drops sequences whose client went away (vLLM aborts on disconnect).
    fn reap_aborted(&mut self, now: Instant) {
        let gone = |s: &Seq| s.req.output.is_closed();
        while let Some(i) = self.running.iter().position(gone) {
            let seq = self.running.remove(i);
            self.finish(seq, FinishReason::Abort, now, None);
        }
        while let Some(i) = self.waiting.iter().position(gone) {
            if let Some(seq) = self.waiting.remove(i) {
                self.finish(seq, FinishReason::Abort, now, None);
            }
        }
    }

    /// Frees the sequence's blocks, records it, and tells its client (with the
    /// final token, if the sequence ended by producing one).
    fn finish(&mut self, seq: Seq, reason: FinishReason, now: Instant, last: Option<TokenId>) {
        self.pool.free(&seq.table);
        let secs = |from: Option<Instant>, to: Option<Instant>| match (from, to) {
            (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64() * self.scale,
            _ => 0.0,
        };
        let arrival = Some(seq.req.arrival);
        let end = Some(now);
        let usage = Usage {
            reason,
            prompt_tokens: seq.req.prompt.len(),
            completion_tokens: seq.output_len(),
            cached_tokens: seq.cached_tokens.unwrap_or(0),
            block_ids: match seq.req.kv {
                KvTransfer::RemoteDecode => seq.table.clone(),
                _ => Vec::new(),
            },
        };
        self.report.finished.push(FinishedRecord {
            usage: usage.clone(),
            params_max_tokens: seq.req.params_max_tokens,
            e2e: secs(arrival, end),
            queue: secs(arrival, seq.first_scheduled.or(end)),
            inference: secs(seq.first_scheduled, end),
            prefill: secs(seq.first_scheduled, seq.first_token),
            decode: secs(seq.first_token, end),
        });
        let out = match last {
            Some(token) => SeqOutput::Last(token, usage),
            None => SeqOutput::Finished(usage),
        };
        let _ = seq.req.output.send(out);
    }
}

fn distinct_loras<'a>(seqs: impl Iterator<Item = &'a Seq>) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for seq in seqs {
        if let Some(lora) = &seq.req.lora {
            if !names.contains(&lora.name) {
                names.push(lora.name.clone());
            }
        }
    }
    names
}

#[cfg(test)]
mod tests;

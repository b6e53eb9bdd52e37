//! inference-sim: a vLLM model-server simulator faithful enough that routing
//! results measured on it hold on GPUs.
//!
//! Why: there is no GPU here, so every routing claim is measured against
//! simulated pods. A fixed-latency fake rewards bad routers; this one models
//! what makes pods differ: continuous batching with a waiting queue, chunked
//! prefill, a vLLM-exact prefix cache (sha256_cbor block hashes, LRU reuse of
//! freed blocks, preemption), LoRA slots, per-pod speed, and vLLM's metrics and
//! KV events byte for byte.
//!
//! One request through the modules:
//!
//! 1. [`http`] parses the OpenAI body ([`openai`]; Responses, Anthropic Messages and token-in
//!    generate bodies become the same request in [`apis`]), applies [`faults`],
//!    resolves the model or LoRA adapter ([`lora`]), tokenizes
//!    ([`tokenizer`], chat template included) and checks the context length.
//! 2. The request goes to the pod's engine task ([`runner`]), which owns the
//!    pure scheduler ([`engine`]) and its block pool ([`kv_cache`], hashed by
//!    [`hashing`]).
//! 3. Each step: schedule (budget, cache hits, allocation, preemption), sleep
//!    the step's simulated time on tokio time, sample one token per finished
//!    prefill/decode, stream tokens back; fold the step into [`metrics`] and
//!    publish its events ([`kv_events`]).
//! 4. [`pod`] owns one pod's tasks; [`cluster`] hosts many and kills or
//!    restarts them (also through its admin endpoint).
//!
//! Start pods in-process with [`Cluster::start`] / [`Cluster::start_on`] or
//! [`run_pod`]; see `src/bin/inference-sim.rs` for the command line:
//!
//! ```text
//! cargo run --release -p inference-sim --bin inference-sim -- --pods 4 --base-port 8000 \
//!     --time-scale 10 --speeds 1,1,1,0.5 --admin-port 8099 \
//!     --kv-events-endpoint 'tcp://*:5557' --kv-events-replay-endpoint 'tcp://*:5657'
//! ```
//!
//! Defaults: 256 sequence slots (vLLM ≥ 0.9 picks 1024 on ≥ 70 GB GPUs),
//! 8192 batched tokens, 27,493 blocks of 16 tokens (an 8B model on an 80 GB
//! H100), the `h100-8b` timing profile.
//!
//! Prefill/decode disaggregation: with a KV connector (`--kv-transfer-config`, NixlConnector),
//! a request whose `kv_transfer_params` say `do_remote_decode` is prefilled and answered with
//! the `kv_transfer_params` vLLM's NIXL connector returns (`remote_block_ids`,
//! `remote_engine_id`, `remote_host`, `remote_port`); a request carrying those with
//! `do_remote_prefill` holds its blocks while the KV it does not have locally is pulled
//! (`bytes per token × tokens / bandwidth`, simulated time), then computes only the last
//! prompt token. Pulls are in `vllm:nixl_xfer_time_seconds` / `vllm:nixl_bytes_transferred`;
//! pulled blocks are cached and announced in KV events like computed ones. The decode-side
//! sidecar is `crate::pd_sidecar` (a stand-in for llm-d's).
//!
//! The HTTP surface, and the routes served that vLLM does not serve (Anthropic
//! `/v1/messages`) or serves differently (embeddings skip the engine): `README.md`.
//!
//! Simplified (honestly): generated text is filler; no speculative decoding,
//! multimodal, prompt embeddings, beam search or `n > 1`; one KV-cache group;
//! step time is a linear model (no quadratic prefill attention); the CPU cost
//! of tokenization and HTTP is real, not simulated.

pub mod apis;
pub mod cluster;
pub mod config;
pub mod engine;
pub mod faults;
pub mod hashing;
pub mod hook;
pub mod http;
pub mod kv_cache;
pub mod kv_events;
pub mod lora;
pub mod metrics;
pub mod openai;
pub mod pod;
pub mod runner;
pub mod tokenizer;

pub use cluster::{serve_admin, Cluster, ClusterError, PodStatus};
pub use config::{
    EngineConfig, EngineNaming, KvRole, KvTransferConfig, KvUsageMetric, MetricsOptions, PodConfig,
    Profile, TimingProfile,
};
pub use faults::{FaultSwitch, Faults, RETURN_ERROR_HEADER};
pub use hook::{ForcedMetrics, MetricValues, MetricsMode, RecordedRequest, TestHook};
pub use kv_events::{EventEncoding, KvEventsConfig, SocketMode};
pub use pod::{run_pod, Pod, PodControl, PodError};
pub use tokenizer::{Tokenizer, TokenizerKind};

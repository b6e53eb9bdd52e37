//! The load generator behind `loadgen` and `hack/bench.sh`: the same seeded workload against
//! any OpenAI-compatible HTTP endpoint (Envoy with or without epp, vllm-router, sglang-router,
//! or a pod directly), on loopback.
//!
//! One run, step by step:
//!
//! 1. [`workload`] makes the request contents from a seed (shared prefix, multi-turn chat,
//!    long/short mix, LoRA mix, random);
//! 2. [`schedule`] decides when they go out (Poisson or constant stages, or a closed loop);
//! 3. [`run`] sends them as streaming requests ([`stream`]) and records TTFT, every inter-token
//!    gap, end-to-end latency, status, tokens, cached tokens and the serving pod;
//! 4. [`pods`] reads the pods' vLLM counters before and after, for the prefix-cache hit rate and
//!    the per-pod spread whatever the router;
//!    ([`trace`] replays aiperf/Mooncake JSONL traces instead: contents and send times from
//!    the file, and writes synthetic agentic and RL traces);
//! 5. [`summary`] condenses it all (percentiles, throughput, errors, oracle hit rate, stages);
//!    [`plot`] draws TTFT CDFs and latency against offered load as SVG.

pub mod bench;
pub mod plot;
pub mod pods;
pub mod run;
pub mod schedule;
pub mod stream;
pub mod summary;
pub mod trace;
pub mod workload;

use serde::{Deserialize, Serialize};

pub use run::{run, RequestRecord, RunConfig};
pub use schedule::{Load, Stage};
pub use summary::{summarize, Summary, MARKDOWN_HEADER};
pub use workload::Workload;

/// The file `loadgen --out` writes: what was run, the summary, and every request.
#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    /// The workload and load, as given (free-form JSON so old reports still load).
    pub config: serde_json::Value,
    pub summary: Summary,
    pub requests: Vec<RequestRecord>,
}

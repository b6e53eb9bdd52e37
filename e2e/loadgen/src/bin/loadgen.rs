//! `loadgen`: sends a seeded LLM workload to an OpenAI-compatible endpoint on loopback and
//! writes every request and a summary as JSON, a Markdown row, and a TTFT CDF (SVG).
//!
//! ```text
//! loadgen --target 127.0.0.1:8081 --workload shared-prefix --groups 64 --system-len 3000 \
//!     --rate-stages 5:30,10:30 --pods 127.0.0.1:8000,127.0.0.1:8001 --out run.json
//! loadgen --target 127.0.0.1:8081 --workload random --concurrency 16 --max-requests 5000
//! loadgen --target 127.0.0.1:8081 --workload trace --trace mooncake.jsonl \
//!     --trace-tokens-per-block 16 --trace-time-scale 0.1 --out run.json
//! ```
//!
//! Traces (aiperf / Dynamo Mooncake JSONL) are written by `tracegen`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use loadgen::plot::{self, Series};
use loadgen::pods::{delta, scrape_all};
use loadgen::summary::Context;
use loadgen::trace::Replay;
use loadgen::{run, summarize, Load, Report, RunConfig, Stage, Workload, MARKDOWN_HEADER};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Kind {
    SharedPrefix,
    MultiTurn,
    Mix,
    Lora,
    Random,
    /// Replay a JSONL trace (--trace): contents and send times from the file.
    Trace,
}

/// Seeded LLM load against an OpenAI-compatible endpoint on 127.0.0.1.
#[derive(Debug, Parser)]
#[command(name = "loadgen", about)]
struct Args {
    /// The router (or pod) to send to; must be a loopback address.
    #[arg(long)]
    target: SocketAddr,
    #[arg(long, value_enum, default_value_t = Kind::SharedPrefix)]
    workload: Kind,
    /// Shared prefix: number of system prompts (groups).
    #[arg(long, default_value_t = 64)]
    groups: usize,
    /// Shared prefix: questions per group.
    #[arg(long, default_value_t = 16)]
    prompts_per_group: usize,
    /// Shared prefix and multi-turn: system prompt tokens.
    #[arg(long, default_value_t = 3000)]
    system_len: usize,
    /// Question tokens (shared prefix, multi-turn).
    #[arg(long, default_value_t = 300)]
    question_len: usize,
    /// Output tokens of every request (`max_tokens`, with `ignore_eos`).
    #[arg(long, default_value_t = 100)]
    output_len: usize,
    /// Multi-turn: concurrent chat sessions, and turns before a session starts over.
    #[arg(long, default_value_t = 32)]
    sessions: usize,
    #[arg(long, default_value_t = 8)]
    turns: usize,
    /// Random and LoRA: prompt tokens.
    #[arg(long, default_value_t = 1000)]
    input_len: usize,
    /// LoRA: adapters `lora-0..N` (Zipf popularity).
    #[arg(long, default_value_t = 8)]
    adapters: usize,
    /// Mix: short prompt tokens, long fraction, Pareto tail bounds.
    #[arg(long, default_value_t = 200)]
    short_len: usize,
    #[arg(long, default_value_t = 0.1)]
    long_fraction: f64,
    #[arg(long, default_value_t = 2000)]
    long_min: usize,
    #[arg(long, default_value_t = 12000)]
    long_max: usize,
    /// Trace: the JSONL file (`timestamp` ms, `input_length`, `output_length`, `hash_ids`).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Trace: tokens per hash block in the file (Mooncake traces: 512).
    #[arg(long, default_value_t = 512)]
    trace_block_size: usize,
    /// Trace: tokens per hash block when replayed (scales every prompt by this / block size).
    #[arg(long)]
    trace_tokens_per_block: Option<usize>,
    /// Trace: multiplies every timestamp (0.1 = ten times faster).
    #[arg(long, default_value_t = 1.0)]
    trace_time_scale: f64,
    /// Open loop: `rate:seconds` stages, comma-separated (e.g. `5:30,10:30`).
    #[arg(long, conflicts_with = "concurrency")]
    rate_stages: Option<String>,
    /// Open loop: evenly spaced arrivals instead of Poisson.
    #[arg(long)]
    constant: bool,
    /// Closed loop: requests in flight.
    #[arg(long)]
    concurrency: Option<usize>,
    #[arg(long, default_value_t = 100_000)]
    max_requests: usize,
    /// Stop sending after this long (defaults to the stages' total, else 10 s).
    #[arg(long)]
    duration_secs: Option<f64>,
    /// Requests sent in the first this-many seconds warm the caches and are left out of the summary.
    #[arg(long, default_value_t = 0.0)]
    warmup_secs: f64,
    /// Requests still running this long after the end are cut off.
    #[arg(long, default_value_t = 30.0)]
    drain_secs: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value = "meta-llama/Llama-3.1-8B-Instruct")]
    model: String,
    /// Pods whose /metrics give the hit rate and per-pod spread (comma-separated ip:port).
    #[arg(long, value_delimiter = ',')]
    pods: Vec<SocketAddr>,
    /// KV block size of the pods (for the oracle hit rate).
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Name of this run in tables and plots.
    #[arg(long, default_value = "run")]
    label: String,
    /// Write the JSON report here (and `<stem>-ttft-cdf.svg` beside it).
    #[arg(long)]
    out: Option<PathBuf>,
}

impl Args {
    fn workload(&self) -> Workload {
        match self.workload {
            Kind::SharedPrefix => Workload::SharedPrefix {
                groups: self.groups,
                prompts_per_group: self.prompts_per_group,
                system_len: self.system_len,
                question_len: self.question_len,
                output_len: self.output_len,
            },
            Kind::MultiTurn => Workload::MultiTurn {
                sessions: self.sessions,
                turns: self.turns,
                system_len: self.system_len,
                question_len: self.question_len,
                output_len: self.output_len,
            },
            Kind::Mix => Workload::LongShortMix {
                short_len: self.short_len,
                long_fraction: self.long_fraction,
                long_min: self.long_min,
                long_max: self.long_max,
                output_len: self.output_len,
            },
            Kind::Lora => Workload::LoraMix {
                adapters: self.adapters,
                input_len: self.input_len,
                output_len: self.output_len,
            },
            Kind::Random => Workload::Random {
                input_len: self.input_len,
                output_len: self.output_len,
            },
            Kind::Trace => Workload::Trace {
                path: self
                    .trace
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                replay: self.replay(),
            },
        }
    }

    fn replay(&self) -> Replay {
        Replay {
            block_size: self.trace_block_size.max(1),
            tokens_per_block: self
                .trace_tokens_per_block
                .unwrap_or(self.trace_block_size)
                .max(1),
            time_scale: self.trace_time_scale,
        }
    }

    fn load(&self) -> anyhow::Result<Load> {
        if matches!(self.workload, Kind::Trace) {
            // The trace sets the send times; one stage spanning it bounds the run.
            let path = self
                .trace
                .as_ref()
                .context("--workload trace needs --trace FILE")?;
            let entries = loadgen::trace::read(path)?;
            anyhow::ensure!(!entries.is_empty(), "{} has no requests", path.display());
            let replay = self.replay();
            let span = entries.last().map_or(0.0, |e| replay.at_secs(e)) + 0.001;
            return Ok(Load::Open {
                stages: vec![Stage {
                    rate: entries.len() as f64 / span,
                    duration: Duration::from_secs_f64(span),
                }],
                poisson: false,
            });
        }
        match (&self.rate_stages, self.concurrency) {
            (Some(text), _) => {
                let stages =
                    Load::parse_stages(text).context("--rate-stages must look like 5:30,10:30")?;
                Ok(Load::Open {
                    stages,
                    poisson: !self.constant,
                })
            }
            (None, Some(c)) => Ok(Load::Closed {
                concurrency: c.max(1),
            }),
            (None, None) => {
                anyhow::bail!("give --rate-stages (open loop) or --concurrency (closed loop)")
            }
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.target.ip().is_loopback(),
        "--target must be a loopback address"
    );
    let load = args.load()?;
    let duration = args
        .duration_secs
        .map(Duration::from_secs_f64)
        .or(load.planned())
        .unwrap_or(Duration::from_secs(10));
    let stage_rates: Vec<f64> = match &load {
        Load::Open { stages, .. } => stages.iter().map(|s| s.rate).collect(),
        Load::Closed { .. } => Vec::new(),
    };
    let cfg = RunConfig {
        target: args.target,
        workload: args.workload(),
        load: load.clone(),
        max_requests: args.max_requests,
        max_duration: duration,
        drain: Duration::from_secs_f64(args.drain_secs),
        seed: args.seed,
        model: args.model.clone(),
    };
    let before = scrape_all(&args.pods).await;
    let records = run(cfg.clone()).await;
    let pod_delta = delta(&scrape_all(&args.pods).await, &before);
    let ctx = Context {
        label: &args.label,
        workload: &cfg.workload,
        stage_rates: &stage_rates,
        pod_delta: &pod_delta,
        block_size: args.block_size,
        warmup_s: args.warmup_secs,
    };
    let summary = summarize(&records, &ctx);
    println!("{MARKDOWN_HEADER}\n{}", summary.markdown_row());
    if let Some(out) = &args.out {
        let config = serde_json::json!({"workload": cfg.workload, "load": load, "seed": args.seed,
            "max_requests": args.max_requests, "warmup_s": args.warmup_secs, "duration_s": duration.as_secs_f64(), "target": args.target.to_string()});
        let ttfts: Vec<f64> = records
            .iter()
            .filter(|r| r.ok())
            .filter_map(|r| r.ttft_ms)
            .collect();
        let report = Report {
            config,
            summary,
            requests: records,
        };
        std::fs::write(out, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", out.display()))?;
        let svg = out.with_file_name(format!(
            "{}-ttft-cdf.svg",
            out.file_stem().unwrap_or_default().to_string_lossy()
        ));
        plot::ttft_cdf(
            &svg,
            &format!("TTFT CDF: {}", args.label),
            &[Series {
                label: args.label.clone(),
                points: plot::cdf(ttfts),
            }],
        )?;
    }
    Ok(())
}

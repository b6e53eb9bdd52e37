//! `tracegen`: writes synthetic request traces in the aiperf / Dynamo Mooncake JSONL format
//! (`timestamp` ms, `input_length`, `output_length`, `hash_ids` of `--block-size`-token blocks),
//! for `loadgen --workload trace`.
//!
//! ```text
//! tracegen agentic --sessions 16 --turns 8 --out agentic.jsonl
//! tracegen rl --bursts 10 --burst-size 16 --out rl.jsonl
//! ```

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use loadgen::trace;

/// Synthetic traces in the Mooncake JSONL format.
#[derive(Debug, Parser)]
#[command(name = "tracegen", about)]
struct Args {
    #[command(subcommand)]
    kind: Kind,
    /// Tokens per hash block.
    #[arg(long, global = true, default_value_t = 512)]
    block_size: usize,
    #[arg(long, global = true, default_value_t = 1)]
    seed: u64,
    /// Where to write the JSONL.
    #[arg(long, global = true, default_value = "trace.jsonl")]
    out: PathBuf,
}

#[derive(Debug, Subcommand)]
enum Kind {
    /// Multi-turn agent sessions: every turn resends the previous context plus new tokens.
    Agentic {
        #[arg(long, default_value_t = 16)]
        sessions: usize,
        #[arg(long, default_value_t = 8)]
        turns: usize,
        /// System prompt tokens shared by every session.
        #[arg(long, default_value_t = 2048)]
        system_len: usize,
        /// First turn's prompt tokens (system prompt included).
        #[arg(long, default_value_t = 4096)]
        first_len: usize,
        /// Tokens added per turn (the previous answer and tool output).
        #[arg(long, default_value_t = 1024)]
        growth: usize,
        #[arg(long, default_value_t = 200)]
        output_len: usize,
        /// Milliseconds between session starts.
        #[arg(long, default_value_t = 500.0)]
        stagger_ms: f64,
        /// Mean think time between a session's turns (exponential), ms.
        #[arg(long, default_value_t = 3000.0)]
        think_ms: f64,
    },
    /// RL rollouts: bursts of the same prompt sent at once.
    Rl {
        #[arg(long, default_value_t = 10)]
        bursts: usize,
        #[arg(long, default_value_t = 16)]
        burst_size: usize,
        #[arg(long, default_value_t = 3000)]
        input_len: usize,
        #[arg(long, default_value_t = 500)]
        output_len: usize,
        /// Milliseconds between bursts.
        #[arg(long, default_value_t = 5000.0)]
        gap_ms: f64,
    },
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let entries = match a.kind {
        Kind::Agentic {
            sessions,
            turns,
            system_len,
            first_len,
            growth,
            output_len,
            stagger_ms,
            think_ms,
        } => trace::agentic(
            sessions,
            turns,
            system_len,
            first_len,
            growth,
            output_len,
            stagger_ms,
            think_ms,
            a.block_size,
            a.seed,
        ),
        Kind::Rl {
            bursts,
            burst_size,
            input_len,
            output_len,
            gap_ms,
        } => trace::rl_bursts(
            bursts,
            burst_size,
            input_len,
            output_len,
            gap_ms,
            a.block_size,
            a.seed,
        ),
    };
    trace::write(&a.out, &entries)?;
    println!("{} requests written to {}", entries.len(), a.out.display());
    Ok(())
}

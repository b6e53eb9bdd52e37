//! Routing that prices the network (issue 36, items 3 and 4): two regions on one machine, 40 ms
//! and 280 ms round trips from the hub (delaying proxies on loopback), each with its own
//! in-process inference-sim pods, spoke epp and Envoy; a hub (epp with `network-cost-scorer`,
//! epp with llm-d's `load` policy, llm-d-router v0.10's EPP with it) behind its own Envoy.
//!
//! Two scenarios per hub and round, each on a fresh bed:
//! - **saturate**: an open-loop Poisson load below the near region's capacity, then above it,
//!   then below again: TTFT p50/p90 and the share served by the far region in each phase;
//! - **lose**: a steady load, and the near region cut off (both proxies close every connection
//!   and refuse new ones) in the middle: failed requests sent before the cut (in flight there)
//!   and after it (routed to a lost region), and TTFT after it.
//!
//! Prints every round, then `mean (min–max)` over the rounds. Bounded: no round starts after
//! `--budget-minutes`, every run is bounded by its phases plus 30 s of drain.
//!
//! Run: `cargo build -p loadgen --bin region-bench`, then
//! `EPP_ENVOY=$(hack/install-envoy.sh) EPP_LLMD_EPP=/path/to/llm-d-epp target/debug/region-bench --rounds 3`
//! (without `EPP_LLMD_EPP`, leave `llmd` out of `--hubs`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use loadgen::bench::regions::{
    self, Bed, HubPolicy, LossResult, NetworkCost, Phase, PhaseStats, RegionSpec, Traffic,
};
use loadgen::workload::Workload;

#[derive(Parser, Debug)]
#[command(about = "a hub over two regions 40 ms and 280 ms away: saturation and loss")]
struct Args {
    /// Hubs, comma-separated: epp (network-cost-scorer), epp-load, llmd.
    #[arg(long, default_value = "epp,epp-load,llmd", value_delimiter = ',')]
    hubs: Vec<String>,
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// The epp hub's `network-cost-scorer` `queuedRequestMs` (about a request's duration over
    /// a pod's running sequences).
    #[arg(long, default_value_t = 100)]
    queued_request_ms: u32,
    /// The epp hub's `network-cost-scorer` `idleTtftMs` (an uncached prompt's TTFT at an idle
    /// pool).
    #[arg(long, default_value_t = 50)]
    idle_ttft_ms: u32,
    /// The epp hub tracks prompt prefixes (`multicluster-approx-prefix-cache-producer`), so a
    /// cluster that served a group's system prompt is cheaper for that group by `idleTtftMs`.
    #[arg(long)]
    prefix: bool,
    #[arg(long, default_value_t = 40)]
    near_rtt_ms: u64,
    #[arg(long, default_value_t = 280)]
    far_rtt_ms: u64,
    /// Pods per region.
    #[arg(long, default_value_t = 2)]
    pods: usize,
    /// Running sequences per pod (inference-sim --max-num-seqs).
    #[arg(long, default_value_t = 4)]
    max_num_seqs: usize,
    /// Requests per second below the near region's capacity.
    #[arg(long, default_value_t = 8.0)]
    low_rate: f64,
    /// Requests per second above it.
    #[arg(long, default_value_t = 40.0)]
    high_rate: f64,
    /// Seconds of each saturation phase.
    #[arg(long, default_value_t = 8.0)]
    phase_secs: f64,
    /// Requests per second during the loss scenario.
    #[arg(long, default_value_t = 10.0)]
    loss_rate: f64,
    /// Seconds of the loss scenario's load; the cut comes at half of it.
    #[arg(long, default_value_t = 10.0)]
    loss_secs: f64,
    /// Tokens of each group's shared system prompt.
    #[arg(long, default_value_t = 256)]
    system_len: usize,
    #[arg(long, default_value_t = 32)]
    output_len: usize,
    /// No round starts after this many minutes.
    #[arg(long, default_value_t = 20.0)]
    budget_minutes: f64,
    /// Where the beds' files go (default: a new directory under the system's temp dir).
    #[arg(long)]
    out: Option<PathBuf>,
}

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

fn secs(what: &str, v: f64) -> anyhow::Result<Duration> {
    anyhow::ensure!(v.is_finite() && v > 0.0, "--{what} must be > 0, got {v}");
    Ok(Duration::from_secs_f64(v))
}

fn specs(args: &Args) -> Vec<RegionSpec> {
    let region = |name: &str, ms| RegionSpec {
        name: name.into(),
        rtt: Duration::from_millis(ms),
        pods: args.pods,
    };
    vec![
        region("near", args.near_rtt_ms),
        region("far", args.far_rtt_ms),
    ]
}

fn traffic(args: &Args, seed: u64) -> Traffic {
    Traffic {
        workload: Workload::SharedPrefix {
            groups: 8,
            prompts_per_group: 32,
            system_len: args.system_len,
            question_len: 32,
            output_len: args.output_len,
        },
        model: MODEL.into(),
        seed,
    }
}

fn saturation(args: &Args) -> anyhow::Result<Vec<Phase>> {
    let d = secs("phase-secs", args.phase_secs)?;
    let phase = |name: &str, rate| Phase {
        name: name.into(),
        rate,
        duration: d,
    };
    Ok(vec![
        phase("below", args.low_rate),
        phase("saturated", args.high_rate),
        phase("recovered", args.low_rate),
    ])
}

fn print_phase(hub: HubPolicy, round: usize, p: &PhaseStats) {
    println!(
        "{:<17} round {round} {:<10} {:>5.1} req/s: {} sent, {} failed, TTFT p50 {:.0} ms p90 {:.0} ms, cross-region {:.0}%",
        hub.name(),
        p.name,
        p.rate,
        p.sent,
        p.failed,
        p.ttft.p50,
        p.ttft.p90,
        p.cross_region * 100.0
    );
}

fn print_loss(hub: HubPolicy, round: usize, l: &LossResult) {
    println!(
        "{:<17} round {round} lose near at {:.1}s: {} sent, {} failed sent before the cut ({} in flight there), {} failed sent after it; after: TTFT p50 {:.0} ms p90 {:.0} ms, cross-region {:.0}%",
        hub.name(),
        l.cut_at_s,
        l.sent,
        l.failed_in_flight,
        l.in_flight_there,
        l.failed_after,
        l.after.ttft.p50,
        l.after.ttft.p90,
        l.after.cross_region * 100.0
    );
}

/// Every round's figures of one hub.
#[derive(Default)]
struct Results {
    phases: Vec<Vec<PhaseStats>>,
    losses: Vec<LossResult>,
}

/// `mean (min–max)` of `v`, `–` when empty.
fn spread(v: &[f64], unit: &str) -> String {
    if v.is_empty() {
        return "–".into();
    }
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let (lo, hi) = v
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
            (a.min(*x), b.max(*x))
        });
    format!("{mean:.0}{unit} ({lo:.0}–{hi:.0})")
}

fn table(all: &[(HubPolicy, Results)], phases: &[Phase]) {
    println!("\n| hub | phase | rounds | TTFT p50 ms | TTFT p90 ms | cross-region % | failed |");
    println!("|---|---|---|---|---|---|---|");
    for (hub, r) in all {
        for (i, p) in phases.iter().enumerate() {
            let of = |f: fn(&PhaseStats) -> f64| -> Vec<f64> {
                r.phases.iter().map(|ph| f(&ph[i])).collect()
            };
            println!(
                "| {} | {} ({} req/s) | {} | {} | {} | {} | {} |",
                hub.name(),
                p.name,
                p.rate,
                r.phases.len(),
                spread(&of(|s| s.ttft.p50), ""),
                spread(&of(|s| s.ttft.p90), ""),
                spread(&of(|s| s.cross_region * 100.0), ""),
                spread(&of(|s| s.failed as f64), ""),
            );
        }
    }
    println!("\n| hub | rounds | failed, sent before the cut | in flight there at the cut | failed, sent after the cut | TTFT p50 / p90 after, ms |");
    println!("|---|---|---|---|---|---|");
    for (hub, r) in all {
        let of = |f: fn(&LossResult) -> f64| -> Vec<f64> { r.losses.iter().map(f).collect() };
        println!(
            "| {} | {} | {} | {} | {} | {} / {} |",
            hub.name(),
            r.losses.len(),
            spread(&of(|l| l.failed_in_flight as f64), ""),
            spread(&of(|l| l.in_flight_there as f64), ""),
            spread(&of(|l| l.failed_after as f64), ""),
            spread(&of(|l| l.after.ttft.p50), ""),
            spread(&of(|l| l.after.ttft.p90), ""),
        );
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let hubs = args
        .hubs
        .iter()
        .map(|h| match HubPolicy::parse(h)? {
            HubPolicy::EppNetworkCost(_) => Ok(HubPolicy::EppNetworkCost(NetworkCost {
                queued_request_ms: args.queued_request_ms,
                idle_ttft_ms: args.idle_ttft_ms,
                prefix: args.prefix,
            })),
            other => Ok(other),
        })
        .collect::<Result<Vec<_>, loadgen::bench::BenchError>>()?;
    let llmd = std::env::var_os("EPP_LLMD_EPP").map(PathBuf::from);
    let phases = saturation(&args)?;
    let loss_secs = secs("loss-secs", args.loss_secs)?;
    let engine = regions::engine(MODEL, args.max_num_seqs);
    let dir = match &args.out {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("region-bench-{}", std::process::id())),
    };
    println!("files in {}", dir.display());
    let budget = Duration::from_secs_f64(args.budget_minutes * 60.0);
    let started = Instant::now();
    let mut all: Vec<(HubPolicy, Results)> =
        hubs.iter().map(|h| (*h, Results::default())).collect();
    'rounds: for round in 0..args.rounds {
        for (hub, results) in all.iter_mut() {
            if started.elapsed() > budget {
                println!("budget of {budget:?} spent: stopping");
                break 'rounds;
            }
            let seed = 7 + round as u64;
            let bed_dir = dir.join(format!("{}-{round}-saturate", hub.name().replace(' ', "-")));
            let bed = Bed::start(&specs(&args), &engine, *hub, llmd.as_deref(), &bed_dir).await?;
            let stats = regions::phases(&bed, &phases, &traffic(&args, seed)).await;
            bed.stop().await;
            stats.iter().for_each(|p| print_phase(*hub, round, p));
            results.phases.push(stats);
            let bed_dir = dir.join(format!("{}-{round}-lose", hub.name().replace(' ', "-")));
            let bed = Bed::start(&specs(&args), &engine, *hub, llmd.as_deref(), &bed_dir).await?;
            let loss = regions::lose(
                &bed,
                0,
                args.loss_rate,
                loss_secs,
                loss_secs / 2,
                &traffic(&args, seed),
            )
            .await;
            bed.stop().await;
            print_loss(*hub, round, &loss);
            results.losses.push(loss);
        }
    }
    table(&all, &phases);
    Ok(())
}

//! Failover under load (issue 35, item 4; docs/operations/failover.md): epp replicas (the epp
//! binary) behind a health-checked Envoy (`config/envoy/ha-active-active.yaml` or
//! `ha-hot-standby.yaml`) in front of inference-sim pods, an open-loop shared-prefix load at each
//! rate, and in each round one fault: steady (none), a rolling restart of every replica, SIGTERM
//! of one, SIGKILL of one, or (`apiserver-gone`, not in the default list) the replicas discovering
//! their pods from a real kube-apiserver that is SIGKILLed and held down for `--apiserver-down`
//! seconds. Prints every round, then a table of `mean (min–max)` over the rounds.
//! Bounded: each round's load is `fault-at` + what the fault takes + `settle` seconds, and no
//! round starts after `--budget-minutes`.
//!
//! Run: `cargo build -p epp --bin epp -p inference-sim --bin inference-sim -p loadgen --bin failover-bench`,
//! then `EPP_ENVOY=$(hack/install-envoy.sh) target/debug/failover-bench --rates 50,100,150 --rounds 3`
//! (`EPP_BIN` names another epp binary; the default is the one beside this binary).
//! `apiserver-gone` needs kube-apiserver and etcd from `hack/install-kube.sh` (`.kube-bin`, or
//! `EPP_KUBE_BIN`); its pods listen on one port at 127.0.0.1, 127.0.0.2, ... (one target port).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use loadgen::bench::cluster::{Engine, SimCluster, SimOptions};
use loadgen::bench::failover::{self, FailoverOptions, Fault, Layout, Round};
use loadgen::bench::routers::Bins;
use loadgen::workload::Workload;

#[derive(Parser, Debug)]
#[command(about = "epp replicas failing over under load, through a health-checked Envoy")]
struct Args {
    /// Requests per second, comma-separated.
    #[arg(long, default_value = "50,100,150", value_delimiter = ',')]
    rates: Vec<f64>,
    /// Rounds per fault and rate.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Faults, comma-separated: steady, rolling-restart, sigterm, sigkill, apiserver-gone.
    #[arg(
        long,
        default_value = "steady,rolling-restart,sigterm,sigkill",
        value_delimiter = ','
    )]
    faults: Vec<String>,
    #[arg(long, default_value_t = 2)]
    replicas: usize,
    /// active-active or hot-standby.
    #[arg(long, default_value = "active-active")]
    layout: String,
    /// inference-sim pods.
    #[arg(long, default_value_t = 4)]
    pods: usize,
    /// epp's --drain-timeout, seconds.
    #[arg(long, default_value_t = 3.0)]
    drain_timeout: f64,
    /// When the fault starts, seconds into the load.
    #[arg(long, default_value_t = 5.0)]
    fault_at: f64,
    /// apiserver-gone: seconds kube-apiserver stays down (epp's --kube-api-unreachable-grace
    /// is 30 s).
    #[arg(long, default_value_t = 40.0)]
    apiserver_down: f64,
    /// Seconds after the fault's end that still count as "during" it.
    #[arg(long, default_value_t = 3.0)]
    settle: f64,
    /// epp's --config-file (default: its built-in default).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Tokens of each group's shared system prompt.
    #[arg(long, default_value_t = 256)]
    system_len: usize,
    /// Output tokens per request.
    #[arg(long, default_value_t = 4)]
    output_len: usize,
    /// inference-sim --time-scale.
    #[arg(long, default_value_t = 10.0)]
    time_scale: f64,
    /// No round starts after this many minutes.
    #[arg(long, default_value_t = 20.0)]
    budget_minutes: f64,
    /// Where the processes' logs go (default: a new directory under the system's temp dir).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// `host_per_pod`: every pod on one port at its own loopback address (Kubernetes discovery).
fn sim_options(pods: usize, time_scale: f64, host_per_pod: bool) -> SimOptions {
    SimOptions {
        pods,
        num_gpu_blocks: 1001,
        block_size: 16,
        max_model_len: 16384,
        profile: "llmd-h100-8b".into(),
        time_scale,
        lora_adapters: Vec::new(),
        max_loras: 1,
        kv_events: false,
        host_per_pod,
        speeds: Vec::new(),
        engine: Engine::InferenceSim,
        kv_events_sub: None,
    }
}

fn options(args: &Args, bins: &Bins) -> anyhow::Result<FailoverOptions> {
    let secs = |what: &str, v: f64| {
        anyhow::ensure!(
            v.is_finite() && v >= 0.0,
            "--{what} must be >= 0 seconds, got {v}"
        );
        Ok(Duration::from_secs_f64(v))
    };
    Ok(FailoverOptions {
        epp: bins.epp.clone(),
        config: args.config.clone(),
        replicas: args.replicas,
        layout: Layout::parse(&args.layout).map_err(anyhow::Error::msg)?,
        rate: 1.0,
        duration: Duration::ZERO,
        fault_at: secs("fault-at", args.fault_at)?,
        settle: secs("settle", args.settle)?,
        drain_timeout: secs("drain-timeout", args.drain_timeout)?,
        apiserver_down: secs("apiserver-down", args.apiserver_down)?,
        workload: Workload::SharedPrefix {
            groups: 8,
            prompts_per_group: 16,
            system_len: args.system_len,
            question_len: 32,
            output_len: args.output_len,
        },
        model: "meta-llama/Llama-3.1-8B-Instruct".into(),
        seed: 7,
    })
}

/// When Envoy took the (first) replica out of rotation, after what.
fn out_of_rotation(r: &Round) -> String {
    let after = match r.fault {
        Fault::ApiServerGone => "the API server's SIGKILL",
        _ => "SIGTERM",
    };
    r.out_of_rotation_secs
        .map(|s| format!(", out of Envoy's rotation {s:.1}s after {after}"))
        .unwrap_or_default()
}

fn print_round(r: &Round) {
    println!(
        "{:>15} {:>5} req/s: {} sent, {} failed{}{}, fault {:.1}s{}, prefix hit {} → {}, p50 {:.0} ms, p99 {:.0} ms{}",
        r.fault.name(),
        r.rate,
        r.sent,
        r.failed,
        r.victim_in_flight
            .map(|v| format!(" ({v} in flight on the killed replica)"))
            .unwrap_or_default(),
        out_of_rotation(r),
        r.fault_secs,
        r.panic_routed
            .filter(|n| *n > 0)
            .map(|n| format!(" ({n} streams routed in Envoy's panic mode)"))
            .unwrap_or_default(),
        r.hit_steady.map_or("–".into(), |h| format!("{h:.3}")),
        r.hit_during.map_or("–".into(), |h| format!("{h:.3}")),
        r.p50_ms,
        r.p99_ms,
        if r.errors.is_empty() {
            String::new()
        } else {
            format!(" errors: {:?}", r.errors)
        }
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let faults = args
        .faults
        .iter()
        .map(|f| Fault::parse(f))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let bins = Bins::beside_current_exe()?;
    let base = options(&args, &bins)?;
    let dir = match &args.out {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("failover-bench-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    println!("logs in {}", dir.display());
    let budget = Duration::from_secs_f64(args.budget_minutes * 60.0);
    let started = Instant::now();
    let mut rounds = Vec::new();
    let mut failed_rounds = 0;
    'all: for round in 0..args.rounds {
        for &rate in &args.rates {
            for &fault in &faults {
                if started.elapsed() > budget {
                    println!("budget of {:?} spent: stopping", budget);
                    break 'all;
                }
                let mut opts = base.clone();
                opts.rate = rate;
                opts.seed = base.seed + round as u64;
                opts.duration = failover::needed(fault, &opts);
                let round_dir = dir.join(format!("{}-{rate}-{round}", fault.name()));
                std::fs::create_dir_all(&round_dir)?;
                let cluster = SimCluster::start(
                    &bins.inference_sim,
                    &sim_options(args.pods, args.time_scale, fault == Fault::ApiServerGone),
                    &round_dir,
                )
                .await?;
                match failover::round(&opts, fault, &cluster.pods, &round_dir).await {
                    Ok(r) => {
                        print_round(&r);
                        rounds.push(r);
                    }
                    Err(e) => {
                        println!("{:>15} {rate:>5} req/s: round failed: {e}", fault.name());
                        failed_rounds += 1;
                    }
                }
            }
        }
    }
    println!("\n{}", failover::table(&rounds));
    anyhow::ensure!(
        failed_rounds == 0,
        "{failed_rounds} rounds failed to run (above)"
    );
    Ok(())
}

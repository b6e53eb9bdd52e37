//! `bench`: the routing-quality and overhead benchmark (run it through `hack/bench.sh`).
//! Starts the simulated cluster, each router in turn, `loadgen` against it, then the overhead
//! paths; writes `results.md`, `results.json` and SVG plots to `--out` and prints the tables.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use loadgen::bench::plan::{scenarios, Mode, PlanOptions};
use loadgen::bench::routers::Bins;
use loadgen::bench::{compare, compat, cost, crosscheck, overhead, report};

/// Routing quality of epp against Envoy, vllm-router and sglang-router, and epp's overhead.
#[derive(Debug, Parser)]
#[command(name = "bench", about)]
struct Args {
    #[arg(long, value_enum, default_value_t = Mode::Quick)]
    mode: Mode,
    /// Output directory (the last one given wins: hack/bench.sh passes its own first).
    #[arg(long, default_value = "target/bench", overrides_with = "out")]
    out: PathBuf,
    /// Offered load of the shared-prefix run (requests/s).
    #[arg(long, default_value_t = 17.0)]
    rate: f64,
    /// Offered load of the no-sharing run (requests/s).
    #[arg(long, default_value_t = 5.5)]
    random_rate: f64,
    /// Seconds of load per routing run [default: smoke 2, quick 18, full 45].
    #[arg(long)]
    duration: Option<f64>,
    /// Seconds at the start of each routing run left out of the figures [default: quick 6, full 10].
    #[arg(long)]
    warmup: Option<f64>,
    /// Skip vllm-router and sglang-router.
    #[arg(long)]
    no_peers: bool,
    /// Skip the routing comparison (overhead only).
    #[arg(long)]
    no_routing: bool,
    /// Skip the overhead runs (full mode).
    #[arg(long)]
    no_overhead: bool,
    /// Run the overhead runs in quick mode too.
    #[arg(long)]
    overhead: bool,
    /// Seed of every workload (repeat a comparison with another to see its spread).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Seconds per overhead case, and rounds of each.
    #[arg(long, default_value_t = 8.0)]
    overhead_secs: f64,
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Only these scenarios (comma-separated names).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Only these routers (comma-separated labels, e.g. envoy-round-robin,epp-best).
    #[arg(long, value_delimiter = ',')]
    routers: Vec<String>,
    /// Another epp configuration to compare, `name=path` (repeatable). A configuration that
    /// holds `${ENDPOINTS_FILE}` (llm-d's `file-discovery`, as `hack/bench/llmd-*.yaml`) gets
    /// llm-d's endpoints file, as llm-d-router does, and no endpoint flag.
    #[arg(long)]
    epp: Vec<String>,
    /// Run every epp router once per replica count, e.g. `1,3`: N active-active epp processes
    /// in Envoy's ext_proc cluster (labels `epp-<name>-x<N>`).
    #[arg(long, value_delimiter = ',')]
    epp_replicas: Vec<usize>,
    /// With `--epp-replicas`: run each multi-replica precise router a second time with the
    /// replicas sharing their speculative entries (labels `epp-<name>-x<N>-shared`).
    #[arg(long)]
    share_speculative: bool,
    /// Cross-check loadgen against inference-perf (default in full mode).
    #[arg(long)]
    crosscheck: bool,
    /// Hugging Face tokenizer directory for inference-perf (made by hack/bench.sh).
    #[arg(long, default_value = "target/bench/tokenizer-cl100k")]
    tokenizer: PathBuf,
    /// inference-sim timing profile and time scale.
    #[arg(long, default_value = "llmd-h100-8b")]
    profile: String,
    #[arg(long, default_value_t = 0.5)]
    time_scale: f64,
    /// Leave out the upstream EPPs (GIE's EPP, llm-d-router; hack/install-peers.sh).
    #[arg(long)]
    no_upstream: bool,
    /// Run the cost comparison (100 pods: idle CPU, CPU per request, peak RSS, decision
    /// latency of epp and each upstream EPP).
    #[arg(long)]
    cost: bool,
    /// Cost run: pods, seconds of idle, seconds per load, req/s of small chat, 10K and 100K prompts.
    #[arg(long, default_value_t = 100)]
    cost_pods: usize,
    #[arg(long, default_value_t = 30.0)]
    cost_idle_secs: f64,
    #[arg(long, default_value_t = 15.0)]
    cost_secs: f64,
    #[arg(long, value_delimiter = ',', default_value = "40,8,1")]
    cost_rates: Vec<f64>,
    /// Send the same requests (well-formed, bodyless, subset hints, bad inputs, a repeated long
    /// prompt) through epp and each upstream EPP and compare status, pod and error body.
    #[arg(long)]
    compat: bool,
    /// Cost run: the pods' time scale (fast, so the EPPs, not the simulated GPUs, are measured).
    #[arg(long, default_value_t = 10.0)]
    cost_time_scale: f64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let bins = Bins::beside_current_exe()?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let duration_s = args.duration.unwrap_or(match args.mode {
        Mode::Smoke => 2.0,
        Mode::Quick => 18.0,
        Mode::Full => 45.0,
    });
    let warmup_s = args.warmup.unwrap_or(match args.mode {
        Mode::Smoke => 0.0,
        Mode::Quick => 6.0,
        Mode::Full => 10.0,
    });
    let opts = PlanOptions {
        mode: args.mode,
        shared_prefix_rate: args.rate,
        random_rate: args.random_rate,
        duration_s,
        warmup_s,
        peers: !args.no_peers && args.mode != Mode::Smoke,
        profile: args.profile.clone(),
        time_scale: args.time_scale,
        epp_replicas: args.epp_replicas.clone(),
        share_speculative: args.share_speculative,
        upstream: !args.no_upstream && args.mode != Mode::Smoke,
        seed: args.seed,
        extra_epp: args
            .epp
            .iter()
            .filter_map(|e| e.split_once('='))
            .map(|(n, p)| (n.to_owned(), PathBuf::from(p)))
            .collect(),
    };
    let mut md = format!(
        "# bench {:?}, {}\n\nmachine load before: {}\n",
        args.mode,
        now(),
        uptime()
    );
    let mut results = Vec::new();
    if !args.no_routing {
        for mut s in scenarios(&opts)
            .into_iter()
            .filter(|s| args.only.is_empty() || args.only.contains(&s.name))
        {
            s.routers
                .retain(|r| args.routers.is_empty() || args.routers.contains(&r.label()));
            loadgen::bench::trace_replay::write_trace(&mut s, &opts, &args.out)?;
            results.extend(compare::run(&s, &bins, &args.out).await);
        }
        md.push_str(&report::tables(&results));
        md.push_str(&format!(
            "\n### targets\n\n{}",
            report::targets(&results, "epp-best")
        ));
        for p in report::plots(&results, &args.out) {
            md.push_str(&format!("\nplot: {p}"));
        }
    }
    if args.crosscheck || (args.mode == Mode::Full && args.only.is_empty()) {
        let secs = 30.0;
        let s = loadgen::bench::plan::crosscheck(&opts, secs);
        let tok = std::fs::canonicalize(&args.tokenizer).unwrap_or(args.tokenizer.clone());
        let rows = crosscheck::run(
            &s,
            &bins,
            &args.out.join("crosscheck"),
            &tok,
            opts.shared_prefix_rate / 2.0,
            secs as u64,
        )
        .await;
        md.push_str(&format!("\n\n### cross-check with inference-perf (shared prefix, epp-default, {} req/s, {secs} s)\n\n{}", opts.shared_prefix_rate / 2.0, crosscheck::table(&rows)));
    }
    let mut costs = Vec::new();
    if args.cost {
        let rates: [f64; 3] = match args.cost_rates.as_slice() {
            [a, b, c] => [*a, *b, *c],
            _ => anyhow::bail!("--cost-rates takes three rates: small, 10K, 100K"),
        };
        let copts = cost::CostOptions {
            pods: args.cost_pods,
            idle_secs: args.cost_idle_secs,
            shapes: cost::shapes(rates, args.cost_secs),
            time_scale: args.cost_time_scale,
        };
        let mut rs = loadgen::bench::plan::cost_routers();
        rs.retain(|r| args.routers.is_empty() || args.routers.contains(&r.label()));
        costs = cost::run(
            &rs,
            &copts,
            &bins,
            &args.out.join("cost"),
            loadgen::bench::plan::MODEL,
        )
        .await;
        md.push_str(&format!(
            "\n\n### cost ({} pods, idle {} s, then {} s per load at {:?} req/s)\n\nepp binary: `{}`\n\n{}",
            copts.pods,
            copts.idle_secs,
            args.cost_secs,
            rates,
            bins.epp.display(),
            cost::table(&costs, "epp-default")
        ));
    }
    let mut compat_results = Vec::new();
    if args.compat {
        use compat::Suite;
        let suites = [
            (
                Suite::Default,
                loadgen::bench::plan::cost_routers(),
                "epp-default",
                "compatibility (same requests, 4 pods; status, pod, error body)",
            ),
            (
                Suite::Lora,
                loadgen::bench::plan::lora_routers(),
                "epp-lora",
                "compatibility, LoRA (each EPP with its LoRA configuration)",
            ),
        ];
        for (suite, mut rs, ours, title) in suites {
            rs.retain(|r| args.routers.is_empty() || args.routers.contains(&r.label()));
            let dir = args.out.join("compat");
            let results = compat::run(&rs, &bins, &dir, loadgen::bench::plan::MODEL, suite).await;
            md.push_str(&format!(
                "\n\n### {title}\n\n{}",
                compat::table(&results, ours)
            ));
            compat_results.extend(results);
        }
    }
    let mut over = Vec::new();
    if !args.no_overhead && (args.mode == Mode::Full || args.overhead) {
        over = overhead::run(
            &bins,
            &args.out.join("overhead"),
            args.overhead_secs,
            args.rounds,
        )
        .await?;
        md.push_str(&format!("\n\n### overhead\n\n{}", overhead::table(&over)));
    }
    md.push_str(&format!("\nmachine load after: {}\n", uptime()));
    println!("{md}");
    std::fs::write(args.out.join("results.md"), &md)?;
    let json = serde_json::json!({"routing": results, "overhead": over, "cost": costs, "compat": compat_results, "options": format!("{args:?}")});
    std::fs::write(
        args.out.join("results.json"),
        serde_json::to_vec_pretty(&json)?,
    )?;
    Ok(())
}

fn uptime() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| {
            format!(
                "load average {}",
                s.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
            )
        })
        .unwrap_or_default()
}

fn now() -> String {
    std::process::Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

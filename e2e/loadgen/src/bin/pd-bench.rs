//! `pd-bench`: aggregated serving against prefill/decode disaggregation (issue 21) on
//! inference-sim pods, with llm-d's `prefix-based-pd-decider` at several thresholds and epp's
//! `cost-based-pd-decider`. Each run starts its own stack ([`harness::stack::pd`]): the
//! aggregated runs put epp's P/D guide profile (prefix 2 + queue 1, max-score) over all pods;
//! the P/D runs split the same pods into prefill and decode (decode pods behind llm-d's
//! `pd-sidecar` when `EPP_PD_SIDECAR` names its binary, else the stand-in). With `--llmd-epp`,
//! llm-d-router's own EPP runs the threshold configurations too (`llmd-pd-prefix-<t>`). Prints one markdown row per run and writes `results.md` / `results.json`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use harness::pd_sidecar::SidecarConfig;
use harness::stack::pd::{PdOptions, PdStack};
use inference_sim::EngineConfig;
use loadgen::{self, pods, summary, Load, RunConfig, Stage, Workload};

#[derive(Debug, Parser)]
#[command(name = "pd-bench", about)]
struct Args {
    #[arg(long, default_value = "target/pd-bench")]
    out: PathBuf,
    /// Pods in every arrangement (P/D: half prefill, half decode).
    #[arg(long, default_value_t = 4)]
    pods: usize,
    /// Data-parallel ranks per pod (`--data-parallel-size`): each rank an engine of its own,
    /// an endpoint of its own, served by the decode sidecar on its port + rank.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=8))]
    data_parallel: u16,
    /// Seconds of load per run, and the warm-up left out of the figures.
    #[arg(long, default_value_t = 30.0)]
    duration: f64,
    #[arg(long, default_value_t = 5.0)]
    warmup: f64,
    /// Offered load (requests/s) of the long-prompt, mixed and multi-turn workloads.
    #[arg(long, default_value_t = 3.0)]
    long_rate: f64,
    #[arg(long, default_value_t = 6.0)]
    mixed_rate: f64,
    #[arg(long, default_value_t = 6.0)]
    multiturn_rate: f64,
    /// `nonCachedTokens` thresholds of the prefix-based decider runs.
    #[arg(long, value_delimiter = ',', default_value = "16,512,2048")]
    thresholds: Vec<u32>,
    /// Only these workloads (long, mixed, multiturn).
    #[arg(long, value_delimiter = ',')]
    workloads: Vec<String>,
    /// Only these arrangements (aggregated, pd-prefix-<t>, pd-cost).
    #[arg(long, value_delimiter = ',')]
    arrangements: Vec<String>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// `interferenceWeight` of the cost-based decider runs (one run per value).
    #[arg(long, value_delimiter = ',', default_value = "0.25")]
    cost_interference: Vec<f64>,
    /// llm-d-router v0.10's EPP binary: adds `llmd-pd-prefix-<t>` runs, its own EPP in epp's
    /// place with the same configuration (side by side).
    #[arg(long)]
    llmd_epp: Option<PathBuf>,
}

/// One stack arrangement: its label, whether the pool is aggregated, the configuration, and
/// which picker runs it.
struct Arrangement {
    label: String,
    aggregated: bool,
    config: String,
    llmd_epp: Option<PathBuf>,
}

fn workloads(a: &Args) -> Vec<(&'static str, Workload, f64)> {
    vec![
        (
            "long",
            Workload::Random {
                input_len: 3000,
                output_len: 120,
            },
            a.long_rate,
        ),
        (
            "mixed",
            Workload::LongShortMix {
                short_len: 200,
                long_fraction: 0.25,
                long_min: 1500,
                long_max: 6000,
                output_len: 120,
            },
            a.mixed_rate,
        ),
        (
            "multiturn",
            Workload::MultiTurn {
                sessions: 12,
                turns: 6,
                system_len: 2000,
                question_len: 60,
                output_len: 80,
            },
            a.multiturn_rate,
        ),
    ]
}

fn arrangements(a: &Args) -> anyhow::Result<Vec<Arrangement>> {
    let epp = |label: String, aggregated: bool, config: String| Arrangement {
        label,
        aggregated,
        config,
        llmd_epp: None,
    };
    let root = harness::envoy::repo_root().join("config/examples");
    let pd = std::fs::read_to_string(root.join("llm-d-pd.yaml")).context("llm-d-pd.yaml")?;
    let cost =
        std::fs::read_to_string(root.join("pd-cost-based.yaml")).context("pd-cost-based.yaml")?;
    // Aggregated: the decode profile's scorers over every pod, no prefill stage.
    let aggregated = pd.replace("prefill: prefix-based-pd-decider", "{}");
    let mut out = vec![epp("aggregated".to_owned(), true, aggregated)];
    for t in &a.thresholds {
        let text = pd.replace("nonCachedTokens: 16", &format!("nonCachedTokens: {t}"));
        if let Some(bin) = &a.llmd_epp {
            out.push(Arrangement {
                label: format!("llmd-pd-prefix-{t}"),
                aggregated: false,
                config: text.clone(),
                llmd_epp: Some(bin.clone()),
            });
        }
        out.push(epp(format!("pd-prefix-{t}"), false, text));
    }
    const DEFAULT_WEIGHT: &str = "interferenceWeight: 0.25";
    anyhow::ensure!(
        cost.contains(DEFAULT_WEIGHT),
        "pd-cost-based.yaml no longer says {DEFAULT_WEIGHT:?}: --cost-interference cannot set it"
    );
    for w in &a.cost_interference {
        let text = cost.replace(DEFAULT_WEIGHT, &format!("interferenceWeight: {w}"));
        let label = if *w == 0.25 {
            "pd-cost".to_owned()
        } else {
            format!("pd-cost-{w}")
        };
        out.push(epp(label, false, text));
    }
    Ok(out)
}

async fn run_one(
    a: &Args,
    label: &str,
    arr: Arrangement,
    workload: &Workload,
    rate: f64,
) -> anyhow::Result<summary::Summary> {
    let aggregated = arr.aggregated;
    let decode = if aggregated { a.pods } else { a.pods / 2 };
    let opts = PdOptions {
        prefill: a.pods - decode,
        decode,
        aggregated,
        engine: EngineConfig {
            model: "m".into(),
            ..EngineConfig::default()
        },
        kv_bytes_per_token: 131_072.0,
        kv_bandwidth_gbps: 25.0,
        sidecar: SidecarConfig::new("127.0.0.1:1".parse()?),
        epp_config: arr.config,
        epp_args: vec!["--refresh-metrics-interval".into(), "50ms".into()],
        record_requests: false,
        data_parallel: a.data_parallel,
        llmd_epp: arr.llmd_epp,
    };
    let stack = PdStack::start(opts).await?;
    tokio::time::sleep(Duration::from_millis(500)).await; // first scrapes
    let pod_addrs = stack.cluster.addrs().to_vec();
    let before = pods::scrape_all(&pod_addrs).await;
    let cfg = RunConfig {
        target: stack.envoy.listener_addr(),
        workload: workload.clone(),
        load: Load::Open {
            stages: vec![Stage {
                rate,
                duration: Duration::from_secs_f64(a.duration),
            }],
            poisson: true,
        },
        max_requests: 100_000,
        max_duration: Duration::from_secs_f64(a.duration),
        drain: Duration::from_secs(20),
        seed: a.seed,
        model: "m".into(),
    };
    let records = loadgen::run(cfg).await;
    let after = pods::scrape_all(&pod_addrs).await;
    let delta = pods::delta(&after, &before);
    let ctx = summary::Context {
        label,
        workload,
        stage_rates: &[rate],
        pod_delta: &delta,
        block_size: 16,
        warmup_s: a.warmup,
    };
    let s = summary::summarize(&records, &ctx);
    let counts: Vec<_> = stack.sidecars.iter().map(|s| s.counts()).collect();
    let sum = |f: fn(&harness::pd_sidecar::SidecarCounts) -> u64| counts.iter().map(f).sum::<u64>();
    eprintln!(
        "{label}: sidecar {}: {} requests disaggregated, {} decode-only, {} prefill retries, {} prefill failures",
        stack.sidecar_kind(),
        sum(|c| c.disaggregated),
        sum(|c| c.decode_only),
        sum(|c| c.prefill_retries),
        sum(|c| c.prefill_failures),
    );
    stack.stop().await;
    Ok(s)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let a = Args::parse();
    std::fs::create_dir_all(&a.out)?;
    let keep = |only: &[String], l: &str| only.is_empty() || only.iter().any(|o| o == l);
    let mut md = String::new();
    let mut all = Vec::new();
    for (wname, workload, rate) in workloads(&a)
        .into_iter()
        .filter(|w| keep(&a.workloads, w.0))
    {
        md += &format!(
            "\n### {wname} ({rate} req/s)\n\n{}\n",
            loadgen::MARKDOWN_HEADER
        );
        println!(
            "\n### {wname} ({rate} req/s)\n\n{}",
            loadgen::MARKDOWN_HEADER
        );
        for arr in arrangements(&a)? {
            if !keep(&a.arrangements, &arr.label) {
                continue;
            }
            let full = format!("{wname}/{}", arr.label);
            let s = run_one(&a, &full, arr, &workload, rate).await?;
            println!("{}", s.markdown_row());
            md += &format!("{}\n", s.markdown_row());
            all.push(s);
        }
    }
    std::fs::write(a.out.join("results.md"), md)?;
    std::fs::write(
        a.out.join("results.json"),
        serde_json::to_string_pretty(&all)?,
    )?;
    Ok(())
}

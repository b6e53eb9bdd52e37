//! `bench-policies`: issue #7's balancing-policy benchmarks on the simulator, through a real
//! Envoy and epp, each policy on a fresh stack with the same seeded workload.
//!
//! - `mixed-fleet`: two fast pods (speed 2.0, weight 4) and two slow ones (speed 0.5, weight 1);
//!   plain round robin against weighted round robin and weighted least-request. Reported: each
//!   pod's share of the requests and its TTFT, and the overall TTFT / E2E.
//! - `bursty`: four equal pods, quiet stretches broken by short bursts far above the quiet rate;
//!   max-score (queue + KV scorers) against power-of-two-choices (same scorers) and round robin.
//!   Reported: TTFT and E2E tails.
//! - `shared-prefix`: four equal pods whose KV pool holds only a few of the groups' system
//!   prompts; round robin against consistent hashing with bounded loads (`config/examples/
//!   chwbl.yaml` with one endpoint per pick, no prefix index) and the default profile
//!   (approximate prefix index).
//!   Reported: prefix-cache hit rate (cached / prompt tokens from the responses' usage), TTFT and
//!   each pod's share.
//!
//! Pods use inference-sim's `llmd-h100-8b` timing (llm-d-inference-sim's: 12 ms step overhead,
//! 0.8 ms per running sequence, so latency grows with the batch) in real time; requests are 256
//! prompt tokens and 64 output tokens with no sharing.
//! Everything (pods, epp, loadgen) runs in this process except Envoy, on loopback; a run is
//! bounded by `--secs` of load plus a drain. Run: `cargo run --release -p loadgen --bin
//! bench-policies -- --scenario all` (EPP_ENVOY set, see `hack/install-envoy.sh`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use harness::envoy::{EnvoyConfig, Template};
use harness::stack::Epp;
use inference_sim::{Cluster, EngineConfig, PodConfig, Profile};
use loadgen::summary::Percentiles;
use loadgen::{self, Load, RequestRecord, RunConfig, Stage, Workload};
use tokio::net::TcpListener;

#[derive(Debug, Parser)]
#[command(name = "bench-policies", about)]
struct Args {
    /// `mixed-fleet`, `bursty`, `shared-prefix` or `all`.
    #[arg(long, default_value = "all")]
    scenario: String,
    /// Seconds of offered load per policy run.
    #[arg(long, default_value_t = 30.0)]
    secs: f64,
    /// Offered rate of the mixed-fleet run (requests/s).
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
    /// Quiet and burst rates of the bursty run (requests/s).
    #[arg(long, default_value_t = 8.0)]
    quiet_rate: f64,
    #[arg(long, default_value_t = 80.0)]
    burst_rate: f64,
    /// Simulated seconds per wall second.
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Bursty run's requests: `random` (256 prompt / 64 output tokens) or `long-short` (mostly
    /// 128-token prompts, 10% of 2,000-6,000 tokens; 64 output tokens).
    #[arg(long, default_value = "random")]
    bursty_workload: String,
    /// Offered rate of the shared-prefix run (requests/s).
    #[arg(long, default_value_t = 8.0)]
    prefix_rate: f64,
    /// KV blocks (16 tokens each) per pod in the shared-prefix run: 256 hold about three of
    /// the eight 1,024-token system prompts.
    #[arg(long, default_value_t = 256)]
    kv_blocks: usize,
    /// Where the endpoints files go.
    #[arg(long, default_value = "target/bench-policies")]
    out: PathBuf,
}

const RANDOM: Workload = Workload::Random {
    input_len: 256,
    output_len: 64,
};

/// One pod of a fleet: speed factor and the weight epp is told.
#[derive(Clone, Copy)]
struct PodSpec {
    speed: f64,
    weight: u32,
    /// KV pool size; `None` keeps the engine's default.
    kv_blocks: Option<usize>,
}

fn config(plugins: &[&str]) -> String {
    let mut text = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n".to_owned();
    for p in plugins {
        text.push_str(&format!("- type: {p}\n"));
    }
    text
}

/// Starts pods + epp + Envoy, runs the load, stops everything; returns the records and the
/// pods' addresses (index = pod).
async fn run_policy(
    args: &Args,
    label: &str,
    fleet: &[PodSpec],
    epp_config: &str,
    load: Load,
    workload: Workload,
) -> anyhow::Result<(Vec<RequestRecord>, Vec<String>)> {
    let mut listeners = Vec::new();
    let mut configs = Vec::new();
    for (i, p) in fleet.iter().enumerate() {
        listeners.push(TcpListener::bind("127.0.0.1:0").await?);
        let timing = Profile::LlmdH100Llama8b.timing();
        let mut engine = EngineConfig {
            speed: p.speed,
            time_scale: args.time_scale,
            timing,
            ..EngineConfig::default()
        };
        engine.num_gpu_blocks = p.kv_blocks.unwrap_or(engine.num_gpu_blocks);
        configs.push(PodConfig {
            engine,
            pod_name: format!("pod-{i}"),
            seed: args.seed + i as u64,
            prompt_tokens_details: true,
            ..Default::default()
        });
    }
    let cluster = Cluster::start_on(configs, listeners).await?;
    let addrs = cluster.addrs().to_vec();
    std::fs::create_dir_all(&args.out)?;
    let file = args.out.join(format!("endpoints-{label}.yaml"));
    let yaml: String = addrs
        .iter()
        .zip(fleet)
        .enumerate()
        .map(|(i, (a, p))| {
            format!(
                "- {{address: {}, port: {}, name: pod-{i}, weight: {}}}\n",
                a.ip(),
                a.port(),
                p.weight
            )
        })
        .collect();
    std::fs::write(&file, yaml).with_context(|| format!("writing {}", file.display()))?;
    let flags = [
        "--static-endpoints-file",
        &file.display().to_string(),
        "--config-text",
        epp_config,
        "--secure-serving",
        "false",
    ]
    .map(str::to_owned);
    let epp = Epp::start(&flags).await?;
    let envoy = EnvoyConfig::new(Template::Duplex)
        .epp(epp.grpc)
        .pool(addrs.iter().copied())
        .start()
        .await?;
    let secs = Duration::from_secs_f64(args.secs);
    let cfg = RunConfig {
        target: envoy.listener_addr(),
        workload,
        load,
        max_requests: 100_000,
        max_duration: secs,
        drain: Duration::from_secs(20),
        seed: args.seed,
        model: EngineConfig::default().model,
    };
    let records = loadgen::run(cfg).await;
    if let Some(r) = records.iter().find(|r| !r.ok()) {
        eprintln!(
            "{label}: first failure: status {} {}",
            r.status,
            r.error.as_deref().unwrap_or("")
        );
    }
    drop(envoy);
    epp.stop().await;
    cluster.shutdown().await;
    Ok((records, addrs.iter().map(ToString::to_string).collect()))
}

fn ttft(records: &[&RequestRecord]) -> Percentiles {
    Percentiles::of(records.iter().filter_map(|r| r.ttft_ms).collect())
}

/// One markdown row: overall figures then each pod's share and TTFT p50.
fn row(label: &str, records: &[RequestRecord], pods: usize) -> String {
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok()).collect();
    let t = ttft(&ok);
    let e2e = Percentiles::of(ok.iter().map(|r| r.e2e_ms).collect());
    let mut per_pod: BTreeMap<String, Vec<&RequestRecord>> = BTreeMap::new();
    for r in &ok {
        per_pod
            .entry(r.pod.clone().unwrap_or_default())
            .or_default()
            .push(r);
    }
    let cells: Vec<String> = (0..pods)
        .map(|i| {
            let rs = per_pod
                .get(&format!("pod-{i}"))
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            format!(
                "{:.0}% / {:.0}",
                100.0 * rs.len() as f64 / ok.len().max(1) as f64,
                ttft(rs).p50
            )
        })
        .collect();
    format!(
        "| {label} | {} | {} | {:.0} / {:.0} / {:.0} | {:.0} / {:.0} | {} |",
        records.len(),
        records.len() - ok.len(),
        t.p50,
        t.p90,
        t.p99,
        e2e.p50,
        e2e.p99,
        cells.join(" | ")
    )
}

async fn mixed_fleet(args: &Args) -> anyhow::Result<()> {
    let fleet = [
        PodSpec {
            speed: 2.0,
            weight: 4,
            kv_blocks: None,
        },
        PodSpec {
            speed: 2.0,
            weight: 4,
            kv_blocks: None,
        },
        PodSpec {
            speed: 0.5,
            weight: 1,
            kv_blocks: None,
        },
        PodSpec {
            speed: 0.5,
            weight: 1,
            kv_blocks: None,
        },
    ];
    println!("\n### mixed fleet: pods 0-1 speed 2.0 weight 4, pods 2-3 speed 0.5 weight 1; Poisson {} req/s for {} s\n", args.rate, args.secs);
    println!("| policy | requests | errors | TTFT p50 / p90 / p99 (ms) | E2E p50 / p99 (ms) | pod-0 share / TTFT p50 | pod-1 | pod-2 (slow) | pod-3 (slow) |\n|---|---:|---:|---|---|---|---|---|---|");
    for (label, picker) in [
        ("round-robin", "round-robin-picker"),
        ("weighted-round-robin", "weighted-round-robin-picker"),
        ("weighted-least-request", "weighted-least-request-picker"),
    ] {
        let load = Load::Open {
            stages: vec![Stage {
                rate: args.rate,
                duration: Duration::from_secs_f64(args.secs),
            }],
            poisson: true,
        };
        let (records, _) =
            run_policy(args, label, &fleet, &config(&[picker]), load, RANDOM).await?;
        println!("{}", row(label, &records, fleet.len()));
    }
    Ok(())
}

async fn bursty(args: &Args) -> anyhow::Result<()> {
    let fleet = [PodSpec {
        speed: 1.0,
        weight: 1,
        kv_blocks: None,
    }; 4];
    let quiet = Stage {
        rate: args.quiet_rate,
        duration: Duration::from_secs(4),
    };
    let burst = Stage {
        rate: args.burst_rate,
        duration: Duration::from_secs(1),
    };
    let cycles = (args.secs / 5.0).ceil().max(1.0) as usize;
    let workload = match args.bursty_workload.as_str() {
        "random" => RANDOM,
        "long-short" => Workload::LongShortMix {
            short_len: 128,
            long_fraction: 0.1,
            long_min: 2000,
            long_max: 6000,
            output_len: 64,
        },
        other => anyhow::bail!("unknown --bursty-workload {other:?}: random or long-short"),
    };
    let stages: Vec<Stage> = (0..cycles)
        .flat_map(|_| [quiet.clone(), burst.clone()])
        .collect();
    println!("\n### bursty: 4 equal pods; {cycles} cycles of 4 s at {} req/s then 1 s at {} req/s (Poisson), {} requests\n", args.quiet_rate, args.burst_rate, args.bursty_workload);
    println!("| policy | requests | errors | TTFT p50 / p90 / p99 (ms) | E2E p50 / p99 (ms) | pod-0 share / TTFT p50 | pod-1 | pod-2 | pod-3 |\n|---|---:|---:|---|---|---|---|---|---|");
    let scorers = ["queue-scorer", "kv-cache-utilization-scorer"];
    for (label, picker) in [
        ("max-score", "max-score-picker"),
        ("power-of-two-choices", "power-of-two-choices-picker"),
        ("round-robin", "round-robin-picker"),
    ] {
        let plugins: Vec<&str> = if picker == "round-robin-picker" {
            vec![picker]
        } else {
            scorers.iter().copied().chain([picker]).collect()
        };
        let load = Load::Open {
            stages: stages.clone(),
            poisson: true,
        };
        let (records, _) = run_policy(
            args,
            label,
            &fleet,
            &config(&plugins),
            load,
            workload.clone(),
        )
        .await?;
        println!("{}", row(label, &records, fleet.len()));
    }
    Ok(())
}

/// Prefix-cache hit rate (cached / prompt tokens, from the responses' usage), TTFT and each
/// pod's share of the requests; `spread` is the busiest pod's share over the idlest one's.
fn prefix_row(label: &str, records: &[RequestRecord], pods: usize) -> String {
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok()).collect();
    let t = ttft(&ok);
    let prompt: u64 = ok.iter().filter_map(|r| r.prompt_tokens).sum();
    let cached: u64 = ok.iter().filter_map(|r| r.cached_tokens).sum();
    let counts: Vec<usize> = (0..pods)
        .map(|i| {
            ok.iter()
                .filter(|r| r.pod.as_deref() == Some(&format!("pod-{i}")))
                .count()
        })
        .collect();
    let shares: Vec<String> = counts
        .iter()
        .map(|c| format!("{:.0}%", 100.0 * *c as f64 / ok.len().max(1) as f64))
        .collect();
    let (max, min) = (
        counts.iter().max().copied().unwrap_or(0),
        counts.iter().min().copied().unwrap_or(0),
    );
    let spread = if min == 0 {
        "∞".to_owned()
    } else {
        format!("{:.2}", max as f64 / min as f64)
    };
    format!(
        "| {label} | {} | {} | {:.1}% | {:.0} / {:.0} / {:.0} | {} | {spread} |",
        records.len(),
        records.len() - ok.len(),
        100.0 * cached as f64 / prompt.max(1) as f64,
        t.p50,
        t.p90,
        t.p99,
        shares.join(" / ")
    )
}

async fn shared_prefix(args: &Args) -> anyhow::Result<()> {
    let fleet = [PodSpec {
        speed: 1.0,
        weight: 1,
        kv_blocks: Some(args.kv_blocks),
    }; 4];
    let workload = Workload::SharedPrefix {
        groups: 8,
        prompts_per_group: 16,
        system_len: 1024,
        question_len: 32,
        output_len: 16,
    };
    println!(
        "\n### shared prefix: 4 equal pods with {} KV blocks each; 8 groups of 1,024-token system prompts + 32-token questions, 16 output tokens; Poisson {} req/s for {} s\n",
        args.kv_blocks, args.prefix_rate, args.secs
    );
    println!("| policy | requests | errors | prefix hit rate | TTFT p50 / p90 / p99 (ms) | share pod-0 / 1 / 2 / 3 | spread (max/min) |\n|---|---:|---:|---:|---|---|---:|");
    // config/examples/chwbl.yaml with one endpoint: its `maxNumOfEndpoints: 2` fallback list is
    // for a gateway that retries over it; this Envoy (ORIGINAL_DST) answers it 503.
    let chwbl = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: approx-prefix-cache-producer\n  parameters: {blockSizeTokens: 16, autoTune: false}\n- type: consistent-hash-picker\n  parameters: {loadFactor: 1.25, virtualNodes: 100, maxNumOfEndpoints: 1}\n";
    let default = include_str!("../../../../config/examples/upstream-default.yaml");
    for (label, cfg) in [
        ("round-robin", config(&["round-robin-picker"])),
        ("chwbl", chwbl.to_owned()),
        ("default (prefix index)", default.to_owned()),
    ] {
        let load = Load::Open {
            stages: vec![Stage {
                rate: args.prefix_rate,
                duration: Duration::from_secs_f64(args.secs),
            }],
            poisson: true,
        };
        let (records, _) = run_policy(
            args,
            label.split(' ').next().unwrap_or(label),
            &fleet,
            &cfg,
            load,
            workload.clone(),
        )
        .await?;
        println!("{}", prefix_row(label, &records, fleet.len()));
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match args.scenario.as_str() {
        "mixed-fleet" => mixed_fleet(&args).await,
        "bursty" => bursty(&args).await,
        "shared-prefix" => shared_prefix(&args).await,
        "all" => {
            mixed_fleet(&args).await?;
            bursty(&args).await?;
            shared_prefix(&args).await
        }
        other => {
            anyhow::bail!("unknown scenario {other:?}: mixed-fleet, bursty, shared-prefix or all")
        }
    }
}

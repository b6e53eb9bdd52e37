//! `soak`: epp under mixed load for a long time while its pods churn, watching for leaks.
//!
//! Stack: inference-sim pods, epp in this process (`--static-endpoints-file`, re-read when it
//! changes) and a real Envoy. Load: three open-loop workloads at once (shared-prefix,
//! long/short mix, multi-turn chat), sent in one-minute rounds so the load generator's own
//! records never accumulate. Churn: every `--churn-seconds` one pod leaves the endpoints file,
//! is stopped once epp has stopped picking it, restarted and added back; no request may fail
//! (none is injected). Every `--sample-seconds`, the process's RSS and open file descriptors
//! (/proc/self: epp, the pods and the load generator share it; Envoy does not) and epp's
//! `/debug/snapshot` are sampled. The verdict: RSS and fds flat after warm-up, zero errors.
//!
//! usage: soak [--minutes 30] [--rate 12] [--pods 4]   (EPP_ENVOY names the Envoy binary)

use anyhow::Context;
use clap::Parser;
use harness::envoy::{EnvoyConfig, Template};
use harness::stack::Epp;
use inference_sim::{Cluster, EngineConfig, PodConfig};
use loadgen::run::{run, RunConfig};
use loadgen::schedule::{Load, Stage};
use loadgen::workload::Workload;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(
    name = "soak",
    about = "epp under mixed load with churning pods; RSS, fds and errors over time"
)]
struct Args {
    /// How long to run.
    #[arg(long, default_value_t = 30.0)]
    minutes: f64,
    /// Total offered load, requests per second (split over three workloads).
    #[arg(long, default_value_t = 12.0)]
    rate: f64,
    /// Simulated pods (one at a time is out of the pool while it churns).
    #[arg(long, default_value_t = 4)]
    pods: usize,
    /// Seconds between samples.
    #[arg(long, default_value_t = 10)]
    sample_seconds: u64,
    /// Seconds between pod churn events.
    #[arg(long, default_value_t = 30)]
    churn_seconds: u64,
    /// Allowed RSS growth after warm-up, MiB.
    #[arg(long, default_value_t = 32.0)]
    rss_slack_mib: f64,
}

/// Totals shared by the load rounds and the sampler.
#[derive(Default)]
struct Counters {
    ok: AtomicU64,
    errors: AtomicU64,
    churns: AtomicU64,
}

struct Sample {
    at: Duration,
    rss_mib: f64,
    fds: usize,
    ok: u64,
    errors: u64,
    endpoints: usize,
    inflight: u64,
    index_blocks: u64,
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok());
    kb.unwrap_or(0.0) / 1024.0
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

fn endpoints_yaml(addrs: &[(usize, SocketAddr)]) -> String {
    addrs
        .iter()
        .map(|(i, a)| {
            format!(
                "- address: {}\n  port: {}\n  name: sim-{i}\n",
                a.ip(),
                a.port()
            )
        })
        .collect()
}

fn write_endpoints(path: &Path, addrs: &[(usize, SocketAddr)]) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, endpoints_yaml(addrs))?;
    std::fs::rename(&tmp, path).context("replacing the endpoints file")
}

/// One minute-long round of the three workloads; adds their outcomes to `counters`.
async fn load_round(target: SocketAddr, rate: f64, round: u64, seconds: f64, counters: &Counters) {
    let workloads = [
        Workload::SharedPrefix {
            groups: 8,
            prompts_per_group: 16,
            system_len: 600,
            question_len: 40,
            output_len: 16,
        },
        Workload::LongShortMix {
            short_len: 60,
            long_fraction: 0.1,
            long_min: 1500,
            long_max: 6000,
            output_len: 8,
        },
        Workload::MultiTurn {
            sessions: 6,
            turns: 5,
            system_len: 200,
            question_len: 30,
            output_len: 12,
        },
    ];
    let mut set = JoinSet::new();
    for (k, workload) in workloads.into_iter().enumerate() {
        let duration = Duration::from_secs_f64(seconds);
        let load = Load::Open {
            stages: vec![Stage {
                rate: rate / 3.0,
                duration,
            }],
            poisson: true,
        };
        let cfg = RunConfig {
            target,
            workload,
            load,
            max_requests: 100_000,
            max_duration: duration,
            drain: Duration::from_secs(30),
            seed: round * 3 + k as u64,
            model: "soak-model".into(),
        };
        set.spawn(run(cfg));
    }
    while let Some(done) = set.join_next().await {
        for r in done.unwrap_or_default() {
            if r.ok() {
                counters.ok.fetch_add(1, Ordering::Relaxed);
            } else {
                counters.errors.fetch_add(1, Ordering::Relaxed);
                eprintln!("request error: status {} {:?}", r.status, r.error);
            }
        }
    }
}

async fn load_loop(target: SocketAddr, rate: f64, until: Instant, counters: Arc<Counters>) {
    let mut round = 0;
    loop {
        let left = until
            .saturating_duration_since(Instant::now())
            .as_secs_f64();
        if left < 1.0 {
            return;
        }
        load_round(target, rate, round, left.min(60.0), &counters).await;
        round += 1;
    }
}

/// Takes pods out of the pool and back, one at a time, until `stop`.
async fn churn_loop(
    cluster: Arc<Cluster>,
    file: PathBuf,
    every: Duration,
    counters: Arc<Counters>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let all: Vec<(usize, SocketAddr)> = cluster.addrs().iter().copied().enumerate().collect();
    let mut victim = 0;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = tokio::time::sleep(every) => {}
        }
        let rest: Vec<(usize, SocketAddr)> =
            all.iter().copied().filter(|(i, _)| *i != victim).collect();
        write_endpoints(&file, &rest)?;
        // epp re-reads the file within a second; requests already on the pod finish.
        tokio::time::sleep(Duration::from_secs(8)).await;
        cluster.kill(victim).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        cluster.restart(victim).await?;
        write_endpoints(&file, &all)?;
        counters.churns.fetch_add(1, Ordering::Relaxed);
        victim = (victim + 1) % all.len();
    }
}

async fn sample(epp: &Epp, started: Instant, counters: &Counters) -> Sample {
    let snap = match harness::client::get(epp.metrics, "/debug/snapshot").await {
        Ok(r) => r.json().unwrap_or_default(),
        Err(_) => serde_json::Value::Null,
    };
    Sample {
        at: started.elapsed(),
        rss_mib: rss_mib(),
        fds: open_fds(),
        ok: counters.ok.load(Ordering::Relaxed),
        errors: counters.errors.load(Ordering::Relaxed),
        endpoints: snap["endpoints"].as_array().map_or(0, Vec::len),
        inflight: snap["inflight_total"].as_u64().unwrap_or(0),
        index_blocks: snap["prefix_index"]["approximate_blocks"]
            .as_u64()
            .unwrap_or(0),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Flat means: the last third's median RSS within `slack` MiB of the median right after
/// warm-up (the second sixth), and fds back within 32 of their warm-up peak.
fn verdict(samples: &[Sample], slack: f64, churns: u64) -> (bool, String) {
    let n = samples.len();
    if n < 6 {
        return (false, format!("too few samples ({n}) to judge"));
    }
    let warm = median(samples[n / 6..n / 3].iter().map(|s| s.rss_mib).collect());
    let late = median(samples[n * 2 / 3..].iter().map(|s| s.rss_mib).collect());
    let fd_warm = samples[n / 6..n / 3]
        .iter()
        .map(|s| s.fds)
        .max()
        .unwrap_or(0);
    let fd_late = samples[n * 2 / 3..]
        .iter()
        .map(|s| s.fds)
        .max()
        .unwrap_or(0);
    let last = &samples[n - 1];
    let rss_ok = late - warm <= slack;
    let fd_ok = fd_late <= fd_warm + 32;
    let ok = rss_ok && fd_ok && last.errors == 0 && last.ok > 0 && churns > 0;
    let text = format!(
        "RSS warm-up median {warm:.1} MiB, last-third median {late:.1} MiB ({:+.1} MiB, slack {slack}) {}; fds warm-up max {fd_warm}, last-third max {fd_late} {}; {} requests ok, {} errors; {churns} churn events",
        late - warm,
        if rss_ok { "flat" } else { "GROWING" },
        if fd_ok { "flat" } else { "GROWING" },
        last.ok,
        last.errors
    );
    (ok, text)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = std::env::temp_dir().join(format!("epp-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("endpoints.yaml");
    let engine = EngineConfig {
        model: "soak-model".into(),
        time_scale: 10.0,
        ..EngineConfig::default()
    };
    let configs: Vec<PodConfig> = (0..args.pods)
        .map(|i| PodConfig {
            engine: engine.clone(),
            pod_name: format!("sim-{i}"),
            seed: i as u64,
            prompt_tokens_details: true,
            ..Default::default()
        })
        .collect();
    let mut listeners = Vec::new();
    for _ in 0..args.pods {
        listeners.push(tokio::net::TcpListener::bind("127.0.0.1:0").await?);
    }
    let cluster = Arc::new(Cluster::start_on(configs, listeners).await?);
    let all: Vec<(usize, SocketAddr)> = cluster.addrs().iter().copied().enumerate().collect();
    write_endpoints(&file, &all)?;
    let flags = [
        "--static-endpoints-file",
        file.to_str().context("temp path")?,
        "--secure-serving",
        "false",
        "--refresh-metrics-interval",
        "50ms",
    ];
    let epp = Epp::start(&flags.map(String::from)).await?;
    let envoy = EnvoyConfig::new(Template::Duplex)
        .epp(epp.grpc)
        .pool(cluster.addrs().iter().copied())
        .start()
        .await?;
    let result = soak(&args, &epp, envoy.listener_addr(), &cluster, &file).await;
    drop(envoy);
    epp.stop().await;
    cluster.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
    let (ok, text) = result?;
    println!("\nverdict: {} — {text}", if ok { "PASS" } else { "FAIL" });
    anyhow::ensure!(ok, "soak failed");
    Ok(())
}

async fn soak(
    args: &Args,
    epp: &Epp,
    gateway: SocketAddr,
    cluster: &Arc<Cluster>,
    file: &Path,
) -> anyhow::Result<(bool, String)> {
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(args.minutes * 60.0);
    let counters = Arc::new(Counters::default());
    let stop = CancellationToken::new();
    let mut tasks = JoinSet::new();
    tasks.spawn(churn_loop(
        Arc::clone(cluster),
        file.to_owned(),
        Duration::from_secs(args.churn_seconds),
        Arc::clone(&counters),
        stop.clone(),
    ));
    let load = load_loop(gateway, args.rate, until, Arc::clone(&counters));
    tokio::pin!(load);
    println!(
        "{:>7} {:>9} {:>6} {:>9} {:>7} {:>10} {:>9} {:>12}",
        "t (s)", "RSS MiB", "fds", "ok", "errors", "endpoints", "inflight", "index blocks"
    );
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs(args.sample_seconds));
    loop {
        tokio::select! {
            _ = &mut load => break,
            _ = tick.tick() => {
                let s = sample(epp, started, &counters).await;
                println!("{:>7.0} {:>9.1} {:>6} {:>9} {:>7} {:>10} {:>9} {:>12}", s.at.as_secs_f64(), s.rss_mib, s.fds, s.ok, s.errors, s.endpoints, s.inflight, s.index_blocks);
                samples.push(s);
            }
        }
    }
    stop.cancel();
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let last = sample(epp, started, &counters).await;
    println!(
        "{:>7.0} {:>9.1} {:>6} {:>9} {:>7} {:>10} {:>9} {:>12}  (end)",
        last.at.as_secs_f64(),
        last.rss_mib,
        last.fds,
        last.ok,
        last.errors,
        last.endpoints,
        last.inflight,
        last.index_blocks
    );
    anyhow::ensure!(
        last.inflight == 0,
        "{} requests still counted in flight after the load ended",
        last.inflight
    );
    samples.push(last);
    Ok(verdict(
        &samples,
        args.rss_slack_mib,
        counters.churns.load(Ordering::Relaxed),
    ))
}

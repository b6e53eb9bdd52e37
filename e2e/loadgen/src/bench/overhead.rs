//! What epp costs in Envoy's path (method of envoy-ext-proc.md §9): the same closed-loop load
//! through Envoy alone (STATIC cluster, round robin), Envoy + the do-nothing ext_proc server and
//! Envoy + epp, in front of cheap model servers (`inference-sim` pods a million times faster
//! than real time: one output token, no model time, real tokenization and prefix hashing), for
//! a small request and for a 220 KB prompt. Reported: requests/s, latency
//! percentiles and CPU µs per request of each process, from `/proc/<pid>/stat`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::compare::{read_report, run_loadgen};
use super::procs::{cpu_time, free_port_range, wait_http_ok, Proc};
use super::routers::{self, Bins, Router};
use super::BenchError;

/// One request shape of the overhead runs.
#[derive(Clone, Debug, Serialize)]
pub struct Shape {
    pub name: String,
    /// Prompt tokens (one-token words: ≈ 5 bytes each).
    pub input_tokens: usize,
    pub concurrency: usize,
}

/// The two shapes of the issue: a small request and a ≈ 220 KB prompt.
pub fn shapes() -> Vec<Shape> {
    vec![
        Shape {
            name: "small".into(),
            input_tokens: 20,
            concurrency: 16,
        },
        Shape {
            name: "220KB".into(),
            input_tokens: 44_000,
            concurrency: 4,
        },
    ]
}

/// One measured case.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct OverheadResult {
    pub shape: String,
    pub path: String,
    pub round: usize,
    pub requests: usize,
    pub error_rate: f64,
    pub rps: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    /// CPU µs per request: envoy, epp / noop-extproc, backends.
    pub cpu_us: BTreeMap<String, f64>,
    pub error: Option<String>,
}

/// The three paths, in table order.
pub fn paths() -> Vec<Router> {
    let default = harness::envoy::repo_root()
        .join("hack")
        .join("bench")
        .join("epp-default.yaml");
    vec![
        Router::EnvoyRoundRobin,
        Router::EnvoyNoopExtProc,
        Router::Epp {
            name: "default".into(),
            config: default,
            replicas: 1,
        },
    ]
}

/// Runs every shape × path × round for `secs` seconds each.
pub async fn run(
    bins: &Bins,
    dir: &Path,
    secs: f64,
    rounds: usize,
) -> Result<Vec<OverheadResult>, BenchError> {
    std::fs::create_dir_all(dir).map_err(BenchError::io(format!("creating {}", dir.display())))?;
    let backends = Backends::start(bins, dir, 4).await?;
    let mut out = Vec::new();
    for shape in shapes() {
        for round in 1..=rounds {
            for path in paths() {
                let label = format!("{}-{}-{round}", shape.name, path.label());
                eprintln!("[bench] overhead: {label}");
                let cdir = dir.join(&label);
                std::fs::create_dir_all(&cdir)
                    .map_err(BenchError::io(format!("creating {}", cdir.display())))?;
                let r = case(bins, &backends, &path, &shape, secs, &cdir).await;
                let mut r = r.unwrap_or_else(|e| OverheadResult {
                    error: Some(e.to_string()),
                    ..OverheadResult::default()
                });
                (r.shape, r.path, r.round) = (shape.name.clone(), path.label(), round);
                out.push(r);
            }
        }
    }
    Ok(out)
}

/// The model servers: inference-sim pods in one process, with the context for the 220 KB shape
/// and a time scale that makes model time negligible.
struct Backends {
    proc_: Proc,
    addrs: Vec<SocketAddr>,
}

impl Backends {
    async fn start(bins: &Bins, dir: &Path, n: usize) -> Result<Self, BenchError> {
        let base = free_port_range(n)?;
        let args: Vec<String> = [
            "--pods",
            &n.to_string(),
            "--base-port",
            &base.to_string(),
            "--model",
            super::plan::MODEL,
            "--max-model-len",
            "65536",
            "--time-scale",
            "1000000",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let mut proc_ = Proc::spawn("inference-sim", &bins.inference_sim, &args, dir)?;
        let addrs: Vec<SocketAddr> = (0..n as u16)
            .map(|i| SocketAddr::from(([127, 0, 0, 1], base + i)))
            .collect();
        for a in &addrs {
            wait_http_ok(&mut proc_, *a, "/metrics", Duration::from_secs(10)).await?;
        }
        Ok(Self { proc_, addrs })
    }
}

async fn case(
    bins: &Bins,
    be: &Backends,
    path: &Router,
    shape: &Shape,
    secs: f64,
    dir: &Path,
) -> Result<OverheadResult, BenchError> {
    let running = routers::start(path, &be.addrs, &[], None, bins, dir, super::plan::MODEL).await?;
    let mut pids = running.pids();
    pids.push(("backends".into(), be.proc_.pid()));
    let before: Vec<Duration> = pids
        .iter()
        .map(|(_, p)| cpu_time(*p).unwrap_or_default())
        .collect();
    let report_path = dir.join("report.json");
    let args: Vec<String> = [
        "--target",
        &running.target.to_string(),
        "--workload",
        "random",
        "--input-len",
        &shape.input_tokens.to_string(),
        "--output-len",
        "1",
        "--concurrency",
        &shape.concurrency.to_string(),
        "--duration-secs",
        &secs.to_string(),
        "--drain-secs",
        "10",
        "--model",
        super::plan::MODEL,
        "--label",
        &path.label(),
        "--out",
        &report_path.display().to_string(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    run_loadgen(&bins.loadgen, args, dir).await?;
    let rep = read_report(&report_path)?;
    let n = rep.summary.ok.max(1) as f64;
    let cpu: BTreeMap<String, f64> = pids
        .iter()
        .zip(before)
        .map(|((name, pid), b)| {
            (
                name.clone(),
                cpu_time(*pid)
                    .unwrap_or_default()
                    .saturating_sub(b)
                    .as_secs_f64()
                    * 1e6
                    / n,
            )
        })
        .collect();
    let s = rep.summary;
    Ok(OverheadResult {
        requests: s.requests,
        error_rate: s.error_rate,
        rps: s.throughput_rps,
        p50_ms: s.e2e_ms.p50,
        p90_ms: s.e2e_ms.p90,
        p99_ms: s.e2e_ms.p99,
        cpu_us: cpu,
        ..OverheadResult::default()
    })
}

/// The overhead table: one row per shape × path × round.
pub fn table(results: &[OverheadResult]) -> String {
    let mut out = String::from("| request | path | round | requests | errors | req/s | p50 / p90 / p99 (ms) | CPU µs/req |\n|---|---|---:|---:|---:|---:|---|---|\n");
    for r in results {
        let cpu: Vec<String> = r
            .cpu_us
            .iter()
            .map(|(k, v)| format!("{k} {v:.0}"))
            .collect();
        let line = match &r.error {
            Some(e) => format!(
                "| {} | {} | {} | failed: {} |||||\n",
                r.shape,
                r.path,
                r.round,
                e.lines().next().unwrap_or("")
            ),
            None => format!(
                "| {} | {} | {} | {} | {:.1}% | {:.0} | {:.2} / {:.2} / {:.2} | {} |\n",
                r.shape,
                r.path,
                r.round,
                r.requests,
                r.error_rate * 100.0,
                r.rps,
                r.p50_ms,
                r.p90_ms,
                r.p99_ms,
                cpu.join(", ")
            ),
        };
        out.push_str(&line);
    }
    out
}

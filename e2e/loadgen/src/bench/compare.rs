//! One comparison: the same seeded workload through each router in turn, each on a freshly
//! started simulated cluster. The load generator runs as its own process (`loadgen`), so its
//! CPU is not charged to any router, and the routers' CPU is read from `/proc` around the run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use super::cluster::{SimCluster, SimOptions};
use super::procs::{cpu_time, free_ports};
use super::routers::{self, Bins, Router};
use super::BenchError;
use crate::{Report, Summary};

/// A workload to compare the routers on.
#[derive(Clone, Debug, Serialize)]
pub struct Scenario {
    pub name: String,
    pub sim: SimOptions,
    /// `loadgen` flags for the workload and the load (everything but target, pods, label, out).
    pub loadgen_args: Vec<String>,
    pub routers: Vec<Router>,
    pub model: String,
}

/// What one router did on one scenario.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RouterResult {
    pub scenario: String,
    pub router: String,
    pub summary: Option<Summary>,
    /// Why there is no summary.
    pub error: Option<String>,
    /// CPU µs per finished request of each router process (envoy, epp, ...) and of the pods.
    pub cpu_us_per_request: BTreeMap<String, f64>,
    /// The loadgen JSON report (every request).
    pub report: Option<PathBuf>,
}

/// Runs every router of `scenario`; a router that cannot start is recorded, not fatal.
pub async fn run(scenario: &Scenario, bins: &Bins, dir: &Path) -> Vec<RouterResult> {
    let mut out = Vec::new();
    for router in &scenario.routers {
        let label = router.label();
        eprintln!("[bench] {}: {label}", scenario.name);
        let rdir = dir.join(&scenario.name).join(&label);
        let result = match std::fs::create_dir_all(&rdir) {
            Ok(()) => one(scenario, router, bins, &rdir).await,
            Err(e) => Err(BenchError::io(format!("creating {}", rdir.display()))(e)),
        };
        let r = result.unwrap_or_else(|e| RouterResult {
            error: Some(e.to_string()),
            ..RouterResult::default()
        });
        if let Some(e) = &r.error {
            eprintln!("[bench]   failed: {e}");
        }
        out.push(RouterResult {
            scenario: scenario.name.clone(),
            router: label,
            ..r
        });
    }
    out
}

async fn one(
    scenario: &Scenario,
    router: &Router,
    bins: &Bins,
    dir: &Path,
) -> Result<RouterResult, BenchError> {
    // A router that binds the KV-event SUB socket gets a port of its own for this run; the pods
    // (started fresh for each router, before it) are told to publish there.
    let kv_events_sub = if router.binds_kv_events() {
        Some(free_ports(1)?[0])
    } else {
        None
    };
    let sim = SimOptions {
        kv_events: router.needs_kv_events(),
        host_per_pod: scenario.sim.host_per_pod || router.needs_host_per_pod(),
        kv_events_sub,
        ..scenario.sim.clone()
    };
    let cluster = SimCluster::start(&bins.inference_sim, &sim, dir).await?;
    let running = routers::start_on(router, &cluster, bins, dir, &scenario.model).await?;
    let mut pids = running.pids();
    pids.push(("pods".into(), cluster.proc_.pid()));
    let before: Vec<_> = pids
        .iter()
        .map(|(_, p)| cpu_time(*p).unwrap_or_default())
        .collect();
    let report_path = dir.join("report.json");
    let mut args = scenario.loadgen_args.clone();
    let pods: Vec<String> = cluster.pods.iter().map(ToString::to_string).collect();
    args.extend([
        "--target".into(),
        running.target.to_string(),
        "--pods".into(),
        pods.join(","),
        "--label".into(),
        router.label(),
    ]);
    args.extend([
        "--model".into(),
        scenario.model.clone(),
        "--block-size".into(),
        scenario.sim.block_size.to_string(),
    ]);
    args.extend(["--out".into(), report_path.display().to_string()]);
    run_loadgen(&bins.loadgen, args, dir).await?;
    save_metrics(running.metrics, &dir.join("epp-metrics.txt")).await;
    let report: Report = read_report(&report_path)?;
    let n = report.summary.ok.max(1) as f64;
    let cpu = pids
        .iter()
        .zip(before)
        .map(|((name, pid), b)| {
            (
                name.clone(),
                (cpu_time(*pid).unwrap_or_default().saturating_sub(b)).as_secs_f64() * 1e6 / n,
            )
        })
        .collect();
    drop(running);
    drop(cluster);
    Ok(RouterResult {
        summary: Some(report.summary),
        cpu_us_per_request: cpu,
        report: Some(report_path),
        ..RouterResult::default()
    })
}

/// Writes the EPP's Prometheus text at the end of the run to `path` (best effort: a failed
/// scrape leaves no file), for what the EPP itself counted (e.g. llm-d's KV-block index lookups).
async fn save_metrics(addr: Option<std::net::SocketAddr>, path: &Path) {
    let Some(addr) = addr else { return };
    if let Ok(r) = harness::client::get(addr, "/metrics").await {
        if r.status.is_success() {
            let _ = std::fs::write(path, &r.body);
        }
    }
}

/// Runs `loadgen` to completion (its stdout and stderr go to `loadgen.log` in `dir`).
pub async fn run_loadgen(loadgen: &Path, args: Vec<String>, dir: &Path) -> Result<(), BenchError> {
    let log = dir.join("loadgen.log");
    let exe = loadgen.to_path_buf();
    let status =
        tokio::task::spawn_blocking(move || -> std::io::Result<std::process::ExitStatus> {
            let out = std::fs::File::create(&log)?;
            let err = out.try_clone()?;
            Command::new(exe)
                .args(args)
                .stdout(out)
                .stderr(err)
                .status()
        })
        .await
        .map_err(|e| BenchError::Setup(format!("loadgen task: {e}")))?
        .map_err(BenchError::io("running loadgen"))?;
    if !status.success() {
        return Err(BenchError::Exited {
            name: "loadgen".into(),
            log: super::procs::log_tail(&dir.join("loadgen.log")),
        });
    }
    Ok(())
}

pub fn read_report(path: &Path) -> Result<Report, BenchError> {
    let bytes =
        std::fs::read(path).map_err(BenchError::io(format!("reading {}", path.display())))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| BenchError::Setup(format!("{} is not a loadgen report: {e}", path.display())))
}

//! A measurement, not run by default (`#[ignore]`): the memory of the epp binary watching a pool
//! of 1,000 Ready pods on a real kube-apiserver, and how long the first sync takes. For
//! BENCHMARKS.md:
//!
//! ```text
//! cargo build --release --bin epp
//! cargo test -p epp-e2e --test e2e kube_scale:: -- --ignored --nocapture
//! ```
//!
//! The binary is `$EPP_BIN`, else `target/release/epp`, else `target/debug/epp`. Pod IPs are
//! 127.1.x.y (nothing listens, so scrapes fail fast); scrapes run every 5 s.
#![allow(clippy::unwrap_used)]

use crate::kube_support;

use futures::StreamExt;
use kube_support::*;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PODS: usize = 1000;

fn epp_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("EPP_BIN") {
        return bin.into();
    }
    let release = root().join("target/release/epp");
    if release.is_file() {
        return release;
    }
    root().join("target/debug/epp")
}

fn rss_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

async fn ready_pods(metrics: u16) -> Option<i64> {
    let addr = ([127, 0, 0, 1], metrics).into();
    let text = harness::prometheus::scrape(addr, "/metrics").await.ok()?;
    Some(harness::prometheus::value(&text, "inference_pool_ready_pods")? as i64)
}

/// Starts the epp binary for `pool` in `namespace`; the child and its first port.
fn spawn_epp(
    kubeconfig: &std::path::Path,
    namespace: &str,
    dir: &std::path::Path,
) -> (std::process::Child, u16) {
    let base = harness::ports::free_range(3).unwrap();
    let binary = epp_binary();
    let log = std::fs::File::create(dir.join(format!("epp-{namespace}.log"))).unwrap();
    let child = Command::new(&binary)
        .args(["--pool-name", "pool", "--pool-namespace", namespace])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--secure-serving=false", "--refresh-metrics-interval", "5s"])
        // The measurement reads /metrics without a token (kube_ops tests the auth).
        .arg("--metrics-endpoint-auth=false")
        .args(["--refresh-prometheus-metrics-interval", "100ms"])
        .args(["--grpc-port", &base.to_string()])
        .args(["--grpc-health-port", &(base + 1).to_string()])
        .args(["--metrics-port", &(base + 2).to_string()])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e} (cargo build --bin epp)", binary.display()));
    (child, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement (BENCHMARKS.md); run with --ignored --nocapture"]
async fn epp_watching_a_thousand_pods_on_a_real_server() {
    let (server, ns) = setup("scale").await;
    create(&ns, pool(&[8000])).await;
    let made = Instant::now();
    futures::stream::iter(0..PODS)
        .map(|i| {
            let ns = ns.clone();
            async move {
                let name = format!("pod-{i}");
                create_pod(&ns, &name, serde_json::json!({"app": "vllm"})).await;
                let ip = format!("127.1.{}.{}", i / 250, 1 + i % 250);
                set_status(&ns, &name, &ip, true).await;
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    println!(
        "measured: {PODS} pods created and made Ready in {:?}",
        made.elapsed()
    );

    let dir = TempDir::new("epp-scale");
    let kubeconfig = dir.0.join("kubeconfig");
    server.admin_kubeconfig(&kubeconfig, &ns.name).unwrap();
    let idle = dir.0.join("idle.kubeconfig");
    let empty = server.namespace("scale-empty").await.unwrap();
    server.admin_kubeconfig(&idle, &empty.name).unwrap();
    let (mut baseline, _) = spawn_epp(&idle, &empty.name, &dir.0);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle_rss = rss_kib(baseline.id(), "VmRSS:");
    let _ = Command::new("kill").arg(baseline.id().to_string()).status();
    let _ = baseline.wait();
    let binary = epp_binary();
    let (mut epp, base) = spawn_epp(&kubeconfig, &ns.name, &dir.0);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(120);
    while ready_pods(base + 2).await != Some(PODS as i64) {
        assert!(Instant::now() < deadline, "epp never saw {PODS} pods");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let synced = started.elapsed();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (rss, hwm) = (rss_kib(epp.id(), "VmRSS:"), rss_kib(epp.id(), "VmHWM:"));
    println!(
        "measured: {} watching {PODS} Ready pods: first sync {synced:?} after start; RSS {} MiB (peak {} MiB) 10 s later; with no pods {} MiB",
        binary.display(),
        rss / 1024,
        hwm / 1024,
        idle_rss / 1024
    );
    let _ = Command::new("kill").arg(epp.id().to_string()).status();
    let _ = epp.wait();
}

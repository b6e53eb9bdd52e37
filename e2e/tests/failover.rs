//! Failover through a real Envoy (issue 35, item 4): two epp processes (the epp binary, so the
//! test can signal one by PID) behind `config/envoy/ha-active-active.yaml` (gRPC health checks
//! on each replica's health port, outlier detection), in-process inference-sim pods, a steady
//! open-loop load, and SIGTERM of one replica in the middle of it. epp answers NOT_SERVING at
//! once and serves its open streams for `--drain-timeout`; Envoy stops sending it new streams
//! at its next health check. The test fails if a single request fails. The measurement at
//! upstream's rates is `failover-bench` (docs/operations/failover.md).
//!
//! The epp binary is `$EPP_BIN`, else `epp` in this test binary's profile directory
//! (`cargo build --bin epp`; `hack/test.sh` builds it with the workspace).
#![allow(clippy::unwrap_used)] // integration tests: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use inference_sim::{Cluster, EngineConfig, PodConfig};
use loadgen::bench::failover::{self, FailoverOptions, Fault, Layout};
use loadgen::workload::Workload;
use tokio::net::TcpListener;

fn epp_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("EPP_BIN") {
        return bin.into();
    }
    // <target>/<profile>/deps/e2e-<hash> → <target>/<profile>/epp
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .join("epp");
    assert!(
        bin.is_file(),
        "{} does not exist: cargo build --bin epp (or set EPP_BIN)",
        bin.display()
    );
    bin
}

async fn pods(n: usize) -> (Cluster, Vec<SocketAddr>) {
    let mut listeners = Vec::new();
    let mut configs = Vec::new();
    for i in 0..n {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
        configs.push(PodConfig {
            engine: EngineConfig::default(),
            pod_name: format!("sim-{i}"),
            seed: i as u64,
            prompt_tokens_details: true,
            ..Default::default()
        });
    }
    let cluster = Cluster::start_on(configs, listeners).await.unwrap();
    let addrs = cluster.addrs().to_vec();
    (cluster, addrs)
}

fn options(rate: f64) -> FailoverOptions {
    let mut opts = FailoverOptions {
        epp: epp_binary(),
        config: None,
        replicas: 2,
        layout: Layout::ActiveActive,
        rate,
        duration: Duration::ZERO,
        fault_at: Duration::from_secs(2),
        settle: Duration::from_secs(1),
        drain_timeout: Duration::from_secs(3),
        apiserver_down: Duration::from_secs(40),
        workload: Workload::SharedPrefix {
            groups: 4,
            prompts_per_group: 8,
            system_len: 200,
            question_len: 20,
            output_len: 8,
        },
        model: EngineConfig::default().model,
        seed: 1,
    };
    opts.duration = failover::needed(Fault::Sigterm, &opts);
    opts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_of_one_replica_under_load_drops_no_request() {
    let (_cluster, addrs) = pods(2).await;
    let dir = tempdir();
    let opts = options(30.0);
    let r = failover::round(&opts, Fault::Sigterm, &addrs, &dir)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    println!("sigterm at {} req/s: {r:?}", opts.rate);
    let planned = (opts.rate * opts.duration.as_secs_f64()) as usize;
    assert!(r.sent + 2 >= planned, "sent {} of {planned}", r.sent);
    assert_eq!(r.failed, 0, "requests failed: {:?}", r.errors);
    assert!(
        r.victim_streams.unwrap() > 10,
        "the signalled replica served only {:?} streams before its SIGTERM",
        r.victim_streams
    );
    assert!(
        r.fault_secs >= opts.drain_timeout.as_secs_f64(),
        "the replica exited after {:.1}s, before its drain ({:?}) ended",
        r.fault_secs,
        opts.drain_timeout
    );
    let out = r.out_of_rotation_secs.unwrap();
    assert!(
        out < opts.drain_timeout.as_secs_f64(),
        "Envoy's health check took the replica out of rotation {out:.1}s after SIGTERM, \
         after its drain ({:?}) had ended",
        opts.drain_timeout
    );
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "epp-failover-test-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

//! Faults against a real kube-apiserver, with traffic through a real Envoy: the API server is
//! killed (SIGKILL) and restarted under load (routing continues from the last known state, no
//! request fails, and the watches resume: a change made right after the restart, with etcd
//! compacted past epp's last resourceVersion, reaches the traffic), and three epp replicas elect
//! a leader on a real Lease (as the chart's ServiceAccount, with its leader-election Role): the
//! leader is cut off from the API server five times (a partition, so it cannot release the
//! Lease) and another replica reports ready within 2x the lease duration while no request
//! fails. The tests kill and restart their API server, so they have one of their own ([`own_setup`];
//! the other tests of the binary share another) and run one at a time ([`SERIAL`]). Each
//! prints its measurements (`measured:` lines, for BENCHMARKS.md). Needs hack/install-kube.sh
//! and hack/install-envoy.sh.
#![allow(clippy::unwrap_used)]

use crate::k8s_support;
use crate::kube_support;
use harness::kube_apiserver::KubeApiServer;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube_support::*;
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The tests stop their API server; they must not overlap.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// This file's API server, started on first use with the CRDs installed: not the binary's shared
/// one, which other tests use while these kill and restart theirs.
static OWN: tokio::sync::OnceCell<KubeApiServer> = tokio::sync::OnceCell::const_new();

/// This file's server (started on first use) and a fresh namespace on it.
async fn own_setup(
    prefix: &str,
) -> (
    &'static KubeApiServer,
    harness::kube_apiserver::TestNamespace,
) {
    let server = OWN
        .get_or_init(|| async {
            let server = KubeApiServer::start()
                .await
                .unwrap_or_else(|e| panic!("real API server: {e}"));
            install_crds(&server).await;
            server
        })
        .await;
    (server, server.namespace(prefix).await.unwrap())
}

/// A bounded load loop through Envoy: at most `max` requests, until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Load {
    fn start(envoy: std::net::SocketAddr, max: u64) -> Self {
        let (stop, ok, failed) = (Arc::default(), Arc::default(), Arc::default());
        let (s, o, f): (Arc<AtomicBool>, Arc<AtomicU64>, Arc<AtomicU64>) =
            (Arc::clone(&stop), Arc::clone(&ok), Arc::clone(&failed));
        #[allow(clippy::disallowed_methods)]
        let task = tokio::spawn(async move {
            for _ in 0..max {
                if s.load(Ordering::Relaxed) {
                    return;
                }
                let r = harness::client::post_json(envoy, "/v1/completions", COMPLETION).await;
                let counter = if r.is_ok_and(|r| r.status.is_success()) {
                    &o
                } else {
                    &f
                };
                counter.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        Self {
            stop,
            ok,
            failed,
            task,
        }
    }

    /// Stops the loop; (succeeded, failed).
    async fn finish(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
        (
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_survives_an_api_server_kill_and_the_watches_resume() {
    let _serial = SERIAL.lock().await;
    let (server, ns) = own_setup("faults-restart").await;
    let (port, pods) = sim_pods(3).await;
    create(&ns, pool(&[port])).await;
    ready_pod(&ns, "pod-0", "127.0.0.2").await;
    ready_pod(&ns, "pod-1", "127.0.0.3").await;
    create_pod(&ns, "pod-2", json!({"app": "vllm"})).await;
    let epp = k8s_support::Epp::start_with(
        &ns.name,
        |path| server.admin_kubeconfig(path, &ns.name).unwrap(),
        &["--pool-name", "pool"],
    )
    .await;
    epp.wait_endpoints(2, Duration::from_secs(20)).await;
    let envoy = envoy(epp.grpc, &pods).await;
    wait_served(&envoy, &["pod-0", "pod-1"]).await;
    let before = Api::<Pod>::namespaced(ns.client.clone(), &ns.name)
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();

    let load = Load::start(envoy.listener_addr(), 20_000);
    server.stop_apiserver(true);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let down = Instant::now();
    server.start_apiserver().await.unwrap();
    let restart = down.elapsed();
    // Changes right after the restart, then history compacted: a watch resumed from before the
    // restart cannot be served and the server answers 410 Gone.
    set_status(&ns, "pod-1", "127.0.0.3", false).await;
    set_status(&ns, "pod-2", "127.0.0.4", true).await;
    let changed = Instant::now();
    let revision = server.compact_etcd().await.unwrap();
    epp.wait_endpoints(2, Duration::from_secs(60)).await;
    wait_served(&envoy, &["pod-0", "pod-2"]).await;
    let recovered = changed.elapsed();
    let (ok, failed) = load.finish().await;
    println!(
        "measured: api-server restart {restart:?}; epp followed a change made after the restart in {recovered:?}; load {ok} ok, {failed} failed"
    );
    assert_eq!(
        failed, 0,
        "requests failed while the API server was down ({ok} ok)"
    );
    assert!(ok > 0);

    // Found here: kube-apiserver 1.36 still answers an exact list at `before` (compacted in
    // etcd) from its watch-cache snapshots, so compaction alone does not make the API server
    // answer 410 while its cache covers the version; the restart is what breaks the watches.
    let compacted: i64 = before.parse().unwrap();
    assert!(revision > compacted, "etcd compacted past {before}");

    drop(envoy);
    epp.stop().await;
    for p in pods {
        p.shutdown().await;
    }
}

/// Lease timing of the replicas: lease 2 s, renew deadline 1.5 s, retry 200 ms.
const LEASE: Duration = Duration::from_secs(2);
const HA_ARGS: [&str; 9] = [
    "--pool-name",
    "llama",
    "--ha-enable-leader-election",
    "--ha-lease-duration",
    "2s",
    "--ha-renew-deadline",
    "1500ms",
    "--ha-retry-period",
    "200ms",
];

async fn readiness(replicas: &[k8s_support::Epp]) -> Vec<bool> {
    let mut ready = Vec::new();
    for r in replicas {
        ready.push(r.is_ready().await);
    }
    ready
}

/// Waits (bounded) until exactly one replica other than `not` is ready; its index.
async fn one_leader(replicas: &[k8s_support::Epp], not: Option<usize>) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = readiness(replicas).await;
        let leaders: Vec<usize> = (0..ready.len()).filter(|i| ready[*i]).collect();
        if let [one] = leaders[..] {
            if Some(one) != not {
                return one;
            }
        }
        assert!(Instant::now() < deadline, "no single new leader: {ready:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_a_real_lease_within_twice_the_lease_duration() {
    let _serial = SERIAL.lock().await;
    let (server, ns) = own_setup("faults-leader").await;
    let (port, pods) = sim_pods(2).await;
    let values = chart_values(port, json!({"inferenceExtension": {"replicas": 3}}));
    install_chart(&ns, "llama", &values).await;
    ready_pod(&ns, "pod-0", "127.0.0.2").await;
    ready_pod(&ns, "pod-1", "127.0.0.3").await;
    let token = server.mint_token(&ns.name, "llama-epp").await.unwrap();
    let mut proxies = Vec::new();
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let proxy = Proxy::start(server.addr()).await;
        let via = proxy.addr;
        let epp = k8s_support::Epp::start_with(
            &ns.name,
            |path| token_kubeconfig_via(server, &ns, &token, via, path),
            &HA_ARGS,
        )
        .await;
        proxies.push(Some(proxy));
        replicas.push(epp);
    }
    for r in &replicas {
        r.wait_endpoints(2, Duration::from_secs(20)).await;
    }
    let envoy = harness::envoy::EnvoyConfig::new(harness::envoy::Template::Duplex)
        .epp_replicas(replicas.iter().map(|r| r.grpc))
        .pool(pods.iter().map(harness::sim_pod::SimPod::addr))
        .start()
        .await
        .unwrap();
    let load = Load::start(envoy.listener_addr(), 20_000);
    let mut leader = one_leader(&replicas, None).await;
    let mut failovers = Vec::new();
    for _ in 0..5 {
        let (addr, target) = proxies[leader].take().unwrap().cut().await;
        let cut = Instant::now();
        let next = one_leader(&replicas, Some(leader)).await;
        failovers.push(cut.elapsed());
        proxies[leader] = Some(Proxy::restore(addr, target).await);
        leader = next;
        // Let the old leader rejoin as a standby before the next cut.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (ok, failed) = load.finish().await;
    let mut sorted = failovers.clone();
    sorted.sort();
    println!(
        "measured: leader failover over {} cuts: min {:?} median {:?} max {:?} (lease {LEASE:?}); load {ok} ok, {failed} failed",
        sorted.len(),
        sorted[0],
        sorted[sorted.len() / 2],
        sorted[sorted.len() - 1]
    );
    assert!(
        sorted[sorted.len() - 1] <= 2 * LEASE,
        "failover took {sorted:?}"
    );
    assert_eq!(failed, 0, "requests failed during failover ({ok} ok)");
    drop(envoy);
    for r in replicas {
        r.stop().await;
    }
    for p in proxies.into_iter().flatten() {
        p.cut().await;
    }
    for p in pods {
        p.shutdown().await;
    }
}

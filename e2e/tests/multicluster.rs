//! epp as a multi-cluster hub (llm-d-router v0.10's hub-and-spoke, alpha), through a real
//! Envoy: each cluster is one endpoint (its gateway: an inference-sim pod here), scored by its
//! spoke EPP's pool gauges.
//!
//! - Beyond upstream: a spoke whose metrics stop answering is left out once its last reading
//!   is older than `--metrics-staleness-threshold`, and comes back with its next answer (the
//!   spokes are [`crate::hub_support`]'s stand-ins, over https with their CA verified).
//! - epp is a spoke epp's hub reads: the spokes here are epp itself, each over one pod, and
//!   the hub reads their `llm_d_epp_average_queue_size`; and llm-d-router v0.10's EPP is one
//!   too (ignored without `EPP_LLMD_EPP`, as the differential suite).
//!
//! Routing that prices the network, over regions with round trips, is in [`crate::regions`].

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use harness::client;
use harness::envoy::{Envoy, EnvoyConfig, Template};
use harness::sim_pod::{test_pod_config, SimPod};
use harness::stack::Epp;
use http::Method;

use crate::hub_support::{Pool, Spokes};

/// A hub over the clusters file `clusters`: the queue scorer and the max-score picker, its
/// spokes scraped with `source` (the data source's parameters).
fn hub_config(clusters: &Path, source: &str) -> String {
    format!(
        "apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- {{name: clusters, type: multicluster-file-discovery, parameters: {{path: {clusters:?}}}}}
- {{name: spokes, type: multicluster-metrics-data-source, parameters: {source}}}
- {{name: pool, type: multicluster-metrics-extractor}}
- {{type: multicluster-queue-scorer}}
- {{type: max-score-picker}}
schedulingProfiles:
- name: default
  plugins: [{{pluginRef: multicluster-queue-scorer}}, {{pluginRef: max-score-picker}}]
dataLayer:
  discovery: {{pluginRef: clusters}}
  sources: [{{pluginRef: spokes, extractors: [{{pluginRef: pool}}]}}]
"
    )
}

/// The clusters file: each pod a cluster's gateway, its spoke's metrics at `metrics[i]`.
fn clusters_file(pods: &[SimPod], metrics: &[SocketAddr]) -> String {
    let mut s = String::from("endpoints:\n");
    for (p, m) in pods.iter().zip(metrics) {
        s += &format!(
            "- {{name: {}, address: {}, port: '{}', labels: {{metricsAddress: {}, metricsPort: '{}'}}}}\n",
            p.name(),
            p.addr().ip(),
            p.addr().port(),
            m.ip(),
            m.port()
        );
    }
    s
}

/// A hub epp loading `config` (written into `dir`), and the Envoy in front of it.
async fn hub(dir: &Path, config: &str, pods: &[SimPod]) -> anyhow::Result<(Epp, Envoy)> {
    let path = dir.join("hub.yaml");
    std::fs::write(&path, config)?;
    let flags: Vec<String> = [
        "--config-file",
        &path.display().to_string(),
        "--secure-serving",
        "false",
        "--refresh-metrics-interval",
        "50ms",
        "--metrics-staleness-threshold",
        "300ms",
        "--allow-experimental-plugins",
        "true",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let epp = Epp::start(&flags).await?;
    let envoy = EnvoyConfig::new(Template::Duplex)
        .epp(epp.grpc)
        .epp_tls(false)
        .pool(pods.iter().map(SimPod::addr))
        .start()
        .await?;
    Ok((epp, envoy))
}

/// The pod that served one completion sent through `envoy`.
async fn served(envoy: &Envoy) -> anyhow::Result<String> {
    let body = r#"{"model":"test-model","prompt":"hello","max_tokens":1}"#
        .replace("test-model", harness::sim_pod::TEST_MODEL);
    let resp = client::send(
        envoy.listener_addr(),
        client::request(Method::POST, "/v1/completions", body)?,
    )
    .await?;
    anyhow::ensure!(resp.status.is_success(), "status {}", resp.status);
    Ok(resp
        .header("x-inference-pod")
        .unwrap_or_default()
        .to_owned())
}

/// Sends completions until one is served by `pod` (bounded: `within`).
async fn until_served_by(envoy: &Envoy, pod: &str, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let got = served(envoy).await?;
        if got == pod {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "still {got}, never {pod}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn pods(n: usize) -> anyhow::Result<Vec<SimPod>> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(SimPod::bind(test_pod_config(&format!("cluster-{i}"))).await?);
    }
    Ok(out)
}

pub(crate) fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("epp-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoke_that_stops_answering_is_left_out_until_it_answers_again() {
    let dir = scratch("hub-eject");
    let gateways = pods(2).await.unwrap();
    let pools = [
        Pool {
            kv: 0.1,
            queue: 0.0,
        },
        Pool {
            kv: 0.1,
            queue: 5.0,
        },
    ];
    let spokes = Spokes::start(&pools, &dir).await.unwrap();
    let metrics: Vec<SocketAddr> = (0..2)
        .map(|i| SocketAddr::from(([127, 0, 0, 1], spokes.port(i))))
        .collect();
    let clusters = dir.join("clusters.yaml");
    std::fs::write(&clusters, clusters_file(&gateways, &metrics)).unwrap();
    let source = format!("{{caCertPath: {:?}}}", spokes.ca.display().to_string());
    let (epp, envoy) = hub(&dir, &hub_config(&clusters, &source), &gateways)
        .await
        .unwrap();
    spokes.scraped().await.unwrap();
    for _ in 0..3 {
        assert_eq!(
            served(&envoy).await.unwrap(),
            "cluster-0",
            "the shorter queue"
        );
    }
    spokes.silence(0, true);
    until_served_by(&envoy, "cluster-1", Duration::from_secs(5))
        .await
        .unwrap();
    for _ in 0..3 {
        assert_eq!(
            served(&envoy).await.unwrap(),
            "cluster-1",
            "cluster-0's spoke is silent: left out"
        );
    }
    spokes.silence(0, false);
    spokes.scraped().await.unwrap();
    for _ in 0..3 {
        assert_eq!(served(&envoy).await.unwrap(), "cluster-0", "back");
    }
    drop(envoy);
    epp.stop().await;
    spokes.shutdown().await;
    for p in gateways {
        p.shutdown().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A spoke: epp over one pod, publishing its pool gauges every 50 ms.
async fn spoke_epp(pod: &SimPod) -> anyhow::Result<Epp> {
    let flags: Vec<String> = [
        "--static-endpoints",
        &pod.addr().to_string(),
        "--secure-serving",
        "false",
        "--refresh-metrics-interval",
        "50ms",
        "--refresh-prometheus-metrics-interval",
        "50ms",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    Epp::start(&flags).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epp_hub_reads_epp_spokes_pool_gauges() {
    let dir = scratch("hub-epp-spokes");
    let gateways = pods(2).await.unwrap();
    gateways[0].hook().set_waiting(Some(8));
    gateways[1].hook().set_waiting(Some(0));
    let spoke_a = spoke_epp(&gateways[0]).await.unwrap();
    let spoke_b = spoke_epp(&gateways[1]).await.unwrap();
    let clusters = dir.join("clusters.yaml");
    let metrics = [spoke_a.metrics, spoke_b.metrics];
    std::fs::write(&clusters, clusters_file(&gateways, &metrics)).unwrap();
    let (hub_epp, envoy) = hub(&dir, &hub_config(&clusters, "{scheme: http}"), &gateways)
        .await
        .unwrap();
    until_served_by(&envoy, "cluster-1", Duration::from_secs(10))
        .await
        .unwrap();
    gateways[0].hook().set_waiting(Some(0));
    gateways[1].hook().set_waiting(Some(8));
    until_served_by(&envoy, "cluster-0", Duration::from_secs(10))
        .await
        .unwrap();
    let avg = spoke_b
        .metric("llm_d_epp_average_queue_size")
        .await
        .expect("the spoke publishes its pool's average queue");
    assert!(avg >= 8.0, "{avg}");
    drop(envoy);
    for e in [hub_epp, spoke_a, spoke_b] {
        e.stop().await;
    }
    for p in gateways {
        p.shutdown().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs llm-d-router v0.10's EPP: EPP_LLMD_EPP=/path/to/llm-d-epp cargo test -p epp-e2e --test e2e multicluster:: -- --ignored"]
async fn an_epp_hub_reads_llm_d_spokes_pool_gauges() {
    let llmd = harness::llmd_epp::binary_from_env().unwrap_or_else(|e| panic!("{e:#}"));
    let dir = scratch("hub-llmd-spokes");
    let gateways = pods(2).await.unwrap();
    gateways[0].hook().set_waiting(Some(8));
    gateways[1].hook().set_waiting(Some(0));
    let spoke_config = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n";
    let mut spokes = Vec::new();
    for (i, pod) in gateways.iter().enumerate() {
        let spoke_dir = dir.join(format!("spoke-{i}"));
        std::fs::create_dir_all(&spoke_dir).unwrap();
        let endpoint = harness::llmd_epp::FileEndpoint {
            name: pod.name(),
            addr: pod.addr(),
            labels: &[],
        };
        let spoke = harness::llmd_epp::LlmdEpp::start(&llmd, spoke_config, &[endpoint], &spoke_dir)
            .await
            .unwrap();
        spokes.push(spoke);
    }
    let metrics: Vec<SocketAddr> = spokes.iter().map(|s| s.metrics_addr()).collect();
    let clusters = dir.join("clusters.yaml");
    std::fs::write(&clusters, clusters_file(&gateways, &metrics)).unwrap();
    let (hub_epp, envoy) = hub(&dir, &hub_config(&clusters, "{scheme: http}"), &gateways)
        .await
        .unwrap();
    // llm-d refreshes its pool gauges every 5 s (--refresh-prometheus-metrics-interval).
    until_served_by(&envoy, "cluster-1", Duration::from_secs(20))
        .await
        .unwrap();
    gateways[0].hook().set_waiting(Some(0));
    gateways[1].hook().set_waiting(Some(8));
    until_served_by(&envoy, "cluster-0", Duration::from_secs(20))
        .await
        .unwrap();
    drop(envoy);
    hub_epp.stop().await;
    drop(spokes);
    for p in gateways {
        p.shutdown().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

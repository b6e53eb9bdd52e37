//! Balancing policies of issue #7 through a real Envoy: a pod whose GPU memory is exhausted gets
//! no traffic while its `/health` is 200 (DCGM series from the simulator), a session token
//! pins follow-up requests to the pod that served the session, and a fallback list with an
//! Envoy retry policy survives a dead primary.

use std::time::{Duration, Instant};

use harness::client::{self, HttpResponse};
use harness::envoy::{repo_root, EnvoyConfig, Template};
use harness::stack::{Epp, StackOptions};
use http::{Method, StatusCode};
use inference_sim::{Cluster, EngineConfig, PodConfig};
use tokio::net::TcpListener;

use super::support::{access_log, args, completion, post, sample, start, wait_for_metrics, MODEL};

/// Simulated pods with DCGM series, epp with `config`, Envoy (duplex, ORIGINAL_DST).
struct GpuStack {
    cluster: Cluster,
    epp: Epp,
    envoy: harness::envoy::Envoy,
}

impl GpuStack {
    async fn start(pods: usize, config: &str) -> Self {
        let mut listeners = Vec::new();
        let mut configs = Vec::new();
        for i in 0..pods {
            listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
            let mut cfg = PodConfig {
                engine: EngineConfig {
                    model: MODEL.into(),
                    time_scale: 20.0,
                    ..EngineConfig::default()
                },
                pod_name: format!("sim-{i}"),
                seed: i as u64,
                ..Default::default()
            };
            cfg.metrics.dcgm = true;
            configs.push(cfg);
        }
        let cluster = Cluster::start_on(configs, listeners).await.unwrap();
        let endpoints: Vec<String> = cluster.addrs().iter().map(ToString::to_string).collect();
        let flags = [
            "--static-endpoints",
            &endpoints.join(","),
            "--secure-serving",
            "false",
            "--config-text",
            config,
            "--refresh-metrics-interval",
            "20ms",
            // session-affinity-scorer is an alpha plugin upstream.
            "--allow-experimental-plugins",
        ];
        let epp = Epp::start(&args(&flags)).await.unwrap();
        let envoy = EnvoyConfig::new(Template::Duplex)
            .epp(epp.grpc)
            .pool(cluster.addrs().iter().copied())
            .start()
            .await
            .unwrap();
        Self {
            cluster,
            epp,
            envoy,
        }
    }

    async fn post(&self, prompt: &str, headers: &[(&'static str, &str)]) -> HttpResponse {
        let mut req = client::request(Method::POST, "/v1/completions", completion(prompt)).unwrap();
        for (k, v) in headers {
            req = client::with_header(req, k, v).unwrap();
        }
        client::send(self.envoy.listener_addr(), req).await.unwrap()
    }

    /// The index of the pod that answered (`x-inference-pod: sim-<i>`).
    fn served(&self, r: &HttpResponse) -> usize {
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        r.header("x-inference-pod")
            .and_then(|p| p.strip_prefix("sim-"))
            .and_then(|i| i.parse().ok())
            .unwrap()
    }

    /// Waits until epp has scraped every pod at least `rounds` times in total (bounded).
    /// Waits for `scrapes` more successful scrapes than epp has done so far, so every pod has
    /// been scraped since the caller changed it (a total since start-up can already be reached
    /// on a slow machine before the change, leaving a pod's last scrape stale).
    async fn wait_for_scrapes(&self, scrapes: f64) {
        let count = |t: &str| {
            sample(t, "epp_metrics_scrapes_total", &[("outcome", "success")]).unwrap_or(0.0)
        };
        let now = count(&self.epp.metrics_text().await.unwrap());
        wait_for_metrics(&self.epp, "successful scrapes", |t| {
            count(t) >= now + scrapes
        })
        .await;
    }

    async fn stop(self) {
        drop(self.envoy);
        self.epp.stop().await;
        self.cluster.shutdown().await;
    }
}

fn config(plugins: &str, profile: &str) -> String {
    format!("apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n{plugins}schedulingProfiles:\n- name: default\n  plugins:\n{profile}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_with_exhausted_gpu_memory_gets_no_traffic_while_healthy() {
    let cfg = config(
        "- type: gpu-memory-filter\n  parameters: {minFreeMiB: 2048}\n- type: gpu-utilization-scorer\n- type: max-score-picker\n",
        "  - pluginRef: gpu-memory-filter\n  - pluginRef: gpu-utilization-scorer\n  - pluginRef: max-score-picker\n",
    );
    let stack = GpuStack::start(3, &cfg).await;
    let faults = stack.cluster.faults(0).await.unwrap();
    faults.set(inference_sim::Faults {
        gpu_memory_exhausted: true,
        ..Default::default()
    });
    let health = client::get(stack.cluster.addrs()[0], "/health")
        .await
        .unwrap();
    assert_eq!(
        health.status,
        StatusCode::OK,
        "the exhausted pod still answers /health"
    );
    stack.wait_for_scrapes(30.0).await;
    let mut served = [0usize; 3];
    for i in 0..30 {
        served[stack.served(&stack.post(&format!("gpu test {i}"), &[]).await)] += 1;
    }
    assert_eq!(served[0], 0, "the exhausted pod was chosen: {served:?}");
    assert!(served[1] > 0 && served[2] > 0, "{served:?}");
    // Memory freed: the pod serves again once a scrape shows it (bounded wait).
    faults.set(inference_sim::Faults::default());
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut back = false;
    for i in 0.. {
        if stack.served(&stack.post(&format!("recovered {i}"), &[]).await) == 0 {
            back = true;
            break;
        }
        if Instant::now() > deadline {
            break;
        }
    }
    assert!(back, "the recovered pod never got traffic again");
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_token_pins_follow_up_requests_to_the_sessions_pod() {
    let cfg = config(
        "- type: session-affinity-scorer\n- type: queue-scorer\n- type: max-score-picker\n",
        "  - pluginRef: session-affinity-scorer\n    weight: 10\n  - pluginRef: queue-scorer\n  - pluginRef: max-score-picker\n",
    );
    let stack = GpuStack::start(3, &cfg).await;
    let first = stack.post("hello session", &[]).await;
    let owner = stack.served(&first);
    let token = first
        .header("x-session-token")
        .expect("the response carries x-session-token")
        .to_owned();
    // The token is base64 of the endpoint name; static endpoints are named by their address.
    assert_eq!(
        epp::extproc::wire::decode_token(&token),
        Some(stack.cluster.addrs()[owner].to_string())
    );
    for i in 0..12 {
        let r = stack
            .post(&format!("turn {i}"), &[("x-session-token", &token)])
            .await;
        assert_eq!(stack.served(&r), owner, "turn {i} left the session's pod");
        assert_eq!(r.header("x-session-token"), Some(token.as_str()));
    }
    // A token that does not decode is ignored, not an error.
    let r = stack
        .post("no session", &[("x-session-token", "%%not-base64%%")])
        .await;
    assert_eq!(r.status, StatusCode::OK);
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_list_with_envoy_retries_survives_a_dead_primary() {
    let cfg = config(
        "- type: round-robin-picker\n  parameters: {maxNumOfEndpoints: 3}\n",
        "  - pluginRef: round-robin-picker\n",
    );
    let template = Template::File(repo_root().join("config/envoy/duplex-override-host-retry.yaml"));
    let flags = [
        "--config-text",
        cfg.as_str(),
        "--metrics-staleness-threshold",
        "60s",
    ];
    let mut stack = start(StackOptions {
        template,
        epp_args: args(&flags),
        ..StackOptions::default()
    })
    .await;
    let dead = stack.pods.remove(0);
    let dead_addr = dead.endpoint();
    dead.shutdown().await;
    let n = 12;
    for i in 0..n {
        let r = post(
            &stack,
            "/v1/completions",
            completion(&format!("fallback {i}")),
            &[],
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "request {i}: {}", r.text());
    }
    let log = access_log(&stack, n).await;
    let primary_dead: Vec<_> = log
        .iter()
        .filter(|e| {
            e.header
                .as_deref()
                .is_some_and(|h| h.starts_with(&dead_addr))
        })
        .collect();
    assert!(
        primary_dead.len() >= n / 3,
        "round robin made the dead pod primary for a third of the requests: {log:#?}"
    );
    for e in primary_dead {
        assert_eq!(e.status, 200, "{}", e.line);
        let second = e
            .header
            .as_deref()
            .and_then(|h| h.split(',').nth(1))
            .map(str::to_owned);
        assert_eq!(
            e.served, second,
            "served by the next endpoint of the list: {}",
            e.line
        );
    }
    wait_for_metrics(&stack.epp, "served fallbacks", |t| {
        sample(t, "epp_served_fallbacks_total", &[]).unwrap_or(0.0) >= 1.0
    })
    .await;
    stack.stop().await;
}

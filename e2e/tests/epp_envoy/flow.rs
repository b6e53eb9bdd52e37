//! Flow control through Envoy (issue #7): with `--flow-control`, requests wait in epp while the
//! pool is saturated; when capacity frees they are served, the Critical objective before the
//! standard one before the Sheddable one; a full queue answers 429 at once, and a request that
//! waits past the TTL 429. Priorities come from InferenceObjectives served by the fake API
//! server (Kubernetes mode); the pod is an inference-sim pod whose reported queue the test forces, so
//! saturation is exact: queue 50 saturates, queue 4 leaves room for one request per scrape
//! (epp counts what it sent since the last scrape as queued), which releases the waiting
//! requests one by one, in order.

use std::time::Duration;

use harness::envoy::{EnvoyConfig, Template};
use harness::fake_apiserver::FakeApiServer;
use harness::sim_pod::SimPod;
use harness::stack::Epp;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::json;

use super::support::{args, completion, sample, traffic, wait_for_metrics};

pub(super) const NS: &str = "llm";
const OBJECTIVE: &str = "x-gateway-inference-objective";

async fn create(client: &kube::Client, obj: serde_json::Value) {
    let api_version = obj["apiVersion"].as_str().unwrap();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = kube::api::GroupVersionKind::gvk(group, version, obj["kind"].as_str().unwrap());
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NS, &kube::api::ApiResource::from_gvk(&gvk));
    api.create(
        &PostParams::default(),
        &serde_json::from_value(obj).unwrap(),
    )
    .await
    .unwrap();
}

pub(super) async fn cluster(client: &kube::Client, port: u16) {
    create(client, json!({
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "pool", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": [{"number": port}], "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}}
    }))
    .await;
    create(client, json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "pod-0", "namespace": NS, "labels": {"app": "vllm"}},
        "spec": {"containers": [{"name": "vllm", "image": "vllm"}]},
        "status": {"podIP": "127.0.0.1", "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .await;
    for (name, priority) in [("critical", 100), ("sheddable", -10)] {
        create(client, json!({
            "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceObjective",
            "metadata": {"name": name, "namespace": NS}, "spec": {"priority": priority, "poolRef": {"name": "pool"}}
        }))
        .await;
    }
}

async fn send(envoy: std::net::SocketAddr, objective: &'static str) -> (u16, String, &'static str) {
    let req =
        harness::client::request(http::Method::POST, "/v1/completions", completion(objective))
            .unwrap();
    let req = harness::client::with_header(req, OBJECTIVE, objective).unwrap();
    let r = harness::client::send(envoy, req).await.unwrap();
    (r.status.as_u16(), r.text(), objective)
}

/// Requests waiting in epp's flow-control queue, summed over its series (one per priority here).
fn queued(text: &str) -> f64 {
    harness::prometheus::sum(text, "inference_extension_flow_control_queue_size")
}

/// Waits until `n` requests wait in epp's queue (the 429 below depends on the three being queued).
async fn wait_queued(epp: &Epp, n: usize) {
    wait_for_metrics(epp, &format!("{n} queued"), |t| queued(t) == n as f64).await;
}

/// Requests that left flow control with `outcome`.
fn outcomes(text: &str, outcome: &str) -> Option<f64> {
    sample(
        text,
        "inference_extension_flow_control_request_queue_duration_seconds_count",
        &[("outcome", outcome)],
    )
}

/// Waits until epp has scraped the pod's queue (Kubernetes mode names the pod, not its address).
async fn wait_queue(epp: &Epp, waiting: f64) {
    wait_for_metrics(epp, &format!("pool queue {waiting}"), |t| {
        sample(t, "inference_pool_average_queue_size", &[]) == Some(waiting)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_requests_are_served_by_priority_a_full_queue_and_expiry_are_429() {
    let api = FakeApiServer::bind().await.unwrap();
    let client = api.client(NS).unwrap();
    let pod = SimPod::named("pod-0").await.unwrap();
    cluster(&client, pod.addr().port()).await;
    let dir = std::env::temp_dir().join(format!(
        "epp-flow-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig, NS).unwrap();
    let flags = [
        "--pool-name",
        "pool",
        "--pool-namespace",
        NS,
        "--kubeconfig",
        &kubeconfig.display().to_string(),
        "--secure-serving=false",
        "--metrics-endpoint-auth=false",
        "--refresh-prometheus-metrics-interval",
        "50ms",
        "--flow-control",
        "--flow-control-max-requests",
        "3",
        "--flow-control-default-request-ttl",
        "3s",
    ];
    let epp = Epp::start(&args(&flags)).await.unwrap();
    let envoy = EnvoyConfig::new(Template::Duplex)
        .epp(epp.grpc)
        .start()
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let addr = envoy.listener_addr();
    pod.hook().set_waiting(Some(50));
    wait_queue(&epp, 50.0).await;

    let mut waiting = tokio::task::JoinSet::new();
    for (n, objective) in ["sheddable", "standard", "critical"]
        .into_iter()
        .enumerate()
    {
        waiting.spawn(send(addr, objective));
        wait_queued(&epp, n + 1).await;
    }
    let (status, text, _) = send(addr, "critical").await;
    assert_eq!(status, 429, "the queue holds 3: {text}");
    assert!(
        text.contains("flow control queue is full: maxRequests 3"),
        "{text}"
    );
    let text = epp.metrics_text().await.unwrap();
    assert_eq!(outcomes(&text, "RejectedCapacity"), Some(1.0), "{text}");
    assert!(
        traffic(&pod).is_empty(),
        "nothing passes while the pool is saturated"
    );

    pod.hook().set_waiting(Some(4));
    while let Some(done) = waiting.join_next().await {
        let (status, text, objective) = done.unwrap();
        assert_eq!(status, 200, "{objective}: {text}");
    }
    let order: Vec<String> = traffic(&pod)
        .iter()
        .map(|r| r.header(OBJECTIVE).unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        order,
        ["critical", "standard", "sheddable"],
        "released by priority when capacity freed"
    );
    wait_queued(&epp, 0).await;

    pod.hook().set_waiting(Some(50));
    wait_queue(&epp, 50.0).await;
    let started = std::time::Instant::now();
    let (status, text, _) = send(addr, "critical").await;
    assert_eq!(status, 429, "{text}");
    assert!(text.contains("request timed out in queue"), "{text}");
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    wait_for_metrics(&epp, "an EvictedTTL outcome", |t| {
        outcomes(t, "EvictedTTL") == Some(1.0) && queued(t) == 0.0
    })
    .await;
    drop(envoy);
    epp.stop().await;
    pod.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Each request `(tenant, x-llm-d-slo-ttft-ms)`, queued in this order in epp while its one pod is
/// saturated, then released; returns the `tag` of each in the order the pod received them.
/// `plugins` and `band` are YAML lines for the configuration's `plugins` and its
/// `flowControl.defaultPriorityBand` (empty: upstream's defaults).
async fn release_order(plugins: &str, band: &str, requests: &[(&str, Option<u32>)]) -> Vec<String> {
    release_order_by(TENANT, &[], plugins, band, requests).await
}

/// The fairness key header.
const TENANT: &str = "x-gateway-inference-fairness-id";

/// A flow-control configuration: queue-scorer, `plugins` (YAML lines) and the default band's
/// fields `band` (empty: upstream's defaults).
fn flow_config(plugins: &str, band: &str) -> String {
    let flow = if band.is_empty() {
        String::new()
    } else {
        format!("flowControl:\n  defaultPriorityBand: {{{band}}}\n")
    };
    format!(
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nfeatureGates: [flowControl]\nplugins:\n- {{type: queue-scorer}}\n{plugins}schedulingProfiles:\n- name: default\n  plugins: [{{pluginRef: queue-scorer}}]\n{flow}"
    )
}

/// A completion naming its tenant in `tenant_header`, with an SLO when given.
fn tenant_request(
    prompt: &str,
    tenant_header: &'static str,
    tenant: &str,
    slo_ms: Option<u32>,
) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    let req = harness::client::request(http::Method::POST, "/v1/completions", completion(prompt))
        .unwrap();
    let mut req = harness::client::with_header(req, tenant_header, tenant).unwrap();
    if let Some(ms) = slo_ms {
        req = harness::client::with_header(req, "x-llm-d-slo-ttft-ms", &ms.to_string()).unwrap();
    }
    req
}

/// [`release_order`] with each request's tenant sent in `tenant_header`, after one request of
/// each tenant in `served_first` has been served (the pod not yet saturated).
async fn release_order_by(
    tenant_header: &'static str,
    served_first: &[&str],
    plugins: &str,
    band: &str,
    requests: &[(&str, Option<u32>)],
) -> Vec<String> {
    let pod = SimPod::named("pod-0").await.unwrap();
    let config = flow_config(plugins, band);
    let flags = [
        "--static-endpoints",
        &pod.endpoint(),
        "--secure-serving=false",
    ];
    let more = ["--config-text", &config, "--allow-experimental-plugins"];
    let epp = Epp::start(&args(&[&flags[..], &more[..]].concat()))
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{config}"));
    let envoy = EnvoyConfig::new(Template::Duplex)
        .epp(epp.grpc)
        .pool([pod.addr()])
        .start()
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let addr = envoy.listener_addr();
    for tenant in served_first {
        let req = tenant_request(
            "one two three four five six seven eight",
            tenant_header,
            tenant,
            None,
        );
        let r = harness::client::send(addr, req).await.unwrap();
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
    if let Some(last) = served_first.last() {
        wait_for_metrics(&epp, "the served tenants' attained service", |t| {
            let labels = [("program_id", *last)];
            sample(
                t,
                "llm_d_epp_program_aware_attained_service_tokens",
                &labels,
            )
            .is_some_and(|v| v > 0.0)
        })
        .await;
    }
    let served = traffic(&pod).len();
    pod.hook().set_waiting(Some(50));
    wait_queue(&epp, 50.0).await;
    let mut waiting = tokio::task::JoinSet::new();
    for (n, (tenant, slo)) in requests.iter().enumerate() {
        let tag = slo.map_or_else(|| (*tenant).to_owned(), |ms| format!("{tenant}{ms}"));
        let req = tenant_request(&format!("request {n}"), tenant_header, tenant, *slo);
        let req = harness::client::with_header(req, "x-test-tag", &tag).unwrap();
        waiting.spawn(async move { harness::client::send(addr, req).await.unwrap() });
        wait_queued(&epp, n + 1).await;
    }
    assert_eq!(traffic(&pod).len(), served, "all wait in epp");
    pod.hook().set_waiting(Some(4));
    while let Some(done) = waiting.join_next().await {
        let r = done.unwrap();
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
    let order = traffic(&pod)[served..]
        .iter()
        .map(|r| r.header("x-test-tag").unwrap_or_default().to_owned())
        .collect();
    drop(envoy);
    epp.stop().await;
    pod.shutdown().await;
    order
}

/// A band's fairness policy through Envoy, three requests of tenant `a` queued before one of
/// `b`: upstream's default releases the band's oldest request first whatever its tenant;
/// `round-robin-fairness-policy` lets `b`'s one request pass `a`'s backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bands_fairness_policy_orders_the_tenants_released() {
    let queued = [("a", None), ("a", None), ("a", None), ("b", None)];
    assert_eq!(
        release_order("", "", &queued).await,
        ["a", "a", "a", "b"],
        "global strict (default): oldest first"
    );
    assert_eq!(
        release_order(
            "- {name: fair, type: round-robin-fairness-policy}\n",
            "fairnessPolicyRef: fair",
            &queued
        )
        .await,
        ["a", "b", "a", "a"],
        "round robin: the tenants in turn"
    );
}

/// `slo-deadline-ordering-policy` through Envoy: of one tenant's requests queued without an SLO,
/// with `x-llm-d-slo-ttft-ms: 900` and with 100, the 100 ms one is released first, the one
/// without an SLO last; `edf-ordering-policy` keeps arrival order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slo_deadline_ordering_releases_the_earliest_deadline_first() {
    let queued = [("a", None), ("a", Some(900)), ("a", Some(100))];
    assert_eq!(
        release_order(
            "- {name: slo, type: slo-deadline-ordering-policy}\n",
            "orderingPolicyRef: slo",
            &queued
        )
        .await,
        ["a100", "a900", "a"]
    );
    assert_eq!(
        release_order(
            "- {type: edf-ordering-policy}\n",
            "orderingPolicyRef: edf-ordering-policy",
            &queued
        )
        .await,
        ["a", "a900", "a100"]
    );
}

/// llm-d's `agent-identity`: with no fairness header, a request's Claude Code session
/// (`x-claude-code-session-id`) is its fairness key, so round robin takes the sessions in
/// turn; without the plugin all four share `default-flow` and leave in arrival order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_identity_makes_each_agent_session_a_fairness_key() {
    let queued = [("a", None), ("a", None), ("a", None), ("b", None)];
    let round_robin = "- {name: fair, type: round-robin-fairness-policy}\n";
    assert_eq!(
        release_order_by(
            "x-claude-code-session-id",
            &[],
            &format!("{round_robin}- {{type: agent-identity}}\n"),
            "fairnessPolicyRef: fair",
            &queued
        )
        .await,
        ["a", "b", "a", "a"]
    );
    assert_eq!(
        release_order_by(
            "x-claude-code-session-id",
            &[],
            round_robin,
            "fairnessPolicyRef: fair",
            &queued
        )
        .await,
        ["a", "a", "a", "b"]
    );
}

/// llm-d's `program-aware-fairness` through Envoy: tenant `a` has been served (its tokens
/// counted, `llm_d_epp_program_aware_attained_service_tokens`), `b` not; of `a`, `a`, `b`
/// queued in that order, `b`, the least served, is released first. Upstream's default
/// releases them in arrival order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn program_aware_fairness_releases_the_least_served_tenant_first() {
    let queued = [("a", None), ("a", None), ("b", None)];
    assert_eq!(
        release_order_by(
            TENANT,
            &["a"],
            "- {type: program-aware-fairness}\n",
            "fairnessPolicyRef: program-aware-fairness",
            &queued
        )
        .await,
        ["b", "a", "a"]
    );
    assert_eq!(release_order("", "", &queued).await, ["a", "a", "b"]);
}

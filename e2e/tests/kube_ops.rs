//! Operations against a real kube-apiserver (e2e/harness/src/kube_apiserver.rs):
//! - readiness follows Kubernetes discovery: NOT_SERVING while the API server is unreachable at
//!   start-up, SERVING once the pool and pods are listed, NOT_SERVING again when the server
//!   stays unreachable beyond `--kube-api-unreachable-grace` (a network cut through a proxy, so
//!   the shared server keeps serving the other tests), SERVING again when it answers; and the
//!   same with a server of the test's own killed (SIGKILL) and restarted;
//! - a ServiceAccount without the leader-election Role: every refused Lease request is counted
//!   in `epp_kubernetes_forbidden_total{resource="leases"}`, epp keeps running and routing data
//!   stays current, and it never reports ready (it cannot lead);
//! - `/metrics` behind TokenReview + SubjectAccessReview (the default in Kubernetes mode) with
//!   the chart's RBAC: 401 without or with a bad token, 403 for a ServiceAccount without the
//!   `/metrics` grant (and for a path it was not granted), 200 for one bound to a ClusterRole
//!   granting it; answers are cached (a revoked grant is still honoured within the cache TTL);
//!   without the chart's grant to create reviews, a token not cached yet is a 500.
//!
//! Needs hack/install-kube.sh and the Helm venv (hack/helm/venv.sh, created on first use).
#![allow(clippy::unwrap_used)]

use crate::k8s_support;
use crate::kube_support;

use harness::kube_apiserver::{KubeApiServer, TestNamespace};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams};
use kube_support::*;
use serde_json::json;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Waits (bounded) until readiness is `want`; how long it took.
async fn wait_ready(epp: &k8s_support::Epp, want: bool, within: Duration) -> Duration {
    let start = Instant::now();
    while epp.is_ready().await != want {
        assert!(
            start.elapsed() < within,
            "readiness did not become {want} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_discovery_and_the_api_server_being_reachable() {
    let (server, ns) = setup("ops-ready").await;
    create(&ns, pool(&[8000])).await;
    ready_pod(&ns, "pod-0", "127.0.0.2").await;
    ready_pod(&ns, "pod-1", "127.0.0.3").await;
    let token = server.mint_token(&ns.name, "default").await.unwrap();
    grant_discovery(&ns).await;
    // Unreachable from the start: the proxy is cut before epp starts.
    let (via, target) = Proxy::start(server.addr()).await.cut().await;
    let epp = k8s_support::Epp::start_with(
        &ns.name,
        |path| token_kubeconfig_via(server, &ns, &token, via, path),
        &["--pool-name", "pool", "--kube-api-unreachable-grace", "1s"],
    )
    .await;
    for _ in 0..10 {
        assert!(
            !epp.is_ready().await,
            "ready without ever reaching the API server"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let proxy = Proxy::restore(via, target).await;
    let first = wait_ready(&epp, true, Duration::from_secs(30)).await;
    epp.wait_endpoints(2, Duration::from_secs(5)).await;

    // A cut beyond the grace: NOT_SERVING, the last known endpoints kept.
    let cut = Instant::now();
    let (via, target) = proxy.cut().await;
    wait_ready(&epp, false, Duration::from_secs(20)).await;
    let unready = cut.elapsed();
    assert!(
        unready >= Duration::from_secs(1),
        "NOT_SERVING after {unready:?}, before the 1 s grace"
    );
    assert_eq!(
        epp.ready_pods().await,
        Some(2),
        "the last known state stays"
    );
    let proxy = Proxy::restore(via, target).await;
    let back = wait_ready(&epp, true, Duration::from_secs(20)).await;
    println!(
        "measured: ready {first:?} after the API server became reachable; NOT_SERVING {unready:?} after a cut (grace 1 s); SERVING {back:?} after it was restored"
    );

    // The pool deleted: not synced any more (upstream's PoolHasSynced).
    let pools: Api<kube::api::DynamicObject> = Api::namespaced_with(
        ns.client.clone(),
        &ns.name,
        &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            "inference.networking.k8s.io",
            "v1",
            "InferencePool",
        )),
    );
    pools
        .delete("pool", &DeleteParams::default())
        .await
        .unwrap();
    wait_ready(&epp, false, Duration::from_secs(20)).await;
    epp.stop().await;
    proxy.cut().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_turns_not_serving_while_the_api_server_is_stopped_and_back_after_its_restart() {
    // A server of this test's own: stopping the shared one would break the tests beside it.
    let server = KubeApiServer::start().await.unwrap();
    install_crds(&server).await;
    let ns = server.namespace("ops-stop").await.unwrap();
    create(&ns, pool(&[8000])).await;
    ready_pod(&ns, "pod-0", "127.0.0.2").await;
    let epp = k8s_support::Epp::start_with(
        &ns.name,
        |path| server.admin_kubeconfig(path, &ns.name).unwrap(),
        &["--pool-name", "pool", "--kube-api-unreachable-grace", "1s"],
    )
    .await;
    wait_ready(&epp, true, Duration::from_secs(30)).await;
    let killed = Instant::now();
    server.stop_apiserver(true);
    wait_ready(&epp, false, Duration::from_secs(20)).await;
    let unready = killed.elapsed();
    assert!(
        unready >= Duration::from_secs(1),
        "before the grace: {unready:?}"
    );
    assert_eq!(
        epp.ready_pods().await,
        Some(1),
        "the last known state stays"
    );
    let restarted = Instant::now();
    server.start_apiserver().await.unwrap();
    let up = restarted.elapsed();
    let back = wait_ready(&epp, true, Duration::from_secs(30)).await;
    println!("measured: NOT_SERVING {unready:?} after SIGKILL (grace 1 s); API server restarted in {up:?}, SERVING {back:?} after it was ready");
    epp.stop().await;
}

/// Grants the namespace's `default` ServiceAccount what discovery reads (as the chart's Role).
async fn grant_discovery(ns: &TestNamespace) {
    create(
        ns,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "discovery"},
               "rules": [
                   {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
                   {"apiGroups": ["inference.networking.k8s.io", "inference.networking.x-k8s.io"],
                    "resources": ["inferencepools", "inferencemodels", "inferenceobjectives", "inferencemodelrewrites"],
                    "verbs": ["get", "list", "watch"]}
               ]}),
    )
    .await;
    create(
        ns,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "discovery"},
               "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": ns.name}],
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "discovery"}}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_lease_is_counted_and_logged_not_fatal() {
    let (server, ns) = setup("ops-lease").await;
    // One replica: the chart renders no leader-election Role.
    install_chart(&ns, "llama", &chart_values(8000, json!({}))).await;
    ready_pod(&ns, "pod-0", "127.0.0.2").await;
    let dir = TempDir::new("epp-lease");
    let kubeconfig = dir.0.join("sa.kubeconfig");
    sa_kubeconfig(server, &ns, "llama-epp", &kubeconfig).await;
    let epp = k8s_support::Epp::start_with(
        &ns.name,
        |path| std::fs::copy(&kubeconfig, path).map(drop).unwrap(),
        &[
            "--pool-name",
            "llama",
            "--ha-enable-leader-election",
            "--ha-retry-period",
            "100ms",
        ],
    )
    .await;
    epp.wait_endpoints(1, Duration::from_secs(20)).await;
    let line = r#"epp_kubernetes_forbidden_total{resource="leases",verb="get"}"#;
    let deadline = Instant::now() + Duration::from_secs(20);
    while epp.metric(line).await.is_none_or(|n| n < 3.0) {
        assert!(
            Instant::now() < deadline,
            "refused lease requests not counted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Still running and following the cluster: a new pod is discovered.
    ready_pod(&ns, "pod-1", "127.0.0.3").await;
    epp.wait_endpoints(2, Duration::from_secs(20)).await;
    assert!(
        !epp.is_ready().await,
        "a replica that cannot lead is not ready"
    );
    epp.stop().await;
}

/// `GET path` on the metrics port with an optional bearer token: (status, body).
async fn get_as(metrics: SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    let mut req = harness::client::request(http::Method::GET, path, bytes::Bytes::new()).unwrap();
    if let Some(token) = token {
        req =
            harness::client::with_header(req, "authorization", &format!("Bearer {token}")).unwrap();
    }
    let r = harness::client::send(metrics, req).await.unwrap();
    (r.status.as_u16(), r.text())
}

/// A ClusterRole granting `get` on /metrics, bound to ServiceAccount `sa` of `ns`; the binding's name.
async fn grant_metrics(server: &KubeApiServer, ns: &TestNamespace, sa: &str) -> String {
    let admin = server.admin_client("default").await.unwrap();
    let name = format!("{}-metrics-reader", ns.name);
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": name},
        "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    }))
    .unwrap();
    Api::<ClusterRole>::all(admin.clone())
        .create(&Default::default(), &role)
        .await
        .unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns.name}],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(admin)
        .create(&Default::default(), &binding)
        .await
        .unwrap();
    name
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_a_token_the_api_server_authenticates_and_authorizes() {
    let (server, ns) = setup("ops-auth").await;
    install_chart(&ns, "llama", &chart_values(8000, json!({}))).await;
    ready_pod(&ns, "pod-0", "127.0.0.2").await;
    for sa in ["reader", "stranger"] {
        server
            .create_service_account(&ns.client, &ns.name, sa)
            .await
            .unwrap();
    }
    let reader_grant = grant_metrics(server, &ns, "reader").await;
    let dir = TempDir::new("epp-auth");
    let kubeconfig = dir.0.join("sa.kubeconfig");
    sa_kubeconfig(server, &ns, "llama-epp", &kubeconfig).await;
    // epp as the chart's ServiceAccount, with upstream's default (no --metrics-endpoint-auth).
    let args: Vec<String> = [
        "--secure-serving=false",
        "--pool-name",
        "llama",
        "--pool-namespace",
        &ns.name,
        "--kubeconfig",
        &kubeconfig.display().to_string(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let epp = harness::stack::Epp::start(&args).await.unwrap();
    let reader = server.mint_token(&ns.name, "reader").await.unwrap();
    let stranger = server.mint_token(&ns.name, "stranger").await.unwrap();

    assert_eq!(
        get_as(epp.metrics, "/metrics", None).await,
        (401, "Unauthorized\n".into())
    );
    assert_eq!(
        get_as(epp.metrics, "/metrics", Some("not-a-token")).await.0,
        401
    );
    let (status, body) = get_as(epp.metrics, "/metrics", Some(&stranger)).await;
    assert_eq!(
        (status, body.trim()),
        (
            403,
            format!(
                "Authorization denied for user system:serviceaccount:{}:stranger",
                ns.name
            )
            .as_str()
        )
    );
    let (status, body) = get_as(epp.metrics, "/metrics", Some(&reader)).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("inference_pool_ready_pods"), "{body}");
    assert_eq!(
        get_as(epp.metrics, "/debug/snapshot", Some(&reader))
            .await
            .0,
        403,
        "the grant names /metrics only"
    );
    // Cached: a revoked grant is honoured until the allow TTL (5 minutes) runs out.
    Api::<ClusterRoleBinding>::all(server.admin_client("default").await.unwrap())
        .delete(&reader_grant, &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(get_as(epp.metrics, "/metrics", Some(&reader)).await.0, 200);
    let (_, text) = get_as(epp.metrics, "/metrics", Some(&reader)).await;
    for (outcome, at_least) in [
        ("allowed", 3.0),
        ("unauthenticated", 2.0),
        ("forbidden", 2.0),
    ] {
        let line = format!(r#"epp_metrics_auth_requests_total{{outcome="{outcome}"}}"#);
        let n: f64 = text
            .lines()
            .find(|l| l.starts_with(&line))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {line} in {text}"));
        assert!(n >= at_least, "{line} {n}");
    }
    // epp without the chart's review grant: a token not cached yet cannot be reviewed (500).
    server
        .create_service_account(&ns.client, &ns.name, "late")
        .await
        .unwrap();
    let late = server.mint_token(&ns.name, "late").await.unwrap();
    let chart_grant = format!("{}-llama-epp-metrics-auth", ns.name);
    Api::<ClusterRoleBinding>::all(server.admin_client("default").await.unwrap())
        .delete(&chart_grant, &DeleteParams::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = get_as(epp.metrics, "/metrics", Some(&late)).await;
        if status == 500 {
            assert_eq!(body, "Authentication failed\n");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still {status} without the review grant"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The refusal is counted like every other RBAC refusal (read with the reader's cached answer).
    let (status, text) = get_as(epp.metrics, "/metrics", Some(&reader)).await;
    assert_eq!(status, 200, "{text}");
    assert!(
        text.contains(r#"epp_kubernetes_forbidden_total{resource="tokenreviews",verb="create"}"#),
        "{text}"
    );
    epp.stop().await;
}

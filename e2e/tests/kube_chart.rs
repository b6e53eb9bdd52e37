//! The Helm chart against a real kube-apiserver: its default rendering is accepted (every object
//! validated and admitted by the real server), epp runs as the chart's ServiceAccount with a
//! minted token, discovers the pool and its pods and routes through a real Envoy, and the
//! server refuses what the chart does not grant (least privilege). Needs hack/install-kube.sh,
//! hack/install-envoy.sh and the Helm venv (hack/helm/venv.sh, created on first use).
#![allow(clippy::unwrap_used)]

use crate::k8s_support;
use crate::kube_support;

use harness::kube_apiserver::KubeApiServer;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, ListParams, PostParams};
use kube_support::*;
use serde_json::json;
use std::collections::BTreeSet;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_installs_and_epp_routes_as_its_service_account_with_least_privilege() {
    let (server, ns) = setup("chart").await;
    let (port, pods) = sim_pods(2).await;
    let objects = install_chart(&ns, "llama", &chart_values(port, json!({}))).await;
    let kinds: BTreeSet<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
    for kind in [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Service",
        "Deployment",
        "InferencePool",
    ] {
        assert!(
            kinds.contains(kind),
            "the chart rendered no {kind}: {kinds:?}"
        );
    }
    let sa = objects
        .iter()
        .find(|o| o["kind"] == "ServiceAccount")
        .and_then(|o| o["metadata"]["name"].as_str())
        .unwrap();
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    assert_eq!(
        deployment["spec"]["template"]["spec"]["serviceAccountName"], sa,
        "epp's pods run as the chart's ServiceAccount"
    );

    ready_pod(&ns, "pod-0", "127.0.0.2").await;
    ready_pod(&ns, "pod-1", "127.0.0.3").await;
    let dir = TempDir::new("epp-chart");
    let kubeconfig = dir.0.join("sa.kubeconfig");
    sa_kubeconfig(server, &ns, sa, &kubeconfig).await;
    let epp = k8s_support::Epp::start_with(
        &ns.name,
        |path| std::fs::copy(&kubeconfig, path).map(drop).unwrap(),
        &["--pool-name", "llama"],
    )
    .await;
    epp.wait_endpoints(2, Duration::from_secs(20)).await;
    let envoy = envoy(epp.grpc, &pods).await;
    wait_served(&envoy, &["pod-0", "pod-1"]).await;

    let as_sa = KubeApiServer::client_from(&kubeconfig).await.unwrap();
    assert_least_privilege(&as_sa, &ns.name).await;

    drop(envoy);
    epp.stop().await;
    for p in pods {
        p.shutdown().await;
    }
}

/// What the chart's Role grants (read pods and the inference CRDs of the release namespace) and
/// its `/metrics` auth ClusterRole grants (create TokenReviews) works; everything else is refused
/// by the server with 403.
async fn assert_least_privilege(client: &kube::Client, ns: &str) {
    let lp = ListParams::default();
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .expect("the chart grants list pods");
    let review = k8s_openapi::api::authentication::v1::TokenReview {
        spec: k8s_openapi::api::authentication::v1::TokenReviewSpec {
            token: "not-a-token".into(),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<k8s_openapi::api::authentication::v1::TokenReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("the chart grants create tokenreviews (metrics auth)");
    assert_ne!(answer.status.and_then(|s| s.authenticated), Some(true));
    let forbidden = |what: &str, r: Result<(), kube::Error>| {
        let (code, message) = rejection(r);
        assert_eq!(code, 403, "{what}: {message}");
    };
    forbidden(
        "list secrets",
        Api::<Secret>::namespaced(client.clone(), ns)
            .list(&lp)
            .await
            .map(drop),
    );
    forbidden(
        "list pods of another namespace",
        Api::<Pod>::namespaced(client.clone(), "default")
            .list(&lp)
            .await
            .map(drop),
    );
    forbidden(
        "list pods cluster-wide",
        Api::<Pod>::all(client.clone()).list(&lp).await.map(drop),
    );
    forbidden(
        "list cluster roles",
        Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(client.clone())
            .list(&lp)
            .await
            .map(drop),
    );
    forbidden(
        "create a pod",
        Api::<Pod>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &pod("intruder", json!({})))
            .await
            .map(drop),
    );
    forbidden(
        "get leases with one replica (no leader election)",
        Api::<Lease>::namespaced(client.clone(), ns)
            .list(&lp)
            .await
            .map(drop),
    );
}

/// A ServiceAccount without the chart's Role: every watch is refused, and epp says which
/// permission is missing (counted per resource and verb) instead of crashing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_counted_by_resource_and_verb_when_the_role_is_missing() {
    let (server, ns) = setup("chart-norbac").await;
    create(&ns, pool(&[8000])).await;
    server
        .create_service_account(&ns.client, &ns.name, "nobody")
        .await
        .unwrap();
    let dir = TempDir::new("epp-norbac");
    let kubeconfig = dir.0.join("sa.kubeconfig");
    sa_kubeconfig(server, &ns, "nobody", &kubeconfig).await;
    let epp = k8s_support::Epp::start_with(
        &ns.name,
        |path| std::fs::copy(&kubeconfig, path).map(drop).unwrap(),
        &["--pool-name", "pool"],
    )
    .await;
    for resource in ["pods", "inferencepools", "inferenceobjectives"] {
        let line =
            format!(r#"epp_kubernetes_forbidden_total{{resource="{resource}",verb="list"}}"#);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while epp.metric(&line).await.is_none_or(|n| n < 1.0) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no refusal counted for {resource}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert_ne!(epp.ready_pods().await, Some(1), "nothing was discovered");
    epp.stop().await;
}

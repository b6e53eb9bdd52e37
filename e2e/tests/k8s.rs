//! epp's Kubernetes mode against the fake API server, for what a real one cannot show: objects
//! that break the CRDs' CEL rules (a real server never admits them, but they exist when stored
//! before the rule, or written around validation) are ignored and counted; and history that
//! changes while the server is unreachable, then is compacted, so epp must re-list after
//! `410 Gone`. Everything else (pods, pools, objectives, rewrites, shedding, restarts, leader
//! election, RBAC) runs against a real kube-apiserver: e2e/tests/kube_*.rs.
#![allow(clippy::unwrap_used)]

use crate::k8s_support;

use harness::fake_apiserver::FakeApiServer;
use k8s_support::*;
use serde_json::json;
use std::time::Duration;

const WITHIN: Duration = Duration::from_secs(15);

/// Objects a real API server would reject for their CEL rules are ignored (the pool with a
/// duplicate port, a renamed InferenceModel) and counted; fixing them takes effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_breaking_the_crd_validation_rules_are_ignored_and_counted() {
    let api = FakeApiServer::bind().await.unwrap();
    let client = api.client(NS).unwrap();
    create(&client, pool(&[8000, 8000])).await;
    create_pod(&client, "a", "10.0.0.1").await;
    create(&client, json!({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceModel",
        "metadata": {"name": "food", "namespace": NS},
        "spec": {"modelName": "food", "poolRef": {"name": "pool"}, "targetModels": [{"name": "food-v2"}]}
    }))
    .await;
    let epp = Epp::start(&api, &["--pool-name", "pool"]).await;
    let pool_failures =
        r#"epp_crd_validation_failures_total{kind="InferencePool",rule="target-ports-unique"}"#;
    let deadline = tokio::time::Instant::now() + WITHIN;
    while epp.metric(pool_failures).await.is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the duplicate-port pool was never rejected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_ne!(
        epp.ready_pods().await,
        Some(2),
        "a rejected pool selects nothing"
    );
    patch(
        &client,
        "inference.networking.k8s.io/v1",
        "InferencePool",
        "pool",
        json!({"spec": {"targetPorts": [{"number": 8000}, {"number": 8001}]}}),
    )
    .await;
    epp.wait_endpoints(2, WITHIN).await;
    let deadline = tokio::time::Instant::now() + WITHIN;
    while send(epp.grpc, "food", &[]).await.model().as_deref() != Some("food-v2") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the InferenceModel never took effect"
        );
    }
    patch(
        &client,
        "inference.networking.x-k8s.io/v1alpha2",
        "InferenceModel",
        "food",
        json!({"spec": {"modelName": "drink"}}),
    )
    .await;
    let renamed =
        r#"epp_crd_validation_failures_total{kind="InferenceModel",rule="model-name-immutable"}"#;
    let deadline = tokio::time::Instant::now() + WITHIN;
    while epp.metric(renamed).await.is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the rename was never rejected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        send(epp.grpc, "food", &[]).await.model().as_deref(),
        Some("food-v2"),
        "the previous version stays"
    );
    assert_eq!(
        send(epp.grpc, "drink", &[]).await.model().as_deref(),
        Some("drink"),
        "the rename did not apply"
    );
    epp.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epp_recovers_when_the_api_server_restarts_and_history_is_gone() {
    let api = FakeApiServer::bind().await.unwrap();
    let client = api.client(NS).unwrap();
    create(&client, pool(&[8000])).await;
    create_pod(&client, "a", "10.0.0.1").await;
    let epp = Epp::start(&api, &["--pool-name", "pool"]).await;
    epp.wait_endpoints(1, WITHIN).await;
    let (addr, store) = api.stop().await;
    // While the server is down: a pod goes away, another arrives, and the history is compacted,
    // so resuming the watch from the old resourceVersion answers 410 Gone and epp must re-list.
    let key = |name: &str| harness::fake_apiserver::Key {
        collection: "api/v1/pods".into(),
        namespace: NS.into(),
        name: name.into(),
    };
    store.delete(key("a")).unwrap();
    store
        .create(
            key("b"),
            serde_json::to_value(pod("b", "10.0.0.2")).unwrap(),
        )
        .unwrap();
    store
        .create(
            key("c"),
            serde_json::to_value(pod("c", "10.0.0.3")).unwrap(),
        )
        .unwrap();
    store.compact();
    let api =
        FakeApiServer::start(tokio::net::TcpListener::bind(addr).await.unwrap(), store).unwrap();
    epp.wait_endpoints(2, Duration::from_secs(40)).await;
    let client = api.client(NS).unwrap();
    create_pod(&client, "d", "10.0.0.4").await;
    epp.wait_endpoints(3, WITHIN).await;
    epp.stop().await;
}

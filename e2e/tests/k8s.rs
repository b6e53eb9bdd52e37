//! epp's Kubernetes mode against the fake API server (an unmodified `kube::Client` on both
//! sides): pods and the InferencePool drive the endpoint set, InferenceModelRewrites split
//! traffic, InferenceModels / InferenceObjectives decide who is shed under saturation, the API
//! server restarts mid-watch, and leader election leaves exactly one replica ready.
#![allow(clippy::unwrap_used)]

mod k8s_support;

use epp_e2e::fake_apiserver::FakeApiServer;
use epp_e2e::standin::{StandIn, StandInOptions};
use k8s_support::*;
use serde_json::json;
use std::time::Duration;

const WITHIN: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_come_and_go_and_the_endpoint_set_follows() {
    let api = FakeApiServer::bind().await.unwrap();
    let client = api.client(NS).unwrap();
    create(&client, pool(&[8000, 8001])).await;
    create_pod(&client, "a", "10.0.0.1").await;
    let epp = Epp::start(&api, &["--pool-name", "pool"]).await;
    epp.wait_endpoints(2, WITHIN).await;
    create_pod(&client, "b", "10.0.0.2").await;
    epp.wait_endpoints(4, WITHIN).await;
    let mut unready = pod("c", "10.0.0.3");
    unready
        .status
        .as_mut()
        .unwrap()
        .conditions
        .as_mut()
        .unwrap()[0]
        .status = "False".into();
    kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), NS)
        .create(&Default::default(), &unready)
        .await
        .unwrap();
    delete_pod(&client, "a").await;
    epp.wait_endpoints(2, WITHIN).await;
    let Outcome::Routed { destination, .. } = send(epp.grpc, "m", &[]).await else {
        panic!("not routed")
    };
    assert!(destination.starts_with("10.0.0.2:"), "{destination}");
    epp.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_90_10_canary_rewrite_splits_a_thousand_requests() {
    let api = FakeApiServer::bind().await.unwrap();
    let client = api.client(NS).unwrap();
    create(&client, pool(&[8000])).await;
    create_pod(&client, "a", "10.0.0.1").await;
    create(&client, json!({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceModelRewrite",
        "metadata": {"name": "canary", "namespace": NS},
        "spec": {"poolRef": {"name": "pool"}, "rules": [{"matches": [{"model": {"type": "Exact", "value": "food-review"}}],
                 "targets": [{"modelRewrite": "food-review-v1", "weight": 90}, {"modelRewrite": "food-review-v2", "weight": 10}]}]}
    }))
    .await;
    let epp = Epp::start(&api, &["--pool-name", "pool"]).await;
    epp.wait_endpoints(1, WITHIN).await;
    let deadline = tokio::time::Instant::now() + WITHIN;
    while send(epp.grpc, "food-review", &[]).await.model().as_deref() == Some("food-review") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the rewrite never took effect"
        );
    }
    let channel = connect(epp.grpc).await;
    let mut v2 = 0;
    for _ in 0..1000 {
        match send_on(channel.clone(), "food-review", &[])
            .await
            .model()
            .as_deref()
        {
            Some("food-review-v1") => {}
            Some("food-review-v2") => v2 += 1,
            other => panic!("unexpected model {other:?}"),
        }
    }
    assert!(
        (70..=130).contains(&v2),
        "v2 got {v2} of 1000, expected about 100"
    );
    epp.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sheddable_models_are_shed_under_saturation_and_critical_ones_are_served() {
    let api = FakeApiServer::bind().await.unwrap();
    let client = api.client(NS).unwrap();
    let server = StandIn::start(
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        StandInOptions::named("a"),
    )
    .unwrap();
    create(&client, pool(&[server.addr().port()])).await;
    create_pod(&client, "a", "127.0.0.1").await;
    for (name, crit) in [("batch", "Sheddable"), ("chat", "Critical")] {
        create(
            &client,
            json!({
                "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceModel",
                "metadata": {"name": name, "namespace": NS},
                "spec": {"modelName": name, "criticality": crit, "poolRef": {"name": "pool"}}
            }),
        )
        .await;
    }
    create(&client, json!({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceObjective",
        "metadata": {"name": "background", "namespace": NS}, "spec": {"priority": -10, "poolRef": {"name": "pool"}}
    }))
    .await;
    let epp = Epp::start(&api, &["--pool-name", "pool"]).await;
    epp.wait_endpoints(1, WITHIN).await;
    server.set_waiting(Some(0));
    let status = |o: &Outcome| match o {
        Outcome::Routed { .. } => 200,
        Outcome::Rejected { status } => *status,
    };
    assert_eq!(
        eventually(
            || async { status(&send(epp.grpc, "batch", &[]).await) },
            200
        )
        .await,
        200,
        "idle pool serves sheddable work"
    );
    server.set_waiting(Some(50));
    assert_eq!(
        eventually(
            || async { status(&send(epp.grpc, "batch", &[]).await) },
            429
        )
        .await,
        429,
        "saturated pool sheds the Sheddable model"
    );
    assert_eq!(
        status(&send(epp.grpc, "chat", &[]).await),
        200,
        "Critical is never shed"
    );
    assert_eq!(
        status(&send(epp.grpc, "other", &[]).await),
        200,
        "priority 0 is never shed"
    );
    assert_eq!(
        status(
            &send(
                epp.grpc,
                "chat",
                &[("x-gateway-inference-objective", "background")]
            )
            .await
        ),
        429,
        "a negative objective is shed"
    );
    epp.stop().await;
}

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

/// Repeats `f` (bounded) until it returns `want`; returns the last value.
async fn eventually<F, Fut>(f: F, want: i32) -> i32
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = i32>,
{
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let got = f().await;
        if got == want || tokio::time::Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
    let key = |name: &str| epp_e2e::fake_apiserver::Key {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_with_leader_election_have_exactly_one_ready() {
    let api = FakeApiServer::bind().await.unwrap();
    let client = api.client(NS).unwrap();
    create(&client, pool(&[8000])).await;
    let args = [
        "--pool-name",
        "pool",
        "--ha-enable-leader-election",
        "--ha-lease-duration",
        "2s",
        "--ha-renew-deadline",
        "1500ms",
        "--ha-retry-period",
        "200ms",
    ];
    let one = Epp::start(&api, &args).await;
    let two = Epp::start(&api, &args).await;
    let deadline = tokio::time::Instant::now() + WITHIN;
    let mut ready = (false, false);
    while tokio::time::Instant::now() < deadline {
        ready = (one.is_ready().await, two.is_ready().await);
        if ready.0 != ready.1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        ready.0 != ready.1,
        "exactly one replica must be ready, got {ready:?}"
    );
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            (one.is_ready().await, two.is_ready().await),
            ready,
            "leadership must be stable"
        );
    }
    let lease: k8s_openapi::api::coordination::v1::Lease =
        kube::Api::namespaced(client.clone(), NS)
            .get("epp-llm-pool.gateway-api-inference-extension.sigs.k8s.io")
            .await
            .unwrap();
    assert!(lease.spec.unwrap().holder_identity.is_some());
    let (leader, standby) = if ready.0 { (one, two) } else { (two, one) };
    leader.stop().await;
    let deadline = tokio::time::Instant::now() + WITHIN;
    while !standby.is_ready().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the standby never took over"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    standby.stop().await;
}

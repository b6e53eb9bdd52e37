//! epp's Kubernetes discovery against a real kube-apiserver, with traffic through a real Envoy:
//! pods are created with the pool's labels and their status is patched through `pods/status`
//! (as a kubelet would) with distinct 127.0.0.x IPs where inference-sim pods listen; the
//! traffic follows them becoming ready, unready, terminating and deleted. Data-parallel ranks
//! (several target ports), the v1alpha2 pool, and the objective CRDs (rewrites, shedding) on
//! real objects. Needs hack/install-kube.sh and hack/install-envoy.sh.
#![allow(clippy::unwrap_used)]

use crate::k8s_support;
use crate::kube_support;

use harness::sim_pod::{test_pod_config, SimPod};
use k8s_support::{send, send_on, Epp, Outcome};
use kube_support::*;
use serde_json::json;
use std::time::Duration;

const WITHIN: Duration = Duration::from_secs(20);

async fn epp_as_admin(
    server: &harness::kube_apiserver::KubeApiServer,
    ns: &harness::kube_apiserver::TestNamespace,
    args: &[&str],
) -> Epp {
    Epp::start_with(
        &ns.name,
        |path| server.admin_kubeconfig(path, &ns.name).unwrap(),
        args,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_follows_pods_becoming_ready_unready_terminating_and_deleted() {
    let (server, ns) = setup("pods-life").await;
    let (port, pods) = sim_pods(3).await;
    create(&ns, pool(&[port])).await;
    ready_pod(&ns, "pod-0", "127.0.0.2").await;
    ready_pod(&ns, "pod-1", "127.0.0.3").await;
    create_pod(&ns, "pod-2", json!({"app": "vllm"})).await;
    let epp = epp_as_admin(server, &ns, &["--pool-name", "pool"]).await;
    epp.wait_endpoints(2, WITHIN).await;
    let envoy = envoy(epp.grpc, &pods).await;
    wait_served(&envoy, &["pod-0", "pod-1"]).await;

    set_status(&ns, "pod-1", "127.0.0.3", false).await;
    epp.wait_endpoints(1, WITHIN).await;
    wait_served(&envoy, &["pod-0"]).await;

    set_status(&ns, "pod-2", "127.0.0.4", true).await;
    epp.wait_endpoints(2, WITHIN).await;
    wait_served(&envoy, &["pod-0", "pod-2"]).await;

    // Bound to a node and no kubelet to confirm: the pod stays, Terminating.
    delete_pod(&ns, "pod-0", Some(30)).await;
    epp.wait_endpoints(1, WITHIN).await;
    wait_served(&envoy, &["pod-2"]).await;
    delete_pod(&ns, "pod-0", None).await;

    set_status(&ns, "pod-1", "127.0.0.3", true).await;
    epp.wait_endpoints(2, WITHIN).await;
    wait_served(&envoy, &["pod-1", "pod-2"]).await;
    delete_pod(&ns, "pod-1", None).await;
    epp.wait_endpoints(1, WITHIN).await;
    wait_served(&envoy, &["pod-2"]).await;

    drop(envoy);
    epp.stop().await;
    for p in pods {
        p.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_target_port_of_a_pod_is_an_endpoint_data_parallel_ranks() {
    let (server, ns) = setup("pods-ranks").await;
    let base = harness::ports::free_range(2).unwrap();
    let mut ranks = Vec::new();
    for (i, port) in [base, base + 1].into_iter().enumerate() {
        let listener = tokio::net::TcpListener::bind(("127.0.0.2", port))
            .await
            .unwrap();
        let rank = SimPod::start(listener, test_pod_config(&format!("rank-{i}")));
        ranks.push(rank.await.unwrap());
    }
    create(&ns, pool(&[base, base + 1])).await;
    ready_pod(&ns, "dp", "127.0.0.2").await;
    let epp = epp_as_admin(server, &ns, &["--pool-name", "pool"]).await;
    epp.wait_endpoints(2, WITHIN).await;
    let envoy = envoy(epp.grpc, &ranks).await;
    wait_served(&envoy, &["rank-0", "rank-1"]).await;
    drop(envoy);
    epp.stop().await;
    for p in ranks {
        p.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v1alpha2_pool_selects_its_pods_too() {
    let (server, ns) = setup("pods-alpha").await;
    let (port, pods) = sim_pods(2).await;
    create(&ns, json!({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferencePool",
        "metadata": {"name": "pool"},
        "spec": {"selector": {"app": "vllm"}, "targetPortNumber": port, "extensionRef": {"name": "pool-epp"}}
    }))
    .await;
    ready_pod(&ns, "pod-0", "127.0.0.2").await;
    ready_pod(&ns, "pod-1", "127.0.0.3").await;
    let args = [
        "--pool-name",
        "pool",
        "--pool-group",
        "inference.networking.x-k8s.io",
    ];
    let epp = epp_as_admin(server, &ns, &args).await;
    epp.wait_endpoints(2, WITHIN).await;
    let envoy = envoy(epp.grpc, &pods).await;
    wait_served(&envoy, &["pod-0", "pod-1"]).await;
    drop(envoy);
    epp.stop().await;
    for p in pods {
        p.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_90_10_canary_rewrite_on_a_real_object_splits_a_thousand_requests() {
    let (server, ns) = setup("pods-canary").await;
    create(&ns, pool(&[8000])).await;
    ready_pod(&ns, "a", "10.0.0.1").await;
    create(&ns, json!({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceModelRewrite",
        "metadata": {"name": "canary"},
        "spec": {"poolRef": {"name": "pool"}, "rules": [{"matches": [{"model": {"type": "Exact", "value": "food-review"}}],
                 "targets": [{"modelRewrite": "food-review-v1", "weight": 90}, {"modelRewrite": "food-review-v2", "weight": 10}]}]}
    }))
    .await;
    let epp = epp_as_admin(server, &ns, &["--pool-name", "pool"]).await;
    epp.wait_endpoints(1, WITHIN).await;
    let deadline = tokio::time::Instant::now() + WITHIN;
    while send(epp.grpc, "food-review", &[]).await.model().as_deref() == Some("food-review") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the rewrite never took effect"
        );
    }
    let channel = k8s_support::connect(epp.grpc).await;
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
async fn sheddable_objectives_on_real_objects_are_shed_under_saturation() {
    let (server, ns) = setup("pods-shed").await;
    let pod = SimPod::named("a").await.unwrap();
    create(&ns, pool(&[pod.addr().port()])).await;
    ready_pod(&ns, "a", "127.0.0.1").await;
    create(&ns, json!({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceModel",
        "metadata": {"name": "batch"}, "spec": {"modelName": "batch", "criticality": "Sheddable", "poolRef": {"name": "pool"}}
    }))
    .await;
    create(&ns, json!({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceObjective",
        "metadata": {"name": "background"}, "spec": {"priority": -10, "poolRef": {"name": "pool"}}
    }))
    .await;
    let epp = epp_as_admin(server, &ns, &["--pool-name", "pool"]).await;
    epp.wait_endpoints(1, WITHIN).await;
    pod.hook().set_waiting(Some(50));
    let status = |o: Outcome| match o {
        Outcome::Routed { .. } => 200,
        Outcome::Rejected { status } => status,
    };
    let deadline = tokio::time::Instant::now() + WITHIN;
    while status(send(epp.grpc, "batch", &[]).await) != 429 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the Sheddable model was never shed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status(send(epp.grpc, "other", &[]).await), 200);
    let objective = [("x-gateway-inference-objective", "background")];
    assert_eq!(status(send(epp.grpc, "chat", &objective).await), 429);
    epp.stop().await;
    pod.shutdown().await;
}

/// An llm-d v1.0 configuration that writes the resolved priority into the forwarded body.
const PROPAGATE_PRIORITY: &str = "apiVersion: llm-d.ai/v1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins: [{pluginRef: queue-scorer}]\nrequestHandler:\n  propagatePriority: true\n";

/// An InferencePool v1 `name` labelled `labels`, selecting the `app=vllm` pods on port 8000.
fn labelled_pool(name: &str, labels: serde_json::Value) -> serde_json::Value {
    let mut p = pool(&[8000]);
    p["metadata"] = json!({"name": name, "labels": labels});
    p
}

/// The priority epp at `grpc` gives a request naming `objective`, read from the body it forwards.
async fn priority_of(grpc: std::net::SocketAddr, objective: &str) -> Option<i64> {
    let header = [("x-gateway-inference-objective", objective)];
    match send(grpc, "chat", &header).await {
        Outcome::Routed { body, .. } => {
            serde_json::from_slice::<serde_json::Value>(&body).ok()?["priority"].as_i64()
        }
        Outcome::Rejected { status } => panic!("{objective}: rejected with {status}"),
    }
}

/// Waits (bounded) until epp gives each objective its expected priority.
async fn wait_priorities(epp: &Epp, pool: &str, want: &[(&str, i64)]) {
    let want: Vec<_> = want
        .iter()
        .map(|(o, p)| ((*o).to_owned(), Some(*p)))
        .collect();
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let mut got = Vec::new();
        for (objective, _) in &want {
            got.push((objective.clone(), priority_of(epp.grpc, objective).await));
        }
        if got == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{pool}: priorities {got:?}, expected {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One objective naming two pools in `poolRefs` and one selecting both by label set the
/// priority of requests at each pool's epp; objectives for other pools or labels do not, and a
/// pool relabelled out of a selector loses that objective.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_pool_objectives_set_the_priority_of_requests_for_two_pools() {
    let (server, ns) = setup("pods-multi-pool").await;
    create(
        &ns,
        labelled_pool("pool-a", json!({"tier": "gold", "zone": "east"})),
    )
    .await;
    create(
        &ns,
        labelled_pool("pool-b", json!({"tier": "gold", "zone": "west"})),
    )
    .await;
    ready_pod(&ns, "a", "10.0.0.1").await;
    let objective = |version: &str, name: &str, mut spec: serde_json::Value, priority: i64| {
        spec["priority"] = json!(priority);
        json!({
            "apiVersion": format!("inference.networking.x-k8s.io/{version}"), "kind": "InferenceObjective",
            "metadata": {"name": name}, "spec": spec
        })
    };
    let both = json!({"poolRefs": [{"name": "pool-a"}, {"name": "pool-b"}]});
    create(&ns, objective("v1", "shared", both, 7)).await;
    let gold = json!({"poolSelector": {"matchLabels": {"tier": "gold"}}});
    // Positive priorities: the pod reports no metrics, so the pool counts as saturated and a
    // negative priority would be shed.
    create(&ns, objective("v1", "gold", gold, 3)).await;
    let east = json!({"poolSelector": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["east"]}]}});
    create(&ns, objective("v1alpha2", "east", east, 5)).await;
    let elsewhere = json!({"poolRefs": [{"name": "pool-c"}]});
    create(&ns, objective("v1", "elsewhere", elsewhere, 9)).await;

    let args = |pool| ["--pool-name", pool, "--config-text", PROPAGATE_PRIORITY];
    let a = epp_as_admin(server, &ns, &args("pool-a")).await;
    let b = epp_as_admin(server, &ns, &args("pool-b")).await;
    a.wait_endpoints(1, WITHIN).await;
    b.wait_endpoints(1, WITHIN).await;
    let at_a = [("shared", 7), ("gold", 3), ("east", 5), ("elsewhere", 0)];
    wait_priorities(&a, "pool-a", &at_a).await;
    let at_b = [("shared", 7), ("gold", 3), ("east", 0), ("elsewhere", 0)];
    wait_priorities(&b, "pool-b", &at_b).await;

    create(
        &ns,
        labelled_pool("pool-b", json!({"tier": "silver", "zone": "west"})),
    )
    .await;
    let at_b = [("shared", 7), ("gold", 0), ("east", 0), ("elsewhere", 0)];
    wait_priorities(&b, "pool-b", &at_b).await;
    wait_priorities(&a, "pool-a", &at_a).await;
    a.stop().await;
    b.stop().await;
}

//! epp through a real Envoy in front of inference-sim pods (vLLM-faithful prefix caching and
//! queueing): prefix-aware routing must turn shared prompts into cache hits that round robin
//! over the same pods does not get.
#![allow(clippy::unwrap_used)] // integration tests: a failed unwrap is a failed test

use bytes::Bytes;
use harness::client;
use harness::envoy::{EnvoyConfig, Template};
use harness::stack::SimStack;
use inference_sim::{Cluster, EngineConfig, PodConfig};
use std::net::SocketAddr;

const GROUPS: usize = 3; // not a multiple of the pod count, so round robin cannot align groups to pods
const PER_GROUP: usize = 8;

fn engine() -> EngineConfig {
    EngineConfig {
        model: "m".into(),
        time_scale: 20.0,
        default_max_output: 4,
        ..EngineConfig::default()
    }
}

fn system_prompt(group: usize) -> String {
    format!("You are assistant number {group}. ")
        + &format!("Rule {group}: answer using the documentation of product {group}. ").repeat(120)
}

/// Sends the shared-prefix workload sequentially; returns (prompt tokens, cached tokens) and the
/// pods that served each group.
async fn workload(gateway: SocketAddr) -> (u64, u64, Vec<std::collections::BTreeSet<String>>) {
    let (mut prompt, mut cached) = (0, 0);
    let mut served = vec![std::collections::BTreeSet::new(); GROUPS];
    for q in 0..PER_GROUP {
        for (g, pods) in served.iter_mut().enumerate() {
            let body = serde_json::json!({"model": "m", "max_tokens": 4, "messages": [
                {"role": "system", "content": system_prompt(g)},
                {"role": "user", "content": format!("question {q} of group {g}")}]});
            let r = client::post_json(
                gateway,
                "/v1/chat/completions",
                Bytes::from(body.to_string()),
            )
            .await
            .unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
            let usage = r.json().unwrap()["usage"].clone();
            prompt += usage["prompt_tokens"].as_u64().unwrap();
            cached += usage["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap();
            pods.insert(r.header("x-inference-pod").unwrap().to_owned());
        }
    }
    (prompt, cached, served)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_aware_routing_beats_round_robin_on_cache_hits() {
    let stack = SimStack::start(
        4,
        engine(),
        Template::Duplex,
        &["--refresh-metrics-interval".into(), "20ms".into()],
        false,
    )
    .await
    .unwrap();
    let (prompt, cached, served) = workload(stack.envoy.listener_addr()).await;
    let epp_ratio = cached as f64 / prompt as f64;
    for pods in &served {
        assert_eq!(pods.len(), 1, "each group stays on one pod: {served:?}");
    }
    let metrics = stack.epp.metrics_text().await.unwrap();
    assert!(metrics.contains("inference_objective_prompt_cached_tokens_count{model_name=\"m\",target_model_name=\"m\"} 24"), "{metrics}");
    stack.stop().await;

    let pods: Vec<PodConfig> = (0..4)
        .map(|i| PodConfig {
            engine: engine(),
            pod_name: format!("rr-{i}"),
            prompt_tokens_details: true,
            ..Default::default()
        })
        .collect();
    let mut listeners = Vec::new();
    for _ in 0..4 {
        listeners.push(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let cluster = Cluster::start_on(pods, listeners).await.unwrap();
    let envoy = EnvoyConfig::new(Template::RoundRobin)
        .pool(cluster.addrs().iter().copied())
        .start()
        .await
        .unwrap();
    let (rr_prompt, rr_cached, rr_served) = workload(envoy.listener_addr()).await;
    let rr_ratio = rr_cached as f64 / rr_prompt as f64;
    assert!(
        rr_served.iter().all(|p| p.len() > 1),
        "round robin spreads groups: {rr_served:?}"
    );
    assert!(epp_ratio > 0.75, "epp cache-hit ratio {epp_ratio:.2}");
    assert!(
        epp_ratio > rr_ratio + 0.25,
        "epp {epp_ratio:.2} vs round robin {rr_ratio:.2}"
    );
    drop(envoy);
    cluster.shutdown().await;
}

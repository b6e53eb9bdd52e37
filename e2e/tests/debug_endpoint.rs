//! `GET /debug/snapshot` on the metrics port shows what the picker believes: the endpoints with
//! their scraped metrics and age, in-flight counts, the prefix index sizes and the active config.
#![allow(clippy::unwrap_used)] // integration tests: a failed unwrap is a failed test

use bytes::Bytes;
use harness::client;
use harness::sim_pod::test_pod_config;
use harness::stack::{Stack, StackOptions};
use std::time::{Duration, Instant};

const CONFIG: &str = r#"apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
"#;

async fn snapshot(stack: &Stack) -> serde_json::Value {
    let r = client::get(stack.epp.metrics, "/debug/snapshot")
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    r.json().unwrap()
}

/// Polls the snapshot until `ready` holds (bounded: 5 s).
async fn wait_for(
    stack: &Stack,
    what: &str,
    ready: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = snapshot(stack).await;
        if ready(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{what} not seen within 5 s:\n{s:#}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_snapshot_shows_endpoints_inflight_index_and_config() {
    // Every request waits 600 ms before the engine takes it (the added_latency fault).
    let mut pod_config = test_pod_config("pod");
    pod_config.faults.added_latency_ms = 600;
    let args = vec![
        "--config-text".to_owned(),
        CONFIG.to_owned(),
        "--refresh-metrics-interval".to_owned(),
        "20ms".to_owned(),
    ];
    let stack = Stack::start(StackOptions {
        pods: 2,
        epp_args: args,
        pod_config,
        ..StackOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    stack.pods[0].hook().set_waiting(Some(7));

    let first = stack.pods[0].endpoint();
    let s = wait_for(&stack, "pod-0's queue of 7", |s| {
        s["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["address"] == first.as_str() && e["metrics"]["waiting"] == 7.0)
    })
    .await;
    let endpoints = s["endpoints"].as_array().unwrap();
    assert_eq!(endpoints.len(), 2);
    for e in endpoints {
        let m = &e["metrics"];
        assert!(
            m["age_ms"].as_u64().unwrap() < 2000 && m["stale"] == false,
            "fresh metrics: {e}"
        );
        assert!(e["name"].is_string() && e["inflight"] == 0, "{e}");
    }
    assert_eq!(s["config"]["origin"], "--config-text");
    assert_eq!(s["config"]["text"], CONFIG);
    assert_eq!(s["prefix_index"]["approximate_blocks"], 0);
    assert_eq!(s["prefix_index"]["precise_entries"], 0);

    // A slow request is in flight while the snapshot is taken, and its prompt is indexed.
    let prompt = "a long shared system prompt for the prefix index ".repeat(40);
    let body = Bytes::from(
        serde_json::json!({"model": "test-model", "prompt": prompt, "max_tokens": 2}).to_string(),
    );
    let gateway = stack.envoy.listener_addr();
    let tracker = tokio_util::task::TaskTracker::new();
    let pending = tracker.spawn(async move {
        client::post_json(gateway, "/v1/completions", body)
            .await
            .unwrap()
    });
    let busy = wait_for(&stack, "one request in flight", |s| {
        s["inflight_total"] == 1
    })
    .await;
    assert!(
        busy["prefix_index"]["approximate_blocks"].as_u64().unwrap() > 0,
        "the routed prompt's blocks are indexed: {busy:#}"
    );
    assert_eq!(
        busy["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["inflight"] == 1)
            .count(),
        1
    );
    assert_eq!(pending.await.unwrap().status, 200);
    wait_for(&stack, "the request released", |s| s["inflight_total"] == 0).await;

    let missing = client::get(stack.epp.metrics, "/debug/nothing")
        .await
        .unwrap();
    assert_eq!(missing.status, 404);
    stack.stop().await;
}

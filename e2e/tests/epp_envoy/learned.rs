//! llm-d v0.11's traffic-learned hub scorers through Envoy: with no metric telling the pods
//! apart, `latency-observation-scorer-hub` learns from the streamed responses which pod is
//! slow, and then keeps requests off it; `mrl-scorer-hub` learns it from the sojourns.

use std::time::Duration;

use harness::stack::{Stack, StackOptions};

use super::support::{args, post, received_counts, served_by, slow_steps, start, MODEL};

/// Pod 1 takes 80 ms an engine step, pod 0 the test pods' few milliseconds.
const SLOW: usize = 1;

fn streamed(i: usize) -> String {
    serde_json::json!({
        "model": MODEL,
        "prompt": format!("request number {i}"),
        "max_tokens": 3,
        "stream": true,
    })
    .to_string()
}

async fn stack(plugins: &str, scorer: &str) -> Stack {
    let config = format!(
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n{plugins}- type: max-score-picker\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: {scorer}\n  - pluginRef: max-score-picker\n"
    );
    start(StackOptions {
        pods: 2,
        epp_args: args(&["--config-text", &config, "--allow-experimental-plugins"]),
        pod_overrides: vec![(SLOW, slow_steps(Duration::from_millis(80), &[]))],
        ..StackOptions::default()
    })
    .await
}

/// Sends sequential streamed requests until each pod has answered `per_pod` (at most
/// `budget`), then `n` more, and returns where those went.
async fn after_learning(stack: &Stack, per_pod: usize, budget: usize, n: usize) -> Vec<usize> {
    let mut sent = 0;
    while received_counts(stack).iter().any(|c| *c < per_pod) {
        assert!(
            sent < budget,
            "a pod never got traffic to learn from: {:?}",
            received_counts(stack)
        );
        served_by(
            stack,
            &post(stack, "/v1/completions", streamed(sent), &[]).await,
        );
        sent += 1;
    }
    let mut served = Vec::new();
    for i in 0..n {
        let response = post(stack, "/v1/completions", streamed(sent + i), &[]).await;
        served.push(served_by(stack, &response));
    }
    served
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_latency_observer_learns_the_slow_pod_and_the_scorer_avoids_it() {
    let plugins = "- type: latency-observer-producer-hub\n  name: observer\n  parameters: {minRequests: 3, intervalDuration: 10ms}\n- type: latency-observation-scorer-hub\n  name: ttft\n  parameters: {explorationRate: 0, ttftPercentilesProducerName: observer}\n";
    let stack = stack(plugins, "ttft").await;
    let served = after_learning(&stack, 3, 60, 10).await;
    assert!(
        served.iter().all(|p| *p != SLOW),
        "a request went to the slow pod after both were learned: {served:?}"
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sojourn_observer_learns_the_slow_pod_and_the_mrl_scorer_avoids_it() {
    let plugins = "- type: sojourn-time-observer-hub\n  parameters: {minSamples: 3}\n- type: mrl-scorer-hub\n  name: mrl\n  parameters: {explorationRate: 0}\n";
    let stack = stack(plugins, "mrl").await;
    // Sequential requests leave nothing in flight, so every residual is 0: a tie. A burst
    // of concurrent streams is where the residuals differ: one request just started on the
    // slow pod owes more than several on the fast one.
    let served = after_learning(&stack, 3, 60, 0).await;
    assert!(served.is_empty());
    let burst = (0..8).map(|i| post(&stack, "/v1/completions", streamed(1000 + i), &[]));
    let responses = futures::future::join_all(burst).await;
    let served: Vec<usize> = responses.iter().map(|r| served_by(&stack, r)).collect();
    assert!(
        served.iter().filter(|p| **p == SLOW).count() <= 2,
        "the slow pod took more than 2 of 8 concurrent requests: {served:?}"
    );
    stack.stop().await;
}

//! The estimated-TTFT scheduler (`config/examples/epp-ttft.yaml`) through Envoy, on issue 20's
//! symptom: sequential short chat requests that share their beginning with an earlier one. The
//! upstream default weighs `prefix 3 × ratio` against `queue 2 × min-max` and sends them all to
//! the pod holding that beginning although it reports a queue and another pod is idle; in time
//! units, a short match never pays for a queue of four requests.

use std::time::Duration;

use harness::stack::{Stack, StackOptions};

use super::support::{args, example_config, post, served_by, start, wait_for_scraped_queue, MODEL};

/// A chat request: a shared system message (about 70 tokens: several 16-token blocks) and a
/// short question of its own.
fn chat(i: usize) -> String {
    let system = super::support::words(7, 60);
    serde_json::json!({
        "model": MODEL,
        "max_tokens": 3,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": format!("question number {i}")},
        ],
    })
    .to_string()
}

async fn stack(config: &str) -> Stack {
    let config = example_config(config);
    start(StackOptions {
        pods: 2,
        epp_args: args(&[
            "--config-text",
            &config,
            "--refresh-metrics-interval",
            "20ms",
            "--refresh-prometheus-metrics-interval",
            "100ms",
            "--metrics-staleness-threshold",
            "2s",
        ]),
        ..StackOptions::default()
    })
    .await
}

/// Where the first request lands (the pod now holding the shared beginning), after which that
/// pod reports `queue` waiting requests; then where each of `n` sequential requests goes.
async fn routes_after_a_queue_on_the_holder(
    stack: &Stack,
    queue: u64,
    n: usize,
) -> (usize, Vec<usize>) {
    let first = post(stack, "/v1/chat/completions", chat(0), &[]).await;
    let holder = served_by(stack, &first);
    stack.pods[holder].hook().set_waiting(Some(queue));
    wait_for_scraped_queue(&stack.epp, &stack.pods[holder].endpoint(), queue as f64).await;
    let mut served = Vec::new();
    for i in 1..=n {
        let response = post(stack, "/v1/chat/completions", chat(i), &[]).await;
        served.push(served_by(stack, &response));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (holder, served)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_match_never_goes_behind_a_queue_four_deeper_than_an_idle_pod() {
    let stack = stack("epp-ttft.yaml").await;
    let (holder, served) = routes_after_a_queue_on_the_holder(&stack, 4, 12).await;
    assert!(
        served.iter().all(|p| *p != holder),
        "a request went to pod {holder}, which holds the shared beginning behind 4 queued requests, while the other pod was idle: {served:?}"
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_default_sends_them_behind_the_queue() {
    // The symptom the test above guards against: with weights, the prefix ratio wins.
    let stack = stack("upstream-default.yaml").await;
    let (holder, served) = routes_after_a_queue_on_the_holder(&stack, 20, 6).await;
    assert!(
        served.iter().all(|p| *p == holder),
        "expected the upstream default to stick to pod {holder} despite its queue of 20: {served:?}"
    );
    stack.stop().await;
}

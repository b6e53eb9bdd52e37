//! What epp's default scheduler does with real scraped metrics, seen through Envoy: a deep queue
//! repels traffic, long repeated prompts stick to the pod that has their prefix, and a pod whose
//! metrics stopped arriving is a last resort.

use harness::sim_pod::test_pod_config;
use harness::stack::StackOptions;
use inference_sim::MetricsMode;

use super::support::{
    access_log, args, completion, post, received_counts, sample, served_by, start, traffic,
    wait_for_metrics, wait_for_scraped_queue, words,
};

/// Fast scrapes and pool gauges, so tests can see what epp scraped.
fn fast_scrapes(staleness: &str) -> Vec<String> {
    args(&[
        "--refresh-metrics-interval",
        "20ms",
        "--refresh-prometheus-metrics-interval",
        "100ms",
        "--metrics-staleness-threshold",
        staleness,
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_with_a_deep_queue_gets_no_new_requests() {
    let stack = start(StackOptions {
        epp_args: fast_scrapes("2s"),
        ..StackOptions::default()
    })
    .await;
    stack.pods[0].hook().set_waiting(Some(50));
    wait_for_scraped_queue(&stack.epp, &stack.pods[0].endpoint(), 50.0).await;
    let mut served = [0usize; 3];
    for i in 0..30 {
        let response = post(
            &stack,
            "/v1/completions",
            completion(&format!("queue test {i}")),
            &[],
        )
        .await;
        served[served_by(&stack, &response)] += 1;
    }
    assert_eq!(
        served[0], 0,
        "the pod with 50 waiting was chosen: {served:?}"
    );
    assert!(
        served[1] > 0 && served[2] > 0,
        "the idle pods share the load: {served:?}"
    );
    assert_eq!(received_counts(&stack), served);
    let log = access_log(&stack, 30).await;
    let busy = stack.pods[0].endpoint();
    assert!(
        log.iter()
            .all(|e| e.upstream.as_deref() != Some(busy.as_str())),
        "{log:#?}"
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_long_prompts_stick_to_one_pod_and_distinct_ones_spread() {
    let stack = start(StackOptions::default()).await;
    // 2,500 words of the vocabulary are at least 2,500 tokens: over 150 prefix blocks.
    let prompt = completion(&words(1, 2_500));
    let mut sticky = Vec::new();
    for _ in 0..8 {
        let response = post(&stack, "/v1/completions", prompt.clone(), &[]).await;
        sticky.push(served_by(&stack, &response));
    }
    assert!(
        sticky.iter().all(|p| *p == sticky[0]),
        "the same long prompt moved between pods: {sticky:?}"
    );
    assert_eq!(traffic(&stack.pods[sticky[0]]).len(), 8);

    let mut spread = [0usize; 3];
    for seed in 100..109 {
        let response = post(
            &stack,
            "/v1/completions",
            completion(&words(seed, 2_500)),
            &[],
        )
        .await;
        spread[served_by(&stack, &response)] += 1;
    }
    assert!(
        spread.iter().filter(|n| **n > 0).count() >= 2,
        "distinct prompts all went to one pod: {spread:?}"
    );
    let log = access_log(&stack, 17).await;
    let home = stack.pods[sticky[0]].endpoint();
    assert!(
        log[..8]
            .iter()
            .all(|e| e.upstream.as_deref() == Some(home.as_str())),
        "{log:#?}"
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_metrics_go_stale_is_avoided_even_when_it_looks_idle() {
    let stack = start(StackOptions {
        epp_args: fast_scrapes("500ms"),
        ..StackOptions::default()
    })
    .await;
    for pod in &stack.pods[1..] {
        pod.hook().set_waiting(Some(5));
    }
    for pod in &stack.pods[1..] {
        wait_for_scraped_queue(&stack.epp, &pod.endpoint(), 5.0).await;
    }
    // While its metrics are fresh, the idle pod 0 is the best choice.
    for i in 0..3 {
        let response = post(
            &stack,
            "/v1/completions",
            completion(&format!("fresh {i}")),
            &[],
        )
        .await;
        assert_eq!(served_by(&stack, &response), 0);
    }
    stack.pods[0].hook().set_metrics_mode(MetricsMode::Error);
    // One stale endpoint, and the pool average over the fresh ones is 5: pods 1 and 2 are fresh,
    // so pod 0 is the stale one.
    let text = wait_for_metrics(&stack.epp, "pod 0 stale", |t| {
        sample(t, "epp_stale_endpoints", &[]) == Some(1.0)
            && sample(t, "inference_pool_average_queue_size", &[]) == Some(5.0)
    })
    .await;
    for i in 0..20 {
        let response = post(
            &stack,
            "/v1/completions",
            completion(&format!("stale {i}")),
            &[],
        )
        .await;
        assert_ne!(
            served_by(&stack, &response),
            0,
            "request {i} went to the stale pod"
        );
    }
    assert_eq!(traffic(&stack.pods[0]).len(), 3);
    let failed = sample(
        &text,
        "epp_metrics_scrapes_total",
        &[("outcome", "failure")],
    );
    assert!(
        failed.is_some_and(|n| n >= 1.0),
        "scrape failures are counted:\n{text}"
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_burst_spreads_over_the_pods_before_any_scrape_sees_it() {
    // Each answer waits 300 ms (the added_latency fault), so the burst is in flight at once; the
    // pods report no queue and epp scrapes them once at start-up only, so nothing but what epp
    // itself dispatched tells the pods apart.
    let mut pod_config = test_pod_config("pod");
    pod_config.faults.added_latency_ms = 300;
    let stack = start(StackOptions {
        pod_config,
        epp_args: args(&["--refresh-metrics-interval", "60s"]),
        ..StackOptions::default()
    })
    .await;
    let bodies: Vec<String> = (0..30).map(|i| completion(&format!("burst {i}"))).collect();
    let burst = bodies
        .iter()
        .map(|b| post(&stack, "/v1/completions", b.clone(), &[]));
    let responses = futures::future::join_all(burst).await;
    let mut served = [0usize; 3];
    for response in &responses {
        served[served_by(&stack, response)] += 1;
    }
    // Uniformly random picks would leave some pod outside 7..=13 in about a third of runs.
    assert!(
        served.iter().all(|n| (7..=13).contains(n)),
        "the burst was not spread: {served:?}"
    );
    assert_eq!(received_counts(&stack), served);
    stack.stop().await;
}

//! `prefix-cache-affinity-filter` (llm-d's optimized baseline) through a real Envoy, and its
//! counter `llm_d_epp_prefix_cache_affinity_filter_decisions_total` (llm-d-router v0.11): the
//! first request of a prompt finds no warm pod (`no_match`), the repeats stay on the pod that
//! served it (`sticky`), each counted under the filter's instance name.

use super::support::{args, completion, post, sample, served_by, start, wait_for_metrics, words};
use harness::stack::StackOptions;

const CONFIG: &str = "apiVersion: llm-d.ai/v1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
- name: sticky
  type: prefix-cache-affinity-filter
  parameters:
    affinityThreshold: 0.8
- type: token-load-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: sticky
  - pluginRef: token-load-scorer
  - pluginRef: max-score-picker
";

const COUNTER: &str = "llm_d_epp_prefix_cache_affinity_filter_decisions_total";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_affinity_filter_keeps_a_repeated_prompt_on_its_pod_and_counts_each_decision() {
    let stack = start(StackOptions {
        epp_args: args(&["--config-text", CONFIG]),
        ..StackOptions::default()
    })
    .await;
    let prompt = words(7, 400);
    let mut served = Vec::new();
    for _ in 0..4 {
        let response = post(&stack, "/v1/completions", completion(&prompt), &[]).await;
        assert_eq!(response.status.as_u16(), 200, "{}", response.text());
        served.push(served_by(&stack, &response));
    }
    assert!(served.iter().all(|&p| p == served[0]), "sticky: {served:?}");
    let count = |text: &str, outcome: &str| {
        let labels = [("plugin_name", "sticky"), ("outcome", outcome)];
        sample(text, COUNTER, &labels).unwrap_or(0.0)
    };
    let text = wait_for_metrics(&stack.epp, "four affinity decisions", |t| {
        count(t, "no_match") + count(t, "sticky") >= 4.0
    })
    .await;
    assert_eq!(
        count(&text, "no_match"),
        1.0,
        "the first request: no warm pod"
    );
    assert_eq!(
        count(&text, "sticky"),
        3.0,
        "the repeats: the warm pod only"
    );
    assert_eq!(count(&text, "load_override"), 0.0);
    stack.stop().await;
}

//! The benchmark's smoke path, so the harness cannot rot: the load generator runs for about a
//! second against 2 simulated pods through Envoy + epp, and its summary and report must be
//! well formed (every request recorded, TTFT and pods known, JSON that reads back).
#![allow(clippy::unwrap_used)] // integration tests: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::time::Duration;

use harness::envoy::Template;
use harness::stack::SimStack;
use inference_sim::EngineConfig;
use loadgen::pods::{delta, scrape_all};
use loadgen::summary::Context;
use loadgen::{run, summarize, Load, Report, RunConfig, Stage, Workload};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loadgen_through_epp_writes_a_well_formed_summary() {
    let engine = EngineConfig {
        model: "m".into(),
        time_scale: 10.0,
        ..EngineConfig::default()
    };
    let stack = SimStack::start(2, engine, Template::Duplex, &[], false)
        .await
        .unwrap();
    let workload = Workload::SharedPrefix {
        groups: 2,
        prompts_per_group: 2,
        system_len: 64,
        question_len: 8,
        output_len: 4,
    };
    let cfg = RunConfig {
        target: stack.envoy.listener_addr(),
        workload: workload.clone(),
        load: Load::Open {
            stages: vec![Stage {
                rate: 10.0,
                duration: Duration::from_secs(1),
            }],
            poisson: true,
        },
        max_requests: 50,
        max_duration: Duration::from_secs(1),
        drain: Duration::from_secs(20),
        seed: 3,
        model: "m".into(),
    };
    let pods = stack.cluster.addrs().to_vec();
    let before = scrape_all(&pods).await;
    let records = run(cfg).await;
    let pod_delta = delta(&scrape_all(&pods).await, &before);
    let ctx = Context {
        label: "epp",
        workload: &workload,
        stage_rates: &[10.0],
        pod_delta: &pod_delta,
        block_size: 16,
        warmup_s: 0.0,
    };
    let summary = summarize(&records, &ctx);
    stack.stop().await;

    assert!(summary.requests >= 3, "{summary:?}");
    assert_eq!(
        summary.ok, summary.requests,
        "{:?}",
        summary.errors_by_status
    );
    assert!(summary.ttft_ms.p50 > 0.0 && summary.ttft_ms.p90 >= summary.ttft_ms.p50);
    assert!(summary.output_tokens_per_s > 0.0 && summary.throughput_rps > 0.0);
    assert_eq!(
        summary.per_pod_requests.values().sum::<f64>(),
        summary.ok as f64 + 0.0,
        "{:?}",
        summary.per_pod_requests
    );
    assert!(summary.prefix_hit_rate.is_some() && summary.oracle_hit_rate.is_some());
    assert!(records
        .iter()
        .all(|r| r.pod.is_some() && r.output_tokens == 4 && r.prompt_tokens == Some(72)));
    let report = Report {
        config: serde_json::json!({"workload": workload}),
        summary: summary.clone(),
        requests: records,
    };
    let text = serde_json::to_string(&report).unwrap();
    let back: Report = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (back.summary.requests, back.summary.ok, back.requests.len()),
        (summary.requests, summary.ok, summary.requests)
    );
    assert_eq!(back.summary.markdown_row(), summary.markdown_row());
    let value: BTreeMap<String, serde_json::Value> = serde_json::from_str(&text).unwrap();
    for key in ["p50", "p90", "p99"] {
        assert!(value["summary"]["ttft_ms"][key].is_f64(), "{key} in {text}");
    }
    assert!(summary.markdown_row().starts_with("| epp |"));
}

//! Exposition shape tests (the Python parser check lives in `tests/sim_*.rs`).

use super::*;
use crate::engine::{EngineGauges, FinishedRecord, StepReport, Usage};

#[test]
fn floats_render_as_prometheus_client_does() {
    let cases = [
        (0.0, "0.0"),
        (3.0, "3.0"),
        (0.25, "0.25"),
        (1843712.0, "1.843712e+06"),
        (1755000123.4, "1.7550001234e+09"),
        (245760.0, "245760.0"),
        (1e16, "1e+16"),
        (1.5e-05, "1.5e-05"),
        (2560.0, "2560.0"),
        (1000000.0, "1e+06"),
        (123456.789, "123456.789"),
        (0.0001, "0.0001"),
        (12.0 / 7.0, "1.7142857142857142"),
        (99999999999.0, "9.9999999999e+10"),
        (12345678901.5, "1.23456789015e+10"),
        (f64::INFINITY, "+Inf"),
    ];
    for (v, want) in cases {
        assert_eq!(py_float(v), want, "{v}");
    }
}

fn sample_metrics() -> (PodMetrics, PodConfig) {
    let mut cfg = PodConfig::default();
    cfg.engine.model = "m".into();
    cfg.engine.max_model_len = 100;
    cfg.enable_lora = true;
    let mut m = PodMetrics::new(100, 1.7550001234e9);
    m.initialised = true;
    let gauges = EngineGauges {
        running: 3,
        waiting: 1,
        kv_usage: 0.25,
        ..Default::default()
    };
    m.set_gauges(gauges, true, 1.7e9);
    let usage = Usage {
        reason: FinishReason::Stop,
        prompt_tokens: 30,
        completion_tokens: 5,
        cached_tokens: 16,
        block_ids: Vec::new(),
    };
    let finished = FinishedRecord {
        usage,
        params_max_tokens: None,
        e2e: 0.4,
        queue: 0.0,
        inference: 0.4,
        prefill: 0.05,
        decode: 0.35,
    };
    m.record(&StepReport {
        scheduled_tokens: 14,
        finished: vec![finished],
        ..Default::default()
    });
    (m, cfg)
}

#[test]
fn families_have_sorted_common_labels_total_and_created_series() {
    let (m, cfg) = sample_metrics();
    let text = render(&m, &cfg);
    for line in [
        "# TYPE vllm:num_requests_running gauge",
        r#"vllm:num_requests_running{engine="0",model_name="m"} 3.0"#,
        r#"vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25"#,
        r#"vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25"#,
        "# TYPE vllm:prompt_tokens_total counter",
        "# TYPE vllm:prompt_tokens_created gauge",
        r#"vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7550001234e+09"#,
        r#"vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 1.0"#,
        r#"vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 0.0"#,
        r#"vllm:request_prompt_tokens_bucket{engine="0",le="20.0",model_name="m"} 0.0"#,
        r#"vllm:request_prompt_tokens_bucket{engine="0",le="50.0",model_name="m"} 1.0"#,
        r#"vllm:request_prompt_tokens_bucket{engine="0",le="+Inf",model_name="m"} 1.0"#,
        r#"vllm:request_prompt_tokens_sum{engine="0",model_name="m"} 30.0"#,
        r#"vllm:iteration_tokens_total_bucket{engine="0",le="16.0",model_name="m"} 1.0"#,
        r#"vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.7e+09"#,
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
    }
    let cache = text
        .lines()
        .find(|l| l.starts_with("vllm:cache_config_info{"))
        .unwrap();
    assert!(
        cache.starts_with(r#"vllm:cache_config_info{block_size="16",cache_dtype="auto""#),
        "{cache}"
    );
    assert!(cache.contains(r#"engine="0",gpu_memory_utilization"#) && cache.ends_with("} 1.0"));
}

#[test]
fn histogram_samples_are_buckets_then_count_then_sum() {
    let (m, cfg) = sample_metrics();
    let text = render(&m, &cfg);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("vllm:e2e_request_latency_seconds_") && !l.contains("_created"))
        .collect();
    let n = lines.len();
    assert!(lines[n - 3].contains(r#"le="+Inf""#));
    assert!(lines[n - 2].starts_with("vllm:e2e_request_latency_seconds_count"));
    assert!(lines[n - 1].starts_with("vllm:e2e_request_latency_seconds_sum"));
}

#[test]
fn options_select_kv_names_and_hide_created_and_cache_config_until_ready() {
    let (mut m, mut cfg) = sample_metrics();
    cfg.metrics.kv_usage = KvUsageMetric::New;
    cfg.metrics.created_series = false;
    m.initialised = false;
    let text = render(&m, &cfg);
    assert!(!text.contains("gpu_cache_usage_perc"));
    assert!(!text.contains("_created"));
    assert!(!text.contains("cache_config_info"));
}

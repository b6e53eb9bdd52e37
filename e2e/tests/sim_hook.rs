//! inference-sim's test hook on its own (no Envoy): every request recorded byte for byte,
//! forced metric values, `/metrics` failing or hanging, and the identity headers, the
//! protocol details the router tests rely on.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use harness::client;
use harness::prometheus;
use http::{Method, StatusCode};
use inference_sim::{EngineConfig, FaultSwitch, MetricsMode, Pod, PodConfig, RETURN_ERROR_HEADER};
use tokio::net::TcpListener;

/// A recording pod named `name` serving `test-model` (short answers, cached-token details on),
/// changed by `change`.
async fn start(name: &str, change: impl FnOnce(&mut PodConfig)) -> Pod {
    let mut cfg = PodConfig {
        engine: EngineConfig {
            model: "test-model".into(),
            num_gpu_blocks: 1024,
            default_max_output: 5,
            ..EngineConfig::default()
        },
        pod_name: name.into(),
        prompt_tokens_details: true,
        record_requests: true,
        ..PodConfig::default()
    };
    change(&mut cfg);
    let faults = FaultSwitch::new(cfg.faults.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("test setup");
    Pod::start(listener, Arc::new(cfg), faults)
        .await
        .expect("test setup")
}

async fn metric(addr: SocketAddr, series: &str) -> f64 {
    let text = prometheus::scrape(addr, "/metrics")
        .await
        .expect("test setup");
    prometheus::value(&text, series).unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

#[tokio::test]
async fn records_each_request_and_names_itself() {
    let pod = start("pod-x", |c| c.engine.model = "m".into()).await;
    let body = r#"{"model":"m","prompt":"a b c"}"#;
    let response = client::post_json(pod.addr(), "/v1/completions?x=1", body)
        .await
        .unwrap();
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.header("x-inference-pod"), Some("pod-x"));
    let port = pod.addr().port().to_string();
    assert_eq!(response.header("x-inference-port"), Some(port.as_str()));
    let json = response.json().unwrap();
    assert_eq!(json["model"], "m");
    assert_eq!(json["usage"]["prompt_tokens"], 3);
    assert_eq!(json["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let recorded = pod.control().hook().requests();
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].method, Method::POST);
    assert_eq!(recorded[0].path, "/v1/completions?x=1");
    assert_eq!(&recorded[0].body[..], body.as_bytes());
}

#[tokio::test]
async fn answers_models_health_and_errors() {
    let pod = start("p", |c| {
        c.enable_lora = true;
        c.lora_modules = vec!["sql-lora".into()];
    })
    .await;
    let models = client::get(pod.addr(), "/v1/models")
        .await
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(models["data"][1]["id"], "sql-lora");
    assert_eq!(models["data"][1]["parent"], "test-model");
    assert_eq!(
        client::get(pod.addr(), "/health").await.unwrap().status,
        StatusCode::OK
    );
    let missing = client::get(pod.addr(), "/nope").await.unwrap();
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    let bad = client::post_json(pod.addr(), "/v1/completions", "{")
        .await
        .unwrap();
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let req = client::request(
        Method::POST,
        "/v1/completions",
        r#"{"model":"m","prompt":"x"}"#,
    );
    let forced = client::with_header(req.unwrap(), RETURN_ERROR_HEADER, "429").unwrap();
    let forced = client::send(pod.addr(), forced).await.unwrap();
    assert_eq!(forced.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(forced.header("x-inference-pod"), Some("p"));
}

#[tokio::test]
async fn forced_metric_values_and_failure_modes() {
    let pod = start("p", |_| {}).await;
    let control = pod.control();
    control.hook().set_waiting(Some(7));
    control.hook().set_running(Some(3));
    control.hook().set_kv_usage(Some(0.5));
    let waiting = r#"vllm:num_requests_waiting{engine="0",model_name="test-model"}"#;
    let gpu = r#"vllm:gpu_cache_usage_perc{engine="0",model_name="test-model"}"#;
    assert_eq!(metric(pod.addr(), waiting).await, 7.0);
    assert_eq!(metric(pod.addr(), gpu).await, 0.5);
    assert_eq!(control.metric_values().running, 3);

    control.hook().set_metrics_mode(MetricsMode::Error);
    let failed = client::get(pod.addr(), "/metrics").await.unwrap();
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);

    control.hook().set_metrics_mode(MetricsMode::Hang);
    let scrape = client::get(pod.addr(), "/metrics");
    let mut scrape = std::pin::pin!(scrape);
    let hung = tokio::time::timeout(Duration::from_millis(200), &mut scrape).await;
    assert!(hung.is_err(), "a hanging /metrics answered");
    control.hook().set_metrics_mode(MetricsMode::Normal);
    assert_eq!(scrape.await.unwrap().status, StatusCode::OK);
}

#[tokio::test]
async fn lora_info_reports_adapters_in_flight_or_forced() {
    let pod = start("p", |c| {
        c.enable_lora = true;
        c.lora_modules = vec!["a1".into(), "a2".into()];
    })
    .await;
    let control = pod.control();
    control
        .hook()
        .set_lora_adapters(Some(vec!["a2".into()]), Some(vec!["a1".into()]));
    let text = client::get(pod.addr(), "/metrics").await.unwrap().text();
    let expected = r#"vllm:lora_requests_info{max_lora="4",running_lora_adapters="a2",waiting_lora_adapters="a1"}"#;
    assert!(text.contains(expected), "{text}");
    assert!(text.contains(r#"num_gpu_blocks="1024""#), "{text}");
}

#[tokio::test]
async fn several_pods_share_a_process_and_stop_cleanly() {
    let a = start("a", |_| {}).await;
    let b = start("b", |_| {}).await;
    let ra = client::get(a.addr(), "/health").await.unwrap();
    let rb = client::get(b.addr(), "/health").await.unwrap();
    assert_eq!(ra.header("x-inference-pod"), Some("a"));
    assert_eq!(rb.header("x-inference-pod"), Some("b"));
    let addr = a.addr();
    a.stop().await;
    assert!(client::get(addr, "/health").await.is_err());
}

#[tokio::test]
async fn nothing_is_recorded_unless_asked() {
    let pod = start("p", |c| c.record_requests = false).await;
    let body = r#"{"model":"test-model","prompt":"a b c","max_tokens":1}"#;
    let response = client::post_json(pod.addr(), "/v1/completions", body)
        .await
        .unwrap();
    assert_eq!(response.status, StatusCode::OK);
    assert!(pod.control().hook().requests().is_empty());
}

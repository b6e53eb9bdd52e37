//! The model-server stand-in on its own (no Envoy): recording, routes, SSE timing and the
//! metric controls tests rely on.

use std::time::Duration;

use epp_e2e::client;
use epp_e2e::standin::{MetricsMode, StandIn, StandInOptions, RETURN_ERROR_HEADER};
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

async fn metric(pod: &StandIn, series: &str) -> f64 {
    let text = client::get(pod.addr(), "/metrics")
        .await
        .expect("test setup")
        .text();
    let line = text
        .lines()
        .find(|l| l.starts_with(series))
        .unwrap_or_else(|| panic!("no {series} in\n{text}"));
    line.rsplit(' ')
        .next()
        .expect("test setup")
        .parse()
        .expect("test setup")
}

#[tokio::test]
async fn records_each_request_and_names_itself() {
    let pod = StandIn::bind(StandInOptions::named("pod-x")).await.unwrap();
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
    let recorded = pod.requests();
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].method, Method::POST);
    assert_eq!(recorded[0].path, "/v1/completions?x=1");
    assert_eq!(&recorded[0].body[..], body.as_bytes());
}

#[tokio::test]
async fn answers_models_health_and_errors() {
    let opts = StandInOptions {
        lora_adapters: vec!["sql-lora".into()],
        ..StandInOptions::named("p")
    };
    let pod = StandIn::bind(opts).await.unwrap();
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
async fn running_and_kv_usage_follow_requests_in_flight() {
    let opts = StandInOptions {
        stream_interval: Duration::from_millis(200),
        completion_tokens: 3,
        ..StandInOptions::named("p")
    };
    let pod = StandIn::bind(opts).await.unwrap();
    let running = r#"vllm:num_requests_running{engine="0",model_name="test-model"}"#;
    let kv = r#"vllm:kv_cache_usage_perc{engine="0",model_name="test-model"}"#;
    assert_eq!(metric(&pod, running).await, 0.0);
    let body = r#"{"model":"test-model","prompt":"one two three","stream":true}"#;
    let req = client::request(Method::POST, "/v1/completions", body).unwrap();
    let tcp = TcpStream::connect(pod.addr()).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    let exchange = async {
        // The response head has arrived, the body is still streaming: the request is running.
        let response = sender.send_request(req).await.unwrap();
        let during = (metric(&pod, running).await, metric(&pod, kv).await);
        response.into_body().collect().await.unwrap();
        during
    };
    let (running_during, kv_during) = tokio::select! {
        biased;
        during = exchange => during,
        _ = conn => panic!("connection closed early"),
    };
    assert_eq!(running_during, 1.0);
    assert_eq!(kv_during, 1.0 / 1024.0); // (3 prompt + 3 completion tokens) → 1 block of 1024
    assert_eq!(metric(&pod, running).await, 0.0);
    assert_eq!(metric(&pod, kv).await, 0.0);
}

#[tokio::test]
async fn forced_metric_values_and_failure_modes() {
    let pod = StandIn::bind(StandInOptions::named("p")).await.unwrap();
    pod.set_waiting(Some(7));
    pod.set_running(Some(3));
    pod.set_kv_usage(Some(0.5));
    let waiting = r#"vllm:num_requests_waiting{engine="0",model_name="test-model"}"#;
    let gpu = r#"vllm:gpu_cache_usage_perc{engine="0",model_name="test-model"}"#;
    assert_eq!(metric(&pod, waiting).await, 7.0);
    assert_eq!(metric(&pod, gpu).await, 0.5);
    assert_eq!(pod.metric_values().running, 3);

    pod.set_metrics_mode(MetricsMode::Error);
    let failed = client::get(pod.addr(), "/metrics").await.unwrap();
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);

    pod.set_metrics_mode(MetricsMode::Hang);
    let scrape = client::get(pod.addr(), "/metrics");
    let mut scrape = std::pin::pin!(scrape);
    let hung = tokio::time::timeout(Duration::from_millis(200), &mut scrape).await;
    assert!(hung.is_err(), "a hanging /metrics answered");
    pod.set_metrics_mode(MetricsMode::Normal);
    assert_eq!(scrape.await.unwrap().status, StatusCode::OK);
}

#[tokio::test]
async fn lora_info_reports_adapters_in_flight_or_forced() {
    let opts = StandInOptions {
        lora_adapters: vec!["a1".into(), "a2".into()],
        ..StandInOptions::named("p")
    };
    let pod = StandIn::bind(opts).await.unwrap();
    pod.set_lora_adapters(Some(vec!["a2".into()]), Some(vec!["a1".into()]));
    let text = client::get(pod.addr(), "/metrics").await.unwrap().text();
    let expected = r#"vllm:lora_requests_info{max_lora="4",running_lora_adapters="a2",waiting_lora_adapters="a1"}"#;
    assert!(text.contains(expected), "{text}");
    assert!(text.contains(r#"num_gpu_blocks="1024""#), "{text}");
}

#[tokio::test]
async fn several_stand_ins_share_a_process_and_stop_cleanly() {
    let a = StandIn::bind(StandInOptions::named("a")).await.unwrap();
    let b = StandIn::bind(StandInOptions::named("b")).await.unwrap();
    let ra = client::get(a.addr(), "/health").await.unwrap();
    let rb = client::get(b.addr(), "/health").await.unwrap();
    assert_eq!(ra.header("x-inference-pod"), Some("a"));
    assert_eq!(rb.header("x-inference-pod"), Some("b"));
    let addr = a.addr();
    a.shutdown().await;
    assert!(client::get(addr, "/health").await.is_err());
}

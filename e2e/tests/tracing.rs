//! OpenTelemetry tracing through a real Envoy: epp exports its spans over OTLP/gRPC to an
//! in-process receiver, under the trace named by the client's W3C `traceparent` header.
#![allow(clippy::unwrap_used)] // integration tests: a failed unwrap is a failed test

use bytes::Bytes;
use harness::client;
use harness::sim_pod::{test_pod_config, with_long_context};
use harness::stack::{Stack, StackOptions};
use http::Method;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use std::sync::{Arc, Mutex};
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN: &str = "00f067aa0ba902b7";
const BIG_TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";

/// An OTLP collector that keeps every span it receives (and the service name it came with).
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<(String, Span)>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for rs in req.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| string_value(kv.value.as_ref()?))
                .unwrap_or_default();
            spans.extend(
                rs.scope_spans
                    .into_iter()
                    .flat_map(|ss| ss.spans)
                    .map(|s| (service.clone(), s)),
            );
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

fn string_value(v: &opentelemetry_proto::tonic::common::v1::AnyValue) -> Option<String> {
    match &v.value {
        Some(Value::StringValue(s)) => Some(s.clone()),
        Some(Value::IntValue(i)) => Some(i.to_string()),
        _ => None,
    }
}

fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| string_value(kv.value.as_ref()?))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The tracer reads the standard environment, so this test sets it before any runtime
/// thread exists (nextest runs each test in its own process).
#[test]
fn spans_join_the_gateway_trace_and_name_the_chosen_endpoint() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}"));
    std::env::set_var("OTEL_SERVICE_NAME", "epp-under-test");
    std::env::set_var("OTEL_BSP_SCHEDULE_DELAY", "50");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(listener));
}

async fn run(listener: std::net::TcpListener) {
    listener.set_nonblocking(true).unwrap();
    let receiver = Receiver::default();
    let stop = CancellationToken::new();
    let server = tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(receiver.clone()))
        .serve_with_incoming_shutdown(
            TcpListenerStream::new(tokio::net::TcpListener::from_std(listener).unwrap()),
            stop.clone().cancelled_owned(),
        );
    let tracker = tokio_util::task::TaskTracker::new();
    tracker.spawn(server);

    // The large prompt below is ~72,000 tokens: pods with a 128k context.
    let stack = Stack::start(StackOptions {
        pod_config: with_long_context(test_pod_config("pod")),
        ..StackOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("starting the stack: {e:#}"));
    let body = r#"{"model":"test-model","prompt":"trace me through the gateway","max_tokens":4}"#;
    let req = client::request(Method::POST, "/v1/completions", Bytes::from(body)).unwrap();
    let req = client::with_header(
        req,
        "traceparent",
        &format!("00-{TRACE_ID}-{PARENT_SPAN}-01"),
    )
    .unwrap();
    let r = client::send(stack.envoy.listener_addr(), req)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let pod = stack.pod_index(r.header("x-inference-pod")).unwrap();
    let chosen = stack.pods[pod].endpoint();
    // A large body streams in chunks (in duplex mode epp may decide early): same spans.
    let big = serde_json::json!({"model": "test-model", "prompt": "a long prompt that keeps going ".repeat(12_000), "max_tokens": 2}).to_string();
    let req = client::request(Method::POST, "/v1/completions", Bytes::from(big)).unwrap();
    let req = client::with_header(
        req,
        "traceparent",
        &format!("00-{BIG_TRACE_ID}-{PARENT_SPAN}-01"),
    )
    .unwrap();
    let r = client::send(stack.envoy.listener_addr(), req)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    // A request without traceparent starts its own trace.
    let plain = client::post_json(
        stack.envoy.listener_addr(),
        "/v1/completions",
        Bytes::from(body),
    )
    .await
    .unwrap();
    assert_eq!(plain.status, 200);
    stack.stop().await; // shutting epp down flushes the exporter

    let spans = receiver.spans.lock().unwrap().clone();
    stop.cancel();
    tracker.close();
    tracker.wait().await;
    check(&spans, &chosen);
}

fn check(spans: &[(String, Span)], chosen: &str) {
    let ours: Vec<&Span> = spans
        .iter()
        .map(|(_, s)| s)
        .filter(|s| hex(&s.trace_id) == TRACE_ID)
        .collect();
    let names: Vec<&str> = ours.iter().map(|s| s.name.as_str()).collect();
    assert!(
        spans.iter().all(|(svc, _)| svc == "epp-under-test"),
        "service name from OTEL_SERVICE_NAME"
    );
    let root = ours
        .iter()
        .find(|s| s.name == "epp.request")
        .unwrap_or_else(|| panic!("no epp.request span in {names:?}"));
    assert_eq!(
        hex(&root.parent_span_id),
        PARENT_SPAN,
        "the request span's parent is the gateway's span"
    );
    for name in ["parse", "tokenize", "schedule", "response"] {
        let child = ours
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no {name} span in {names:?}"));
        assert_eq!(
            child.parent_span_id, root.span_id,
            "{name} is a child of epp.request"
        );
        assert!(
            child.start_time_unix_nano >= root.start_time_unix_nano
                && child.end_time_unix_nano <= root.end_time_unix_nano,
            "{name} inside the request span"
        );
    }
    let schedule = ours.iter().find(|s| s.name == "schedule").unwrap();
    assert_eq!(
        attr(schedule, "epp.endpoint").as_deref(),
        Some(chosen),
        "the schedule span names the endpoint that served"
    );
    let scores = attr(schedule, "epp.scores").unwrap();
    assert!(
        scores.contains(&format!("{chosen}=")),
        "scores list the chosen endpoint: {scores}"
    );
    assert_eq!(
        attr(
            ours.iter().find(|s| s.name == "parse").unwrap(),
            "epp.model"
        )
        .as_deref(),
        Some("test-model")
    );
    assert_eq!(
        attr(
            ours.iter().find(|s| s.name == "response").unwrap(),
            "http.response.status_code"
        )
        .as_deref(),
        Some("200")
    );
    let big: Vec<&Span> = spans
        .iter()
        .map(|(_, s)| s)
        .filter(|s| hex(&s.trace_id) == BIG_TRACE_ID)
        .collect();
    let big_root = big.iter().find(|s| s.name == "epp.request").unwrap();
    for name in ["parse", "schedule", "response"] {
        let child = big
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no {name} span for the large request"));
        assert_eq!(child.parent_span_id, big_root.span_id);
    }
    let parse = big.iter().find(|s| s.name == "parse").unwrap();
    assert_eq!(attr(parse, "epp.model").as_deref(), Some("test-model"));
    if let Some(seen) = attr(parse, "epp.body_bytes_seen") {
        assert!(
            seen.parse::<usize>().unwrap() <= 372_049,
            "an early decision reports the bytes it had read: {seen}"
        );
    }
    let other_roots = spans
        .iter()
        .filter(|(_, s)| {
            s.name == "epp.request"
                && ![TRACE_ID, BIG_TRACE_ID].contains(&hex(&s.trace_id).as_str())
        })
        .count();
    assert_eq!(
        other_roots, 1,
        "the request without traceparent got a trace of its own"
    );
}

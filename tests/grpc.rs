//! In-process integration: the whole epp (`app::run`) on loopback, driven over a real tonic
//! channel as Envoy would drive it, plus the gRPC health service and the metrics port.
#![allow(clippy::unwrap_used)] // integration tests: a failed unwrap is a failed test

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse, ProtocolConfiguration,
};
use epp::app::{self, Listeners, Options};
use std::net::SocketAddr;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

struct Running {
    grpc: SocketAddr,
    health: SocketAddr,
    metrics: SocketAddr,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

async fn start(extra: &[&str]) -> Running {
    let bind = || async { TcpListener::bind("127.0.0.1:0").await.unwrap() };
    let listeners = Listeners {
        grpc: bind().await,
        health: bind().await,
        metrics: bind().await,
        peers: None,
    };
    let (grpc, health, metrics) = (
        listeners.grpc.local_addr().unwrap(),
        listeners.health.local_addr().unwrap(),
        listeners.metrics.local_addr().unwrap(),
    );
    let mut args = vec!["epp", "--static-endpoints", "127.0.0.1:1,127.0.0.1:2"];
    args.extend_from_slice(extra);
    let opts = Options::try_parse_from_args(&args);
    let shutdown = CancellationToken::new();
    #[allow(clippy::disallowed_methods)] // the test owns and joins this task
    let task = tokio::spawn(app::run(opts, listeners, shutdown.clone()));
    Running {
        grpc,
        health,
        metrics,
        shutdown,
        task,
    }
}

trait ParseArgs {
    fn try_parse_from_args(args: &[&str]) -> Options;
}

impl ParseArgs for Options {
    fn try_parse_from_args(args: &[&str]) -> Options {
        <Options as clap::Parser>::try_parse_from(args).unwrap()
    }
}

fn headers(path: &str, eos: bool) -> ProcessingRequest {
    let h = |k: &str, v: &str| HeaderValue {
        key: k.into(),
        raw_value: v.as_bytes().to_vec(),
        ..Default::default()
    };
    let mode = BodySendMode::FullDuplexStreamed as i32;
    ProcessingRequest {
        request: Some(Request::RequestHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![h(":path", path)],
            }),
            end_of_stream: eos,
            ..Default::default()
        })),
        protocol_config: Some(ProtocolConfiguration {
            request_body_mode: mode,
            response_body_mode: mode,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn body(b: &[u8], eos: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Request::RequestBody(HttpBody {
            body: b.to_vec(),
            end_of_stream: eos,
            ..Default::default()
        })),
        ..Default::default()
    }
}

async fn exchange(
    addr: SocketAddr,
    msgs: Vec<ProcessingRequest>,
    expect: usize,
) -> Vec<ProcessingResponse> {
    let mut client = ExternalProcessorClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    for m in msgs {
        tx.send(m).await.unwrap();
    }
    let mut inbound = client
        .process(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while out.len() < expect {
        let next = tokio::time::timeout(std::time::Duration::from_secs(10), inbound.message())
            .await
            .unwrap()
            .unwrap();
        out.push(next.unwrap());
    }
    drop(tx);
    out
}

#[tokio::test]
async fn routes_over_a_real_grpc_stream_and_serves_health_and_metrics() {
    let epp = start(&["--secure-serving=false"]).await;
    let chat = br#"{"model":"m","messages":[{"role":"user","content":"hello"}]}"#;
    let out = exchange(
        epp.grpc,
        vec![
            headers("/v1/chat/completions", false),
            body(chat, false),
            body(b"", true),
        ],
        2,
    )
    .await;
    let Some(Response::RequestHeaders(h)) = &out[0].response else {
        panic!("{:?}", out[0])
    };
    let set = &h
        .response
        .as_ref()
        .unwrap()
        .header_mutation
        .as_ref()
        .unwrap()
        .set_headers;
    let dest = String::from_utf8(set[0].header.as_ref().unwrap().raw_value.clone()).unwrap();
    assert!(dest == "127.0.0.1:1" || dest == "127.0.0.1:2", "{dest}");
    assert!(matches!(out[1].response, Some(Response::RequestBody(_))));

    let bad = exchange(
        epp.grpc,
        vec![headers("/v1/chat/completions", false), body(b"[]", true)],
        1,
    )
    .await;
    let Some(Response::ImmediateResponse(i)) = &bad[0].response else {
        panic!()
    };
    assert_eq!(i.status.as_ref().unwrap().code, 400);

    let channel = tonic::transport::Channel::from_shared(format!("http://{}", epp.health))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    for service in [
        "liveness",
        "readiness",
        "",
        "inference-extension",
        "envoy.service.ext_proc.v3.ExternalProcessor",
    ] {
        let r = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            r.status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
            "{service}"
        );
    }

    let text = http_get(epp.metrics, "/metrics").await;
    assert!(text.contains("inference_objective_request_total{model_name=\"m\",target_model_name=\"m\",priority=\"0\"} 1"), "{text}");
    assert!(
        text.contains("inference_objective_request_error_total"),
        "{text}"
    );
    epp.shutdown.cancel();
    epp.task.await.unwrap().unwrap();
}

#[tokio::test]
async fn serves_tls_with_a_provided_certificate() {
    let dir = std::env::temp_dir().join(format!("epp-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    std::fs::write(dir.join("tls.crt"), ck.cert.pem()).unwrap();
    std::fs::write(dir.join("tls.key"), ck.signing_key.serialize_pem()).unwrap();
    let cert_path = dir.to_string_lossy().to_string();
    let epp = start(&["--cert-path", &cert_path]).await;
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ck.cert.pem()))
        .domain_name("localhost");
    let channel = tonic::transport::Channel::from_shared(format!("https://{}", epp.grpc))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ExternalProcessorClient::new(channel);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(headers("/v1/models", true)).await.unwrap();
    let mut inbound = client
        .process(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let first = inbound.message().await.unwrap().unwrap();
    assert!(matches!(first.response, Some(Response::RequestHeaders(_))));
    drop(tx);
    epp.shutdown.cancel();
    epp.task.await.unwrap().unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn invalid_configuration_fails_start_up_with_every_problem() {
    let bad = "apiVersion: x\nkind: EndpointPickerConfig\nplugins:\n- type: nope-scorer\n";
    let epp = start(&["--secure-serving=false", "--config-text", bad]).await;
    let err = epp.task.await.unwrap().unwrap_err().to_string();
    assert!(
        err.contains("apiVersion") && err.contains("nope-scorer"),
        "{err}"
    );
}

/// The routing answer to one chat request: `Ok(destination)` or `Err(immediate status)`.
async fn route_chat(addr: SocketAddr) -> Result<String, u32> {
    let chat = br#"{"model":"m","messages":[{"role":"user","content":"hello"}]}"#;
    let msgs = vec![headers("/v1/chat/completions", false), body(chat, true)];
    let out = exchange(addr, msgs, 1).await;
    match &out[0].response {
        Some(Response::RequestHeaders(h)) => {
            let m = h.response.as_ref().unwrap().header_mutation.as_ref();
            let set = &m.unwrap().set_headers[0];
            Ok(String::from_utf8(set.header.as_ref().unwrap().raw_value.clone()).unwrap())
        }
        Some(Response::ImmediateResponse(i)) => Err(i.status.as_ref().unwrap().code as u32),
        other => panic!("{other:?}"),
    }
}

/// Waits (up to 20 s) until the config file has been reloaded successfully `n` times.
async fn reloaded(metrics: SocketAddr, n: u32) {
    let want = format!("epp_config_reloads_total{{outcome=\"success\"}} {n}");
    for _ in 0..200 {
        if http_get(metrics, "/metrics").await.contains(&want) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("no {want}");
}

#[tokio::test]
async fn a_config_reload_turns_flow_control_on_and_off() {
    let dir = std::env::temp_dir().join(format!("epp-flow-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("epp.yaml");
    let plain = epp::config::DEFAULT_CONFIG.to_owned();
    let gated = plain.replace(
        "kind: EndpointPickerConfig\n",
        "kind: EndpointPickerConfig\nfeatureGates: [flowControl]\nflowControl: {defaultRequestTTL: 300ms}\n",
    );
    // Replaced whole (write, then rename), so a poll never reads half a file.
    let replace = |text: &str| {
        std::fs::write(dir.join("next.yaml"), text).unwrap();
        std::fs::rename(dir.join("next.yaml"), &path).unwrap();
    };
    replace(&plain);
    let file = path.to_string_lossy().to_string();
    let epp = start(&["--secure-serving=false", "--config-file", &file]).await;
    // The endpoints never answer a scrape, so the pool counts as saturated: without flow
    // control a request is routed at once; with it, it waits until the section's TTL (429).
    assert!(route_chat(epp.grpc).await.is_ok());
    replace(&gated);
    reloaded(epp.metrics, 1).await;
    let started = std::time::Instant::now();
    assert_eq!(route_chat(epp.grpc).await, Err(429));
    assert!(started.elapsed() >= std::time::Duration::from_millis(300));
    replace(&format!("{plain}# flow control off again\n"));
    reloaded(epp.metrics, 2).await;
    assert!(route_chat(epp.grpc).await.is_ok());
    epp.shutdown.cancel();
    epp.task.await.unwrap().unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

async fn http_get(addr: SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    String::from_utf8_lossy(&buf).into_owned()
}

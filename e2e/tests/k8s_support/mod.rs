//! Support for the Kubernetes tests: epp in-process against the fake API server, objects to
//! create, and a minimal ext_proc client that reports where a request went and what body was
//! forwarded.
#![allow(dead_code, clippy::unwrap_used)]

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, ProcessingRequest, ProtocolConfiguration,
};
use harness::fake_apiserver::FakeApiServer;
use harness::stack::WaitFor;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpListener;

pub const NS: &str = "llm";

/// epp running in-process ([`harness::stack::Epp`]) against a fake or real API server, with the
/// directory of its kubeconfig.
pub struct Epp {
    epp: harness::stack::Epp,
    _dir: TempDir,
}

impl std::ops::Deref for Epp {
    type Target = harness::stack::Epp;
    fn deref(&self) -> &Self::Target {
        &self.epp
    }
}

pub struct TempDir(pub std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Epp {
    /// Starts epp with `args` plus `--kubeconfig` for `api`, plaintext, fast gauges.
    pub async fn start(api: &FakeApiServer, args: &[&str]) -> Self {
        Self::start_with(NS, |path| api.write_kubeconfig(path, NS).unwrap(), args).await
    }

    /// Starts epp for `namespace` with `args` plus `--kubeconfig` (the file `write` writes:
    /// the fake server's, or a real server's with a ServiceAccount token).
    pub async fn start_with(
        namespace: &str,
        write: impl FnOnce(&std::path::Path),
        args: &[&str],
    ) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "epp-k8s-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let kubeconfig = dir.join("kubeconfig");
        write(&kubeconfig);
        let mut full = vec![
            "--secure-serving=false".to_owned(),
            // The tests read /metrics without a token (kube_ops tests the auth).
            "--metrics-endpoint-auth=false".into(),
            "--refresh-prometheus-metrics-interval".into(),
            "50ms".into(),
            "--pool-namespace".into(),
            namespace.into(),
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
        ];
        full.extend(args.iter().map(|s| (*s).to_owned()));
        let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let epp = harness::stack::Epp::launch(grpc, &full, WaitFor::Started)
            .await
            .unwrap_or_else(|e| panic!("epp failed: {e:#}"));
        Self {
            epp,
            _dir: TempDir(dir),
        }
    }

    pub async fn stop(self) {
        self.epp.stop().await;
    }

    /// `inference_pool_ready_pods` (endpoints in the datastore), once the gauge is published.
    pub async fn ready_pods(&self) -> Option<i64> {
        Some(self.metric("inference_pool_ready_pods").await? as i64)
    }

    /// Waits (bounded) until the datastore holds `n` endpoints.
    pub async fn wait_endpoints(&self, n: i64, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        let mut last = None;
        while tokio::time::Instant::now() < deadline {
            last = self.ready_pods().await;
            if last == Some(n) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("expected {n} endpoints within {within:?}, last saw {last:?}");
    }

    /// Whether gRPC health reports `readiness` SERVING.
    pub async fn is_ready(&self) -> bool {
        use tonic_health::pb::{
            health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
        };
        let Ok(endpoint) =
            tonic::transport::Channel::from_shared(format!("http://{}", self.health))
        else {
            return false;
        };
        let Ok(channel) = endpoint.connect().await else {
            return false;
        };
        let mut client = HealthClient::new(channel);
        let resp = client
            .check(HealthCheckRequest {
                service: "readiness".into(),
            })
            .await;
        resp.is_ok_and(|r| r.into_inner().status == ServingStatus::Serving as i32)
    }
}

/// What epp answered for one request.
#[derive(Debug)]
pub enum Outcome {
    Routed { destination: String, body: Vec<u8> },
    Rejected { status: i32 },
}

impl Outcome {
    /// The `model` of the forwarded body.
    pub fn model(&self) -> Option<String> {
        let Self::Routed { body, .. } = self else {
            return None;
        };
        let v: serde_json::Value = serde_json::from_slice(body).ok()?;
        v["model"].as_str().map(str::to_owned)
    }
}

/// A gRPC channel to epp's ext_proc port, to reuse across many requests.
pub async fn connect(grpc: SocketAddr) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(format!("http://{grpc}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Sends one chat request through epp's ext_proc (full duplex), with extra request headers.
pub async fn send(grpc: SocketAddr, model: &str, headers: &[(&str, &str)]) -> Outcome {
    send_on(connect(grpc).await, model, headers).await
}

/// As [`send`], on an existing channel.
pub async fn send_on(
    channel: tonic::transport::Channel,
    model: &str,
    headers: &[(&str, &str)],
) -> Outcome {
    let h = |k: &str, v: &str| HeaderValue {
        key: k.into(),
        raw_value: v.as_bytes().to_vec(),
        ..Default::default()
    };
    let mut list = vec![h(":path", "/v1/chat/completions"), h(":method", "POST")];
    list.extend(headers.iter().map(|(k, v)| h(k, v)));
    let mode = BodySendMode::FullDuplexStreamed as i32;
    let hdrs = ProcessingRequest {
        request: Some(Request::RequestHeaders(HttpHeaders {
            headers: Some(HeaderMap { headers: list }),
            end_of_stream: false,
            ..Default::default()
        })),
        protocol_config: Some(ProtocolConfiguration {
            request_body_mode: mode,
            response_body_mode: mode,
            ..Default::default()
        }),
        ..Default::default()
    };
    let payload = json!({"model": model, "messages": [{"role": "user", "content": "hello"}]})
        .to_string()
        .into_bytes();
    let body = ProcessingRequest {
        request: Some(Request::RequestBody(HttpBody {
            body: payload,
            end_of_stream: true,
            ..Default::default()
        })),
        ..Default::default()
    };
    let mut client = ExternalProcessorClient::new(channel);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(hdrs).await.unwrap();
    tx.send(body).await.unwrap();
    let mut inbound = client
        .process(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let (mut destination, mut forwarded) = (None, Vec::new());
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), inbound.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        match msg.response {
            Some(Response::ImmediateResponse(r)) => {
                return Outcome::Rejected {
                    status: r.status.map_or(0, |s| s.code),
                }
            }
            Some(Response::RequestHeaders(r)) => {
                let set = r
                    .response
                    .and_then(|c| c.header_mutation)
                    .map(|m| m.set_headers)
                    .unwrap_or_default();
                destination = set
                    .iter()
                    .filter_map(|o| o.header.as_ref())
                    .find(|h| h.key == "x-gateway-destination-endpoint")
                    .map(|h| String::from_utf8_lossy(&h.raw_value).into_owned());
            }
            Some(Response::RequestBody(r)) => {
                if let Some(Mutation::StreamedResponse(s)) = r
                    .response
                    .and_then(|c| c.body_mutation)
                    .and_then(|m| m.mutation)
                {
                    forwarded.extend_from_slice(&s.body);
                    if s.end_of_stream {
                        return Outcome::Routed {
                            destination: destination.unwrap_or_default(),
                            body: forwarded,
                        };
                    }
                }
            }
            _ => {}
        }
    }
}

/// A Ready pod with labels `app=vllm` at `ip`.
pub fn pod(name: &str, ip: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "vllm"}},
        "spec": {"containers": [{"name": "vllm", "image": "vllm"}]},
        "status": {"podIP": ip, "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap()
}

pub async fn create_pod(client: &kube::Client, name: &str, ip: &str) {
    Api::<Pod>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pod(name, ip))
        .await
        .unwrap();
}

pub async fn delete_pod(client: &kube::Client, name: &str) {
    Api::<Pod>::namespaced(client.clone(), NS)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
}

/// Merge-patches the object `kind`/`name` (of `api_version`) through the dynamic API.
pub async fn patch(
    client: &kube::Client,
    api_version: &str,
    kind: &str,
    name: &str,
    patch: serde_json::Value,
) {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let ar =
        kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(group, version, kind));
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), NS, &ar);
    api.patch(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(patch),
    )
    .await
    .unwrap();
}

/// Creates any object from JSON through the dynamic API.
pub async fn create(client: &kube::Client, obj: serde_json::Value) {
    let api_version = obj["apiVersion"].as_str().unwrap();
    let kind = obj["kind"].as_str().unwrap();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
    let ar = kube::api::ApiResource::from_gvk(&gvk);
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), NS, &ar);
    let dynamic: kube::api::DynamicObject = serde_json::from_value(obj).unwrap();
    api.create(&PostParams::default(), &dynamic).await.unwrap();
}

/// An InferencePool v1 selecting `app=vllm` on `ports`.
pub fn pool(ports: &[u16]) -> serde_json::Value {
    let ports: Vec<_> = ports.iter().map(|p| json!({"number": p})).collect();
    json!({
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "pool", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": ports, "endpointPickerRef": {"name": "pool-epp", "port": {"number": 9002}}}
    })
}

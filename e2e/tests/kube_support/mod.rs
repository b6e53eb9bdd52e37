//! Support for the tests against a real kube-apiserver (e2e/harness/src/kube_apiserver.rs): the CRDs
//! installed once per test binary, a namespace per test, pods whose status the test sets
//! through `pods/status` (no kubelet runs), and epp started with a kubeconfig.
#![allow(dead_code, clippy::unwrap_used)]

use harness::kube_apiserver::{apply, objects, KubeApiServer, TestNamespace};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

static CRDS: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();

/// The shared server with the CRDs of `config/crd/` installed and established.
pub async fn server() -> &'static KubeApiServer {
    let server = KubeApiServer::shared().await;
    CRDS.get_or_init(|| install_crds(server)).await;
    server
}

/// The shared server (CRDs installed) and a fresh namespace.
pub async fn setup(prefix: &str) -> (&'static KubeApiServer, TestNamespace) {
    let server = server().await;
    (server, server.namespace(prefix).await.unwrap())
}

/// Installs the CRDs of `config/crd/` on `server` and waits until they are established.
pub async fn install_crds(server: &KubeApiServer) {
    objects::install_crds(server)
        .await
        .unwrap_or_else(|e| panic!("installing the CRDs: {e}"));
}

/// Creates any object from JSON in `ns` (server-side apply).
pub async fn create(ns: &TestNamespace, obj: Value) -> kube::api::DynamicObject {
    apply::apply(&ns.client, &ns.name, &obj)
        .await
        .unwrap_or_else(|e| panic!("{} not accepted: {e}", obj["kind"]))
}

/// A pod labelled `labels`, bound to a node name so deletion is graceful.
pub fn pod(name: &str, labels: Value) -> Pod {
    objects::pod(name, labels).unwrap()
}

pub async fn create_pod(ns: &TestNamespace, name: &str, labels: Value) {
    objects::create_pod(ns, name, labels).await.unwrap();
}

/// Sets the pod's IP and Ready condition through the `pods/status` subresource, as a kubelet would.
pub async fn set_status(ns: &TestNamespace, name: &str, ip: &str, ready: bool) {
    objects::set_pod_status(ns, name, ip, ready).await.unwrap();
}

/// A Ready pod `name` at `ip`, labelled `app=vllm`.
pub async fn ready_pod(ns: &TestNamespace, name: &str, ip: &str) {
    objects::ready_pod(ns, name, ip).await.unwrap();
}

/// Deletes a pod; with `grace` None it is removed at once, else it turns Terminating.
pub async fn delete_pod(ns: &TestNamespace, name: &str, grace: Option<u32>) {
    let params = DeleteParams {
        grace_period_seconds: Some(grace.unwrap_or(0)),
        ..Default::default()
    };
    Api::<Pod>::namespaced(ns.client.clone(), &ns.name)
        .delete(name, &params)
        .await
        .unwrap();
}

/// An InferencePool v1 `pool` selecting `app=vllm` on `ports`.
pub fn pool(ports: &[u16]) -> Value {
    objects::inference_pool(ports)
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "{prefix}-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The API error of a rejected call: (HTTP code, message).
pub fn rejection<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> (u16, String) {
    match r {
        Err(kube::Error::Api(e)) => (e.code, e.message),
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Recording inference-sim pods `pod-<i>` on distinct loopback addresses `127.0.0.<2+i>`, all
/// on one port (like pods of a Deployment), so the pool's single target port fits them all.
pub async fn sim_pods(n: usize) -> (u16, Vec<harness::sim_pod::SimPod>) {
    use harness::sim_pod::{test_pod_config, SimPod};
    let port = harness::ports::free_port().unwrap();
    let mut pods = Vec::new();
    for i in 0..n {
        let listener = tokio::net::TcpListener::bind(format!("127.0.0.{}:{port}", 2 + i))
            .await
            .unwrap();
        let pod = SimPod::start(listener, test_pod_config(&format!("pod-{i}")));
        pods.push(pod.await.unwrap());
    }
    (port, pods)
}

/// A real Envoy routing through epp at `grpc` to `pods`.
pub async fn envoy(
    grpc: std::net::SocketAddr,
    pods: &[harness::sim_pod::SimPod],
) -> harness::envoy::Envoy {
    use harness::envoy::{EnvoyConfig, Template};
    EnvoyConfig::new(Template::Duplex)
        .epp(grpc)
        .pool(pods.iter().map(harness::sim_pod::SimPod::addr))
        .start()
        .await
        .unwrap()
}

pub const COMPLETION: &str =
    r#"{"model":"test-model","prompt":"Say hello to the pool","max_tokens":3}"#;

/// One completion through Envoy: `Ok(pod name)` or `Err(status)`.
pub async fn send_through(envoy: &harness::envoy::Envoy) -> Result<String, u16> {
    let r = harness::client::post_json(envoy.listener_addr(), "/v1/completions", COMPLETION)
        .await
        .map_err(|_| 0u16)?;
    if !r.status.is_success() {
        return Err(r.status.as_u16());
    }
    Ok(r.header("x-inference-pod").unwrap_or_default().to_owned())
}

/// Sends `n` completions; the set of pods that served them. Panics on a failed request.
pub async fn served_by(
    envoy: &harness::envoy::Envoy,
    n: usize,
) -> std::collections::BTreeSet<String> {
    let mut pods = std::collections::BTreeSet::new();
    for _ in 0..n {
        match send_through(envoy).await {
            Ok(pod) => pods.insert(pod),
            Err(status) => panic!("a request failed with {status}"),
        };
    }
    pods
}

/// Waits (bounded) until `n` requests are served by exactly `want`.
pub async fn wait_served(envoy: &harness::envoy::Envoy, want: &[&str]) {
    let want: std::collections::BTreeSet<String> = want.iter().map(|s| (*s).to_owned()).collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let got = served_by(envoy, 12).await;
        if got == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "traffic went to {got:?}, expected {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Writes a kubeconfig for ServiceAccount `sa` of `ns` (a freshly minted token) at `path`.
pub async fn sa_kubeconfig(server: &KubeApiServer, ns: &TestNamespace, sa: &str, path: &Path) {
    let token = server.mint_token(&ns.name, sa).await.unwrap();
    server.token_kubeconfig(path, &ns.name, &token).unwrap();
}

/// Lints and renders `charts/inferencepool` as e2e/tests/helm.rs does (Helm's Go code through
/// hack/helm/render.py); the objects of every manifest.
pub fn render_chart(release: &str, namespace: &str, values: &Value) -> Vec<Value> {
    use std::process::Command;
    let venv = Command::new(root().join("hack/helm/venv.sh"))
        .output()
        .unwrap();
    assert!(
        venv.status.success(),
        "creating the helm venv failed: {}",
        String::from_utf8_lossy(&venv.stderr)
    );
    let python = String::from_utf8(venv.stdout).unwrap().trim().to_owned();
    let out = Command::new(python)
        .arg(root().join("hack/helm/render.py"))
        .arg(root().join("charts/inferencepool"))
        .args([release, namespace, &values.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "render failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut objects = Vec::new();
    for text in result["manifests"].as_object().unwrap().values() {
        for doc in serde_norway::Deserializer::from_str(text.as_str().unwrap()) {
            let v = <Value as serde::Deserialize>::deserialize(doc).unwrap();
            if !v.is_null() {
                objects.push(v);
            }
        }
    }
    objects
}

/// Chart values for a pool of `app=vllm` pods on `port`, with `extra` merged in at the top.
pub fn chart_values(port: u16, extra: Value) -> Value {
    let mut values = json!({
        "inferencePool": {"targetPorts": [{"number": port}], "modelServers": {"matchLabels": {"app": "vllm"}}}
    });
    if let (Some(v), Value::Object(extra)) = (values.as_object_mut(), extra) {
        v.extend(extra);
    }
    values
}

/// Renders the chart into `ns` and applies every object as the admin; the objects.
pub async fn install_chart(ns: &TestNamespace, release: &str, values: &Value) -> Vec<Value> {
    let objects = render_chart(release, &ns.name, values);
    for obj in &objects {
        create(ns, obj.clone()).await;
    }
    objects
}

/// A TCP proxy in front of the API server, to cut one client off (a network partition: the
/// client keeps running but cannot reach the server) and to restore it on the same port.
pub struct Proxy {
    pub addr: std::net::SocketAddr,
    target: std::net::SocketAddr,
    cut: tokio_util::sync::CancellationToken,
    tasks: tokio_util::task::TaskTracker,
}

impl Proxy {
    pub async fn start(target: std::net::SocketAddr) -> Self {
        Self::start_on(
            tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
            target,
        )
    }

    fn start_on(listener: tokio::net::TcpListener, target: std::net::SocketAddr) -> Self {
        let addr = listener.local_addr().unwrap();
        let cut = tokio_util::sync::CancellationToken::new();
        let tasks = tokio_util::task::TaskTracker::new();
        let (token, inner) = (cut.clone(), tasks.clone());
        tasks.spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = token.cancelled() => return,
                    a = listener.accept() => a,
                };
                let Ok((mut inbound, _)) = accepted else {
                    continue;
                };
                let token = token.clone();
                inner.spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = token.cancelled() => {}
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    }
                });
            }
        });
        Self {
            addr,
            target,
            cut,
            tasks,
        }
    }

    /// Closes the listener and every connection.
    pub async fn cut(self) -> (std::net::SocketAddr, std::net::SocketAddr) {
        self.cut.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        (self.addr, self.target)
    }

    /// Cuts, then serves again on the same port.
    pub async fn restore(addr: std::net::SocketAddr, target: std::net::SocketAddr) -> Self {
        Self::start_on(tokio::net::TcpListener::bind(addr).await.unwrap(), target)
    }
}

/// A kubeconfig for `token` that reaches the server through `via` (a [`Proxy`]).
pub fn token_kubeconfig_via(
    server: &KubeApiServer,
    ns: &TestNamespace,
    token: &str,
    via: std::net::SocketAddr,
    path: &Path,
) {
    server.token_kubeconfig(path, &ns.name, token).unwrap();
    let text = std::fs::read_to_string(path).unwrap();
    std::fs::write(path, text.replace(&server.url(), &format!("https://{via}"))).unwrap();
}

//! The upstream EPPs next to epp (issue 18), run the way their users run them, each behind the
//! same Envoy bootstrap as epp (`FULL_DUPLEX_STREAMED` ext_proc, ORIGINAL_DST):
//!
//! - **gie-epp**: the Gateway API Inference Extension's EPP v1.5.0 (`hack/install-peers.sh`).
//!   It discovers pods through Kubernetes only, so it runs against the e2e fake API server
//!   ([`harness::fake_apiserver`], started in the bench process, its CPU not charged to the EPP),
//!   holding one `InferencePool` (`inference.networking.k8s.io/v1`) and one Ready pod object per
//!   simulated pod. One target port per pool means one IP per pod: the pods run with
//!   `--host-per-pod` (127.0.0.1, 127.0.0.2, ... all on one port).
//! - **llm-d-epp**: llm-d-router v0.10.0, with its `file-discovery` plugin (no Kubernetes; its
//!   `docs/discovery.md`): the config file names the endpoints file this module writes.
//!
//! Both get plaintext gRPC (`--secure-serving=false`), no metrics-endpoint auth, no tracing, log
//! level error, and the same `--refresh-metrics-interval` as epp (50 ms, also their default).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use super::procs::{free_ports, wait_http_ok, Proc};
use super::routers::{Bins, Running};
use super::BenchError;
use harness::envoy::{EnvoyConfig, Template};
use harness::fake_apiserver::{FakeApiServer, Key};

/// Namespace and pool name the upstream EPPs are told about.
pub const NAMESPACE: &str = "bench";
pub const POOL: &str = "bench-pool";
/// The scrape interval every EPP gets (epp's and both upstream defaults).
pub const REFRESH_METRICS_INTERVAL: &str = "50ms";

/// Where `hack/install-peers.sh` puts peer `name`: `$PEERS_DIR/<name>/bin/<name>`, with
/// `PEERS_DIR` defaulting to `<repo>/.peers` as in the script.
pub fn peer_bin(name: &str) -> PathBuf {
    peers_dir(std::env::var_os("PEERS_DIR"))
        .join(name)
        .join("bin")
        .join(name)
}

fn peers_dir(env: Option<std::ffi::OsString>) -> PathBuf {
    env.filter(|v| !v.is_empty())
        .map_or_else(|| harness::envoy::repo_root().join(".peers"), PathBuf::from)
}

/// Flags both upstream EPPs share (same names in both).
fn common_flags(grpc: u16, health: u16, metrics: u16) -> Vec<String> {
    [
        "--grpc-port",
        &grpc.to_string(),
        "--grpc-health-port",
        &health.to_string(),
        "--metrics-port",
        &metrics.to_string(),
        "--secure-serving=false",
        "--metrics-endpoint-auth=false",
        "--tracing=false",
        "--enable-pprof=false",
        "--zap-log-level",
        "error",
        "--refresh-metrics-interval",
        REFRESH_METRICS_INTERVAL,
        "--pool-namespace",
        NAMESPACE,
        "--pool-name",
        POOL,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

fn missing(bin: &Path) -> BenchError {
    BenchError::Setup(format!(
        "{} is not installed (hack/install-peers.sh)",
        bin.display()
    ))
}

/// The pod objects and the InferencePool of `pods` (all on one port, one IP each).
pub fn seed_store(api: &FakeApiServer, pods: &[SocketAddr]) -> Result<(), BenchError> {
    let port = pods.first().map_or(8000, SocketAddr::port);
    if pods.iter().any(|p| p.port() != port) {
        return Err(BenchError::Setup(
            "gie-epp needs every pod on the same port (SimOptions::host_per_pod)".into(),
        ));
    }
    let store = api.store();
    let key = |collection: &str, name: &str| Key {
        collection: collection.into(),
        namespace: NAMESPACE.into(),
        name: name.into(),
    };
    let err = |e: harness::fake_apiserver::StoreError| BenchError::Setup(e.to_string());
    store
        .create(
            key("apis/inference.networking.k8s.io/v1/inferencepools", POOL),
            json!({
                "apiVersion": "inference.networking.k8s.io/v1",
                "kind": "InferencePool",
                "metadata": {"name": POOL, "namespace": NAMESPACE},
                "spec": {
                    "selector": {"matchLabels": {"app": "sim"}},
                    "targetPorts": [{"number": port}],
                    "endpointPickerRef": {"name": "epp", "kind": "Service",
                        "port": {"number": 9002}, "failureMode": "FailClose"}
                }
            }),
        )
        .map_err(err)?;
    for (i, pod) in pods.iter().enumerate() {
        let name = format!("sim-{i}");
        store
            .create(
                key("api/v1/pods", &name),
                json!({
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "sim"},
                        "uid": format!("00000000-0000-0000-0000-{i:012}")},
                    "spec": {"containers": [{"name": "vllm", "image": "inference-sim",
                        "ports": [{"containerPort": port}]}]},
                    "status": {
                        "phase": "Running",
                        "podIP": pod.ip().to_string(),
                        "podIPs": [{"ip": pod.ip().to_string()}],
                        "conditions": [{"type": "Ready", "status": "True"}]
                    }
                }),
            )
            .map_err(err)?;
    }
    Ok(())
}

/// GIE's EPP against a fake API server holding `pods`, behind Envoy; `config`: a config file,
/// or `None` for its built-in default.
pub async fn gie(
    bins: &Bins,
    pods: &[SocketAddr],
    dir: &Path,
    config: Option<&Path>,
) -> Result<Running, BenchError> {
    let bin = bins.gie_epp.clone();
    if !bin.is_file() {
        return Err(missing(&bin));
    }
    let api = FakeApiServer::bind()
        .await
        .map_err(BenchError::io("starting the fake API server"))?;
    seed_store(&api, pods)?;
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig, NAMESPACE)
        .map_err(BenchError::io("writing the kubeconfig"))?;
    let p = free_ports(3)?;
    let mut args = common_flags(p[0], p[1], p[2]);
    if let Some(c) = config {
        args.extend(["--config-file".to_owned(), c.display().to_string()]);
    }
    let env = [
        ("KUBECONFIG".to_owned(), kubeconfig.display().to_string()),
        ("NAMESPACE".to_owned(), NAMESPACE.to_owned()),
        // The fake API server has no watch-list streaming (sendInitialEvents): plain list + watch.
        (
            "KUBE_FEATURE_WatchListClient".to_owned(),
            "false".to_owned(),
        ),
    ];
    let mut proc_ = Proc::spawn_env("gie-epp", &bin, &args, &env, dir)?;
    wait_http_ok(
        &mut proc_,
        SocketAddr::from(([127, 0, 0, 1], p[2])),
        "/metrics",
        Duration::from_secs(60),
    )
    .await?;
    let grpc = SocketAddr::from(([127, 0, 0, 1], p[0]));
    let envoy = EnvoyConfig::new(Template::Duplex)
        .epp(grpc)
        .concurrency(2)
        .start()
        .await?;
    Ok(Running {
        target: envoy.listener_addr(),
        procs: vec![proc_],
        envoy: Some(envoy),
        metrics: Some(SocketAddr::from(([127, 0, 0, 1], p[2]))),
        api: Some(api),
        extproc: vec![grpc],
    })
}

/// The `file-discovery` endpoints file of `pods`.
pub fn endpoints_file(pods: &[SocketAddr]) -> String {
    let mut s = String::from("endpoints:\n");
    for (i, p) in pods.iter().enumerate() {
        s.push_str(&format!(
            "- name: sim-{i}\n  namespace: {NAMESPACE}\n  address: \"{}\"\n  port: \"{}\"\n",
            p.ip(),
            p.port()
        ));
    }
    s
}

/// `template` with each `${NAME}` of `vars` replaced by its value; an error if a `${...}`
/// placeholder is left (a variable the bench does not fill in, or a misspelt one).
pub fn fill(template: &str, vars: &[(&str, String)]) -> Result<String, BenchError> {
    let mut out = template.to_owned();
    for (name, value) in vars {
        out = out.replace(&format!("${{{name}}}"), value);
    }
    match out.find("${") {
        Some(at) => {
            let rest = &out[at..];
            let end = rest.find('}').map_or(rest.len(), |e| e + 1);
            Err(BenchError::Setup(format!(
                "config placeholder {} is not filled in",
                &rest[..end]
            )))
        }
        None => Ok(out),
    }
}

/// Reads the template `config`, fills in `vars` ([`fill`]) and writes it to `out`.
pub fn render_config(config: &Path, vars: &[(&str, String)], out: &Path) -> Result<(), BenchError> {
    let template = std::fs::read_to_string(config)
        .map_err(BenchError::io(format!("reading {}", config.display())))?;
    let text = fill(&template, vars)
        .map_err(|e| BenchError::Setup(format!("{}: {e}", config.display())))?;
    std::fs::write(out, text).map_err(BenchError::io(format!("writing {}", out.display())))
}

/// The ZMQ endpoint of a KV-event SUB socket bound on loopback `port`.
pub fn kv_events_endpoint(port: u16) -> String {
    format!("tcp://127.0.0.1:{port}")
}

/// The placeholders of the precise configurations (`hack/bench/{llmd,epp-llmd}-precise.yaml`):
/// `RENDER_URL`, the base URL of pod 0's vLLM render endpoints (every pod tokenizes alike, so
/// one pod stands in for llm-d's render sidecar), and `KV_EVENTS_ENDPOINT`, the SUB socket the
/// EPP binds on `kv_sub` and the pods publish to.
pub fn precise_vars(pods: &[SocketAddr], kv_sub: u16) -> Vec<(&'static str, String)> {
    let render = pods
        .first()
        .map_or_else(String::new, |p| format!("http://{p}"));
    vec![
        ("RENDER_URL", render),
        ("KV_EVENTS_ENDPOINT", kv_events_endpoint(kv_sub)),
    ]
}

/// llm-d-router's EPP with file discovery, behind Envoy. `config` is a template in which
/// `${ENDPOINTS_FILE}` is replaced by the endpoints file written here, and each of `vars` by its
/// value ([`fill`]).
pub async fn llmd(
    bins: &Bins,
    pods: &[SocketAddr],
    dir: &Path,
    config: &Path,
    vars: &[(&str, String)],
) -> Result<Running, BenchError> {
    let bin = bins.llmd_epp.clone();
    if !bin.is_file() {
        return Err(missing(&bin));
    }
    let endpoints = dir.join("llmd-endpoints.yaml");
    std::fs::write(&endpoints, endpoints_file(pods))
        .map_err(BenchError::io(format!("writing {}", endpoints.display())))?;
    let rendered = dir.join("llmd-config.yaml");
    let mut all = vec![("ENDPOINTS_FILE", endpoints.display().to_string())];
    all.extend(vars.iter().cloned());
    render_config(config, &all, &rendered)?;
    let p = free_ports(3)?;
    let mut args = common_flags(p[0], p[1], p[2]);
    args.extend([
        "--config-file".to_owned(),
        rendered.display().to_string(),
        "--allow-experimental-plugins=true".to_owned(),
    ]);
    let mut proc_ = Proc::spawn_env("llm-d-epp", &bin, &args, &[], dir)?;
    wait_http_ok(
        &mut proc_,
        SocketAddr::from(([127, 0, 0, 1], p[2])),
        "/metrics",
        Duration::from_secs(60),
    )
    .await?;
    let grpc = SocketAddr::from(([127, 0, 0, 1], p[0]));
    let envoy = EnvoyConfig::new(Template::Duplex)
        .epp(grpc)
        .concurrency(2)
        .start()
        .await?;
    Ok(Running {
        target: envoy.listener_addr(),
        procs: vec![proc_],
        envoy: Some(envoy),
        metrics: Some(SocketAddr::from(([127, 0, 0, 1], p[2]))),
        api: None,
        extproc: vec![grpc],
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn peers_are_found_where_install_peers_puts_them() {
        assert_eq!(
            peers_dir(Some("/work/peers".into())).join("x"),
            Path::new("/work/peers/x")
        );
        assert_eq!(
            peers_dir(Some("".into())),
            harness::envoy::repo_root().join(".peers")
        );
        assert_eq!(peers_dir(None), harness::envoy::repo_root().join(".peers"));
    }

    use super::*;

    #[test]
    fn the_endpoints_file_lists_every_pod_by_ip_and_port() {
        let pods = [
            SocketAddr::from(([127, 0, 0, 1], 9000)),
            SocketAddr::from(([127, 0, 0, 2], 9000)),
        ];
        let f = endpoints_file(&pods);
        assert!(f.starts_with("endpoints:\n- name: sim-0\n"), "{f}");
        assert!(
            f.contains("address: \"127.0.0.2\"\n  port: \"9000\""),
            "{f}"
        );
    }

    #[test]
    fn placeholders_are_filled_in_and_a_left_one_is_an_error() {
        let pods = [
            SocketAddr::from(([127, 0, 0, 1], 9000)),
            SocketAddr::from(([127, 0, 0, 1], 9001)),
        ];
        let vars = precise_vars(&pods, 5600);
        let t = "url: ${RENDER_URL}\nzmqEndpoint: ${KV_EVENTS_ENDPOINT}\nagain: ${RENDER_URL}\n";
        assert_eq!(
            fill(t, &vars).unwrap(),
            "url: http://127.0.0.1:9000\nzmqEndpoint: tcp://127.0.0.1:5600\nagain: http://127.0.0.1:9000\n"
        );
        let err = fill("path: ${ENDPOINTS_FILE}\n", &vars).unwrap_err();
        assert!(err.to_string().contains("${ENDPOINTS_FILE}"), "{err}");
        assert_eq!(fill("no placeholders", &[]).unwrap(), "no placeholders");
    }

    #[test]
    fn the_precise_configs_fill_in_completely_and_keep_llm_ds_plugins() {
        let root = harness::envoy::repo_root().join("hack").join("bench");
        let pods = [SocketAddr::from(([127, 0, 0, 1], 9000))];
        let mut vars = precise_vars(&pods, 5600);
        let epp = std::fs::read_to_string(root.join("epp-llmd-precise.yaml")).unwrap();
        let epp = fill(&epp, &vars).unwrap();
        vars.push(("ENDPOINTS_FILE", "/tmp/endpoints.yaml".into()));
        let llmd = std::fs::read_to_string(root.join("llmd-precise.yaml")).unwrap();
        let llmd = fill(&llmd, &vars).unwrap();
        for text in [&epp, &llmd] {
            for needle in [
                "type: token-producer",
                "url: http://127.0.0.1:9000",
                "type: precise-prefix-cache-producer",
                "zmqEndpoint: tcp://127.0.0.1:5600",
                "discoverPods: false",
                "speculativeIndexing: true",
                "prefixMatchInfoProducerName: precise-prefix-cache-producer",
            ] {
                assert!(text.contains(needle), "{needle} missing:\n{text}");
            }
        }
        assert!(llmd.contains("type: file-discovery") && llmd.contains("/tmp/endpoints.yaml"));
        assert!(!epp.contains("type: file-discovery"));
        // The same plugins and weights apart from discovery: equal once the discovery plugin
        // and the comments are left out.
        let body = |t: &str| -> String {
            let t = t.replace(
                "- name: endpoints\n  type: file-discovery\n  parameters:\n    path: /tmp/endpoints.yaml\n",
                "",
            );
            let t = t.replace("  discovery:\n    pluginRef: endpoints\n", "");
            t.lines()
                .filter(|l| !l.starts_with('#'))
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(body(&epp), body(&llmd));
    }

    #[tokio::test]
    async fn the_fake_api_server_holds_the_pool_and_ready_pods() {
        let api = FakeApiServer::bind().await.unwrap();
        let pods = [
            SocketAddr::from(([127, 0, 0, 1], 9000)),
            SocketAddr::from(([127, 0, 0, 2], 9000)),
        ];
        seed_store(&api, &pods).unwrap();
        let (_, listed) = api.store().list("api/v1/pods", Some(NAMESPACE));
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[1]["status"]["podIP"], "127.0.0.2");
        let (_, pools) = api
            .store()
            .list("apis/inference.networking.k8s.io/v1/inferencepools", None);
        assert_eq!(pools[0]["spec"]["targetPorts"][0]["number"], 9000);
        let mixed = [
            SocketAddr::from(([127, 0, 0, 1], 9000)),
            SocketAddr::from(([127, 0, 0, 1], 9001)),
        ];
        let other = FakeApiServer::bind().await.unwrap();
        assert!(seed_store(&other, &mixed).is_err());
    }
}

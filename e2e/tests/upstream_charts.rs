//! The drop-in promise, tested as a user would try it: the upstream charts rendered with only
//! the image swapped start epp with their exact arguments, environment and mounted ConfigMap,
//! and a request through a real Envoy is served.
//!
//! - GIE v1.5.0's `inferencepool` chart is rendered here by Helm's own Go code from the Go
//!   module cache (`go mod download sigs.k8s.io/gateway-api-inference-extension@v1.5.0`):
//!   vLLM, SGLang, TRT-LLM (trtllm-serve), tracing on and off, 1 and 3 replicas.
//! - llm-d-router v0.10.0 is not served by the Go module proxy here (403 "This module version
//!   is not available"), so its `llm-d-router-gateway` / `-standalone` renderings are the
//!   recorded arguments and ConfigMap of `helm template` at tag v0.10.0 (release `vllm-llama`,
//!   namespace `llm-d`; defaults, and `epp.replicas: 3` with tracing), below.
//!
//! What the test changes, and why: the release is named `pool` in namespace `llm` (the names a
//! user picks), the ConfigMap is written where the Deployment mounts it (`/config` → a temp
//! directory), `--kubeconfig` points epp at an in-process API server (in a cluster epp finds
//! it in-cluster), and epp's listeners are bound by the test (ports 9002/9003/9090 in a pod).
//! The pods are simulator pods exposing the engine's own metric names, so a wrong metric-name
//! flag shows as failed scrapes.
#![allow(clippy::unwrap_used)]

mod k8s_support;

use harness::envoy::{EnvoyConfig, Template};
use harness::fake_apiserver::FakeApiServer;
use inference_sim::{Cluster, EngineConfig, EngineNaming, PodConfig};
use k8s_support::{create, create_pod, pool, NS};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use tokio::net::TcpListener;

const RELEASE: &str = "pool";
const MODEL: &str = "test-model";

/// One rendering: the epp container's args and plain env, and the ConfigMap it mounts.
struct Rendering {
    name: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    config: String,
    naming: EngineNaming,
}

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn gie_dir() -> PathBuf {
    harness::gie::module_dir("the upstream chart")
}

/// A writable copy of GIE's `inferencepool` chart with its library chart in `charts/` (what
/// `helm dependency build` does for the `file://../epplib` dependency).
fn gie_chart(work: &Path) -> PathBuf {
    let charts = gie_dir().join("config/charts");
    let chart = work.join("inferencepool");
    let copy = |from: &Path, to: &Path| {
        let ok = Command::new("cp")
            .arg("-r")
            .arg(from)
            .arg(to)
            .status()
            .unwrap();
        assert!(ok.success());
    };
    copy(&charts.join("inferencepool"), &chart);
    let ok = Command::new("chmod")
        .args(["-R", "u+w"])
        .arg(&chart)
        .status()
        .unwrap();
    assert!(ok.success());
    std::fs::create_dir_all(chart.join("charts")).unwrap();
    copy(&charts.join("epplib"), &chart.join("charts/epplib"));
    chart
}

/// Renders `chart` with `values`; the objects.
fn render(chart: &Path, values: &Value) -> Vec<Value> {
    let venv = Command::new(root().join("hack/helm/venv.sh"))
        .output()
        .unwrap();
    assert!(
        venv.status.success(),
        "{}",
        String::from_utf8_lossy(&venv.stderr)
    );
    let python = String::from_utf8(venv.stdout).unwrap().trim().to_owned();
    let out = Command::new(python)
        .arg(root().join("hack/helm/render.py"))
        .arg(chart)
        .args([RELEASE, NS, &values.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "render: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut objects = Vec::new();
    for text in result["manifests"].as_object().unwrap().values() {
        for doc in serde_norway::Deserializer::from_str(text.as_str().unwrap()) {
            let v: Value = serde::Deserialize::deserialize(doc).unwrap();
            if !v.is_null() {
                objects.push(v);
            }
        }
    }
    objects
}

/// The epp container and the ConfigMap key it mounts, out of a rendering.
fn extract(name: &str, objects: &[Value], naming: EngineNaming) -> Rendering {
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("a Deployment");
    let container = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "epp")
        .expect("the epp container");
    let args: Vec<String> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    let env = container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_owned(),
                e["value"].as_str()?.to_owned(),
            ))
        })
        .collect();
    let file = args
        .iter()
        .skip_while(|a| *a != "--config-file")
        .nth(1)
        .expect("--config-file")
        .rsplit('/')
        .next()
        .unwrap()
        .to_owned();
    let config = objects
        .iter()
        .filter(|o| o["kind"] == "ConfigMap")
        .find_map(|o| o["data"][&file].as_str())
        .expect("the mounted ConfigMap key")
        .to_owned();
    Rendering {
        name: name.to_owned(),
        args,
        env,
        config,
        naming,
    }
}

fn gie_renderings(work: &Path) -> Vec<Rendering> {
    let chart = gie_chart(work);
    let base = json!({"inferencePool": {"modelServers": {"matchLabels": {"app": "vllm"}}}});
    let with = |patch: Value| {
        let mut v = base.clone();
        merge(&mut v, &patch);
        v
    };
    let variants = [
        ("gie vllm", base.clone(), EngineNaming::Vllm),
        (
            "gie sglang",
            with(json!({"inferencePool": {"modelServerType": "sglang"}})),
            EngineNaming::Sglang,
        ),
        (
            "gie trtllm-serve",
            with(json!({"inferencePool": {"modelServerType": "trtllm-serve"}})),
            EngineNaming::TrtllmServe,
        ),
        (
            "gie tracing on",
            with(json!({"inferenceExtension": {"tracing": {"enabled": true}}})),
            EngineNaming::Vllm,
        ),
        (
            "gie 3 replicas",
            with(json!({"inferenceExtension": {"replicas": 3}})),
            EngineNaming::Vllm,
        ),
    ];
    variants
        .into_iter()
        .map(|(name, values, naming)| extract(name, &render(&chart, &values), naming))
        .collect()
}

fn merge(into: &mut Value, patch: &Value) {
    match (into, patch) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v.clone(),
    }
}

/// llm-d-router v0.10.0's charts, as `helm template` rendered them at the tag (see the module
/// doc): `llm-d-router-gateway` and `llm-d-router-standalone` render the same epp container.
const LLMD_CONFIG: &str = r#"apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: metrics-data-source
  parameters:
    scheme: "http"
    path: "/metrics"
    insecureSkipVerify: true
- type: core-metrics-extractor
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
"#;

fn llmd_renderings() -> Vec<Rendering> {
    let args = |extra: &[&str], tracing: &str| -> Vec<String> {
        let mut a: Vec<String> = [
            "--pool-name",
            RELEASE,
            "--pool-namespace",
            NS,
            "--pool-group",
            "inference.networking.k8s.io",
            "--zap-encoder",
            "json",
            "--config-file",
            "/config/default-plugins.yaml",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        a.extend([
            "--grpc-health-port".into(),
            "9003".into(),
            tracing.to_owned(),
        ]);
        a
    };
    let otel = [
        ("OTEL_SERVICE_NAME", "llm-d-router/epp"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4317"),
        ("OTEL_TRACES_EXPORTER", "otlp"),
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "0.1"),
    ];
    vec![
        Rendering {
            name: "llm-d-router-gateway/standalone defaults".into(),
            args: args(&[], "--tracing=false"),
            env: Vec::new(),
            config: LLMD_CONFIG.into(),
            naming: EngineNaming::Vllm,
        },
        Rendering {
            name: "llm-d-router 3 replicas, tracing, sglang".into(),
            args: args(&["--ha-enable-leader-election"], "--tracing=true"),
            env: otel
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            config: LLMD_CONFIG.replace(
                "- type: core-metrics-extractor\n",
                "- type: core-metrics-extractor\n  parameters:\n    defaultEngine: \"sglang\"\n",
            ),
            naming: EngineNaming::Sglang,
        },
    ]
}

/// Starts one simulator pod, the API server objects, epp with the rendering's args, and Envoy;
/// sends requests until one is served (or 20 s pass). Returns an error naming what failed.
async fn serve(r: &Rendering, dir: &Path) -> Result<(), String> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut cfg = PodConfig {
        engine: EngineConfig {
            model: MODEL.into(),
            time_scale: 20.0,
            ..EngineConfig::default()
        },
        pod_name: "sim-0".into(),
        ..Default::default()
    };
    cfg.metrics.naming = r.naming;
    let cluster = Cluster::start_on(vec![cfg], vec![listener]).await.unwrap();
    let api = FakeApiServer::bind().await.unwrap();
    let client = api.client(NS).unwrap();
    create(&client, pool(&[port])).await;
    create_pod(&client, "sim-0", "127.0.0.1").await;
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig, NS).unwrap();
    let mount = dir.join("config");
    std::fs::create_dir_all(&mount).unwrap();
    let mut argv = vec!["epp".to_owned()];
    for a in &r.args {
        match a.strip_prefix("/config/") {
            Some(file) => {
                std::fs::write(mount.join(file), &r.config).unwrap();
                argv.push(mount.join(file).display().to_string());
            }
            None => argv.push(a.clone()),
        }
    }
    argv.extend(["--kubeconfig".into(), kubeconfig.display().to_string()]);
    // The renderings keep upstream's /metrics auth on; the fake API server reviews no tokens,
    // so the scrape check below reads /metrics with auth off (kube_ops tests the auth itself).
    if !argv
        .iter()
        .any(|a| a.starts_with("--metrics-endpoint-auth"))
    {
        argv.push("--metrics-endpoint-auth=false".into());
    }
    // The shared in-process launcher binds the ports and waits for readiness (the leader's,
    // with leader election); a refused argument or config fails start-up with its message.
    let epp = harness::stack::Epp::start(&argv[1..])
        .await
        .map_err(|e| format!("epp did not start with {argv:?}: {e:#}"))?;
    let (grpc, metrics) = (epp.grpc, epp.metrics);
    let envoy = EnvoyConfig::new(Template::Duplex)
        .epp(grpc)
        .epp_tls(true)
        .pool(cluster.addrs().iter().copied())
        .start()
        .await
        .unwrap();
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3});
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut last;
    let outcome = loop {
        match harness::client::post_json(
            envoy.listener_addr(),
            "/v1/chat/completions",
            body.to_string(),
        )
        .await
        {
            Ok(resp)
                if resp.status.is_success() && resp.header("x-inference-pod") == Some("sim-0") =>
            {
                break Ok(());
            }
            Ok(resp) => last = format!("{} {}", resp.status, resp.text()),
            Err(e) => last = e.to_string(),
        }
        if tokio::time::Instant::now() > deadline {
            break Err(format!("not served within 20 s; last answer: {last}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // The engine's metric names are read: scrapes succeed and none fail.
    let scrapes = if outcome.is_ok() {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let text = harness::client::get(metrics, "/metrics")
            .await
            .unwrap()
            .text();
        let count = |outcome: &str| -> f64 {
            let series = format!("epp_metrics_scrapes_total{{outcome=\"{outcome}\"}}");
            harness::prometheus::sum(&text, &series)
        };
        if count("success") > 0.0 && count("failure") == 0.0 {
            Ok(())
        } else {
            Err(format!(
                "scrapes: {} succeeded, {} failed",
                count("success"),
                count("failure")
            ))
        }
    } else {
        Ok(())
    };
    drop(envoy);
    epp.stop().await;
    drop(cluster);
    outcome.and(scrapes)
}

#[test]
fn every_upstream_chart_rendering_starts_epp_and_serves() {
    let work = std::env::temp_dir().join(format!("epp-upstream-charts-{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    let mut renderings = gie_renderings(&work);
    renderings.extend(llmd_renderings());
    let mut failures = Vec::new();
    for (i, r) in renderings.iter().enumerate() {
        // The rendering's plain environment, set while no runtime thread exists.
        for (k, v) in &r.env {
            std::env::set_var(k, v);
        }
        let dir = work.join(format!("r{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let result = rt.block_on(serve(r, &dir));
        eprintln!("{}: {result:?}\n  args {:?}", r.name, r.args);
        if let Err(e) = result {
            failures.push(format!("{}: {e}", r.name));
        }
        drop(rt);
        for (k, _) in &r.env {
            std::env::remove_var(k);
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    assert!(renderings.len() >= 7);
    assert!(
        failures.is_empty(),
        "renderings that did not serve:\n{}",
        failures.join("\n")
    );
}

#[test]
fn the_charts_payload_agnostic_profile_needs_the_experimental_flag_as_upstream() {
    // llm-d-router v0.10.0's chart ships `payload-agnostic.yaml` (passthrough parser,
    // active-request-scorer, session-affinity-scorer); session-affinity-scorer is Alpha, so
    // upstream refuses it without --allow-experimental-plugins, and so does epp, with
    // upstream's message.
    let text = "apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: passthrough-parser
- type: session-affinity-scorer
requestHandler:
  parsers:
  - pluginRef: passthrough-parser
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: session-affinity-scorer
    weight: 1
";
    let err = epp::director::Runtime::build(text, None)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("plugin 'session-affinity-scorer' (type: 'session-affinity-scorer') has Alpha stability level, but command line flag --allow-experimental-plugins is not set"),
        "{err}"
    );
    let load = epp::config::LoadOptions {
        allow_experimental: true,
    };
    epp::director::Runtime::build_with(text, None, load).unwrap();
}

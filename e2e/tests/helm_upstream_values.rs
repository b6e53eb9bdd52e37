//! Values files written for the upstream charts carry over to `charts/inferencepool`: GIE v1.5's
//! `inferencepool` layout (`inferenceExtension.*`, `inferencePool.*`) and llm-d-router v0.10's
//! (`router.*`). Rendered by Helm's own Go code (as `helm.rs`); the epp args must parse with
//! epp's `Options`, and every EndpointPickerConfig file of the ConfigMap must build.
#![allow(clippy::unwrap_used)]

use epp::endpoint::EngineType;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// Lints (strict) and renders release `vllm-llama` in namespace `llm-d`; `Err` is Helm's error
/// text (a template's `fail`).
fn try_render(values: &Value) -> Result<Vec<Value>, String> {
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
        .args(["vllm-llama", "llm-d", &values.to_string()])
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["lint"]["errors"], json!([]), "{}", result["lint"]);
    let mut objects = Vec::new();
    for text in result["manifests"].as_object().unwrap().values() {
        for doc in text.as_str().unwrap().split("\n---\n") {
            let v: Value = serde_norway::from_str(&format!("{doc}\n")).unwrap();
            if !v.is_null() {
                objects.push(v);
            }
        }
    }
    Ok(objects)
}

fn render(values: &Value) -> Vec<Value> {
    try_render(values).unwrap_or_else(|e| panic!("render failed: {e}"))
}

fn find<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
}

fn container(objects: &[Value]) -> &Value {
    let d = find(objects, "Deployment");
    let typed: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(d.clone())
        .unwrap_or_else(|e| panic!("the Deployment does not decode: {e}\n{d:#}"));
    assert!(typed.spec.template.spec.is_some());
    &d["spec"]["template"]["spec"]["containers"][0]
}

/// The epp args, parsed and validated as epp does at start.
fn options(objects: &[Value]) -> (Vec<String>, epp::app::Options) {
    let args: Vec<String> = serde_json::from_value(container(objects)["args"].clone()).unwrap();
    let opts: epp::app::Options =
        clap::Parser::try_parse_from(std::iter::once("epp".to_owned()).chain(args.iter().cloned()))
            .unwrap_or_else(|e| panic!("epp rejects the chart's args {args:?}: {e}"));
    opts.validate().unwrap();
    (args, opts)
}

/// `name -> value` of the container's env (valueFrom entries as `<-fieldPath`).
fn env(objects: &[Value]) -> Vec<(String, String)> {
    container(objects)["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let value = e["value"].as_str().map(str::to_owned).unwrap_or_else(|| {
                format!(
                    "<-{}",
                    e["valueFrom"]["fieldRef"]["fieldPath"].as_str().unwrap()
                )
            });
            (e["name"].as_str().unwrap().to_owned(), value)
        })
        .collect()
}

fn env_value<'a>(env: &'a [(String, String)], name: &str) -> &'a str {
    &env.iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no {name} in {env:?}"))
        .1
}

/// Every file of the ConfigMap must build (alpha plugins allowed, except in `file` when not
/// `experimental`, the --allow-experimental-plugins epp runs with); returns what `file` sets
/// for start-up (the metrics source).
fn config(objects: &[Value], file: &str, experimental: bool) -> epp::director::Startup {
    let cm = find(objects, "ConfigMap");
    let data = cm["data"].as_object().unwrap();
    let mut chosen = None;
    for (name, text) in data {
        let load = epp::config::LoadOptions {
            allow_experimental: name != file || experimental,
        };
        let configured = epp::director::Runtime::configure(text.as_str().unwrap(), None, load)
            .unwrap_or_else(|e| panic!("ConfigMap file {name} does not build: {e}"));
        if name == file {
            chosen = Some(configured.startup);
        }
    }
    chosen.unwrap_or_else(|| panic!("no {file} in the ConfigMap: {:?}", data.keys()))
}

const CUSTOM: &str = "apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: prefix-cache-scorer
- type: core-metrics-extractor
  parameters:
    defaultEngine: sglang
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: prefix-cache-scorer
    weight: 4
";

const OTEL: [&str; 8] = [
    "OTEL_SERVICE_NAME",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_TRACES_EXPORTER",
    "OTEL_RESOURCE_ATTRIBUTES_NODE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES_POD_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
];

#[test]
fn a_gie_inferencepool_values_file_carries_over() {
    let values = json!({
        "inferenceExtension": {
            "replicas": 3,
            "image": {"registry": "registry.example.com", "repository": "epp-rs/epp", "tag": "0.1.0", "pullPolicy": "Always"},
            "failureMode": "FailClose",
            "flags": {"v": 4, "secure-serving": false, "refresh-metrics-interval": "100ms"},
            "env": [{"name": "RUST_BACKTRACE", "value": "1"}],
            "pluginsConfigFile": "custom-plugins.yaml",
            "pluginsCustomConfig": {"custom-plugins.yaml": CUSTOM},
            "extraContainerPorts": [{"name": "zmq", "containerPort": 5557, "protocol": "TCP"}],
            "extraServicePorts": [{"name": "zmq", "port": 5557, "protocol": "TCP", "targetPort": 5557}],
            "volumes": [{"name": "cache", "emptyDir": {}}],
            "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["cpu"]}]}]}}},
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
            "resources": {"requests": {"cpu": "2", "memory": "4Gi"}},
            "monitoring": {"interval": "30s", "prometheus": {"enabled": true, "auth": {"enabled": false}, "extraLabels": {"release": "kube-prometheus"}}},
            "tracing": {"enabled": true, "otelExporterEndpoint": "http://otel-collector:4317", "sampling": {"sampler": "parentbased_traceidratio", "samplerArg": "0.5"}},
            "metricsDataSource": {"scheme": "http", "path": "/metrics", "insecureSkipVerify": true},
            "sidecar": {"enabled": false},
            "latencyPredictor": {"enabled": false}
        },
        "inferencePool": {
            "targetPorts": [{"number": 8000}, {"number": 8001}],
            "modelServerType": "sglang",
            "modelServerProtocol": "http",
            "apiVersion": "inference.networking.k8s.io/v1",
            "modelServers": {"matchLabels": {"app": "sglang-llama"}}
        },
        "provider": {"name": "none"},
        "experimentalHttpRoute": {"enabled": true, "inferenceGatewayName": "inference-gateway", "requestTimeout": "600s"},
        "inferenceObjectives": [{"name": "high-priority", "priority": 5}, {"name": "batch", "priority": -1}]
    });
    let objects = render(&values);
    let (args, opts) = options(&objects);
    assert_eq!(opts.pool_name.as_deref(), Some("vllm-llama"));
    assert_eq!(opts.pool_namespace, "llm-d");
    assert_eq!(
        opts.verbosity, 4,
        "flags.v replaces the chart's -v: {args:?}"
    );
    assert!(
        !opts.secure_serving,
        "flags render --k=v, so false stays false"
    );
    assert!(opts.ha_enable_leader_election, "replicas 3");
    assert!(opts.tracing);
    assert_eq!(
        opts.config_file.as_deref(),
        Some(Path::new("/config/custom-plugins.yaml"))
    );
    assert_eq!(
        opts.refresh_metrics_interval,
        std::time::Duration::from_millis(100)
    );
    assert!(
        !args
            .iter()
            .any(|a| a.contains("-metric=") || a.ends_with("-metric")),
        "no deprecated metric flags for sglang (the engine is in the ConfigMap): {args:?}"
    );

    let d = find(&objects, "Deployment");
    assert_eq!(d["spec"]["replicas"], 3);
    let c = container(&objects);
    assert_eq!(c["image"], "registry.example.com/epp-rs/epp:0.1.0");
    assert_eq!(c["imagePullPolicy"], "Always");
    assert_eq!(
        c["resources"],
        json!({"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "16Gi"}}),
        "merged with the chart's defaults, as upstream's"
    );
    assert_eq!(c["readinessProbe"]["grpc"]["service"], "readiness");
    assert_eq!(c["ports"][3]["containerPort"], 5557);
    assert_eq!(c["volumeMounts"][1]["mountPath"], "/cache");
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["volumes"][1]["name"], "cache");
    assert_eq!(pod["tolerations"][0]["key"], "dedicated");
    assert!(pod["affinity"]["nodeAffinity"].is_object());

    let env = env(&objects);
    let names: Vec<&str> = env.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[2..10], OTEL, "OTEL env as upstream's chart");
    assert_eq!(names.last(), Some(&"RUST_BACKTRACE"), "user env last");
    assert_eq!(
        env_value(&env, "OTEL_SERVICE_NAME"),
        "gateway-api-inference-extension/epp"
    );
    assert_eq!(
        env_value(&env, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        "http://otel-collector:4317"
    );
    assert_eq!(env_value(&env, "OTEL_TRACES_SAMPLER_ARG"), "0.5");
    assert_eq!(
        env_value(&env, "OTEL_RESOURCE_ATTRIBUTES_NODE_NAME"),
        "<-spec.nodeName"
    );

    // The chosen file is the custom one; the default file carries the engine, as upstream's.
    let custom = config(&objects, "custom-plugins.yaml", false);
    assert_eq!(
        custom.metrics_settings.default_engine,
        Some(EngineType::Sglang)
    );
    let default = config(&objects, "default-plugins.yaml", false);
    assert_eq!(
        default.metrics_settings.default_engine,
        Some(EngineType::Sglang)
    );

    let pool = find(&objects, "InferencePool");
    drop(
        serde_json::from_value::<epp::discovery::k8s::crd::pool::InferencePool>(pool.clone())
            .unwrap(),
    );
    assert_eq!(
        pool["spec"]["targetPorts"],
        json!([{"number": 8000}, {"number": 8001}])
    );
    assert_eq!(
        pool["spec"]["selector"]["matchLabels"],
        json!({"app": "sglang-llama"})
    );
    assert_eq!(
        pool["spec"]["endpointPickerRef"]["failureMode"],
        "FailClose"
    );

    let service = find(&objects, "Service");
    assert_eq!(service["spec"]["ports"][2]["name"], "zmq");
    let sm = find(&objects, "ServiceMonitor");
    assert_eq!(sm["spec"]["endpoints"][0]["interval"], "30s");
    assert_eq!(sm["metadata"]["labels"]["release"], "kube-prometheus");
    let route = find(&objects, "HTTPRoute");
    assert_eq!(route["spec"]["parentRefs"][0]["name"], "inference-gateway");
    assert_eq!(
        route["spec"]["rules"][0]["backendRefs"][0]["kind"],
        "InferencePool"
    );
    assert_eq!(route["spec"]["rules"][0]["timeouts"]["request"], "600s");
    let objectives: Vec<_> = objects
        .iter()
        .filter(|o| o["kind"] == "InferenceObjective")
        .map(|o| {
            drop(
                serde_json::from_value::<epp::discovery::k8s::crd::objective::InferenceObjective>(
                    o.clone(),
                )
                .unwrap(),
            );
            (o["metadata"]["name"].clone(), o["spec"]["priority"].clone())
        })
        .collect();
    assert_eq!(
        objectives,
        [
            (json!("high-priority"), json!(5)),
            (json!("batch"), json!(-1))
        ]
    );
}

fn llm_d_values() -> Value {
    json!({
        "router": {
            "epp": {
                "replicas": 3,
                "image": {"registry": "ghcr.io/epp-rs", "repository": "epp", "tag": "0.1.0", "pullPolicy": "Always"},
                "extProcPort": 9002,
                "grpcHealthPort": 9005,
                "flags": {"v": 4, "secure-serving": false},
                "env": [{"name": "RUST_BACKTRACE", "value": "1"}],
                "parsers": ["openai-parser", "anthropic-parser"],
                "metricsDataSource": {"scheme": "http", "path": "/metrics", "insecureSkipVerify": true},
                "pluginsConfigFile": "default-plugins.yaml",
                "pluginsCustomConfig": {"custom-plugins.yaml": CUSTOM},
                "podAnnotations": {"prometheus.io/scrape": "true"},
                "resources": {"requests": {"cpu": "8", "memory": "8Gi"}, "limits": {"memory": "16Gi"}}
            },
            "modelServers": {"type": "sglang", "protocol": "http", "targetPorts": [{"number": 8000}], "matchLabels": {"app": "sglang-llama"}},
            "inferencePool": {"create": true, "failureMode": "FailClose"},
            "monitoring": {"interval": "15s", "prometheus": {"enabled": true, "auth": {"enabled": false}}},
            "tracing": {"enabled": true, "otelExporterEndpoint": "http://otel-collector:4317", "sampling": {"sampler": "parentbased_traceidratio", "samplerArg": "0.1"}},
            "inferenceObjectives": [{"name": "interactive", "priority": 10}],
            "proxy": {"enabled": false},
            "tokenizer": {"enabled": false},
            "latencyPredictor": {"enabled": false}
        },
        "provider": {"name": "istio"},
        "httpRoute": {"create": true, "inferenceGatewayName": "llm-d-gateway", "inferenceGatewayNamespace": "gateways", "requestTimeout": "300s", "headerMatches": {"x-route": "llama"}}
    })
}

#[test]
fn an_llm_d_router_values_file_carries_over() {
    let objects = render(&llm_d_values());
    let (args, opts) = options(&objects);
    assert_eq!(opts.pool_name.as_deref(), Some("vllm-llama"));
    assert_eq!(opts.verbosity, 4);
    assert!(!opts.secure_serving);
    assert!(opts.ha_enable_leader_election);
    assert!(opts.tracing);
    assert_eq!(opts.grpc_health_port, 9005);
    assert_eq!(
        opts.config_file.as_deref(),
        Some(Path::new("/config/default-plugins.yaml"))
    );
    assert!(
        args.contains(&"--secure-serving=false".to_owned()),
        "{args:?}"
    );

    let d = find(&objects, "Deployment");
    assert_eq!(d["spec"]["replicas"], 3);
    assert_eq!(
        d["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"],
        "true"
    );
    let c = container(&objects);
    assert_eq!(c["image"], "ghcr.io/epp-rs/epp:0.1.0");
    assert_eq!(c["ports"][1]["containerPort"], 9005);
    assert_eq!(
        c["livenessProbe"]["grpc"],
        json!({"port": 9005, "service": "liveness"})
    );
    assert_eq!(c["resources"]["requests"]["cpu"], "8");
    let env = env(&objects);
    assert_eq!(env_value(&env, "OTEL_SERVICE_NAME"), "llm-d-router/epp");
    assert_eq!(
        env_value(&env, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        "http://otel-collector:4317"
    );
    assert_eq!(env.last().unwrap().0, "RUST_BACKTRACE");

    let runtime = config(&objects, "default-plugins.yaml", false);
    assert_eq!(
        runtime.metrics_settings.default_engine,
        Some(EngineType::Sglang),
        "router.modelServers.type is core-metrics-extractor's defaultEngine"
    );
    let text = find(&objects, "ConfigMap")["data"]["default-plugins.yaml"]
        .as_str()
        .unwrap()
        .to_owned();
    let doc: Value = serde_norway::from_str(&text).unwrap();
    assert_eq!(doc["apiVersion"], "llm-d.ai/v1alpha1");
    assert_eq!(
        doc["requestHandler"]["parsers"],
        json!([{"pluginRef": "openai-parser"}, {"pluginRef": "anthropic-parser"}])
    );
    // llm-d-router's second shipped profile is there too (its session-affinity-scorer is alpha).
    config(&objects, "payload-agnostic.yaml", true);
    config(&objects, "custom-plugins.yaml", true);

    let pool = find(&objects, "InferencePool");
    assert_eq!(
        pool["spec"]["selector"]["matchLabels"],
        json!({"app": "sglang-llama"})
    );
    assert_eq!(
        pool["spec"]["endpointPickerRef"]["failureMode"],
        "FailClose"
    );
    assert_eq!(
        find(&objects, "ServiceMonitor")["spec"]["endpoints"][0]["interval"],
        "15s"
    );
    let objective = find(&objects, "InferenceObjective");
    assert_eq!(
        objective["apiVersion"], "inference.networking.x-k8s.io/v1alpha2",
        "the group epp watches"
    );
    assert_eq!(objective["spec"]["priority"], 10);
    let route = find(&objects, "HTTPRoute");
    assert_eq!(
        route["spec"]["parentRefs"][0],
        json!({"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "llm-d-gateway", "namespace": "gateways"})
    );
    assert_eq!(
        route["spec"]["rules"][0]["matches"][0]["headers"],
        json!([{"type": "Exact", "name": "x-route", "value": "llama"}])
    );
    assert_eq!(
        find(&objects, "DestinationRule")["spec"]["host"],
        "vllm-llama-epp.llm-d.svc.cluster.local"
    );
}

#[test]
fn router_inference_pool_create_false_runs_epp_standalone() {
    let mut values = llm_d_values();
    values["router"]["inferencePool"] = json!({"create": false});
    values["router"]["modelServers"]["targetPorts"] = json!([{"number": 8000}, {"number": 8001}]);
    values["router"]["modelServers"]["matchLabels"] = json!({"app": "sglang-llama", "tier": "gpu"});
    values["router"]["epp"]["pluginsConfigFile"] = json!("payload-agnostic.yaml");
    values["router"]["epp"]["flags"]["allow-experimental-plugins"] = json!(true);
    values["httpRoute"] = json!({"create": false});
    let objects = render(&values);
    let (_, opts) = options(&objects);
    assert_eq!(opts.pool_name, None);
    assert_eq!(
        opts.endpoint_selector.as_deref(),
        Some("app=sglang-llama,tier=gpu")
    );
    assert_eq!(opts.endpoint_target_ports, [8000, 8001]);
    assert!(opts.allow_experimental_plugins);
    assert_eq!(
        opts.config_file.as_deref(),
        Some(Path::new("/config/payload-agnostic.yaml"))
    );
    config(
        &objects,
        "payload-agnostic.yaml",
        opts.allow_experimental_plugins,
    );
    assert!(!objects.iter().any(|o| o["kind"] == "InferencePool"));
    let role = objects
        .iter()
        .find(|o| o["kind"] == "Role" && o["metadata"]["name"] == "vllm-llama-epp")
        .unwrap();
    assert!(
        !role.to_string().contains("inferencepools"),
        "no pool to read: {role}"
    );

    // GIE's endpointsServer says the same.
    let objects = render(&json!({
        "inferenceExtension": {"endpointsServer": {"createInferencePool": false, "endpointSelector": "app=vllm", "targetPorts": "8000,8001", "modelServerType": "vllm"}},
        "inferencePool": {"modelServers": {"matchLabels": {"app": "ignored"}}}
    }));
    let (_, opts) = options(&objects);
    assert_eq!(opts.endpoint_selector.as_deref(), Some("app=vllm"));
    assert_eq!(opts.endpoint_target_ports, [8000, 8001]);
    assert!(!objects.iter().any(|o| o["kind"] == "InferencePool"));
}

#[test]
fn router_values_win_over_the_gie_names() {
    let objects = render(&json!({
        "inferenceExtension": {"replicas": 2, "flags": {"v": 2, "refresh-metrics-interval": "100ms"}},
        "inferencePool": {"modelServerType": "trtllm-serve", "modelServers": {"matchLabels": {"app": "gie"}}, "failureMode": "FailOpen"},
        "router": {
            "epp": {"replicas": 4, "flags": {"v": 5}},
            "modelServers": {"type": "sglang", "matchLabels": {"app": "router"}},
            "inferencePool": {"failureMode": "FailClose"}
        }
    }));
    let (_, opts) = options(&objects);
    assert_eq!(find(&objects, "Deployment")["spec"]["replicas"], 4);
    assert_eq!(opts.verbosity, 5, "router.epp.flags wins per key");
    assert_eq!(
        opts.refresh_metrics_interval,
        std::time::Duration::from_millis(100),
        "GIE flags the router map does not name stay"
    );
    assert_eq!(
        config(&objects, "default-plugins.yaml", false)
            .metrics_settings
            .default_engine,
        Some(EngineType::Sglang)
    );
    let pool = find(&objects, "InferencePool");
    assert_eq!(
        pool["spec"]["selector"]["matchLabels"],
        json!({"app": "router"})
    );
    assert_eq!(
        pool["spec"]["endpointPickerRef"]["failureMode"],
        "FailClose"
    );
}

#[test]
fn the_engine_without_a_custom_config_only_adds_the_data_layer_when_needed() {
    let base = json!({"inferencePool": {"modelServers": {"matchLabels": {"app": "vllm"}}}});
    let objects = render(&base);
    let text = find(&objects, "ConfigMap")["data"]["default-plugins.yaml"].to_string();
    assert!(!text.contains("core-metrics-extractor"), "{text}");
    for engine in [
        EngineType::Sglang,
        EngineType::TrtllmServe,
        EngineType::TritonTrtllm,
    ] {
        let name = match engine {
            EngineType::Sglang => "sglang",
            EngineType::TrtllmServe => "trtllm-serve",
            _ => "triton-tensorrt-llm",
        };
        let mut values = base.clone();
        values["inferencePool"]["modelServerType"] = json!(name);
        let objects = render(&values);
        let (args, _) = options(&objects);
        assert!(
            !args
                .iter()
                .any(|a| a.contains("-metric=") || a.ends_with("-metric")),
            "{args:?}"
        );
        assert_eq!(
            config(&objects, "default-plugins.yaml", false)
                .metrics_settings
                .default_engine,
            Some(engine)
        );
    }
}

#[test]
fn a_custom_config_as_text_still_replaces_the_default_file() {
    let objects = render(&json!({
        "inferenceExtension": {"pluginsCustomConfig": CUSTOM},
        "inferencePool": {"modelServers": {"matchLabels": {"app": "vllm"}}}
    }));
    let data = find(&objects, "ConfigMap")["data"].as_object().unwrap();
    assert_eq!(data.len(), 1);
    assert_eq!(data["default-plugins.yaml"], CUSTOM);
    let (_, opts) = options(&objects);
    assert_eq!(
        opts.config_file.as_deref(),
        Some(Path::new("/config/default-plugins.yaml"))
    );
    config(&objects, "default-plugins.yaml", false);
}

#[test]
fn upstream_keys_epp_cannot_honour_fail_with_a_message() {
    let gie = |extra: Value| {
        let mut v = json!({"inferencePool": {"modelServers": {"matchLabels": {"app": "vllm"}}}});
        json_merge(&mut v, extra);
        v
    };
    let router = |extra: Value| {
        let mut v = json!({"router": {"modelServers": {"matchLabels": {"app": "vllm"}}}});
        json_merge(&mut v, extra);
        v
    };
    let cases = [
        (
            gie(json!({"inferenceExtension": {"image": {"registry": "registry.k8s.io", "repository": "gateway-api-inference-extension/epp", "tag": "v1.5.0"}}})),
            "is upstream's Go EPP",
        ),
        (
            router(json!({"router": {"epp": {"image": {"registry": "ghcr.io/llm-d", "repository": "llm-d-router-endpoint-picker", "tag": "main"}}}})),
            "is upstream's Go EPP",
        ),
        (
            router(json!({"router": {"epp": {"grpcHealthProbe": 1, "extraArgs": []}}})),
            "unknown or unsupported values: router.epp.extraArgs, router.epp.grpcHealthProbe",
        ),
        (
            gie(json!({"inferenceExtension": {"replica": 2}})),
            "unknown or unsupported values: inferenceExtension.replica",
        ),
        (
            gie(json!({"inferenceExtension": {"sidecar": {"enabled": true}}})),
            "inferenceExtension.sidecar.enabled",
        ),
        (
            gie(json!({"inferenceExtension": {"latencyPredictor": {"enabled": true}}})),
            "latencyPredictor.enabled",
        ),
        (
            router(json!({"router": {"proxy": {"enabled": true}}})),
            "router.proxy.enabled",
        ),
        (
            router(json!({"router": {"tokenizer": {"enabled": true, "modelName": "x"}}})),
            "router.tokenizer.enabled",
        ),
        (
            router(json!({"router": {"monitoring": {"prometheus": {"enabled": true}}}, "provider": {"name": "gke"}})),
            "Google Managed Prometheus",
        ),
        (
            router(json!({"router": {"modelServers": {"type": "triton"}}})),
            "triton (generic NVIDIA Triton) is not supported",
        ),
        (
            gie(json!({"inferencePool": {"modelServerType": "tgi"}})),
            "model server type \\\"tgi\\\" is not one of",
        ),
        (
            router(json!({"router": {"epp": {"pluginsConfigFile": "mine.yaml"}}})),
            "pluginsConfigFile \\\"mine.yaml\\\" is not a file of the ConfigMap (default-plugins.yaml, payload-agnostic.yaml)",
        ),
        (
            router(json!({"router": {"inferencePool": {"create": false}, "modelServers": {"matchLabels": null}}})),
            "standalone mode (no InferencePool)",
        ),
        (
            router(json!({"router": {"inferencePool": {"create": false}}, "httpRoute": {"create": true}})),
            "an HTTPRoute needs the InferencePool",
        ),
        (
            router(json!({"router": {"inferencePool": {"create": false}}, "provider": {"name": "gke"}})),
            "standalone mode does not create",
        ),
        (
            router(json!({"provider": {"gke": {"preferredBackends": {"enabled": true}}}})),
            "provider.gke.preferredBackends.enabled",
        ),
        (
            json!({"router": {"epp": {"replicas": 2}}}),
            "router.modelServers.matchLabels is required",
        ),
        (
            gie(json!({"inferenceExtension": {"failureMode": "Open"}})),
            "failureMode \\\"Open\\\" is not one of FailOpen, FailClose",
        ),
    ];
    for (values, message) in cases {
        let err = try_render(&values)
            .err()
            .unwrap_or_else(|| panic!("{values} rendered; expected a failure naming {message}"));
        assert!(
            err.contains(message),
            "{values}: expected {message:?} in\n{err}"
        );
    }
}

fn json_merge(base: &mut Value, extra: Value) {
    match (base, extra) {
        (Value::Object(b), Value::Object(e)) => {
            for (k, v) in e {
                json_merge(b.entry(k).or_insert(Value::Null), v);
            }
        }
        (b, e) => *b = e,
    }
}

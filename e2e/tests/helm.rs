//! The Helm chart `charts/inferencepool`, linted and rendered by Helm's own Go code
//! (helm-python-sdk in `.venv-helm`, created by `hack/helm/venv.sh` from PyPI on first use).
//! Every rendered object must decode as the type its `kind` claims and re-encode to the same
//! object (so a misspelled field fails), the epp args must be flags epp accepts, and the
//! ConfigMap must be an EndpointPickerConfig epp can build.
#![allow(clippy::unwrap_used)]

use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// Lints (strict) and renders the chart; returns the objects.
fn render(values: &Value) -> Vec<Value> {
    render_release("llama", values)
}

fn render_release(release: &str, values: &Value) -> Vec<Value> {
    try_render(release, values).unwrap_or_else(|e| panic!("render failed: {e}"))
}

/// Lints and renders; `Err` carries Helm's error text (a template's `fail`, say).
fn try_render(release: &str, values: &Value) -> Result<Vec<Value>, String> {
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
        .args([release, "llm", &values.to_string()])
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    let lint = &result["lint"];
    assert_eq!(lint["errors"], json!([]), "{lint}");
    assert!(
        lint["messages"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["severity"].as_i64() < Some(2)),
        "lint warnings: {lint}"
    );
    let mut objects = Vec::new();
    for text in result["manifests"].as_object().unwrap().values() {
        objects.extend(yaml_docs(text.as_str().unwrap()));
    }
    Ok(objects)
}

/// Decodes `v` as `T` and checks that nothing was lost (unknown or misspelled fields);
/// defaults the type fills in are fine.
fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(v: &Value) -> T {
    let t: T = serde_json::from_value(v.clone())
        .unwrap_or_else(|e| panic!("{} does not decode: {e}\n{v:#}", v["kind"]));
    let back = serde_json::to_value(&t).unwrap();
    if let Err(path) = kept(v, &back, String::new()) {
        panic!("{} lost {path} in decoding:\n{v:#}", v["kind"]);
    }
    t
}

/// Whether everything in `orig` survives in `back`; the first lost path otherwise.
fn kept(orig: &Value, back: &Value, path: String) -> Result<(), String> {
    match (orig, back) {
        (Value::Object(o), Value::Object(b)) => o.iter().try_for_each(|(k, v)| {
            b.get(k).map_or(Err(format!("{path}.{k}")), |bv| {
                kept(v, bv, format!("{path}.{k}"))
            })
        }),
        (Value::Array(o), Value::Array(b)) if o.len() == b.len() => o
            .iter()
            .zip(b)
            .enumerate()
            .try_for_each(|(i, (x, y))| kept(x, y, format!("{path}[{i}]"))),
        (o, b) if o == b => Ok(()),
        _ => Err(path),
    }
}

fn check_objects(objects: &[Value]) -> Vec<String> {
    use k8s_openapi::api::{apps::v1::Deployment, core::v1::*, rbac::v1::*};
    let mut kinds = Vec::new();
    for o in objects {
        let kind = o["kind"].as_str().unwrap().to_owned();
        match (o["apiVersion"].as_str().unwrap(), kind.as_str()) {
            ("apps/v1", "Deployment")
                if o["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with("-epp")) =>
            {
                check_deployment(&typed::<Deployment>(o))
            }
            ("v1", "Service") => drop(typed::<Service>(o)),
            ("v1", "ServiceAccount") => drop(typed::<ServiceAccount>(o)),
            ("v1", "Secret") => {
                // The replica-sharing certificates, else the ServiceMonitor's token.
                let name = o["metadata"]["name"].as_str().unwrap_or_default();
                let want = if name.ends_with("-peers-tls") {
                    "kubernetes.io/tls"
                } else {
                    "kubernetes.io/service-account-token"
                };
                assert_eq!(o["type"], want, "Secret {name}");
                drop(typed::<Secret>(o));
            }
            ("v1", "ConfigMap") => {
                let cm = typed::<ConfigMap>(o);
                epp::director::Runtime::build(&cm.data.unwrap()["default-plugins.yaml"], None)
                    .unwrap();
            }
            ("rbac.authorization.k8s.io/v1", "Role") => drop(typed::<Role>(o)),
            ("rbac.authorization.k8s.io/v1", "RoleBinding") => drop(typed::<RoleBinding>(o)),
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => drop(typed::<ClusterRole>(o)),
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                drop(typed::<ClusterRoleBinding>(o))
            }
            ("inference.networking.k8s.io/v1", "InferencePool") => {
                drop(typed::<epp::discovery::k8s::crd::pool::InferencePool>(o))
            }
            ("inference.networking.x-k8s.io/v1alpha2", "InferencePool") => drop(typed::<
                epp::discovery::k8s::crd::pool_v1alpha2::InferencePool,
            >(o)),
            ("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective") => {
                drop(typed::<
                    epp::discovery::k8s::crd::objective::InferenceObjective,
                >(o))
            }
            ("inference.networking.x-k8s.io/v1alpha2", "InferenceModel") => {
                drop(typed::<epp::discovery::k8s::crd::model::InferenceModel>(o))
            }
            ("inference.networking.x-k8s.io/v1alpha2", "InferenceModelRewrite") => {
                drop(typed::<
                    epp::discovery::k8s::crd::rewrite::InferenceModelRewrite,
                >(o))
            }
            ("apps/v1", "Deployment") => drop(typed::<Deployment>(o)),
            ("gateway.networking.k8s.io/v1", "Gateway" | "GatewayClass" | "HTTPRoute") => {
                assert!(o["spec"].is_object())
            }
            ("networking.gke.io/v1", "HealthCheckPolicy" | "GCPBackendPolicy") => {
                assert_eq!(o["spec"]["targetRef"]["kind"], "InferencePool")
            }
            ("networking.istio.io/v1beta1", "DestinationRule") => {
                assert!(o["spec"]["host"].is_string())
            }
            ("monitoring.coreos.com/v1", "ServiceMonitor") => {
                assert_eq!(o["spec"]["endpoints"][0]["port"], "http-metrics")
            }
            (api, kind) => panic!("unexpected object {api} {kind}"),
        }
        kinds.push(kind);
    }
    kinds.sort();
    kinds
}

fn check_deployment(d: &k8s_openapi::api::apps::v1::Deployment) {
    let c = &d.spec.template.spec.as_ref().unwrap().containers[0];
    let args = c.args.clone().unwrap();
    let opts: epp::app::Options =
        clap::Parser::try_parse_from(std::iter::once("epp".to_owned()).chain(args.iter().cloned()))
            .unwrap_or_else(|e| panic!("epp rejects the chart's args {args:?}: {e}"));
    opts.validate().unwrap();
    assert!(opts.uses_kubernetes());
    let ports: Vec<i32> = c
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .map(|p| p.container_port)
        .collect();
    assert_eq!(ports[..3], [9002, 9003, 9090]);
    assert!(c.readiness_probe.as_ref().unwrap().grpc.is_some());
}

#[test]
fn the_default_chart_renders_a_pool_epp_and_least_privilege_rbac() {
    let kinds = check_objects(&render(
        &json!({"inferencePool": {"modelServers": {"matchLabels": {"app": "vllm"}}}}),
    ));
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "Deployment",
            "InferencePool",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount"
        ]
    );
}

/// The rules of the ClusterRole that lets epp review tokens for /metrics, if rendered.
fn metrics_auth_rules(objects: &[Value]) -> Option<Value> {
    objects
        .iter()
        .find(|o| o["kind"] == "ClusterRole")
        .map(|o| o["rules"].clone())
}

fn deployment_args(objects: &[Value]) -> Vec<String> {
    let d = find(objects, "Deployment");
    serde_json::from_value(d["spec"]["template"]["spec"]["containers"][0]["args"].clone()).unwrap()
}

#[test]
fn metrics_auth_is_on_by_default_with_the_review_permissions_and_off_on_request() {
    let pool = json!({"modelServers": {"matchLabels": {"app": "vllm"}}});
    let on = render(&json!({"inferencePool": pool}));
    let args = deployment_args(&on);
    assert!(
        !args.iter().any(|a| a.contains("metrics-endpoint-auth")),
        "{args:?}"
    );
    let rules =
        metrics_auth_rules(&on).expect("a ClusterRole for TokenReview and SubjectAccessReview");
    assert_eq!(
        rules,
        json!([
            {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
            {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}
        ])
    );
    let binding = find(&on, "ClusterRoleBinding");
    assert_eq!(
        binding["subjects"][0]["name"],
        find(&on, "ServiceAccount")["metadata"]["name"]
    );

    let off = render(
        &json!({"inferencePool": pool, "inferenceExtension": {"monitoring": {"prometheus": {"auth": {"enabled": false}}}}}),
    );
    assert!(deployment_args(&off).contains(&"--metrics-endpoint-auth=false".to_owned()));
    assert_eq!(
        metrics_auth_rules(&off),
        None,
        "no cluster-wide grant without auth"
    );

    let scraped = render(
        &json!({"inferencePool": pool, "inferenceExtension": {"monitoring": {"prometheus": {"enabled": true}}}}),
    );
    check_objects(&scraped);
    let monitor = find(&scraped, "ServiceMonitor");
    let secret = find(&scraped, "Secret");
    assert_eq!(
        monitor["spec"]["endpoints"][0]["authorization"]["credentials"]["name"],
        secret["metadata"]["name"]
    );
    let rules = metrics_auth_rules(&scraped).unwrap();
    assert_eq!(
        rules[2],
        json!({"nonResourceURLs": ["/metrics"], "verbs": ["get"]})
    );
}

#[test]
fn replicas_monitoring_objectives_and_the_old_pool_api_render() {
    let values = json!({
        "inferencePool": {"apiVersion": "inference.networking.x-k8s.io/v1alpha2", "modelServers": {"matchLabels": {"app": "vllm"}}},
        "inferenceExtension": {"replicas": 2, "monitoring": {"prometheus": {"enabled": true}}, "flags": {"refresh-metrics-interval": "100ms"}, "scorerWeights": {"queue": 1, "kvCacheUtilization": 1, "prefixCache": 5}},
        "inferenceObjectives": [{"name": "batch", "priority": -1}],
        "inferenceModels": [{"name": "food-review", "criticality": "Critical", "targetModels": [{"name": "food-review-v1", "weight": 90}, {"name": "food-review-v2", "weight": 10}]}]
    });
    let objects = render(&values);
    let kinds = check_objects(&objects);
    assert_eq!(
        kinds.iter().filter(|k| *k == "Role").count(),
        2,
        "leader election adds a Lease role"
    );
    assert!(
        kinds.contains(&"ServiceMonitor".to_owned())
            && kinds.contains(&"InferenceObjective".to_owned())
            && kinds.contains(&"InferenceModel".to_owned())
    );
    let lease_rules = objects
        .iter()
        .find(|o| o["metadata"]["name"] == "llama-epp-leader-election" && o["kind"] == "Role")
        .unwrap();
    assert_eq!(lease_rules["rules"][0]["resources"], json!(["leases"]));
    assert_eq!(
        lease_rules["rules"][1],
        json!({"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}),
        "events as upstream's leader-election role"
    );
}

#[test]
fn active_active_replicas_share_speculative_entries_through_a_headless_service() {
    let values = json!({
        "inferencePool": {"modelServers": {"matchLabels": {"app": "vllm"}}},
        "inferenceExtension": {"replicas": 3, "haMode": "active-active", "kvEvents": {"port": 5557, "replayPort": 5558}}
    });
    let objects = render(&values);
    check_objects(&objects);
    let peers = objects
        .iter()
        .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == "llama-epp-peers")
        .expect("the peers Service");
    assert_eq!(peers["spec"]["clusterIP"], "None");
    assert_eq!(peers["spec"]["publishNotReadyAddresses"], true);
    assert_eq!(peers["spec"]["ports"][0]["protocol"], "TCP");
    let deployment = find(&objects, "Deployment");
    let namespace = deployment["metadata"]["namespace"].as_str().unwrap();
    let args: Vec<String> = serde_json::from_value(
        deployment["spec"]["template"]["spec"]["containers"][0]["args"].clone(),
    )
    .unwrap();
    let opts: epp::app::Options =
        clap::Parser::try_parse_from(std::iter::once("epp".to_owned()).chain(args)).unwrap();
    assert_eq!(opts.speculative_peer_port, Some(9004));
    assert_eq!(
        opts.speculative_peers,
        [format!("llama-epp-peers.{namespace}.svc:9004")]
    );
    assert!(!opts.ha_enable_leader_election);
    let leader = render(
        &json!({"inferencePool": {"modelServers": {"matchLabels": {"app": "vllm"}}}, "inferenceExtension": {"replicas": 3}}),
    );
    assert!(
        !leader
            .iter()
            .any(|o| o["metadata"]["name"] == "llama-epp-peers"),
        "active-passive replicas share nothing"
    );
}

#[test]
fn active_active_replicas_roll_one_at_a_time_and_are_listed_for_a_health_checking_gateway() {
    let values = json!({
        "inferencePool": {"modelServers": {"matchLabels": {"app": "vllm"}}},
        "inferenceExtension": {"replicas": 2, "haMode": "active-active"}
    });
    let objects = render(&values);
    check_objects(&objects);
    let deployment = find(&objects, "Deployment");
    assert_eq!(
        deployment["spec"]["strategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}),
        "a new replica is ready before an old one drains"
    );
    let replicas = objects
        .iter()
        .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == "llama-epp-replicas")
        .expect("the replicas Service a health-checking gateway resolves");
    assert_eq!(replicas["spec"]["clusterIP"], "None");
    assert!(
        replicas["spec"].get("publishNotReadyAddresses").is_none(),
        "only ready replicas are listed"
    );
    let ports: Vec<(String, u64)> = replicas["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["port"].as_u64().unwrap(),
            )
        })
        .collect();
    let args: Vec<String> = serde_json::from_value(
        deployment["spec"]["template"]["spec"]["containers"][0]["args"].clone(),
    )
    .unwrap();
    let opts: epp::app::Options =
        clap::Parser::try_parse_from(std::iter::once("epp".to_owned()).chain(args)).unwrap();
    assert_eq!(
        ports,
        [
            ("grpc-ext-proc".to_owned(), 9002),
            ("grpc-health".to_owned(), u64::from(opts.grpc_health_port))
        ]
    );
    let grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap();
    assert!(
        grace > opts.drain_timeout.as_secs(),
        "the kubelet's grace ({grace}s) outlasts epp's drain ({:?})",
        opts.drain_timeout
    );
    let leader = render(
        &json!({"inferencePool": {"modelServers": {"matchLabels": {"app": "vllm"}}}, "inferenceExtension": {"replicas": 2}}),
    );
    assert_eq!(
        find(&leader, "Deployment")["spec"]["strategy"]["type"],
        "Recreate"
    );
    assert!(
        !leader
            .iter()
            .any(|o| o["metadata"]["name"] == "llama-epp-replicas"),
        "active-passive replicas are not listed one by one"
    );
}

fn find<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
}

#[test]
fn the_image_defaults_to_the_charts_app_version() {
    let objects =
        render(&json!({"inferencePool": {"modelServers": {"matchLabels": {"app": "vllm"}}}}));
    let chart: Value = serde_norway::from_str(
        &std::fs::read_to_string(root().join("charts/inferencepool/Chart.yaml")).unwrap(),
    )
    .unwrap();
    let image = &find(&objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"];
    assert_eq!(
        image.as_str().unwrap(),
        format!(
            "ghcr.io/epp-rs/epp:{}",
            chart["appVersion"].as_str().unwrap()
        )
    );
    assert!(
        std::fs::read_to_string(root().join("Dockerfile"))
            .unwrap()
            .contains("ghcr.io/epp-rs/epp:"),
        "the Dockerfile documents the image name"
    );
}

#[test]
fn the_gke_provider_adds_health_check_and_backend_policies_for_the_pool() {
    let values = |protocol: &str| json!({"provider": {"name": "gke"}, "inferencePool": {"modelServerProtocol": protocol, "targetPorts": [{"number": 8200}, {"number": 8201}], "modelServers": {"matchLabels": {"app": "vllm"}}}});
    let objects = render(&values("http"));
    let kinds = check_objects(&objects);
    assert!(
        kinds.contains(&"HealthCheckPolicy".to_owned())
            && kinds.contains(&"GCPBackendPolicy".to_owned()),
        "{kinds:?}"
    );
    let pool = find(&objects, "InferencePool");
    let target = json!({"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": pool["metadata"]["name"]});
    let hc = find(&objects, "HealthCheckPolicy");
    assert_eq!(hc["spec"]["targetRef"], target);
    assert_eq!(
        hc["spec"]["default"],
        json!({"timeoutSec": 2, "checkIntervalSec": 2, "config": {"type": "HTTP", "httpHealthCheck": {"requestPath": "/health", "port": 8200}}})
    );
    let bp = find(&objects, "GCPBackendPolicy");
    assert_eq!(
        bp["spec"],
        json!({"targetRef": target, "default": {"timeoutSec": 300, "logging": {"enabled": true}}})
    );
    let grpc = render(&values("grpc"));
    let config = &find(&grpc, "HealthCheckPolicy")["spec"]["default"]["config"];
    assert_eq!(config["type"], "GRPC");
    assert_eq!(
        config["grpcHealthCheck"],
        json!({"portSpecification": "USE_FIXED_PORT", "port": 8200, "grpcServiceName": "/vllm.grpc.engine.VllmEngine/HealthCheck"})
    );
    assert!(!kinds.contains(&"DestinationRule".to_owned()));
}

#[test]
fn the_istio_provider_adds_a_tls_destination_rule_for_epps_service() {
    let base = json!({"inferencePool": {"modelServers": {"matchLabels": {"app": "vllm"}}}});
    let mut values = base.clone();
    values["provider"] = json!({"name": "istio", "istio": {"destinationRule": {"trafficPolicy": {"connectionPool": {"http": {"maxRequestsPerConnection": 256000}}}}}});
    let objects = render(&values);
    let kinds = check_objects(&objects);
    assert!(!kinds.contains(&"HealthCheckPolicy".to_owned()));
    let service = find(&objects, "Service");
    let dr = find(&objects, "DestinationRule");
    assert_eq!(
        dr["spec"]["host"].as_str().unwrap(),
        format!(
            "{}.llm.svc.cluster.local",
            service["metadata"]["name"].as_str().unwrap()
        )
    );
    assert_eq!(
        dr["spec"]["trafficPolicy"],
        json!({"tls": {"mode": "SIMPLE", "insecureSkipVerify": true}, "connectionPool": {"http": {"maxRequestsPerConnection": 256000}}})
    );
    values["provider"]["istio"]["destinationRule"]["host"] = json!("epp.example.internal");
    assert_eq!(
        find(&render(&values), "DestinationRule")["spec"]["host"],
        "epp.example.internal"
    );
    let none = check_objects(&render(&base));
    assert!(
        !none.iter().any(
            |k| ["DestinationRule", "HealthCheckPolicy", "GCPBackendPolicy"].contains(&k.as_str())
        ),
        "{none:?}"
    );
    let mut bogus = base;
    bogus["provider"] = json!({"name": "aws"});
    let err = try_render("llama", &bogus).unwrap_err();
    assert!(
        err.contains("provider.name \"aws\" is not one of gke, istio, none"),
        "{err}"
    );
}

fn yaml_docs(text: &str) -> Vec<Value> {
    text.split("\n---\n")
        .map(|d| serde_norway::from_str::<Value>(&format!("{d}\n")).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// The chart spells epp's built-in default out in its template (Helm cannot read Rust), so the
/// two are held equal here: changing the default without the chart fails this test.
#[test]
fn the_charts_default_configmap_is_epps_built_in_default() {
    let objs = render(&json!({"inferencePool": {"modelServers": {"matchLabels": {"app": "m"}}}}));
    let cm = objs
        .iter()
        .find(|o| o["kind"] == "ConfigMap")
        .expect("the chart renders its ConfigMap");
    assert_eq!(
        cm["data"]["default-plugins.yaml"].as_str(),
        Some(epp::config::DEFAULT_CONFIG)
    );
}

#[test]
fn the_envoy_gateway_examples_decode_and_epp_yaml_is_the_rendered_chart() {
    let dir = root().join("config/examples/envoy-gateway");
    for file in [
        "gateway.yaml",
        "httproute.yaml",
        "model-servers.yaml",
        "objectives.yaml",
        "epp.yaml",
    ] {
        check_objects(&yaml_docs(
            &std::fs::read_to_string(dir.join(file)).unwrap(),
        ));
    }
    let committed = yaml_docs(&std::fs::read_to_string(dir.join("epp.yaml")).unwrap());
    let rendered = render_release(
        "vllm-llama3",
        &json!({"inferencePool": {"modelServers": {"matchLabels": {"app": "vllm-llama3"}}}}),
    );
    let key = |o: &Value| format!("{}/{}", o["kind"], o["metadata"]["name"]);
    let mut a: Vec<_> = committed.iter().map(|o| (key(o), o.clone())).collect();
    let mut b: Vec<_> = rendered.into_iter().map(|o| (key(&o), o)).collect();
    a.sort_by(|x, y| x.0.cmp(&y.0));
    b.sort_by(|x, y| x.0.cmp(&y.0));
    let keys = |v: &[(String, Value)]| v.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
    assert_eq!(
        keys(&a),
        keys(&b),
        "config/examples/envoy-gateway/epp.yaml: objects differ from the chart's"
    );
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(
            x.1, y.1,
            "config/examples/envoy-gateway/epp.yaml differs from the chart in {}",
            x.0
        );
    }
}

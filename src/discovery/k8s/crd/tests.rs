use super::*;
use std::path::Path;

#[test]
fn committed_crd_yaml_matches_the_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/crd");
    for (file, crd) in definitions() {
        let committed = std::fs::read_to_string(dir.join(&file)).unwrap_or_default();
        assert!(
            committed == render(&crd).unwrap(),
            "config/crd/{file} is out of date: run hack/gen-crds.sh"
        );
    }
    let files = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(
        files,
        definitions().len(),
        "config/crd/ holds a file no type produces"
    );
}

/// Upstream's documented examples decode into the types (field names and enum spellings agree).
#[test]
fn upstream_examples_decode() {
    let pool: pool::InferencePool = serde_norway::from_str(
        "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata: {name: p, namespace: ns}\nspec:\n  selector: {matchLabels: {app: vllm}}\n  targetPorts: [{number: 8000}, {number: 8001}]\n  appProtocol: kubernetes.io/h2c\n  endpointPickerRef: {group: '', kind: Service, name: p-epp, port: {number: 9002}, failureMode: FailOpen}\nstatus:\n  parents:\n  - parentRef: {group: gateway.networking.k8s.io, kind: Gateway, name: gw, namespace: ns}\n    controllerName: example.net/gw\n    conditions: [{type: Accepted, status: 'True', reason: Accepted, message: '', lastTransitionTime: '2025-01-01T00:00:00Z'}]\n",
    )
    .unwrap();
    assert_eq!(pool.spec.target_ports.len(), 2);
    assert_eq!(
        pool.spec.endpoint_picker_ref.unwrap().failure_mode,
        pool::FailureMode::FailOpen
    );
    let old: pool_v1alpha2::InferencePool = serde_norway::from_str(
        "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferencePool\nmetadata: {name: p}\nspec:\n  selector: {app: vllm}\n  targetPortNumber: 8000\n  extensionRef: {name: p-epp, portNumber: 9002, failureMode: FailClose}\n",
    )
    .unwrap();
    assert_eq!(old.spec.target_port_number, 8000);
    let model: model::InferenceModel = serde_norway::from_str(
        "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceModel\nmetadata: {name: m}\nspec:\n  modelName: food-review\n  criticality: Sheddable\n  targetModels: [{name: food-review-lora-1, weight: 50}]\n  poolRef: {group: inference.networking.x-k8s.io, kind: InferencePool, name: pool}\n",
    )
    .unwrap();
    assert_eq!(model.spec.criticality, Some(model::Criticality::Sheddable));
    let obj: objective::InferenceObjective =
        serde_norway::from_str("apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\nmetadata: {name: o}\nspec: {priority: -1, poolRef: {name: pool}}\n").unwrap();
    assert_eq!(obj.spec.priority, Some(-1));
    let multi: objective_v1::InferenceObjective = serde_norway::from_str(
        "apiVersion: inference.networking.x-k8s.io/v1\nkind: InferenceObjective\nmetadata: {name: o}\nspec:\n  priority: 10\n  poolRefs: [{group: inference.networking.k8s.io, kind: InferencePool, name: a}, {name: b}]\n  poolSelector:\n    matchLabels: {tier: gold}\n    matchExpressions: [{key: zone, operator: In, values: [x, y]}]\n",
    )
    .unwrap();
    assert_eq!(multi.spec.pool_refs.len(), 2);
    let selector = multi.spec.pool_selector.unwrap();
    assert_eq!(selector.match_expressions[0].values, ["x", "y"]);
    let rw: rewrite::InferenceModelRewrite = serde_norway::from_str(
        "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceModelRewrite\nmetadata: {name: r}\nspec:\n  poolRef: {group: inference.networking.k8s.io, kind: InferencePool, name: pool}\n  rules:\n  - matches: [{model: {type: Exact, value: food-review}}]\n    targets: [{modelRewrite: food-review-v1, weight: 90}, {modelRewrite: food-review-v2, weight: 10}]\n",
    )
    .unwrap();
    assert_eq!(rw.spec.rules[0].targets.len(), 2);
}

/// The CEL rules reach the generated schemas at the fields upstream puts them on.
#[test]
fn generated_schemas_carry_the_cel_rules() {
    use validate::*;
    let yaml: std::collections::HashMap<String, String> = definitions()
        .iter()
        .map(|(f, c)| (f.clone(), render(c).unwrap()))
        .collect();
    let schema = |file: &str| -> serde_json::Value {
        let crd: serde_json::Value = serde_norway::from_str(&yaml[file]).unwrap();
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
            .clone()
    };
    let rules = |v: &serde_json::Value| -> Vec<(String, String)> {
        v["x-kubernetes-validations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["rule"].as_str().unwrap().to_owned(),
                    r["message"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let pair = |r: Rule| (r.rule.to_owned(), r.message.to_owned());
    let v1 = schema("inference.networking.k8s.io_inferencepools.yaml");
    assert_eq!(rules(&v1["targetPorts"]), [pair(TARGET_PORTS_UNIQUE)]);
    assert_eq!(v1["targetPorts"]["x-kubernetes-list-type"], "atomic");
    assert_eq!(
        rules(&v1["endpointPickerRef"]),
        [pair(PICKER_PORT_REQUIRED)]
    );
    let model = schema("inference.networking.x-k8s.io_inferencemodels.yaml");
    assert_eq!(rules(&model["modelName"]), [pair(MODEL_NAME_IMMUTABLE)]);
    assert_eq!(
        rules(&model["targetModels"]),
        [pair(TARGET_WEIGHTS_ALL_OR_NONE)]
    );
    assert!(yaml["inference.networking.k8s.io_inferencepools.yaml"]
        .contains("x-kubernetes-validations:\n"));
}

/// InferenceObjective serves v1alpha2 (stored) and v1, both with the multi-pool fields and
/// upstream's rules: one targeting per object, at most 16 pool references unique by name, and a
/// selector replaced whole and never empty.
#[test]
fn the_objective_crd_serves_v1alpha2_and_v1_with_the_multi_pool_fields() {
    use validate::*;
    let (_, crd) = definitions()
        .into_iter()
        .find(|(f, _)| f == "inference.networking.x-k8s.io_inferenceobjectives.yaml")
        .unwrap();
    let crd = serde_json::to_value(&crd).unwrap();
    let versions = crd["spec"]["versions"].as_array().unwrap();
    let names: Vec<_> = versions
        .iter()
        .map(|v| (v["name"].clone(), v["served"].clone(), v["storage"].clone()))
        .collect();
    assert_eq!(
        names,
        [
            ("v1alpha2".into(), true.into(), true.into()),
            ("v1".into(), true.into(), false.into())
        ]
    );
    let rules = |v: &serde_json::Value| -> Vec<String> {
        v["x-kubernetes-validations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["rule"].as_str().unwrap().to_owned())
            .collect()
    };
    let spec = |v: &serde_json::Value| v["schema"]["openAPIV3Schema"]["properties"]["spec"].clone();
    let (alpha, v1) = (spec(&versions[0]), spec(&versions[1]));
    assert_eq!(
        rules(&alpha),
        [OBJECTIVE_POOL_REQUIRED.rule, OBJECTIVE_POOL_REF_ALONE.rule]
    );
    assert_eq!(rules(&v1), [OBJECTIVE_REFS_OR_SELECTOR.rule]);
    assert!(alpha.get("required").is_none(), "poolRef is optional now");
    assert!(v1["properties"].get("poolRef").is_none());
    for s in [&alpha, &v1] {
        let refs = &s["properties"]["poolRefs"];
        assert_eq!(
            (refs["minItems"].as_u64(), refs["maxItems"].as_u64()),
            (Some(1), Some(16))
        );
        assert_eq!(refs["x-kubernetes-list-type"], "map");
        assert_eq!(
            refs["x-kubernetes-list-map-keys"],
            serde_json::json!(["name"])
        );
        let selector = &s["properties"]["poolSelector"];
        assert_eq!(rules(selector), [POOL_SELECTOR_NOT_EMPTY.rule]);
        assert_eq!(selector["x-kubernetes-map-type"], "atomic");
    }
}

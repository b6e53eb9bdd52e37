//! The CRDs of `config/crd/` (generated from src/discovery/k8s/crd) against a real kube-apiserver: the server
//! accepts them as structural schemas with their CEL rules, stores a valid object of every kind
//! that epp's Rust types read back unchanged, and rejects objects breaking upstream's rules with
//! upstream's messages. Needs hack/install-kube.sh.
#![allow(clippy::unwrap_used)]

use crate::kube_support;

use epp::discovery::k8s::crd::{
    model, objective, objective_v1, pool, pool_v1alpha2, rewrite, validate,
};
use harness::kube_apiserver::TestNamespace;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube_support::*;
use serde_json::{json, Value};

/// Creates `obj` with a plain POST (so the error is the server's, unchanged).
async fn try_create(ns: &TestNamespace, obj: &Value) -> Result<DynamicObject, kube::Error> {
    let (group, version) = obj["apiVersion"].as_str().unwrap().split_once('/').unwrap();
    let gvk = GroupVersionKind::gvk(group, version, obj["kind"].as_str().unwrap());
    let (ar, _) = kube::discovery::pinned_kind(&ns.client, &gvk).await?;
    let api: Api<DynamicObject> = Api::namespaced_with(ns.client.clone(), &ns.name, &ar);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(obj.clone()).unwrap(),
    )
    .await
}

fn model_obj(name: &str, targets: Value) -> Value {
    json!({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceModel",
        "metadata": {"name": name},
        "spec": {"modelName": name, "poolRef": {"name": "pool"}, "targetModels": targets}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valid_object_of_every_kind_is_stored_and_reads_back_as_the_rust_type() {
    let (_, ns) = setup("crds-valid").await;
    try_create(&ns, &pool(&[8000, 8001])).await.unwrap();
    let alpha = json!({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferencePool",
        "metadata": {"name": "alpha"},
        "spec": {"selector": {"app": "vllm"}, "targetPortNumber": 8000,
                 "extensionRef": {"name": "pool-epp"}}
    });
    try_create(&ns, &alpha).await.unwrap();
    try_create(
        &ns,
        &model_obj(
            "food",
            json!([{"name": "food-v1", "weight": 90}, {"name": "food-v2", "weight": 10}]),
        ),
    )
    .await
    .unwrap();
    let objective = json!({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceObjective",
        "metadata": {"name": "background"}, "spec": {"priority": -10, "poolRef": {"name": "pool"}}
    });
    try_create(&ns, &objective).await.unwrap();
    let rewrite = json!({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceModelRewrite",
        "metadata": {"name": "canary"},
        "spec": {"poolRef": {"name": "pool"}, "rules": [{"matches": [{"model": {"type": "Exact", "value": "food"}}],
                 "targets": [{"modelRewrite": "food-v1", "weight": 90}, {"modelRewrite": "food-v2", "weight": 10}]}]}
    });
    try_create(&ns, &rewrite).await.unwrap();

    let c = || ns.client.clone();
    let p: pool::InferencePool = Api::namespaced(c(), &ns.name).get("pool").await.unwrap();
    assert_eq!(p.spec.target_ports.len(), 2);
    assert_eq!(
        p.spec.app_protocol,
        pool::AppProtocol::Http,
        "the schema default applied"
    );
    let a: pool_v1alpha2::InferencePool =
        Api::namespaced(c(), &ns.name).get("alpha").await.unwrap();
    assert_eq!(a.spec.target_port_number, 8000);
    let m: model::InferenceModel = Api::namespaced(c(), &ns.name).get("food").await.unwrap();
    assert_eq!(m.spec.target_models.len(), 2);
    let o: objective::InferenceObjective = Api::namespaced(c(), &ns.name)
        .get("background")
        .await
        .unwrap();
    assert_eq!(o.spec.priority, Some(-10));
    let r: rewrite::InferenceModelRewrite =
        Api::namespaced(c(), &ns.name).get("canary").await.unwrap();
    assert_eq!(r.spec.rules.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inference_pool_breaking_upstreams_rules_is_rejected_with_upstreams_message() {
    let (_, ns) = setup("crds-pool").await;
    let (code, message) = rejection(try_create(&ns, &pool(&[8000, 8000])).await);
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains(validate::TARGET_PORTS_UNIQUE.message),
        "{message}"
    );

    let mut no_port = pool(&[8000]);
    no_port["spec"]["endpointPickerRef"] = json!({"name": "pool-epp"});
    let (code, message) = rejection(try_create(&ns, &no_port).await);
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains(validate::PICKER_PORT_REQUIRED.message),
        "{message}"
    );

    let mut not_a_service = no_port.clone();
    not_a_service["spec"]["endpointPickerRef"]["kind"] = json!("Picker");
    not_a_service["spec"]["endpointPickerRef"]["group"] = json!("example.com");
    try_create(&ns, &not_a_service)
        .await
        .expect("a port is only required for a Service");

    let mut no_ports = pool(&[]);
    no_ports["metadata"]["name"] = json!("empty");
    let (code, message) = rejection(try_create(&ns, &no_ports).await);
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("spec.targetPorts"), "{message}");

    let mut nine = pool(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
    nine["metadata"]["name"] = json!("nine");
    let (_, message) = rejection(try_create(&ns, &nine).await);
    assert!(message.contains("must have at most 8 items"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inference_model_breaking_upstreams_rules_is_rejected_with_upstreams_message() {
    let (_, ns) = setup("crds-model").await;
    let partial = model_obj(
        "food",
        json!([{"name": "food-v1", "weight": 90}, {"name": "food-v2"}]),
    );
    let (code, message) = rejection(try_create(&ns, &partial).await);
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains(validate::TARGET_WEIGHTS_ALL_OR_NONE.message),
        "{message}"
    );

    try_create(&ns, &model_obj("food", json!([{"name": "food-v1"}])))
        .await
        .unwrap();
    let api: Api<model::InferenceModel> = Api::namespaced(ns.client.clone(), &ns.name);
    let renamed = api
        .patch(
            "food",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"modelName": "drink"}})),
        )
        .await;
    let (code, message) = rejection(renamed);
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains(validate::MODEL_NAME_IMMUTABLE.message),
        "{message}"
    );
}

fn objective_obj(version: &str, name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": format!("inference.networking.x-k8s.io/{version}"), "kind": "InferenceObjective",
        "metadata": {"name": name}, "spec": spec
    })
}

/// InferenceObjective's v1 and v1alpha2 are both served, and an object written through either
/// carries its `poolRefs` and `poolSelector` through the other (the storage version holds them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_pool_objective_is_stored_through_either_version_and_reads_back_through_both() {
    let (_, ns) = setup("crds-objective").await;
    let multi = json!({"priority": 4, "poolRefs": [{"name": "a"}, {"name": "b"}],
                       "poolSelector": {"matchLabels": {"tier": "gold"}}});
    try_create(&ns, &objective_obj("v1", "multi", multi))
        .await
        .unwrap();
    let refs = json!({"poolRefs": [{"name": "c"}]});
    try_create(&ns, &objective_obj("v1alpha2", "alpha-refs", refs))
        .await
        .unwrap();
    let single = json!({"priority": 1, "poolRef": {"name": "a"}});
    try_create(&ns, &objective_obj("v1alpha2", "single", single))
        .await
        .unwrap();

    let alpha: Api<objective::InferenceObjective> = Api::namespaced(ns.client.clone(), &ns.name);
    let v1: Api<objective_v1::InferenceObjective> = Api::namespaced(ns.client.clone(), &ns.name);
    let names = |refs: &[epp::discovery::k8s::crd::common::PoolRef]| -> Vec<String> {
        refs.iter().map(|r| r.name.clone()).collect()
    };
    let m = alpha.get("multi").await.unwrap();
    assert_eq!(names(&m.spec.pool_refs), ["a", "b"]);
    assert_eq!(m.spec.pool_selector.unwrap().match_labels["tier"], "gold");
    let m = v1.get("multi").await.unwrap();
    assert_eq!(
        (m.spec.priority, names(&m.spec.pool_refs)),
        (Some(4), vec!["a".to_owned(), "b".to_owned()])
    );
    assert_eq!(
        names(&v1.get("alpha-refs").await.unwrap().spec.pool_refs),
        ["c"]
    );
    let s = alpha.get("single").await.unwrap();
    assert_eq!(s.spec.pool_ref.unwrap().name, "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_objective_breaking_upstreams_rules_is_rejected_with_upstreams_message() {
    let (_, ns) = setup("crds-objective-bad").await;
    let rejected = |version: &'static str, spec: Value| {
        let obj = objective_obj(version, "bad", spec);
        let ns = &ns;
        async move { rejection(try_create(ns, &obj).await) }
    };
    for (version, spec, expected) in [
        (
            "v1",
            json!({"priority": 1}),
            validate::OBJECTIVE_REFS_OR_SELECTOR.message,
        ),
        (
            "v1alpha2",
            json!({"priority": 1}),
            validate::OBJECTIVE_POOL_REQUIRED.message,
        ),
        (
            "v1alpha2",
            json!({"poolRef": {"name": "a"}, "poolRefs": [{"name": "b"}]}),
            validate::OBJECTIVE_POOL_REF_ALONE.message,
        ),
        (
            "v1alpha2",
            json!({"poolRef": {"name": "a"}, "poolSelector": {"matchLabels": {"t": "g"}}}),
            validate::OBJECTIVE_POOL_REF_ALONE.message,
        ),
        (
            "v1",
            json!({"poolSelector": {}}),
            validate::POOL_SELECTOR_NOT_EMPTY.message,
        ),
        (
            "v1",
            json!({"poolRefs": [{"name": "a"}, {"name": "a"}]}),
            "Duplicate value",
        ),
        (
            "v1",
            json!({"poolRefs": []}),
            "should have at least 1 items",
        ),
    ] {
        let (code, message) = rejected(version, spec.clone()).await;
        assert_eq!(code, 422, "{version} {spec}: {message}");
        assert!(message.contains(expected), "{version} {spec}: {message}");
    }
    let seventeen: Vec<_> = (0..17).map(|i| json!({"name": format!("p{i}")})).collect();
    let (_, message) = rejected("v1", json!({"poolRefs": seventeen})).await;
    assert!(message.contains("must have at most 16 items"), "{message}");
}

//! The InferencePool export controller (`epp-pool-import`, `epp::discovery::k8s::export`) on
//! two real API servers, each with GIE v1.5.0's own InferencePool and InferencePoolImport
//! CRDs (from the Go module cache): a pool annotated `inference.networking.x-k8s.io/export:
//! ClusterSet` in cluster A is imported into both members with the status the proposal asks
//! for; a pool of the same name exported by B too adds B to `exportingClusters`; withdrawing
//! an export while the controller runs updates the imports; a controller restarted after the
//! last export was withdrawn deletes the imports it alone held, keeps one another controller
//! also manages (its entry untouched), and clears the pools' `Exported` entries.
//!
//! Endpoint mode on the way: the controller writes the exported pool's ready pods of cluster A
//! to an endpoints file (`--endpoints-dir`), and an epp of the importing side reading it with
//! llm-d's `file-discovery` routes a real Envoy's requests to those pods (inference-sim on
//! 127.0.0.x, the pods' IPs in A), following a pod of A turning unready. The controller runs
//! as a ServiceAccount bound to config/rbac/pool-import.yaml in both clusters. Last, with B's
//! API server down, a withdrawn export of A withdraws nothing until B answers again.
#![allow(clippy::unwrap_used)]

use crate::kube_support::create;
use epp::discovery::k8s::export::types::InferencePoolImport;
use epp::discovery::k8s::export::{self, ClusterFlag, Options};
use harness::kube_apiserver::{apply, KubeApiServer, TestNamespace};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::{json, Value};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const CONTROLLER: &str = "epp.test/pool-import";
const GATEWAY: &str = "example.net/gateway";
/// Every wait of this file: the controller reacts to watch events (debounced 200 ms).
const WITHIN: Duration = Duration::from_secs(30);

fn gie_dir() -> PathBuf {
    harness::gie::module_dir("GIE's CRDs")
}

/// Installs GIE's InferencePool and InferencePoolImport CRDs and waits until established.
async fn install_gie_crds(server: &KubeApiServer, gie: &Path) {
    let client = server.admin_client("default").await.unwrap();
    let bases = gie.join("config/crd/bases");
    let files = [
        "inference.networking.k8s.io_inferencepools.yaml",
        "inference.networking.x-k8s.io_inferencepoolimports.yaml",
    ];
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    for file in files {
        let text = std::fs::read_to_string(bases.join(file)).unwrap();
        for crd in apply::apply_yaml(&client, "default", &text).await.unwrap() {
            let name = crd.metadata.name.unwrap();
            let established = await_condition(api.clone(), &name, conditions::is_crd_established());
            tokio::time::timeout(WITHIN, established)
                .await
                .unwrap_or_else(|_| panic!("CRD {name} not established in {WITHIN:?}"))
                .unwrap();
        }
    }
}

/// The namespace `name` on `server` (namespace sameness: the import mirrors the pool's).
async fn same_namespace(server: &KubeApiServer, name: &str) -> TestNamespace {
    let client = server.admin_client(name).await.unwrap();
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    TestNamespace {
        name: name.to_owned(),
        client,
    }
}

/// Writes at `path` a kubeconfig of ServiceAccount `pool-import` of `ns`, bound to
/// config/rbac/pool-import.yaml's ClusterRole: the controller runs with what the docs grant.
async fn as_controller(server: &KubeApiServer, ns: &TestNamespace, path: &Path) {
    server
        .create_service_account(&ns.client, &ns.name, "pool-import")
        .await
        .unwrap();
    let role =
        std::fs::read_to_string(crate::kube_support::root().join("config/rbac/pool-import.yaml"))
            .unwrap();
    apply::apply_yaml(&ns.client, &ns.name, &role)
        .await
        .unwrap();
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": format!("epp-pool-import-{}", ns.name)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "epp-pool-import"},
        "subjects": [{"kind": "ServiceAccount", "name": "pool-import", "namespace": ns.name}]
    });
    create(ns, binding).await;
    crate::kube_support::sa_kubeconfig(server, ns, "pool-import", path).await;
}

/// A GIE v1 InferencePool `name` of `app=vllm` pods on `port`, exported to the ClusterSet
/// when `exported`.
fn pool(name: &str, exported: bool, port: u16) -> Value {
    let annotations = if exported {
        json!({"inference.networking.x-k8s.io/export": "ClusterSet"})
    } else {
        json!({})
    };
    json!({
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": [{"number": port}],
                 "endpointPickerRef": {"name": "pool-epp", "port": {"number": 9002}}}
    })
}

async fn set_export(ns: &TestNamespace, name: &str, exported: bool) {
    let value = exported.then_some("ClusterSet");
    let patch =
        json!({"metadata": {"annotations": {"inference.networking.x-k8s.io/export": value}}});
    pools(ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

fn pools(ns: &TestNamespace) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("inference.networking.k8s.io", "v1", "InferencePool");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "inferencepools");
    Api::namespaced_with(ns.client.clone(), &ns.name, &resource)
}

fn imports(ns: &TestNamespace) -> Api<InferencePoolImport> {
    Api::namespaced(ns.client.clone(), &ns.name)
}

/// Polls `probe` every 100 ms until it returns Some, for at most [`WITHIN`].
async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, String>>,
{
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let last = match probe().await {
            Ok(Some(v)) => return v,
            Ok(None) => "not yet".to_owned(),
            Err(e) => e,
        };
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {WITHIN:?} ({last})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The import's exporting clusters in this controller's entry, once its `Accepted` is True.
async fn exported_by(ns: &TestNamespace, name: &str) -> Result<Option<Vec<String>>, String> {
    let Some(import) = imports(ns).get_opt(name).await.map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let Some(entry) = import.controllers().iter().find(|c| c.name == CONTROLLER) else {
        return Ok(None);
    };
    let accepted = entry
        .conditions
        .iter()
        .any(|c| c.type_ == "Accepted" && c.status == "True");
    Ok(accepted.then(|| {
        entry
            .exporting_clusters
            .iter()
            .map(|c| c.name.clone())
            .collect()
    }))
}

/// Waits until the import `name` in `ns` lists exactly `clusters`.
async fn wait_import(ns: &TestNamespace, cluster: &str, name: &str, clusters: &[&str]) {
    let what = format!(
        "import {}/{name} in {cluster} exported by {clusters:?}",
        ns.name
    );
    eventually(&what, || async {
        Ok(exported_by(ns, name).await?.filter(|got| got == clusters))
    })
    .await;
}

/// This controller's `Exported` condition status on the pool, if it has an entry.
async fn exported_condition(ns: &TestNamespace, name: &str) -> Option<String> {
    let pool = pools(ns).get(name).await.unwrap();
    let parents = pool.data["status"]["parents"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ours = parents.iter().find(|p| p["controllerName"] == CONTROLLER)?;
    assert_eq!(ours["parentRef"]["kind"], "InferencePoolImport");
    assert_eq!(ours["parentRef"]["name"], name);
    assert_eq!(ours["parentRef"]["namespace"], ns.name.as_str());
    let c = &ours["conditions"][0];
    assert_eq!(c["type"], "Exported");
    Some(c["status"].as_str().unwrap().to_owned())
}

/// The controller running in-process on both members until stopped.
struct Running {
    token: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), export::ExportError>>,
}

impl Running {
    fn start(kubeconfigs: &[(&str, PathBuf)], endpoints: &Path) -> Self {
        let options = Options {
            clusters: kubeconfigs
                .iter()
                .map(|(name, path)| ClusterFlag {
                    name: (*name).to_owned(),
                    kubeconfig: path.clone(),
                })
                .collect(),
            controller_name: CONTROLLER.to_owned(),
            resync: Duration::from_secs(5),
            endpoints_dir: Some(endpoints.to_owned()),
        };
        let token = CancellationToken::new();
        let task = tokio_util::task::TaskTracker::new().spawn(export::run(options, token.clone()));
        Self { token, task }
    }

    async fn stop(self) {
        self.token.cancel();
        tokio::time::timeout(WITHIN, self.task)
            .await
            .expect("the controller stops when cancelled")
            .unwrap()
            .unwrap();
    }
}

/// llm-d's default configuration (hack/bench/llmd-default.yaml) with `file-discovery` following
/// `file`.
fn file_discovery_config(file: &Path) -> String {
    let template = crate::kube_support::root().join("hack/bench/llmd-default.yaml");
    let text = std::fs::read_to_string(template).unwrap();
    let line = format!("    path: {}\n    watchFile: true", file.display());
    let out = text.replace("    path: ${ENDPOINTS_FILE}", &line);
    assert_ne!(out, text, "the template's path line moved");
    out
}

/// The names in the endpoints file, once it exists.
fn file_entries(file: &Path) -> Result<Option<Vec<String>>, String> {
    let Ok(text) = std::fs::read_to_string(file) else {
        return Ok(None);
    };
    let doc: Value = serde_norway::from_str(&text).map_err(|e| e.to_string())?;
    let names = doc["endpoints"].as_array().ok_or("no endpoints list")?;
    Ok(Some(
        names
            .iter()
            .map(|e| e["name"].as_str().unwrap_or_default().to_owned())
            .collect(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_pools_into_every_member_and_withdraws_them() {
    let gie = gie_dir();
    let (a, b) = tokio::join!(KubeApiServer::start(), KubeApiServer::start());
    let (a, b) = (a.unwrap(), b.unwrap());
    tokio::join!(install_gie_crds(&a, &gie), install_gie_crds(&b, &gie));
    let ns_a = a.namespace("pool-import").await.unwrap();
    let ns_b = same_namespace(&b, &ns_a.name).await;
    let dir = crate::kube_support::TempDir::new("pool-import");
    let kubeconfigs = [
        ("cluster-a", dir.0.join("a.kubeconfig")),
        ("cluster-b", dir.0.join("b.kubeconfig")),
    ];
    as_controller(&a, &ns_a, &kubeconfigs[0].1).await;
    as_controller(&b, &ns_b, &kubeconfigs[1].1).await;

    let (port, sims) = crate::kube_support::sim_pods(2).await;
    create(&ns_a, pool("llm", true, port)).await;
    create(&ns_a, pool("quiet", false, port)).await;
    crate::kube_support::ready_pod(&ns_a, "pod-0", "127.0.0.2").await;
    crate::kube_support::ready_pod(&ns_a, "pod-1", "127.0.0.3").await;
    let endpoints = dir.0.join("endpoints");
    let controller = Running::start(&kubeconfigs, &endpoints);

    // Exported from A: imported into both members, A's pool says Exported.
    wait_import(&ns_b, "cluster-b", "llm", &["cluster-a"]).await;
    wait_import(&ns_a, "cluster-a", "llm", &["cluster-a"]).await;
    let exported = || async {
        Ok(exported_condition(&ns_a, "llm")
            .await
            .filter(|s| s == "True"))
    };
    eventually("A's pool Exported=True", exported).await;
    let b_import = imports(&ns_b).get("llm").await.unwrap();
    assert_eq!(
        b_import.metadata.namespace.as_deref(),
        Some(ns_a.name.as_str()),
        "namespace sameness"
    );
    assert_eq!(b_import.controllers().len(), 1, "{b_import:?}");
    // Converged means quiet: no rewrite of an unchanged status (each would wake another pass).
    let version = |o: &kube::api::ObjectMeta| o.resource_version.clone().unwrap();
    let pool_version = version(&pools(&ns_a).get("llm").await.unwrap().metadata);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        version(&imports(&ns_b).get("llm").await.unwrap().metadata),
        version(&b_import.metadata)
    );
    assert_eq!(
        version(&pools(&ns_a).get("llm").await.unwrap().metadata),
        pool_version
    );

    // Endpoint mode: an epp reading the import's endpoints file routes to A's pods.
    let file = endpoints.join(&ns_a.name).join("llm.yaml");
    let both = [
        format!("cluster-a.pod-0.{port}"),
        format!("cluster-a.pod-1.{port}"),
    ];
    eventually("the endpoints file lists A's two pods", || async {
        Ok(file_entries(&file)?.filter(|names| names[..] == both[..]))
    })
    .await;
    let config = file_discovery_config(&file);
    let args: Vec<String> = [
        "--config-text",
        &config,
        "--pool-name",
        "llm",
        "--pool-namespace",
        &ns_a.name,
        "--secure-serving",
        "false",
    ]
    .iter()
    .map(|a| (*a).to_owned())
    .collect();
    let epp = harness::epp::Epp::start(&args)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let envoy = crate::kube_support::envoy(epp.grpc, &sims).await;
    crate::kube_support::wait_served(&envoy, &["pod-0", "pod-1"]).await;
    crate::kube_support::set_status(&ns_a, "pod-1", "127.0.0.3", false).await;
    crate::kube_support::wait_served(&envoy, &["pod-0"]).await;
    drop(envoy);
    epp.stop().await;

    // The same pool name exported by B too: both exporting clusters, everywhere.
    create(&ns_b, pool("llm", true, port)).await;
    wait_import(&ns_b, "cluster-b", "llm", &["cluster-a", "cluster-b"]).await;
    wait_import(&ns_a, "cluster-a", "llm", &["cluster-a", "cluster-b"]).await;

    // The gateway's import controller of B writes its own entry (its parents) beside ours.
    let gateway_entry = json!({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1", "kind": "InferencePoolImport",
        "metadata": {"name": "llm", "namespace": ns_b.name},
        "status": {"controllers": [{"name": GATEWAY, "parents": [{
            "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inf-gw"},
            "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}]}]}
    });
    imports(&ns_b)
        .patch_status(
            "llm",
            &PatchParams::apply("gateway").force(),
            &Patch::Apply(&gateway_entry),
        )
        .await
        .unwrap();

    // B withdraws its export while the controller runs: A alone exports again.
    set_export(&ns_b, "llm", false).await;
    wait_import(&ns_b, "cluster-b", "llm", &["cluster-a"]).await;
    wait_import(&ns_a, "cluster-a", "llm", &["cluster-a"]).await;
    let cleared = || async {
        Ok(exported_condition(&ns_b, "llm")
            .await
            .is_none()
            .then_some(()))
    };
    eventually("B's pool Exported entry removed", cleared).await;
    let names: Vec<String> = imports(&ns_b)
        .get("llm")
        .await
        .unwrap()
        .controllers()
        .iter()
        .map(|c| c.name.clone())
        .collect();
    assert!(
        names.contains(&GATEWAY.to_owned()),
        "the gateway's entry stays: {names:?}"
    );

    // An unannotated pool is imported nowhere.
    assert!(imports(&ns_a).get_opt("quiet").await.unwrap().is_none());
    assert!(imports(&ns_b).get_opt("quiet").await.unwrap().is_none());
    assert_eq!(exported_condition(&ns_a, "quiet").await, None);

    // The last export goes while the controller is down; restarted, it converges.
    controller.stop().await;
    set_export(&ns_a, "llm", false).await;
    let controller = Running::start(&kubeconfigs, &endpoints);
    let gone = || async {
        let r = imports(&ns_a)
            .get_opt("llm")
            .await
            .map_err(|e| e.to_string())?;
        Ok(r.is_none().then_some(()))
    };
    eventually("A's import deleted (only this controller held it)", gone).await;
    let withdrawn = || async {
        let import = imports(&ns_b)
            .get_opt("llm")
            .await
            .map_err(|e| e.to_string())?;
        let import = import.ok_or("B's import was deleted, though the gateway holds an entry")?;
        let names: Vec<&str> = import
            .controllers()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        Ok((names == [GATEWAY]).then_some(()))
    };
    eventually("B's import keeps only the gateway's entry", withdrawn).await;
    let cleared = || async {
        Ok(exported_condition(&ns_a, "llm")
            .await
            .is_none()
            .then_some(()))
    };
    eventually("A's pool Exported entry removed", cleared).await;
    let gateway = imports(&ns_b).get("llm").await.unwrap();
    assert_eq!(
        gateway.controllers()[0].parents.len(),
        1,
        "the gateway's parents are untouched"
    );
    let removed = || async { Ok((!file.exists()).then_some(())) };
    eventually("the endpoints file removed with the export", removed).await;
    // An unreachable member withdraws nothing: with B's API server down, A's withdrawn export
    // leaves A's import in place until B answers again.
    set_export(&ns_a, "llm", true).await;
    wait_import(&ns_a, "cluster-a", "llm", &["cluster-a"]).await;
    wait_import(&ns_b, "cluster-b", "llm", &["cluster-a"]).await;
    b.stop_apiserver(true);
    set_export(&ns_a, "llm", false).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let kept = imports(&ns_a).get_opt("llm").await.unwrap();
    assert!(
        kept.is_some(),
        "A's import withdrawn while B could not be listed"
    );
    b.start_apiserver().await.unwrap();
    let gone = || async {
        let r = imports(&ns_a)
            .get_opt("llm")
            .await
            .map_err(|e| e.to_string())?;
        Ok(r.is_none().then_some(()))
    };
    eventually("A's import deleted once B answers", gone).await;
    controller.stop().await;
}

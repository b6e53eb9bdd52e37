//! What the tests and the failover bench create on a real API server: the CRDs of
//! `config/crd/`, an InferencePool, and pods whose status is patched as a kubelet would (no
//! kubelet runs).

use super::{apply, KubeApiServer, KubeError, TestNamespace};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::{json, Value};
use std::time::Duration;

/// How long a CRD may take to be established.
const ESTABLISHED_WITHIN: Duration = Duration::from_secs(30);

/// Installs the CRDs of `<repo>/config/crd/` on `server` and waits until they are established.
pub async fn install_crds(server: &KubeApiServer) -> Result<(), KubeError> {
    let client = server.admin_client("default").await?;
    let dir = crate::envoy::repo_root().join("config").join("crd");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).map_err(|e| KubeError::io(&dir, e))? {
        let path = entry.map_err(|e| KubeError::io(&dir, e))?.path();
        let text = std::fs::read_to_string(&path).map_err(|e| KubeError::io(&path, e))?;
        for obj in apply::apply_yaml(&client, "default", &text).await? {
            names.extend(obj.metadata.name);
        }
    }
    let api = Api::<CustomResourceDefinition>::all(client);
    for name in names {
        let established = await_condition(api.clone(), &name, conditions::is_crd_established());
        tokio::time::timeout(ESTABLISHED_WITHIN, established)
            .await
            .map_err(|_| {
                KubeError::Config(format!(
                    "CRD {name} not established in {ESTABLISHED_WITHIN:?}"
                ))
            })?
            .map_err(|e| KubeError::Config(format!("waiting for CRD {name}: {e}")))?;
    }
    Ok(())
}

/// An InferencePool v1 `pool` selecting `app=vllm` on `ports`.
pub fn inference_pool(ports: &[u16]) -> Value {
    let ports: Vec<_> = ports.iter().map(|p| json!({"number": p})).collect();
    json!({
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "pool"},
        "spec": {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": ports,
                 "endpointPickerRef": {"name": "pool-epp", "port": {"number": 9002}}}
    })
}

/// A pod labelled `labels`, bound to a node name so deletion is graceful (no kubelet runs, so
/// a bound pod stays Terminating until deleted with grace period 0).
pub fn pod(name: &str, labels: Value) -> Result<Pod, KubeError> {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": "node-a", "containers": [{"name": "vllm", "image": "vllm"}]}
    }))
    .map_err(|e| KubeError::Config(format!("pod {name}: {e}")))
}

/// Creates pod `name` labelled `labels` in `ns`.
pub async fn create_pod(ns: &TestNamespace, name: &str, labels: Value) -> Result<(), KubeError> {
    Api::<Pod>::namespaced(ns.client.clone(), &ns.name)
        .create(&PostParams::default(), &pod(name, labels)?)
        .await?;
    Ok(())
}

/// Sets the pod's IP and Ready condition through the `pods/status` subresource, as a kubelet would.
pub async fn set_pod_status(
    ns: &TestNamespace,
    name: &str,
    ip: &str,
    ready: bool,
) -> Result<(), KubeError> {
    let ready = if ready { "True" } else { "False" };
    let status = json!({"status": {
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": ready}]
    }});
    Api::<Pod>::namespaced(ns.client.clone(), &ns.name)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await?;
    Ok(())
}

/// A Ready pod `name` at `ip`, labelled `app=vllm` (what [`inference_pool`] selects).
pub async fn ready_pod(ns: &TestNamespace, name: &str, ip: &str) -> Result<(), KubeError> {
    create_pod(ns, name, json!({"app": "vllm"})).await?;
    set_pod_status(ns, name, ip, true).await
}

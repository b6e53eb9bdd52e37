//! `kubectl apply` for tests: server-side apply of any object, its resource found through the
//! server's discovery, so YAML files (CRDs, the rendered chart) go in unchanged.

use super::KubeError;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::{pinned_kind, Scope};
use serde_json::Value;

/// Field manager of the tests' applies.
const MANAGER: &str = "epp-tests";

/// Applies `object`; namespaced kinds go to `namespace` unless the object names its own.
pub async fn apply(
    client: &kube::Client,
    namespace: &str,
    object: &Value,
) -> Result<DynamicObject, KubeError> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
    let (resource, caps) = pinned_kind(client, &gvk).await?;
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Namespaced => {
            let ns = object["metadata"]["namespace"]
                .as_str()
                .unwrap_or(namespace);
            Api::namespaced_with(client.clone(), ns, &resource)
        }
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    let params = PatchParams::apply(MANAGER).force();
    Ok(api.patch(name, &params, &Patch::Apply(object)).await?)
}

/// Applies every document of a multi-document YAML text, in order.
pub async fn apply_yaml(
    client: &kube::Client,
    namespace: &str,
    text: &str,
) -> Result<Vec<DynamicObject>, KubeError> {
    let mut applied = Vec::new();
    for doc in serde_norway::Deserializer::from_str(text) {
        let value = <Value as serde::Deserialize>::deserialize(doc)
            .map_err(|e| KubeError::Config(format!("YAML: {e}")))?;
        if value.is_null() {
            continue;
        }
        applied.push(apply(client, namespace, &value).await?);
    }
    Ok(applied)
}

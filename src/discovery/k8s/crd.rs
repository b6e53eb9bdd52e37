//! The Gateway API Inference Extension's CRDs as Rust types, and their CustomResourceDefinitions.
//!
//! Kubernetes discovery reads these objects; `config/crd/*.yaml` is generated from these types
//! by `hack/gen-crds.sh`, and a test fails when the committed YAML and the types disagree, so
//! the schema users install is the one epp decodes. Field names, enums and ranges follow upstream
//! (`api/v1/inferencepool_types.go`, `apix/v1alpha2/*`, llm-d-router's `apix/v1/*`).

pub mod common;
pub mod model;
pub mod objective;
pub mod objective_v1;
pub mod pool;
pub mod pool_v1alpha2;
pub mod rewrite;
pub mod validate;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// Every CRD epp reads, with the file name it has under `config/crd/`.
pub fn definitions() -> Vec<(String, CustomResourceDefinition)> {
    let crds = [
        pool::InferencePool::crd(),
        pool_v1alpha2::InferencePool::crd(),
        model::InferenceModel::crd(),
        objectives(),
        rewrite::InferenceModelRewrite::crd(),
    ];
    crds.into_iter()
        .map(|mut crd| {
            approve(&mut crd);
            let file = format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural);
            (file, crd)
        })
        .collect()
}

/// InferenceObjective's CRD: v1alpha2 (storage) and v1, served together. Their schemas hold the
/// same targeting fields, so the API server's default `None` conversion (a relabelling) loses
/// nothing either way.
fn objectives() -> CustomResourceDefinition {
    let mut crd = objective::InferenceObjective::crd();
    let v1 = objective_v1::InferenceObjective::crd().spec.versions;
    crd.spec.versions.extend(v1.into_iter().map(|mut v| {
        v.storage = false;
        v
    }));
    crd
}

/// The annotation a real API server requires of CRDs in protected groups (`*.k8s.io`, but not
/// `*.x-k8s.io`): without it the CRD is rejected ("protected groups must have approval
/// annotation", KEP 1111). The value is upstream's approval.
pub(crate) const API_APPROVED: (&str, &str) = (
    "api-approved.kubernetes.io",
    "https://github.com/kubernetes-sigs/gateway-api-inference-extension/pull/1173",
);

fn approve(crd: &mut CustomResourceDefinition) {
    let group = &crd.spec.group;
    let protected = (group.ends_with(".k8s.io") || group.ends_with(".kubernetes.io"))
        && !group.ends_with(".x-k8s.io");
    if protected {
        let (key, value) = API_APPROVED;
        crd.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(key.to_owned(), value.to_owned());
    }
}

/// The YAML committed for one CRD.
pub fn render(crd: &CustomResourceDefinition) -> Result<String, serde_norway::Error> {
    Ok(format!(
        "# Generated from src/discovery/k8s/crd by hack/gen-crds.sh; do not edit.\n{}",
        serde_norway::to_string(crd)?
    ))
}

#[cfg(test)]
mod tests;

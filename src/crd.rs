//! The Gateway API Inference Extension's CRDs as Rust types, and their CustomResourceDefinitions.
//!
//! Kubernetes discovery reads these objects; `config/crd/*.yaml` is generated from these types
//! by `hack/gen-crds.sh`, and a test fails when the committed YAML and the types disagree, so
//! the schema users install is the one epp decodes. Field names, enums and ranges follow upstream
//! (`api/v1/inferencepool_types.go`, `apix/v1alpha2/*`).

pub mod common;
pub mod model;
pub mod objective;
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
        objective::InferenceObjective::crd(),
        rewrite::InferenceModelRewrite::crd(),
    ];
    crds.into_iter()
        .map(|crd| {
            let file = format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural);
            (file, crd)
        })
        .collect()
}

/// The YAML committed for one CRD.
pub fn render(crd: &CustomResourceDefinition) -> Result<String, serde_yaml::Error> {
    Ok(format!(
        "# Generated from src/crd by hack/gen-crds.sh; do not edit.\n{}",
        serde_yaml::to_string(crd)?
    ))
}

#[cfg(test)]
mod tests;

//! `InferenceObjective` `inference.networking.x-k8s.io/v1` (llm-d's multi-pool objectives):
//! the single `poolRef` is gone; an objective applies to the pools `poolRefs` names and those
//! `poolSelector` matches. Served beside v1alpha2, which stays the storage version and carries
//! the same fields, so the API server converts between them by relabelling (`None` strategy) and
//! epp reads every objective through v1alpha2 ([`super::objective`]).

use super::common::{PoolRef, PoolSelector};
use super::objective::InferenceObjectiveStatus;
use super::validate::OBJECTIVE_REFS_OR_SELECTOR;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// InferenceObjectiveSpec defines the desired state of InferenceObjective.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "inference.networking.x-k8s.io",
    version = "v1",
    kind = "InferenceObjective",
    namespaced,
    status = "InferenceObjectiveStatus",
    printcolumn = r#"{"name": "Inference Pools", "type": "string", "jsonPath": ".spec.poolRefs[*].name"}"#,
    printcolumn = r#"{"name": "Priority", "type": "string", "jsonPath": ".spec.priority"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[kube(
    derive = "PartialEq",
    doc = "InferenceObjective is the Schema for the InferenceObjectives API."
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = super::validate::schema(&[OBJECTIVE_REFS_OR_SELECTOR])))]
pub struct InferenceObjectiveSpec {
    /// Higher is more important; unset is 0; below 0 the request may be shed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Pools this objective applies to, by name (unique), in the objective's namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(min = 1, max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub pool_refs: Vec<PoolRef>,
    /// Pools this objective applies to, by label, in the objective's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_selector: Option<PoolSelector>,
}

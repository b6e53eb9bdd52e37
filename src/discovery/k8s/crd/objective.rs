//! `InferenceObjective` `inference.networking.x-k8s.io/v1alpha2` (GIE v1.x, the storage version):
//! a named priority a request selects with the `x-gateway-inference-objective` header; negative
//! means sheddable.
//!
//! The pools it applies to: the single `poolRef` of GIE v1.x, or, as llm-d's multi-pool
//! objectives write them, `poolRefs` (any named pool) and `poolSelector` (any pool whose labels
//! match). This version's schema carries the `v1` fields ([`super::objective_v1`]) too, so an
//! object written through either version is stored without loss; `poolRef` stands alone.

use super::common::{Condition, PoolRef, PoolSelector};
use super::validate::{OBJECTIVE_POOL_REF_ALONE, OBJECTIVE_POOL_REQUIRED};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// InferenceObjectiveSpec defines the desired state of InferenceObjective.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "inference.networking.x-k8s.io",
    version = "v1alpha2",
    kind = "InferenceObjective",
    namespaced,
    status = "InferenceObjectiveStatus",
    printcolumn = r#"{"name": "Inference Pool", "type": "string", "jsonPath": ".spec.poolRef.name"}"#,
    printcolumn = r#"{"name": "Inference Pools", "type": "string", "jsonPath": ".spec.poolRefs[*].name"}"#,
    printcolumn = r#"{"name": "Priority", "type": "string", "jsonPath": ".spec.priority"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[kube(
    derive = "PartialEq",
    doc = "InferenceObjective is the Schema for the InferenceObjectives API."
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = super::validate::schema(&[OBJECTIVE_POOL_REQUIRED, OBJECTIVE_POOL_REF_ALONE])))]
pub struct InferenceObjectiveSpec {
    /// Higher is more important; unset is 0; below 0 the request may be shed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// The one pool this objective applies to; not combined with poolRefs or poolSelector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_ref: Option<PoolRef>,
    /// Pools this objective applies to, by name (unique), in the objective's namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(min = 1, max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub pool_refs: Vec<PoolRef>,
    /// Pools this objective applies to, by label, in the objective's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_selector: Option<PoolSelector>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InferenceObjectiveStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub(crate) conditions: Vec<Condition>,
}

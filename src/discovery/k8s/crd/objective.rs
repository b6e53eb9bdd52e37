//! `InferenceObjective` `inference.networking.x-k8s.io/v1alpha2` (GIE v1.x): a named priority a
//! request selects with the `x-gateway-inference-objective` header; negative means sheddable.

use super::common::{Condition, PoolRef};
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
    status = "InferenceObjectiveStatus"
)]
#[kube(
    derive = "PartialEq",
    doc = "InferenceObjective is the Schema for the InferenceObjectives API."
)]
#[serde(rename_all = "camelCase")]
pub struct InferenceObjectiveSpec {
    /// Higher is more important; unset is 0; below 0 the request may be shed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// The pool this objective applies to.
    pub pool_ref: PoolRef,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InferenceObjectiveStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub(crate) conditions: Vec<Condition>,
}

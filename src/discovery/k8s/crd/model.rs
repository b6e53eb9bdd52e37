//! `InferenceModel` `inference.networking.x-k8s.io/v1alpha2` (GIE v0.x): a client-facing model
//! name, its criticality (whether it may be shed) and weighted target models (canaries).

use super::common::{Condition, PoolRef};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// InferenceModelSpec defines the desired state of InferenceModel.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "inference.networking.x-k8s.io",
    version = "v1alpha2",
    kind = "InferenceModel",
    namespaced,
    status = "InferenceModelStatus"
)]
#[kube(
    derive = "PartialEq",
    doc = "InferenceModel is the Schema for the InferenceModels API."
)]
#[serde(rename_all = "camelCase")]
pub struct InferenceModelSpec {
    /// The model name clients send in the body's `model`; unique per pool (the oldest wins).
    #[schemars(length(min = 1, max = 256), extend("x-kubernetes-validations" = super::validate::schema(&[super::validate::MODEL_NAME_IMMUTABLE])))]
    pub(crate) model_name: String,
    /// Whether requests may be shed under saturation; Standard when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::common::optional_enum::<Criticality>")]
    pub(crate) criticality: Option<Criticality>,
    /// Models to send the traffic to, split by weight; the model name itself when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10), extend("x-kubernetes-validations" = super::validate::schema(&[super::validate::TARGET_WEIGHTS_ALL_OR_NONE])))]
    pub target_models: Vec<TargetModel>,
    /// The pool serving this model.
    pub(crate) pool_ref: PoolRef,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) enum Criticality {
    /// Never shed.
    Critical,
    /// Not shed (it queues on the model servers).
    #[default]
    Standard,
    /// Shed with 429 when the pool is saturated.
    Sheddable,
}

/// One weighted target of an InferenceModel.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TargetModel {
    #[schemars(length(min = 1, max = 253))]
    pub(crate) name: String,
    /// Relative share of the traffic; weights are set on all targets or on none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub weight: Option<i32>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InferenceModelStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub(crate) conditions: Vec<Condition>,
}

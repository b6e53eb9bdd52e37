//! `InferencePool` `inference.networking.x-k8s.io/v1alpha2`: the pre-GA pool (GIE v0.3–v0.5),
//! still served for migration. One target port, a plain label map, and an `extensionRef`.

use super::common::{Condition, ParentReference};
use super::pool::FailureMode;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// InferencePoolSpec defines the desired state of InferencePool.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "inference.networking.x-k8s.io",
    version = "v1alpha2",
    kind = "InferencePool",
    namespaced,
    shortname = "infpool",
    status = "InferencePoolStatus"
)]
#[kube(
    derive = "PartialEq",
    doc = "InferencePool is the Schema for the InferencePools API."
)]
#[serde(rename_all = "camelCase")]
pub struct InferencePoolSpec {
    /// Labels a pod must all carry to be a member.
    pub(crate) selector: BTreeMap<String, String>,
    /// The model servers' port.
    #[schemars(range(min = 1, max = 65535))]
    pub target_port_number: i32,
    /// The endpoint picker serving this pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) extension_ref: Option<ExtensionRef>,
}

/// Reference to the endpoint picker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ExtensionRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub(crate) group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub(crate) kind: Option<String>,
    #[schemars(length(min = 1, max = 253))]
    pub(crate) name: String,
    /// Port of the extension service; 9002 when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub(crate) port_number: Option<i32>,
    #[serde(default)]
    pub failure_mode: FailureMode,
}

/// Observed state (the field is singular `parent` in this version).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InferencePoolStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub(crate) parent: Vec<PoolStatus>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PoolStatus {
    pub(crate) parent_ref: ParentReference,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub(crate) conditions: Vec<Condition>,
}

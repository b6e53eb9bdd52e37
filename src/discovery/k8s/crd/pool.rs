//! `InferencePool` `inference.networking.k8s.io/v1`: the GA pool. Its selector and target ports
//! decide which pods (and which ports of them) are epp's endpoints.

use super::common::{Condition, ParentReference};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// InferencePoolSpec defines the desired state of InferencePool.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "inference.networking.k8s.io",
    version = "v1",
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
    /// Selects the model-server pods of this pool, in the pool's namespace.
    pub(crate) selector: LabelSelector,
    /// Ports of the selected pods that serve; each port of a pod is a separate endpoint
    /// (data-parallel ranks).
    #[schemars(length(min = 1, max = 8), extend("x-kubernetes-list-type" = "atomic", "x-kubernetes-validations" = super::validate::schema(&[super::validate::TARGET_PORTS_UNIQUE])))]
    pub target_ports: Vec<Port>,
    /// Protocol the gateway speaks to the model servers.
    #[serde(default)]
    pub app_protocol: AppProtocol,
    /// The endpoint picker serving this pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) endpoint_picker_ref: Option<EndpointPickerRef>,
}

/// Label selector; only `matchLabels` (like a Service selector).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LabelSelector {
    /// Labels a pod must all carry to be a member.
    #[schemars(length(min = 1, max = 64))]
    pub match_labels: BTreeMap<String, String>,
}

/// A port of the selected pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Port {
    #[schemars(range(min = 1, max = 65535))]
    pub(crate) number: i32,
}

/// `http` (default) or `kubernetes.io/h2c`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum AppProtocol {
    #[default]
    #[serde(rename = "http")]
    Http,
    #[serde(rename = "kubernetes.io/h2c")]
    H2c,
}

/// What the gateway does when the endpoint picker does not answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) enum FailureMode {
    FailOpen,
    #[default]
    FailClose,
}

/// Reference to the endpoint picker (normally its Service).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = super::validate::schema(&[super::validate::PICKER_PORT_REQUIRED])))]
pub(crate) struct EndpointPickerRef {
    /// API group of the referent; "" is the core group.
    #[serde(default)]
    #[schemars(length(max = 253))]
    pub(crate) group: String,
    /// Kind of the referent.
    #[serde(default = "service")]
    #[schemars(length(min = 1, max = 63))]
    pub(crate) kind: String,
    #[schemars(length(min = 1, max = 253))]
    pub(crate) name: String,
    /// Port of the endpoint picker's Service (required when kind is Service).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) port: Option<Port>,
    #[serde(default)]
    pub failure_mode: FailureMode,
}

/// Observed state, one entry per parent Gateway.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InferencePoolStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub(crate) parents: Vec<ParentStatus>,
}

/// The pool's status as seen by one parent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ParentStatus {
    pub(crate) parent_ref: ParentReference,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) controller_name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub(crate) conditions: Vec<Condition>,
}

fn service() -> String {
    "Service".to_owned()
}

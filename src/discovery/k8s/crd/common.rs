//! Types shared by the CRDs: pool references, parent references and status conditions.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The standard Kubernetes condition (`metav1.Condition`).
pub type Condition = k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// Reference to the InferencePool an object belongs to, in the object's namespace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PoolRef {
    /// API group of the pool; `inference.networking.k8s.io` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub(crate) group: Option<String>,
    /// `InferencePool` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub(crate) kind: Option<String>,
    #[schemars(length(min = 1, max = 253))]
    pub(crate) name: String,
}

/// A parent (usually a Gateway) reporting on a pool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ParentReference {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub(crate) group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub(crate) kind: Option<String>,
    #[schemars(length(min = 1, max = 253))]
    pub(crate) name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub(crate) namespace: Option<String>,
}

/// The schema of an optional string enum: the enum's values without the `null` that schemars adds
/// for `Option` (an unset field is simply absent).
pub(crate) fn optional_enum<T: JsonSchema>(
    generator: &mut schemars::SchemaGenerator,
) -> schemars::Schema {
    let mut schema = T::json_schema(generator);
    schema.remove("nullable");
    schema
}

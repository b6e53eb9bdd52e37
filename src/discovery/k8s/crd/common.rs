//! Types shared by the CRDs: pool references, pool selectors, parent references and status
//! conditions.

use crate::plugin::Invalid;
use crate::scheduling::filter::LabelSelectorFilter;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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
    pub name: String,
}

/// A label selector over InferencePools (`metav1.LabelSelector`), as InferenceObjective's
/// `poolSelector`: replaced whole on update, and never empty (an empty one would select every
/// pool of the namespace, which upstream refuses).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-map-type" = "atomic", "x-kubernetes-validations" = super::validate::schema(&[super::validate::POOL_SELECTOR_NOT_EMPTY])))]
pub struct PoolSelector {
    /// Labels the pool must all carry with these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Requirements the pool's labels must all meet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub match_expressions: Vec<SelectorRequirement>,
}

/// One `matchExpressions` entry: `In`, `NotIn`, `Exists` or `DoesNotExist` on a label key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SelectorRequirement {
    pub key: String,
    pub operator: String,
    /// Non-empty for `In` and `NotIn`, empty for `Exists` and `DoesNotExist`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub values: Vec<String>,
}

impl PoolSelector {
    /// The selector checked as `metav1.LabelSelectorAsSelector` checks it (keys, values,
    /// operators), ready to match labels; the error names the offending part.
    pub(crate) fn compile(&self) -> Result<LabelSelectorFilter, Invalid> {
        let expressions = self
            .match_expressions
            .iter()
            .map(|r| crate::scheduling::filter::Requirement {
                key: r.key.clone(),
                operator: r.operator.clone(),
                values: r.values.clone(),
            })
            .collect();
        LabelSelectorFilter {
            match_labels: self.match_labels.clone(),
            match_expressions: expressions,
        }
        .validate()
    }
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

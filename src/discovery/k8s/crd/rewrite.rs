//! `InferenceModelRewrite` `inference.networking.x-k8s.io/v1alpha2`: rules that rewrite the
//! request's model to weighted targets (canaries, renames).

use super::common::{Condition, PoolRef};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// InferenceModelRewriteSpec defines the desired state of InferenceModelRewrite.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "inference.networking.x-k8s.io",
    version = "v1alpha2",
    kind = "InferenceModelRewrite",
    namespaced,
    status = "InferenceModelRewriteStatus"
)]
#[kube(
    derive = "PartialEq",
    doc = "InferenceModelRewrite is the Schema for the InferenceModelRewrites API."
)]
#[serde(rename_all = "camelCase")]
pub struct InferenceModelRewriteSpec {
    /// The pool whose requests are rewritten.
    pub pool_ref: PoolRef,
    /// Rules in order; an exact match beats a rule without matches.
    #[serde(default)]
    #[schemars(length(max = 16))]
    pub rules: Vec<RewriteRule>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RewriteRule {
    /// Conditions, any of which selects the rule; empty matches every model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub(crate) matches: Vec<RewriteMatch>,
    /// Weighted targets; one is drawn per request.
    #[schemars(length(min = 1, max = 16))]
    pub(crate) targets: Vec<RewriteTarget>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct RewriteMatch {
    pub(crate) model: ModelMatch,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ModelMatch {
    /// Only `Exact` is defined.
    #[serde(default, rename = "type")]
    pub(crate) match_type: MatchType,
    #[schemars(length(min = 1, max = 253))]
    pub(crate) value: String,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) enum MatchType {
    #[default]
    Exact,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RewriteTarget {
    #[schemars(length(min = 1, max = 253))]
    pub(crate) model_rewrite: String,
    /// Relative share; all zero (or unset) means uniform.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1_000_000))]
    pub weight: Option<i32>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InferenceModelRewriteStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub(crate) conditions: Vec<Condition>,
}

//! Upstream's CEL validation rules (`x-kubernetes-validations`), carried in two forms that must
//! agree: the CEL text, which the generated CRD schemas embed so a real API server rejects a bad
//! object at admission, and a Rust predicate with the same meaning, which the watchers apply to
//! every object they receive. The second form is not redundant: an object stored before the
//! CRD carried the rule, written by a client that skipped validation, or served by an API server
//! without CEL (before 1.25) would otherwise reach the scheduler half-valid. A violating object
//! is ignored (as if the API server had rejected it), with a log line and a metric.
//!
//! The rules are exactly upstream's (`api/v1/inferencepool_types.go`,
//! `api/v1alpha2/inferencemodel_types.go` of GIE v0.5, llm-d-router's multi-pool
//! `apix/v1/inferenceobjective_types.go`): unique target ports and a port for a Service picker on
//! the v1 pool; all-or-none weights and an immutable `modelName` on InferenceModel; on
//! InferenceObjective, a pool target (v1alpha2: one of `poolRef`, `poolRefs`, `poolSelector`, and
//! `poolRef` alone; v1: `poolRefs` or `poolSelector`) and a non-empty `poolSelector`.
//! InferenceModelRewrite and the v1alpha2 pool have none.

use super::{model, objective, objective_v1, pool};
use serde_json::{json, Value};

/// One CEL rule: a short id (the metric label), the field it is attached to (as the API
/// server names it in its error), the CEL text and upstream's message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    pub(crate) id: &'static str,
    pub(crate) field: &'static str,
    pub(crate) rule: &'static str,
    pub message: &'static str,
}

/// `InferencePool.spec.targetPorts` (v1).
pub const TARGET_PORTS_UNIQUE: Rule = Rule {
    id: "target-ports-unique",
    field: "spec.targetPorts",
    rule: "self.all(p1, self.exists_one(p2, p1.number==p2.number))",
    message: "port number must be unique",
};

/// `InferencePool.spec.endpointPickerRef` (v1); `kind` defaults to `Service`.
pub const PICKER_PORT_REQUIRED: Rule = Rule {
    id: "picker-port-required",
    field: "spec.endpointPickerRef",
    rule: "self.kind != 'Service' || has(self.port)",
    message: "port is required when kind is 'Service' or unspecified (defaults to 'Service')",
};

/// `InferenceModel.spec.targetModels`.
pub const TARGET_WEIGHTS_ALL_OR_NONE: Rule = Rule {
    id: "target-weights-all-or-none",
    field: "spec.targetModels",
    rule: "self.all(model, has(model.weight)) || self.all(model, !has(model.weight))",
    message: "Weights should be set for all models, or none of the models.",
};

/// `InferenceModel.spec.modelName`: a transition rule, checked against the previous version.
pub const MODEL_NAME_IMMUTABLE: Rule = Rule {
    id: "model-name-immutable",
    field: "spec.modelName",
    rule: "self == oldSelf",
    message: "modelName is immutable",
};

/// `InferenceObjective.spec` (v1alpha2, the storage version): some pool must be targeted.
pub const OBJECTIVE_POOL_REQUIRED: Rule = Rule {
    id: "objective-pool-required",
    field: "spec",
    rule: "has(self.poolRef) || has(self.poolRefs) || has(self.poolSelector)",
    message: "one of poolRef, poolRefs or poolSelector must be set",
};

/// `InferenceObjective.spec` (v1alpha2): the single `poolRef` stands alone.
pub const OBJECTIVE_POOL_REF_ALONE: Rule = Rule {
    id: "objective-pool-ref-alone",
    field: "spec",
    rule: "!(has(self.poolRef) && self.poolRef.name != \"\" && (has(self.poolRefs) || has(self.poolSelector)))",
    message: "poolRef cannot be combined with poolRefs or poolSelector",
};

/// `InferenceObjective.spec` (v1): `poolRef` is gone, a list or a selector remains.
pub const OBJECTIVE_REFS_OR_SELECTOR: Rule = Rule {
    id: "objective-refs-or-selector",
    field: "spec",
    rule: "has(self.poolRefs) || has(self.poolSelector)",
    message: "either poolRefs or poolSelector must be set",
};

/// `InferenceObjective.spec.poolSelector` (both versions): targeting every pool of the
/// namespace with an empty selector is not a supported objective.
pub const POOL_SELECTOR_NOT_EMPTY: Rule = Rule {
    id: "pool-selector-not-empty",
    field: "spec.poolSelector",
    rule: "(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)",
    message: "poolSelector must not be empty",
};

/// The `x-kubernetes-validations` value for `rules` (used by the schemas' `extend` attributes).
pub(crate) fn schema(rules: &[Rule]) -> Value {
    Value::Array(
        rules
            .iter()
            .map(|r| json!({"rule": r.rule, "message": r.message}))
            .collect(),
    )
}

/// An object's rules, evaluated in Rust with the CEL rules' meaning.
pub(crate) trait Validate {
    /// Rules the object breaks on its own.
    fn violations(&self) -> Vec<Rule> {
        Vec::new()
    }

    /// Transition rules (`oldSelf`) the update from `old` breaks.
    fn transition_violations(&self, _old: &Self) -> Vec<Rule> {
        Vec::new()
    }
}

impl Validate for pool::InferencePool {
    fn violations(&self) -> Vec<Rule> {
        let ports = &self.spec.target_ports;
        let unique = ports
            .iter()
            .all(|p1| ports.iter().filter(|p2| p1.number == p2.number).count() == 1);
        let picker_ok = self
            .spec
            .endpoint_picker_ref
            .as_ref()
            .is_none_or(|r| r.kind != "Service" || r.port.is_some());
        [
            (!unique).then_some(TARGET_PORTS_UNIQUE),
            (!picker_ok).then_some(PICKER_PORT_REQUIRED),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

impl Validate for model::InferenceModel {
    fn violations(&self) -> Vec<Rule> {
        let targets = &self.spec.target_models;
        let all_or_none = targets.iter().all(|t| t.weight.is_some())
            || targets.iter().all(|t| t.weight.is_none());
        (!all_or_none)
            .then_some(TARGET_WEIGHTS_ALL_OR_NONE)
            .into_iter()
            .collect()
    }

    fn transition_violations(&self, old: &Self) -> Vec<Rule> {
        (self.spec.model_name != old.spec.model_name)
            .then_some(MODEL_NAME_IMMUTABLE)
            .into_iter()
            .collect()
    }
}

/// The rules broken by an objective's `poolSelector`, if it has one.
fn selector_violations(selector: Option<&super::common::PoolSelector>) -> Option<Rule> {
    selector
        .is_some_and(|s| s.match_labels.is_empty() && s.match_expressions.is_empty())
        .then_some(POOL_SELECTOR_NOT_EMPTY)
}

impl Validate for objective::InferenceObjective {
    fn violations(&self) -> Vec<Rule> {
        let s = &self.spec;
        let (one, refs, selector) = (
            s.pool_ref.is_some(),
            !s.pool_refs.is_empty(),
            s.pool_selector.is_some(),
        );
        let named = s.pool_ref.as_ref().is_some_and(|r| !r.name.is_empty());
        [
            (!(one || refs || selector)).then_some(OBJECTIVE_POOL_REQUIRED),
            (named && (refs || selector)).then_some(OBJECTIVE_POOL_REF_ALONE),
            selector_violations(s.pool_selector.as_ref()),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

impl Validate for objective_v1::InferenceObjective {
    fn violations(&self) -> Vec<Rule> {
        let s = &self.spec;
        let targeted = !s.pool_refs.is_empty() || s.pool_selector.is_some();
        [
            (!targeted).then_some(OBJECTIVE_REFS_OR_SELECTOR),
            selector_violations(s.pool_selector.as_ref()),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

impl Validate for super::pool_v1alpha2::InferencePool {}
impl Validate for super::rewrite::InferenceModelRewrite {}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(spec: Value) -> pool::InferencePool {
        serde_json::from_value(json!({"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool", "metadata": {"name": "p"}, "spec": spec})).unwrap()
    }

    fn model(spec: Value) -> model::InferenceModel {
        serde_json::from_value(json!({"apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceModel", "metadata": {"name": "m"}, "spec": spec})).unwrap()
    }

    #[test]
    fn duplicate_target_ports_break_the_uniqueness_rule() {
        let ok = pool(
            json!({"selector": {"matchLabels": {"a": "b"}}, "targetPorts": [{"number": 8000}, {"number": 8001}]}),
        );
        assert!(ok.violations().is_empty());
        let dup = pool(
            json!({"selector": {"matchLabels": {"a": "b"}}, "targetPorts": [{"number": 8000}, {"number": 8000}]}),
        );
        assert_eq!(dup.violations(), [TARGET_PORTS_UNIQUE]);
    }

    #[test]
    fn a_service_picker_needs_a_port_and_kind_defaults_to_service() {
        let sel = json!({"matchLabels": {"a": "b"}});
        let no_port = pool(
            json!({"selector": sel, "targetPorts": [{"number": 8000}], "endpointPickerRef": {"name": "epp"}}),
        );
        assert_eq!(no_port.violations(), [PICKER_PORT_REQUIRED]);
        let other_kind = pool(
            json!({"selector": sel, "targetPorts": [{"number": 8000}], "endpointPickerRef": {"name": "epp", "kind": "Backend", "group": "x.io"}}),
        );
        assert!(other_kind.violations().is_empty());
        let with_port = pool(
            json!({"selector": sel, "targetPorts": [{"number": 8000}], "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}}),
        );
        assert!(with_port.violations().is_empty());
    }

    #[test]
    fn weights_must_be_set_on_all_targets_or_none() {
        let base = |targets: Value| {
            model(json!({"modelName": "m", "poolRef": {"name": "p"}, "targetModels": targets}))
        };
        assert!(base(json!([{"name": "a"}, {"name": "b"}]))
            .violations()
            .is_empty());
        assert!(
            base(json!([{"name": "a", "weight": 1}, {"name": "b", "weight": 9}]))
                .violations()
                .is_empty()
        );
        assert!(base(json!([])).violations().is_empty());
        assert_eq!(
            base(json!([{"name": "a", "weight": 1}, {"name": "b"}])).violations(),
            [TARGET_WEIGHTS_ALL_OR_NONE]
        );
    }

    #[test]
    fn model_name_cannot_change_on_update() {
        let old = model(json!({"modelName": "m", "poolRef": {"name": "p"}}));
        let same = model(json!({"modelName": "m", "poolRef": {"name": "q"}}));
        let renamed = model(json!({"modelName": "n", "poolRef": {"name": "p"}}));
        assert!(same.transition_violations(&old).is_empty());
        assert_eq!(renamed.transition_violations(&old), [MODEL_NAME_IMMUTABLE]);
    }

    fn objective(version: &str, spec: Value) -> Value {
        json!({"apiVersion": format!("inference.networking.x-k8s.io/{version}"), "kind": "InferenceObjective", "metadata": {"name": "o"}, "spec": spec})
    }

    fn alpha(spec: Value) -> objective::InferenceObjective {
        serde_json::from_value(objective("v1alpha2", spec)).unwrap()
    }

    fn v1(spec: Value) -> objective_v1::InferenceObjective {
        serde_json::from_value(objective("v1", spec)).unwrap()
    }

    #[test]
    fn a_v1alpha2_objective_targets_one_way_and_pool_ref_stands_alone() {
        let refs = json!([{"name": "a"}, {"name": "b"}]);
        let sel = json!({"matchLabels": {"tier": "gold"}});
        assert!(alpha(json!({"poolRef": {"name": "a"}}))
            .violations()
            .is_empty());
        assert!(alpha(json!({"poolRefs": refs})).violations().is_empty());
        assert!(alpha(json!({"poolSelector": sel})).violations().is_empty());
        assert!(alpha(json!({"poolRefs": refs, "poolSelector": sel}))
            .violations()
            .is_empty());
        assert_eq!(
            alpha(json!({"priority": 3})).violations(),
            [OBJECTIVE_POOL_REQUIRED]
        );
        assert_eq!(
            alpha(json!({"poolRef": {"name": "a"}, "poolRefs": refs})).violations(),
            [OBJECTIVE_POOL_REF_ALONE]
        );
        assert_eq!(
            alpha(json!({"poolRef": {"name": "a"}, "poolSelector": sel})).violations(),
            [OBJECTIVE_POOL_REF_ALONE]
        );
        // Upstream's rule lets an unnamed poolRef sit beside the others.
        assert!(alpha(json!({"poolRef": {"name": ""}, "poolRefs": refs}))
            .violations()
            .is_empty());
    }

    #[test]
    fn a_v1_objective_needs_refs_or_a_selector_and_no_selector_is_empty() {
        assert!(v1(json!({"poolRefs": [{"name": "a"}]}))
            .violations()
            .is_empty());
        assert!(v1(
            json!({"poolSelector": {"matchExpressions": [{"key": "tier", "operator": "Exists"}]}})
        )
        .violations()
        .is_empty());
        assert_eq!(
            v1(json!({"priority": 1})).violations(),
            [OBJECTIVE_REFS_OR_SELECTOR]
        );
        assert_eq!(
            v1(json!({"poolSelector": {}})).violations(),
            [POOL_SELECTOR_NOT_EMPTY]
        );
        assert_eq!(
            v1(json!({"poolSelector": {"matchLabels": {}}})).violations(),
            [POOL_SELECTOR_NOT_EMPTY]
        );
        assert_eq!(
            alpha(json!({"poolSelector": {}})).violations(),
            [POOL_SELECTOR_NOT_EMPTY]
        );
        assert_eq!(POOL_SELECTOR_NOT_EMPTY.field, "spec.poolSelector");
    }
}

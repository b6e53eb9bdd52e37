//! The admission gate between a watch and its mirror: objects that break the CRDs' CEL rules
//! ([`crate::discovery::k8s::crd::validate`]) are dropped here, as a real API server would have rejected them.
//!
//! The gate remembers the last accepted version of each object so transition rules (`oldSelf`)
//! can be checked; an update that breaks one keeps the previous version visible, as the API
//! server would have kept it. Every dropped object is logged with the rule's upstream message and
//! counted in `epp_crd_validation_failures{kind,rule}`.

use super::crd::validate::{Rule, Validate};
use crate::metrics::{CrdKind, CrdRuleLabels, Metrics};
use kube::runtime::watcher::Event;
use kube::{Resource, ResourceExt};
use std::collections::BTreeMap;
use std::sync::Arc;

pub(crate) struct Gate<K> {
    kind: CrdKind,
    accepted: BTreeMap<String, K>,
    /// Names seen during a re-list; the rest are forgotten at `InitDone`.
    relisted: Option<BTreeMap<String, K>>,
    metrics: Arc<Metrics>,
}

impl<K: Validate + Resource + Clone> Gate<K> {
    pub(crate) fn new(kind: CrdKind, metrics: Arc<Metrics>) -> Self {
        Self {
            kind,
            accepted: BTreeMap::new(),
            relisted: None,
            metrics,
        }
    }

    /// The event to apply, if any: a rejected object becomes nothing, or, for an update that
    /// breaks a transition rule, the previous version.
    pub(crate) fn admit(&mut self, event: Event<K>) -> Option<Event<K>> {
        match event {
            Event::Init => {
                self.relisted = Some(BTreeMap::new());
                Some(Event::Init)
            }
            Event::InitApply(obj) => {
                let kept = self.check(obj)?;
                self.relisted
                    .get_or_insert_with(BTreeMap::new)
                    .insert(kept.name_any(), kept.clone());
                Some(Event::InitApply(kept))
            }
            Event::InitDone => {
                self.accepted = self.relisted.take().unwrap_or_default();
                Some(Event::InitDone)
            }
            Event::Apply(obj) => {
                let kept = self.check(obj)?;
                self.accepted.insert(kept.name_any(), kept.clone());
                Some(Event::Apply(kept))
            }
            Event::Delete(obj) => {
                self.accepted.remove(&obj.name_any());
                Some(Event::Delete(obj))
            }
        }
    }

    /// The version to keep: `obj` when valid, else the previous accepted version (if any).
    fn check(&self, obj: K) -> Option<K> {
        let old = self.accepted.get(&obj.name_any());
        let mut broken = obj.violations();
        if let Some(old) = old {
            broken.extend(obj.transition_violations(old));
        }
        if broken.is_empty() {
            return Some(obj);
        }
        for rule in &broken {
            self.reject(&obj, rule);
        }
        old.cloned()
    }

    fn reject(&self, obj: &K, rule: &Rule) {
        let ns = obj.namespace().unwrap_or_default();
        tracing::warn!(kind = ?self.kind, namespace = %ns, name = %obj.name_any(), field = rule.field, rule = rule.rule, "ignoring an object that breaks its CRD's validation rule: {}: {}", rule.field, rule.message);
        self.metrics
            .crd_validation_failures
            .get_or_create(&CrdRuleLabels {
                kind: self.kind,
                rule: rule.id,
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::k8s::crd::model::InferenceModel;
    use serde_json::json;

    fn model(name: &str, model_name: &str, weights: &[Option<i32>]) -> InferenceModel {
        let targets: Vec<_> = weights
            .iter()
            .enumerate()
            .map(|(i, w)| json!({"name": format!("t{i}"), "weight": w}))
            .collect();
        let mut v = json!({"apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceModel", "metadata": {"name": name}, "spec": {"modelName": model_name, "poolRef": {"name": "p"}, "targetModels": targets}});
        for t in v["spec"]["targetModels"].as_array_mut().unwrap() {
            if t["weight"].is_null() {
                t.as_object_mut().unwrap().remove("weight");
            }
        }
        serde_json::from_value(v).unwrap()
    }

    fn failures(m: &Metrics, rule: &'static str) -> u64 {
        m.crd_validation_failures
            .get_or_create(&CrdRuleLabels {
                kind: CrdKind::InferenceModel,
                rule,
            })
            .get()
    }

    #[test]
    fn invalid_objects_are_dropped_and_counted() {
        let metrics = Arc::new(Metrics::register(&mut Default::default()));
        let mut gate = Gate::new(CrdKind::InferenceModel, Arc::clone(&metrics));
        assert!(gate
            .admit(Event::Apply(model("a", "m", &[Some(1), None])))
            .is_none());
        assert_eq!(failures(&metrics, "target-weights-all-or-none"), 1);
        assert!(matches!(
            gate.admit(Event::Apply(model("a", "m", &[Some(1), Some(2)]))),
            Some(Event::Apply(_))
        ));
    }

    #[test]
    fn a_renamed_model_keeps_its_previous_version() {
        let metrics = Arc::new(Metrics::register(&mut Default::default()));
        let mut gate = Gate::new(CrdKind::InferenceModel, Arc::clone(&metrics));
        gate.admit(Event::Apply(model("a", "m", &[])));
        let Some(Event::Apply(kept)) = gate.admit(Event::Apply(model("a", "renamed", &[]))) else {
            panic!("the old version should stay")
        };
        assert_eq!(kept.spec.model_name, "m");
        assert_eq!(failures(&metrics, "model-name-immutable"), 1);
        gate.admit(Event::Delete(model("a", "m", &[])));
        assert!(
            matches!(gate.admit(Event::Apply(model("a", "renamed", &[]))), Some(Event::Apply(k)) if k.spec.model_name == "renamed")
        );
    }

    #[test]
    fn a_relist_forgets_objects_that_are_gone() {
        let metrics = Arc::new(Metrics::register(&mut Default::default()));
        let mut gate = Gate::new(CrdKind::InferenceModel, metrics);
        gate.admit(Event::Apply(model("a", "m", &[])));
        for e in [
            Event::Init,
            Event::InitApply(model("b", "n", &[])),
            Event::InitDone,
        ] {
            gate.admit(e);
        }
        assert!(
            matches!(gate.admit(Event::Apply(model("a", "other", &[]))), Some(Event::Apply(k)) if k.spec.model_name == "other")
        );
    }
}

//! InferenceObjective / InferenceModel / InferenceModelRewrite objects → the director's
//! [`Objectives`] snapshot. Only objects targeting our pool count: an InferenceModel or rewrite
//! whose `poolRef` names it; an InferenceObjective whose `poolRef` or any of whose `poolRefs`
//! names it, or whose `poolSelector` matches the InferencePool's labels. When two
//! InferenceModels claim a model name, or rewrite rules overlap, the oldest object wins.

use super::crd::common::PoolRef;
use super::crd::model::{Criticality, InferenceModel};
use super::crd::objective::InferenceObjective;
use super::crd::rewrite::InferenceModelRewrite;
use crate::datastore::objectives::{ModelPolicy, Objectives, RewriteRule, WeightedTargets};
use crate::plugin::Invalid;
use kube::ResourceExt;
use std::collections::BTreeMap;

/// The pool objects must target: its name and, once its InferencePool has been seen, its labels
/// (a `poolSelector` matches nothing before).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct OurPool {
    pub(crate) name: String,
    pub(crate) labels: Option<BTreeMap<String, String>>,
}

/// Our pool; `None` (standalone mode) accepts every object.
pub(crate) type PoolName<'a> = Option<&'a OurPool>;

/// Why an InferenceObjective is ignored although the API server stored it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ObjectiveError {
    /// A selector `metav1.LabelSelectorAsSelector` refuses (an unknown operator, a malformed
    /// key or value, values where none belong): upstream's controller cannot match it either.
    #[error("InferenceObjective {name}: spec.poolSelector ({}): {}", .source.parameter, .source.message)]
    Selector { name: String, source: Invalid },
}

fn ours(pool: PoolName<'_>, r: &PoolRef) -> bool {
    pool.is_none_or(|p| p.name == r.name)
}

/// Whether `o` applies to `pool`: a reference names it, or the selector matches its labels.
pub(crate) fn targets(pool: PoolName<'_>, o: &InferenceObjective) -> Result<bool, ObjectiveError> {
    let spec = &o.spec;
    let selector = spec
        .pool_selector
        .as_ref()
        .map(|s| s.compile())
        .transpose()
        .map_err(|source| ObjectiveError::Selector {
            name: o.name_any(),
            source,
        })?;
    let Some(pool) = pool else {
        return Ok(true);
    };
    let named = spec
        .pool_ref
        .iter()
        .chain(&spec.pool_refs)
        .any(|r| r.name == pool.name);
    let selected = selector.is_some_and(|s| pool.labels.as_ref().is_some_and(|l| s.matches(l)));
    Ok(named || selected)
}

/// Oldest first, then by name, so "the oldest wins" is "the first wins".
fn by_age<K: kube::Resource>(items: &mut [&K]) {
    items.sort_by(|a, b| {
        (
            a.meta().creation_timestamp.as_ref().map(|t| t.0),
            a.name_any(),
        )
            .cmp(&(
                b.meta().creation_timestamp.as_ref().map(|t| t.0),
                b.name_any(),
            ))
    });
}

/// Criticality as a priority: Sheddable is below zero (shed under saturation), Critical above.
pub(crate) fn criticality_priority(c: Option<Criticality>) -> i32 {
    match c.unwrap_or_default() {
        Criticality::Critical => 1,
        Criticality::Standard => 0,
        Criticality::Sheddable => -1,
    }
}

fn weight(w: Option<i32>) -> u32 {
    w.map_or(0, |w| u32::try_from(w).unwrap_or(0))
}

pub(crate) fn build<'a>(
    pool: PoolName<'_>,
    objectives: impl IntoIterator<Item = &'a InferenceObjective>,
    models: impl IntoIterator<Item = &'a InferenceModel>,
    rewrites: impl IntoIterator<Item = &'a InferenceModelRewrite>,
) -> Objectives {
    let mut out = Objectives::default();
    for o in objectives {
        match targets(pool, o) {
            Ok(true) => {
                out.objectives
                    .insert(o.name_any(), o.spec.priority.unwrap_or(0));
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "ignoring an InferenceObjective"),
        }
    }
    let mut models: Vec<&InferenceModel> = models
        .into_iter()
        .filter(|m| ours(pool, &m.spec.pool_ref))
        .collect();
    by_age(&mut models);
    for m in models {
        out.models
            .entry(m.spec.model_name.clone())
            .or_insert_with(|| model_policy(m));
    }
    let mut rewrites: Vec<&InferenceModelRewrite> = rewrites
        .into_iter()
        .filter(|r| ours(pool, &r.spec.pool_ref))
        .collect();
    by_age(&mut rewrites);
    out.rewrites = rewrites.into_iter().flat_map(rewrite_rules).collect();
    out
}

fn model_policy(m: &InferenceModel) -> ModelPolicy {
    // Weights unset on every target mean an even split.
    let targets = m
        .spec
        .target_models
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                weight(t.weight).max(u32::from(t.weight.is_none())),
            )
        })
        .collect();
    ModelPolicy {
        priority: criticality_priority(m.spec.criticality),
        targets: WeightedTargets::new(targets),
    }
}

/// One object's rules: a rule without matches is generic (`model: None`).
fn rewrite_rules(r: &InferenceModelRewrite) -> Vec<RewriteRule> {
    let mut out = Vec::new();
    for rule in &r.spec.rules {
        let Some(targets) = WeightedTargets::new(
            rule.targets
                .iter()
                .map(|t| (t.model_rewrite.clone(), weight(t.weight)))
                .collect(),
        ) else {
            continue;
        };
        if rule.matches.is_empty() {
            out.push(RewriteRule {
                model: None,
                targets: targets.clone(),
            });
        }
        for m in &rule.matches {
            out.push(RewriteRule {
                model: Some(m.model.value.clone()),
                targets: targets.clone(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(
        name: &str,
        created: &str,
        model_name: &str,
        crit: &str,
        pool: &str,
    ) -> InferenceModel {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceModel",
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": {"modelName": model_name, "criticality": crit, "poolRef": {"name": pool}, "targetModels": [{"name": format!("{name}-t")}]}
        }))
        .unwrap()
    }

    #[test]
    fn the_oldest_model_wins_and_other_pools_are_ignored() {
        let models = [
            model("new", "2025-02-01T00:00:00Z", "m", "Sheddable", "p"),
            model("old", "2025-01-01T00:00:00Z", "m", "Critical", "p"),
            model("x", "2025-01-01T00:00:00Z", "n", "Sheddable", "other"),
        ];
        let p = OurPool {
            name: "p".into(),
            labels: None,
        };
        let o = build(Some(&p), [], &models, []);
        assert_eq!(o.models.len(), 1);
        assert_eq!(o.priority(None, "m"), 1);
        let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(1);
        assert_eq!(o.rewrite("m", &mut rng).as_deref(), Some("old-t"));
    }

    fn objective(name: &str, spec: serde_json::Value) -> InferenceObjective {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceObjective",
            "metadata": {"name": name}, "spec": spec
        }))
        .unwrap()
    }

    fn pool(name: &str, labels: Option<&[(&str, &str)]>) -> OurPool {
        OurPool {
            name: name.into(),
            labels: labels.map(|l| {
                l.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect()
            }),
        }
    }

    fn applied(p: &OurPool, objectives: &[InferenceObjective]) -> Vec<String> {
        let mut names: Vec<String> = build(Some(p), objectives, [], [])
            .objectives
            .into_keys()
            .collect();
        names.sort();
        names
    }

    #[test]
    fn an_objective_applies_by_pool_ref_any_pool_ref_or_a_matching_selector() {
        let objectives = [
            objective(
                "single",
                serde_json::json!({"priority": 1, "poolRef": {"name": "a"}}),
            ),
            objective(
                "listed",
                serde_json::json!({"priority": 2, "poolRefs": [{"name": "x"}, {"name": "b"}, {"name": "a"}]}),
            ),
            objective(
                "gold",
                serde_json::json!({"priority": 3, "poolSelector": {"matchLabels": {"tier": "gold"}}}),
            ),
            objective(
                "not-bronze",
                serde_json::json!({"priority": 4, "poolSelector": {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["bronze"]}]}}),
            ),
            objective(
                "elsewhere",
                serde_json::json!({"priority": 5, "poolRefs": [{"name": "x"}]}),
            ),
        ];
        let gold_a = pool("a", Some(&[("tier", "gold")]));
        assert_eq!(
            applied(&gold_a, &objectives),
            ["gold", "listed", "not-bronze", "single"]
        );
        let bronze_b = pool("b", Some(&[("tier", "bronze")]));
        assert_eq!(applied(&bronze_b, &objectives), ["listed"]);
        let c = pool("c", Some(&[]));
        assert_eq!(applied(&c, &objectives), ["not-bronze"]);
        let o = build(Some(&gold_a), &objectives, [], []);
        assert_eq!(o.priority(Some("listed"), "m"), 2);
        assert_eq!(o.priority(Some("gold"), "m"), 3);
    }

    #[test]
    fn a_selector_matches_nothing_before_the_pools_labels_are_known() {
        let objectives = [
            objective(
                "gold",
                serde_json::json!({"poolSelector": {"matchLabels": {"tier": "gold"}}}),
            ),
            objective(
                "untiered",
                serde_json::json!({"poolSelector": {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}}),
            ),
            objective("named", serde_json::json!({"poolRefs": [{"name": "a"}]})),
        ];
        assert_eq!(applied(&pool("a", None), &objectives), ["named"]);
        assert_eq!(
            applied(&pool("a", Some(&[])), &objectives),
            ["named", "untiered"]
        );
    }

    #[test]
    fn a_selector_the_api_server_stored_but_labels_cannot_parse_is_ignored_naming_the_field() {
        let bad = objective(
            "bad",
            serde_json::json!({"poolRefs": [{"name": "a"}], "poolSelector": {"matchExpressions": [{"key": "tier", "operator": "Like", "values": ["g"]}]}}),
        );
        let p = pool("a", Some(&[("tier", "gold")]));
        let err = targets(Some(&p), &bad).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("InferenceObjective bad: spec.poolSelector (matchExpressions): "),
            "{text}"
        );
        assert!(
            text.contains("\"Like\" is not a valid label selector operator"),
            "{text}"
        );
        assert!(applied(&p, &[bad]).is_empty());
        let no_values = objective(
            "no-values",
            serde_json::json!({"poolSelector": {"matchExpressions": [{"key": "tier", "operator": "In"}]}}),
        );
        assert!(matches!(
            targets(Some(&p), &no_values),
            Err(ObjectiveError::Selector { .. })
        ));
    }

    #[test]
    fn standalone_mode_takes_every_objective() {
        let objectives = [
            objective("a", serde_json::json!({"poolRef": {"name": "a"}})),
            objective(
                "gold",
                serde_json::json!({"poolSelector": {"matchLabels": {"tier": "gold"}}}),
            ),
        ];
        assert_eq!(build(None, &objectives, [], []).objectives.len(), 2);
    }
}

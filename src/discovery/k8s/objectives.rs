//! InferenceObjective / InferenceModel / InferenceModelRewrite objects → the director's
//! [`Objectives`] snapshot. Only objects whose `poolRef` names our pool count; when two
//! InferenceModels claim a model name, or rewrite rules overlap, the oldest object wins.

use super::crd::common::PoolRef;
use super::crd::model::{Criticality, InferenceModel};
use super::crd::objective::InferenceObjective;
use super::crd::rewrite::InferenceModelRewrite;
use crate::datastore::objectives::{ModelPolicy, Objectives, RewriteRule, WeightedTargets};
use kube::ResourceExt;

/// The pool objects must reference; `None` (standalone mode) accepts every object.
pub(crate) type PoolName<'a> = Option<&'a str>;

fn ours(pool: PoolName<'_>, r: &PoolRef) -> bool {
    pool.is_none_or(|p| p == r.name)
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
    for o in objectives
        .into_iter()
        .filter(|o| ours(pool, &o.spec.pool_ref))
    {
        out.objectives
            .insert(o.name_any(), o.spec.priority.unwrap_or(0));
    }
    let mut models: Vec<&InferenceModel> = models
        .into_iter()
        .filter(|m| ours(pool, &m.spec.pool_ref))
        .collect();
    by_age(&mut models);
    for m in models {
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
        let policy = ModelPolicy {
            priority: criticality_priority(m.spec.criticality),
            targets: WeightedTargets::new(targets),
        };
        out.models
            .entry(m.spec.model_name.clone())
            .or_insert(policy);
    }
    let mut rewrites: Vec<&InferenceModelRewrite> = rewrites
        .into_iter()
        .filter(|r| ours(pool, &r.spec.pool_ref))
        .collect();
    by_age(&mut rewrites);
    for r in rewrites {
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
                out.rewrites.push(RewriteRule {
                    model: None,
                    targets: targets.clone(),
                });
            }
            for m in &rule.matches {
                out.rewrites.push(RewriteRule {
                    model: Some(m.model.value.clone()),
                    targets: targets.clone(),
                });
            }
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
        let o = build(Some("p"), [], &models, []);
        assert_eq!(o.models.len(), 1);
        assert_eq!(o.priority(None, "m"), 1);
        let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(1);
        assert_eq!(o.rewrite("m", &mut rng).as_deref(), Some("old-t"));
    }
}

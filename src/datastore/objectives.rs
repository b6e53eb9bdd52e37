//! What the cluster says about requests, as one immutable snapshot: InferenceObjectives
//! (priority by name), InferenceModels (criticality and weighted target models by model name)
//! and InferenceModelRewrites (weighted rewrite rules). Kubernetes discovery builds it; the
//! director reads it per request. Pure: no kube types here, randomness comes in as an `Rng`.

use rand::Rng;
use std::collections::HashMap;

/// Request priority: higher is more important; below zero the request may be shed.
pub(crate) type Priority = i32;

/// A weighted choice of model names (canary splits, rewrites).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WeightedTargets(Vec<(String, u32)>);

impl WeightedTargets {
    /// Targets with their weights; all-zero weights draw uniformly (as upstream's
    /// `applyWeightedModelRewrite`). `None` when empty.
    pub(crate) fn new(targets: Vec<(String, u32)>) -> Option<Self> {
        (!targets.is_empty()).then_some(Self(targets))
    }

    /// One draw, proportional to weight.
    pub(crate) fn draw(&self, rng: &mut impl Rng) -> &str {
        let total: u64 = self.0.iter().map(|(_, w)| u64::from(*w)).sum();
        if total == 0 {
            return &self.0[rng.random_range(0..self.0.len())].0;
        }
        let mut pick = rng.random_range(0..total);
        for (name, w) in &self.0 {
            if pick < u64::from(*w) {
                return name;
            }
            pick -= u64::from(*w);
        }
        &self.0[self.0.len() - 1].0
    }
}

/// An InferenceModel, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ModelPolicy {
    pub(crate) priority: Priority,
    /// `None` keeps the requested model.
    pub(crate) targets: Option<WeightedTargets>,
}

/// A rewrite rule; `model: None` matches every model (a generic rule).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RewriteRule {
    pub(crate) model: Option<String>,
    pub(crate) targets: WeightedTargets,
}

/// Everything the director needs from the objective CRDs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Objectives {
    /// InferenceObjective name → priority.
    pub(crate) objectives: HashMap<String, Priority>,
    /// InferenceModel `modelName` → policy (the oldest object wins a name).
    pub(crate) models: HashMap<String, ModelPolicy>,
    /// Rewrite rules, oldest resource first, then list order.
    pub(crate) rewrites: Vec<RewriteRule>,
}

impl Objectives {
    /// The request's priority: the named objective's, else its InferenceModel's, else 0.
    pub(crate) fn priority(&self, objective: Option<&str>, model: &str) -> Priority {
        if let Some(p) = objective.and_then(|o| self.objectives.get(o)) {
            return *p;
        }
        self.models.get(model).map_or(0, |m| m.priority)
    }

    /// The model a request for `model` goes to. As upstream's `mutateModel`: the
    /// `x-gateway-model-name-rewrite` header (`header`, ignored when empty) replaces the body's
    /// model, and a rewrite matching the body's model (not the header's) replaces that in turn.
    #[cfg(test)]
    pub(crate) fn target(&self, model: &str, header: Option<&str>, rng: &mut impl Rng) -> String {
        self.rewrite_or_header(model, header, rng)
            .unwrap_or_else(|| model.to_owned())
    }

    /// [`Self::target`] when something names another model: a rewrite, else the non-empty
    /// rewrite header; `None` (no copy of the name) when the request keeps its model.
    pub(crate) fn rewrite_or_header(
        &self,
        model: &str,
        header: Option<&str>,
        rng: &mut impl Rng,
    ) -> Option<String> {
        let header = header.filter(|h| !h.is_empty());
        self.rewrite(model, rng)
            .or_else(|| header.map(str::to_owned))
    }

    /// The model to send `model` to, if something rewrites it: an exact rewrite rule, else a
    /// generic one, else the InferenceModel's weighted targets.
    pub(crate) fn rewrite(&self, model: &str, rng: &mut impl Rng) -> Option<String> {
        let rule = self
            .rewrites
            .iter()
            .find(|r| r.model.as_deref() == Some(model))
            .or_else(|| self.rewrites.iter().find(|r| r.model.is_none()));
        if let Some(r) = rule {
            return Some(r.targets.draw(rng).to_owned());
        }
        self.models
            .get(model)?
            .targets
            .as_ref()
            .map(|t| t.draw(rng).to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::SmallRng, SeedableRng};

    fn targets(list: &[(&str, u32)]) -> WeightedTargets {
        WeightedTargets::new(list.iter().map(|(n, w)| ((*n).to_owned(), *w)).collect()).unwrap()
    }

    #[test]
    fn weighted_draws_follow_the_weights() {
        let t = targets(&[("a", 90), ("b", 10)]);
        let mut rng = SmallRng::seed_from_u64(1);
        let a = (0..10_000).filter(|_| t.draw(&mut rng) == "a").count();
        assert!((8_800..9_200).contains(&a), "{a}");
        let uniform = targets(&[("a", 0), ("b", 0)]);
        let a = (0..1_000).filter(|_| uniform.draw(&mut rng) == "a").count();
        assert!((400..600).contains(&a), "{a}");
    }

    #[test]
    fn objective_header_beats_model_criticality_and_exact_rewrites_beat_generic() {
        let mut o = Objectives::default();
        o.objectives.insert("batch".into(), -5);
        o.models.insert(
            "m".into(),
            ModelPolicy {
                priority: 1,
                targets: Some(targets(&[("m-v2", 1)])),
            },
        );
        o.rewrites.push(RewriteRule {
            model: None,
            targets: targets(&[("generic", 1)]),
        });
        o.rewrites.push(RewriteRule {
            model: Some("x".into()),
            targets: targets(&[("x-v2", 1)]),
        });
        assert_eq!(o.priority(Some("batch"), "m"), -5);
        assert_eq!(o.priority(Some("unknown"), "m"), 1);
        assert_eq!(o.priority(None, "other"), 0);
        let mut rng = SmallRng::seed_from_u64(2);
        assert_eq!(o.rewrite("x", &mut rng).as_deref(), Some("x-v2"));
        assert_eq!(o.rewrite("m", &mut rng).as_deref(), Some("generic"));
        o.rewrites.clear();
        assert_eq!(o.rewrite("m", &mut rng).as_deref(), Some("m-v2"));
        assert_eq!(o.rewrite("other", &mut rng), None);
    }

    #[test]
    fn a_rewrite_rule_beats_the_rewrite_header_which_beats_the_body() {
        let mut o = Objectives::default();
        o.rewrites.push(RewriteRule {
            model: Some("m".into()),
            targets: targets(&[("m-v2", 1)]),
        });
        let mut rng = SmallRng::seed_from_u64(3);
        assert_eq!(o.target("m", Some("from-header"), &mut rng), "m-v2");
        assert_eq!(
            o.target("other", Some("from-header"), &mut rng),
            "from-header"
        );
        assert_eq!(o.target("other", Some(""), &mut rng), "other");
        assert_eq!(o.target("other", None, &mut rng), "other");
        // The rule matches the body's model, not the header's.
        assert_eq!(o.target("x", Some("m"), &mut rng), "m");
    }
}

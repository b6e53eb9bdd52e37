//! Model-name label values, capped: the first [`MODEL_LABEL_CAP`] distinct names get a series of
//! their own and every later one is reported as [`OTHER`] (llm-d-router v0.10, #1909), so a
//! client sending a fresh `model` per request cannot grow `/metrics` without bound.
//!
//! A [`ModelLabel`] can only be made by [`ModelNames::label`], so every family labelled by model
//! is capped by construction. One set serves `model_name` and `target_model_name` of every family:
//! a name seen once keeps its series for the life of the process. Reads take a shared lock; only
//! a name not seen yet takes the exclusive one.

use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};
use std::collections::HashSet;
use std::fmt::Write;
use std::sync::{Arc, RwLock};

/// Distinct model names that get their own label value.
pub(crate) const MODEL_LABEL_CAP: usize = 1000;

/// The label value of every model name beyond the cap.
pub const OTHER: &str = "other";

/// A model-name label value: the name, or [`OTHER`] beyond the cap.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct ModelLabel(Arc<str>);

impl ModelLabel {
    #[cfg(test)]
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl EncodeLabelValue for ModelLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(&self.0)
    }
}

/// The model names given a label value so far.
pub struct ModelNames {
    seen: RwLock<HashSet<Arc<str>>>,
    cap: usize,
    other: ModelLabel,
}

impl Default for ModelNames {
    fn default() -> Self {
        Self::with_cap(MODEL_LABEL_CAP)
    }
}

impl ModelNames {
    pub(crate) fn with_cap(cap: usize) -> Self {
        Self {
            seen: RwLock::new(HashSet::new()),
            cap,
            other: ModelLabel(Arc::from(OTHER)),
        }
    }

    /// The label value for `name`: itself while fewer than the cap have been seen (or when it
    /// was seen before), else [`OTHER`].
    pub(crate) fn label(&self, name: &str) -> ModelLabel {
        if let Some(known) = self.read().get(name) {
            return ModelLabel(Arc::clone(known));
        }
        let mut seen = self.seen.write().unwrap_or_else(|e| e.into_inner());
        if let Some(known) = seen.get(name) {
            return ModelLabel(Arc::clone(known));
        }
        if seen.len() >= self.cap {
            return self.other.clone();
        }
        let name: Arc<str> = Arc::from(name);
        seen.insert(Arc::clone(&name));
        ModelLabel(name)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashSet<Arc<str>>> {
        self.seen.read().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_beyond_the_cap_are_reported_as_other_and_known_names_keep_theirs() {
        let names = ModelNames::default();
        for i in 0..MODEL_LABEL_CAP {
            assert_eq!(names.label(&format!("m{i}")).as_str(), format!("m{i}"));
        }
        assert_eq!(names.label("one-too-many").as_str(), OTHER);
        assert_eq!(
            names.label("m0").as_str(),
            "m0",
            "a known name keeps its value"
        );
        assert_eq!(
            names.label(&format!("m{}", MODEL_LABEL_CAP - 1)).as_str(),
            "m999"
        );
        assert_eq!(names.label("another").as_str(), OTHER);
    }

    #[test]
    fn the_same_name_counts_once() {
        let names = ModelNames::with_cap(2);
        for _ in 0..10 {
            names.label("a");
        }
        assert_eq!(names.label("b").as_str(), "b");
        assert_eq!(names.label("c").as_str(), OTHER);
    }
}

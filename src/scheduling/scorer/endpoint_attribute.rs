//! `endpoint-attribute-scorer` (llm-d, alpha): scores each endpoint by a numeric attribute (a
//! `core-metrics-extractor` `customMetrics` value, [`crate::config::CustomMetrics`]),
//! normalized linearly, as llm-d-router v0.10's `scorer/endpointattribute`:
//!
//! - `fixedRange {min, max}`: `(v − min) / (max − min)` clamped to [0, 1];
//! - `adaptiveRange` (the default): `(v − lo) / (hi − lo)` over the candidates that have the
//!   attribute; all of them equal ⇒ 1.
//!
//! `linear_lower_is_better` takes `1 −` that. An endpoint without the attribute scores 0.

use crate::plugin::Invalid;
use crate::scheduling::Candidate;

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct EndpointAttributeScorer {
    pub(crate) attribute_key: String,
    pub(crate) algorithm: Algorithm,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct Algorithm {
    /// `linear_lower_is_better` or `linear_higher_is_better`.
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) normalization: Normalization,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub(crate) struct Normalization {
    pub(crate) fixed_range: Option<FixedRange>,
    pub(crate) adaptive_range: Option<AdaptiveRange>,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct FixedRange {
    pub(crate) min: f64,
    pub(crate) max: f64,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AdaptiveRange {}

const LOWER: &str = "linear_lower_is_better";
const HIGHER: &str = "linear_higher_is_better";

impl EndpointAttributeScorer {
    /// Upstream's checks and messages.
    pub(crate) fn validate(self) -> Result<Self, Invalid> {
        if self.attribute_key.is_empty() {
            let m = "endpoint attribute scorer requires a non-empty attributeKey";
            return Err(Invalid::new("attributeKey", m));
        }
        if ![LOWER, HIGHER].contains(&self.algorithm.kind.as_str()) {
            let m = format!("endpoint attribute scorer algorithm.type must be {LOWER:?} or {HIGHER:?}, got {:?}", self.algorithm.kind);
            return Err(Invalid::new("algorithm", m));
        }
        let n = &self.algorithm.normalization;
        if n.fixed_range.is_some() && n.adaptive_range.is_some() {
            let m = "endpoint attribute scorer allows at most one normalization strategy, got both fixedRange and adaptiveRange";
            return Err(Invalid::new("algorithm", m));
        }
        if let Some(f) = n.fixed_range.as_ref().filter(|f| f.min >= f.max) {
            let m = format!("endpoint attribute scorer normalization.fixedRange requires min < max, got min {}, max {}", f.min, f.max);
            return Err(Invalid::new("algorithm", m));
        }
        Ok(self)
    }

    pub(crate) fn score(&self, pool: &[&Candidate], out: &mut [f64]) {
        let values: Vec<Option<f64>> = pool
            .iter()
            .map(|c| {
                c.metrics
                    .as_ref()
                    .and_then(|m| m.attribute(&self.attribute_key))
            })
            .collect();
        let (lo, hi) = match &self.algorithm.normalization.fixed_range {
            Some(f) => (f.min, f.max),
            None => values
                .iter()
                .flatten()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                    (lo.min(*v), hi.max(*v))
                }),
        };
        let lower = self.algorithm.kind == LOWER;
        for (o, v) in out.iter_mut().zip(values) {
            *o = match v {
                None => 0.0,
                Some(_) if hi == lo => 1.0,
                Some(v) => {
                    let n = ((v - lo) / (hi - lo)).clamp(0.0, 1.0);
                    if lower {
                        1.0 - n
                    } else {
                        n
                    }
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::plugin::params_yaml;
    use crate::scheduling::testing::cand;

    fn scorer(yaml: &str) -> Result<EndpointAttributeScorer, String> {
        params_yaml::<EndpointAttributeScorer>(yaml)?
            .validate()
            .map_err(|e| e.message)
    }

    fn scores(s: &EndpointAttributeScorer, values: &[Option<f64>]) -> Vec<f64> {
        let cands: Vec<Candidate> = values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let m = v
                    .iter()
                    .fold(crate::fixtures::metrics(), |m, v| m.attribute("free", *v));
                Candidate {
                    metrics: Some(m.arc()),
                    ..cand(i as u16 + 1, 0.0, 0.0, 0)
                }
            })
            .collect();
        let pool: Vec<&Candidate> = cands.iter().collect();
        let mut out = vec![-1.0; pool.len()];
        s.score(&pool, &mut out);
        out
    }

    #[test]
    fn adaptive_range_normalizes_over_the_candidates_with_the_attribute() {
        let higher =
            scorer("{attributeKey: free, algorithm: {type: linear_higher_is_better}}").unwrap();
        assert_eq!(
            scores(&higher, &[Some(2.0), Some(4.0), None, Some(3.0)]),
            [0.0, 1.0, 0.0, 0.5]
        );
        assert_eq!(
            scores(&higher, &[Some(7.0), None, Some(7.0)]),
            [1.0, 0.0, 1.0],
            "all equal"
        );
        let lower = scorer("{attributeKey: free, algorithm: {type: linear_lower_is_better, normalization: {adaptiveRange: {}}}}").unwrap();
        assert_eq!(
            scores(&lower, &[Some(2.0), Some(4.0), Some(3.0)]),
            [1.0, 0.0, 0.5]
        );
    }

    #[test]
    fn fixed_range_clamps() {
        let yaml = "{attributeKey: free, algorithm: {type: linear_lower_is_better, normalization: {fixedRange: {min: 0, max: 10}}}}";
        let s = scorer(yaml).unwrap();
        assert_eq!(
            scores(&s, &[Some(-5.0), Some(2.5), Some(20.0), None]),
            [1.0, 0.75, 0.0, 0.0]
        );
    }

    #[test]
    fn bad_parameters_are_refused_with_upstreams_messages() {
        let cases = [
            ("{algorithm: {type: linear_lower_is_better}}", "requires a non-empty attributeKey"),
            ("{attributeKey: a, algorithm: {type: log}}", "algorithm.type must be \"linear_lower_is_better\" or \"linear_higher_is_better\", got \"log\""),
            ("{attributeKey: a, algorithm: {type: linear_lower_is_better, normalization: {fixedRange: {min: 0, max: 1}, adaptiveRange: {}}}}", "at most one normalization strategy"),
            ("{attributeKey: a, algorithm: {type: linear_lower_is_better, normalization: {fixedRange: {min: 1, max: 1}}}}", "requires min < max, got min 1, max 1"),
        ];
        for (yaml, want) in cases {
            let err = scorer(yaml).unwrap_err();
            assert!(err.contains(want), "{yaml}: {err}");
        }
    }
}

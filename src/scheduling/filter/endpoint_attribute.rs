//! `endpoint-attribute-filter` (llm-d, alpha): keep the endpoints whose numeric attribute
//! (a `core-metrics-extractor` `customMetrics` value, [`crate::config::CustomMetrics`])
//! compares true against a threshold. As llm-d-router v0.10's
//! `filter/endpointattribute`: an endpoint without the attribute is kept (`onMissing: Pass`,
//! the default) or dropped (`Fail`); with `fallbackOnEmpty`, a filter that would keep no one
//! keeps everyone. `threshold` is the only `algorithm.type`.

use crate::plugin::Invalid;
use crate::scheduling::Candidate;

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct EndpointAttributeFilter {
    pub(crate) attribute: String,
    /// `Pass` (default) or `Fail`.
    pub(crate) on_missing: String,
    pub(crate) fallback_on_empty: bool,
    pub(crate) algorithm: Algorithm,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct Algorithm {
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) threshold: Option<Threshold>,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct Threshold {
    pub(crate) operator: String,
    pub(crate) value: f64,
}

const OPERATORS: [&str; 6] = [
    "LessThan",
    "LessThanOrEqual",
    "GreaterThan",
    "GreaterThanOrEqual",
    "Equal",
    "NotEqual",
];

impl EndpointAttributeFilter {
    /// Upstream's checks and messages.
    pub(crate) fn validate(mut self) -> Result<Self, Invalid> {
        if self.attribute.is_empty() {
            let m = "endpoint attribute filter requires a non-empty attribute";
            return Err(Invalid::new("attribute", m));
        }
        match self.on_missing.as_str() {
            "" => self.on_missing = "Pass".into(),
            "Pass" | "Fail" => {}
            other => {
                let m = format!("endpoint attribute filter onMissing must be \"Pass\" or \"Fail\", got {other:?}");
                return Err(Invalid::new("onMissing", m));
            }
        }
        if self.algorithm.kind != "threshold" {
            let m = format!(
                "endpoint attribute filter algorithm.type must be \"threshold\", got {:?}",
                self.algorithm.kind
            );
            return Err(Invalid::new("algorithm", m));
        }
        let Some(t) = &self.algorithm.threshold else {
            let m = "endpoint attribute filter requires algorithm.threshold when algorithm.type is \"threshold\"";
            return Err(Invalid::new("algorithm", m));
        };
        if !OPERATORS.contains(&t.operator.as_str()) {
            let m = format!("endpoint attribute filter threshold.operator must be one of {OPERATORS:?}, got {:?}", t.operator);
            return Err(Invalid::new("algorithm", m));
        }
        Ok(self)
    }

    fn keeps(&self, c: &Candidate) -> bool {
        let value = c
            .metrics
            .as_ref()
            .and_then(|m| m.attribute(&self.attribute));
        let Some(v) = value else {
            return self.on_missing == "Pass";
        };
        let Some(t) = &self.algorithm.threshold else {
            return false;
        };
        match t.operator.as_str() {
            "LessThan" => v < t.value,
            "LessThanOrEqual" => v <= t.value,
            "GreaterThan" => v > t.value,
            "GreaterThanOrEqual" => v >= t.value,
            "Equal" => v == t.value,
            _ => v != t.value,
        }
    }

    pub(crate) fn filter<'c>(&self, pool: Vec<&'c Candidate>) -> Vec<&'c Candidate> {
        let kept: Vec<&Candidate> = pool.iter().copied().filter(|c| self.keeps(c)).collect();
        if kept.is_empty() && self.fallback_on_empty {
            return pool;
        }
        kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::plugin::params_yaml;
    use crate::scheduling::testing::cand;

    fn filter(yaml: &str) -> Result<EndpointAttributeFilter, String> {
        params_yaml::<EndpointAttributeFilter>(yaml)?
            .validate()
            .map_err(|e| e.message)
    }

    /// Candidates on ports 1.. with `slots` at these values (`None`: not scraped).
    fn pool(values: &[Option<f64>]) -> Vec<Candidate> {
        let with = |(i, v): (usize, &Option<f64>)| {
            let m = v
                .iter()
                .fold(crate::fixtures::metrics(), |m, v| m.attribute("slots", *v));
            Candidate {
                metrics: Some(m.arc()),
                ..cand(i as u16 + 1, 0.0, 0.0, 0)
            }
        };
        values.iter().enumerate().map(with).collect()
    }

    fn kept(f: &EndpointAttributeFilter, pool: &[Candidate]) -> Vec<u16> {
        f.filter(pool.iter().collect())
            .iter()
            .map(|c| c.id.0.port())
            .collect()
    }

    #[test]
    fn each_operator_compares_the_attribute_with_the_threshold() {
        let p = pool(&[Some(1.0), Some(2.0), Some(3.0)]);
        let cases = [
            ("LessThan", vec![1]),
            ("LessThanOrEqual", vec![1, 2]),
            ("GreaterThan", vec![3]),
            ("GreaterThanOrEqual", vec![2, 3]),
            ("Equal", vec![2]),
            ("NotEqual", vec![1, 3]),
        ];
        for (op, want) in cases {
            let yaml = format!("{{attribute: slots, algorithm: {{type: threshold, threshold: {{operator: {op}, value: 2}}}}}}");
            assert_eq!(kept(&filter(&yaml).unwrap(), &p), want, "{op}");
        }
    }

    #[test]
    fn missing_attributes_pass_or_fail_and_an_empty_result_may_fall_back() {
        let p = pool(&[None, Some(5.0)]);
        let base = "attribute: slots, algorithm: {type: threshold, threshold: {operator: LessThan, value: 2}}";
        assert_eq!(kept(&filter(&format!("{{{base}}}")).unwrap(), &p), [1]);
        let fail = filter(&format!("{{{base}, onMissing: Fail}}")).unwrap();
        assert_eq!(kept(&fail, &p), Vec::<u16>::new());
        let back = filter(&format!(
            "{{{base}, onMissing: Fail, fallbackOnEmpty: true}}"
        ))
        .unwrap();
        assert_eq!(kept(&back, &p), [1, 2]);
    }

    #[test]
    fn bad_parameters_are_refused_with_upstreams_messages() {
        let t = "algorithm: {type: threshold, threshold: {operator: Equal, value: 1}}";
        let cases = [
            (format!("{{{t}}}"), "requires a non-empty attribute"),
            (
                format!("{{attribute: a, onMissing: Skip, {t}}}"),
                "onMissing must be \"Pass\" or \"Fail\", got \"Skip\"",
            ),
            (
                "{attribute: a, algorithm: {type: topK}}".to_owned(),
                "algorithm.type must be \"threshold\", got \"topK\"",
            ),
            (
                "{attribute: a, algorithm: {type: threshold}}".to_owned(),
                "requires algorithm.threshold",
            ),
            (
                "{attribute: a, algorithm: {type: threshold, threshold: {operator: Less}}}"
                    .to_owned(),
                "threshold.operator must be one of",
            ),
        ];
        for (yaml, want) in cases {
            let err = filter(&yaml).unwrap_err();
            assert!(err.contains(want), "{yaml}: {err}");
        }
    }
}

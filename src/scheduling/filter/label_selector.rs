//! `label-selector-filter` (llm-d; `by-label-selector` is its deprecated alias): keep the
//! endpoints whose labels match a Kubernetes `LabelSelector`.
//!
//! `matchLabels` requires each key to be present with that value; `matchExpressions` take
//! `In` (present, value listed), `NotIn` (absent, or value not listed), `Exists` and
//! `DoesNotExist`. An empty selector (or none) keeps everyone. Keys, values and operators are
//! checked at load as `metav1.LabelSelectorAsSelector` checks them.

use crate::plugin::Invalid;
use crate::scheduling::Candidate;
use std::collections::BTreeMap;

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct LabelSelectorFilter {
    pub(crate) match_labels: BTreeMap<String, String>,
    pub(crate) match_expressions: Vec<Requirement>,
}

#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Requirement {
    pub(crate) key: String,
    pub(crate) operator: String,
    #[serde(default)]
    pub(crate) values: Vec<String>,
}

impl LabelSelectorFilter {
    /// The checks of `metav1.LabelSelectorAsSelector`.
    pub(crate) fn validate(self) -> Result<Self, Invalid> {
        for (k, v) in &self.match_labels {
            check_key(k)?;
            check_value(v)?;
        }
        for r in &self.match_expressions {
            check_key(&r.key)?;
            match r.operator.as_str() {
                "In" | "NotIn" if r.values.is_empty() => {
                    return Err(Invalid::new("matchExpressions", format!("values: Invalid value: {:?}: for 'in', 'notin' operators, values set can't be empty", r.values)));
                }
                "Exists" | "DoesNotExist" if !r.values.is_empty() => {
                    return Err(Invalid::new("matchExpressions", format!("values: Invalid value: {:?}: values set must be empty for exists and does not exist", r.values)));
                }
                "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
                other => {
                    return Err(Invalid::new(
                        "matchExpressions",
                        format!("{other:?} is not a valid label selector operator"),
                    ))
                }
            }
            r.values.iter().try_for_each(|v| check_value(v))?;
        }
        Ok(self)
    }

    pub(crate) fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| r.matches(labels))
    }

    pub(crate) fn filter<'c>(&self, mut pool: Vec<&'c Candidate>) -> Vec<&'c Candidate> {
        pool.retain(|c| self.matches(&c.labels));
        pool
    }
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        let listed = || value.is_some_and(|v| self.values.contains(v));
        match self.operator.as_str() {
            "In" => listed(),
            "NotIn" => !listed(),
            "Exists" => value.is_some(),
            _ => value.is_none(),
        }
    }
}

/// A qualified name: `[prefix/]name`, the prefix a DNS subdomain, the name ≤ 63 characters of
/// alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
pub(crate) fn check_key(key: &str) -> Result<(), Invalid> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = !name.is_empty() && name.len() <= 63 && label_chars(name);
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            })
    });
    if name_ok && prefix_ok {
        Ok(())
    } else {
        Err(Invalid::new("key", format!("key: Invalid value: {key:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (with an optional DNS subdomain prefix and '/')")))
    }
}

/// A label value: empty, or ≤ 63 characters like a name.
pub(crate) fn check_value(v: &str) -> Result<(), Invalid> {
    if v.is_empty() || (v.len() <= 63 && label_chars(v)) {
        Ok(())
    } else {
        Err(Invalid::new("values", format!("values[0]: Invalid value: {v:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character")))
    }
}

fn label_chars(s: &str) -> bool {
    let b = s.as_bytes();
    b.iter()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::plugin::params;
    use crate::scheduling::testing::labelled;

    fn selector(yaml: &str) -> Result<LabelSelectorFilter, String> {
        let v: serde_norway::Value = serde_norway::from_str(yaml).unwrap();
        params::<LabelSelectorFilter>(&v)
            .map_err(|e| e.to_string())?
            .validate()
            .map_err(|e| e.to_string())
    }

    #[test]
    fn selectors_match_like_kubernetes() {
        let cands = [
            labelled(1, &[("app", "vllm"), ("tier", "gold")]),
            labelled(2, &[("app", "vllm"), ("tier", "tin")]),
            labelled(3, &[("app", "sglang")]),
            labelled(4, &[]),
        ];
        let table = [
            ("~", vec![1, 2, 3, 4]),
            ("{}", vec![1, 2, 3, 4]),
            ("matchLabels: {app: vllm}", vec![1, 2]),
            ("matchExpressions: [{key: tier, operator: In, values: [gold, silver]}]", vec![1]),
            ("matchExpressions: [{key: tier, operator: NotIn, values: [gold]}]", vec![2, 3, 4]),
            ("matchExpressions: [{key: tier, operator: Exists}]", vec![1, 2]),
            ("matchExpressions: [{key: tier, operator: DoesNotExist}]", vec![3, 4]),
            (
                "{matchLabels: {app: vllm}, matchExpressions: [{key: tier, operator: NotIn, values: [tin]}]}",
                vec![1],
            ),
        ];
        for (yaml, want) in table {
            let f = selector(yaml).unwrap();
            let kept: Vec<u16> = f
                .filter(cands.iter().collect())
                .iter()
                .map(|c| c.id.0.port())
                .collect();
            assert_eq!(kept, want, "{yaml}");
        }
    }

    #[test]
    fn invalid_selectors_are_refused_at_load() {
        let bad = [
            (
                "matchExpressions: [{key: a, operator: In}]",
                "values set can't be empty",
            ),
            (
                "matchExpressions: [{key: a, operator: Exists, values: [x]}]",
                "values set must be empty",
            ),
            (
                "matchExpressions: [{key: a, operator: in, values: [x]}]",
                "\"in\" is not a valid label selector operator",
            ),
            ("matchLabels: {\"-a\": x}", "key: Invalid value: \"-a\""),
            ("matchLabels: {a: \"x y\"}", "Invalid value: \"x y\""),
            ("matchLabel: {a: b}", "unknown field `matchLabel`"),
        ];
        for (yaml, want) in bad {
            let err = selector(yaml).unwrap_err();
            assert!(err.contains(want), "{yaml}: {err}");
        }
        assert!(selector("matchLabels: {llm-d.ai/role: decode, x.io/y_z: a.b-c}").is_ok());
    }
}

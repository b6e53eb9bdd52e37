//! `by-label` (llm-d, deprecated: use `label-selector-filter` or the role filters) and the role
//! filters `decode-filter`, `prefill-filter`, `encode-filter`, which are fixed `by-label`
//! instances on the `llm-d.ai/role` label.
//!
//! An endpoint stays when its value of `label` is one of `validValues`, or when it has no such
//! label and `allowsNoLabel` is set. The role filters take no parameters (upstream ignores
//! whatever is given, and so does epp).

use crate::plugin::Invalid;
use crate::scheduling::Candidate;

/// The label naming an endpoint's disaggregation role.
pub const ROLE_LABEL: &str = "llm-d.ai/role";

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ByLabelFilter {
    pub(crate) label: String,
    pub(crate) valid_values: Vec<String>,
    pub(crate) allows_no_label: bool,
}

/// Which role filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    Decode,
    Prefill,
    Encode,
}

impl ByLabelFilter {
    /// Upstream's checks and messages.
    pub(crate) fn validate(self) -> Result<Self, Invalid> {
        tracing::info!("Deprecated: plugin type 'by-label' is deprecated, use 'label-selector-filter' for generic label filtering or 'decode-filter'/'prefill-filter'/'encode-filter' for role-based filtering");
        if self.label.is_empty() {
            return Err(Invalid::new(
                "label",
                "invalid configuration for 'by-label' filter: 'label' must be specified",
            ));
        }
        if self.valid_values.is_empty() && !self.allows_no_label {
            return Err(Invalid::new("validValues", "invalid configuration for 'by-label' filter: either 'validValues' must be non-empty or 'allowsNoLabel' must be true"));
        }
        Ok(self)
    }

    /// The role filter `role` (upstream's `roles.go`).
    pub(crate) fn role(role: Role) -> Self {
        let (allows_no_label, values): (bool, &[&str]) = match role {
            Role::Decode => (
                true,
                &["decode", "prefill-decode", "both", "encode-prefill-decode"],
            ),
            Role::Prefill => (
                false,
                &[
                    "prefill",
                    "encode-prefill",
                    "prefill-decode",
                    "both",
                    "encode-prefill-decode",
                ],
            ),
            Role::Encode => (
                false,
                &["encode", "encode-prefill", "encode-prefill-decode"],
            ),
        };
        Self {
            label: ROLE_LABEL.into(),
            valid_values: values.iter().map(|v| (*v).to_owned()).collect(),
            allows_no_label,
        }
    }

    pub(crate) fn keeps(&self, c: &Candidate) -> bool {
        self.keeps_labels(&c.labels)
    }

    /// Whether an endpoint with `labels` stays.
    pub(crate) fn keeps_labels(&self, labels: &std::collections::BTreeMap<String, String>) -> bool {
        match labels.get(&self.label) {
            None => self.allows_no_label,
            Some(v) => {
                let kept = self.valid_values.iter().any(|ok| ok == v);
                if !kept && self.label == ROLE_LABEL {
                    warn_unknown_role(v);
                }
                kept
            }
        }
    }

    pub(crate) fn filter<'c>(&self, mut pool: Vec<&'c Candidate>) -> Vec<&'c Candidate> {
        pool.retain(|c| self.keeps(c));
        pool
    }
}

/// Every `llm-d.ai/role` value upstream knows (`both` is deprecated: `prefill-decode`).
pub(crate) const ROLE_VALUES: [&str; 8] = [
    "prefill",
    "decode",
    "prefill-decode",
    "encode",
    "encode-prefill",
    "encode-decode",
    "encode-prefill-decode",
    "both",
];

/// A role value upstream does not know excludes the endpoint from every role filter; the value
/// is logged once per process (a typo in a pod template would otherwise be silent).
fn warn_unknown_role(value: &str) {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    static SEEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    if ROLE_VALUES.contains(&value) {
        return;
    }
    let seen = SEEN.get_or_init(Mutex::default);
    let first = seen
        .lock()
        .map(|mut s| s.len() < 64 && s.insert(value.to_owned()))
        .unwrap_or(false);
    if first {
        tracing::warn!(
            label = ROLE_LABEL,
            value,
            known = ?ROLE_VALUES,
            "endpoints with an unknown role value are excluded from the prefill, decode and encode filters"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::plugin::params;
    use crate::scheduling::testing::labelled;

    fn roles() -> Vec<Candidate> {
        let values = [
            "decode",
            "prefill",
            "encode",
            "both",
            "prefill-decode",
            "encode-prefill",
            "encode-prefill-decode",
            "other",
        ];
        let mut cands: Vec<Candidate> = values
            .iter()
            .enumerate()
            .map(|(i, v)| labelled(i as u16 + 1, &[(ROLE_LABEL, v)]))
            .collect();
        cands.push(labelled(9, &[]));
        cands
    }

    fn kept(f: &ByLabelFilter, cands: &[Candidate]) -> Vec<u16> {
        f.filter(cands.iter().collect())
            .iter()
            .map(|c| c.id.0.port())
            .collect()
    }

    /// The filter the configuration decoder makes of a role filter's `type:`.
    fn role_filter(plugin_type: &str) -> ByLabelFilter {
        use crate::config::plugin::{NamedPlugin, Plugin};
        use crate::scheduling::{filter::Filter, Plugin as S};
        let spec = crate::config::PluginSpec {
            name: None,
            plugin_type: plugin_type.to_owned(),
            parameters: None,
        };
        match NamedPlugin::decode(&spec, Default::default())
            .unwrap()
            .plugin
        {
            Plugin::Scheduling(S::Filter(Filter::ByLabel(f))) => f,
            other => panic!("{plugin_type}: {other:?}"),
        }
    }

    #[test]
    fn role_filters_keep_upstreams_role_sets() {
        let cands = roles();
        let table = [
            ("decode-filter", vec![1, 4, 5, 7, 9]),
            ("prefill-filter", vec![2, 4, 5, 6, 7]),
            ("encode-filter", vec![3, 6, 7]),
        ];
        for (name, want) in table {
            let f = role_filter(name);
            assert_eq!(kept(&f, &cands), want, "{name}");
        }
    }

    #[test]
    fn by_label_checks_parameters_and_filters_on_one_label() {
        let v: serde_norway::Value =
            serde_norway::from_str("{label: tier, validValues: [gold]}").unwrap();
        let f = params::<ByLabelFilter>(&v).unwrap().validate().unwrap();
        let cands = [
            labelled(1, &[("tier", "gold")]),
            labelled(2, &[("tier", "tin")]),
            labelled(3, &[]),
        ];
        assert_eq!(kept(&f, &cands), vec![1]);
        let open = ByLabelFilter {
            allows_no_label: true,
            ..f
        };
        assert_eq!(kept(&open, &cands), vec![1, 3]);
        let bad = [
            ("{validValues: [a]}", "'label' must be specified"),
            (
                "{label: tier}",
                "either 'validValues' must be non-empty or 'allowsNoLabel' must be true",
            ),
        ];
        for (yaml, want) in bad {
            let v: serde_norway::Value = serde_norway::from_str(yaml).unwrap();
            let err = params::<ByLabelFilter>(&v)
                .unwrap()
                .validate()
                .unwrap_err()
                .to_string();
            assert!(err.ends_with(want), "{yaml}: {err}");
        }
        let v: serde_norway::Value = serde_norway::from_str("{label: a, values: [b]}").unwrap();
        assert!(params::<ByLabelFilter>(&v).is_err());
    }
}

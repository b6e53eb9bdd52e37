//! `disaggregatedset-rollout-screener` (llm-d, alpha): during a `DisaggregatedSet` rollout,
//! keeps every request on one revision, so a prefill pod and a decode pod of different
//! revisions never serve the same request. As llm-d-router v0.10's
//! `requestcontrol/screener/disaggregatedsetrollout`:
//!
//! - The pods counted are the pool's ready pods matching `scope.labelSelector` that carry
//!   both the revision label (`revisionGating.revisionLabelKey`, default
//!   `disaggregatedset.x-k8s.io/revision`) and the role label (`roleLabelKey`, default
//!   `disaggregatedset.x-k8s.io/role`). A revision is covered when each of
//!   `requireRoles.values` has a pod; each covered revision weighs its pods of every required
//!   role (`mode: sum`), or its pods of the role with the most pods over all covered revisions
//!   (`max-role`; ties go to the first listed role).
//! - Each request keeps only the candidates of covered revisions, then, unless a strict header
//!   selector's header is set, of one revision drawn by weight (revisions in byte order, as
//!   upstream sorts them). A candidate without a revision label is dropped. `mode: disabled`
//!   does neither.
//! - Each `strict` header selector whose request header is set keeps only the candidates whose
//!   `labelKey` label equals it. When nothing is left the request fails with 503.
//! - The response carries, for every selector (`strict` or `prefer`), its `headerName` set to
//!   the serving endpoint's `labelKey` label, when it has one.
//!
//! Upstream watches Pods itself (any pod matching the scope); epp counts the pool's ready pods,
//! which are the same pods when the scope selects pods of this pool, as a single EPP serving
//! both roles has it.

mod selector;

use crate::plugin::Invalid;
use crate::scheduling::lifecycle::{Headers, Lifecycle, Owned, Placed, Screening};
use crate::scheduling::Candidate;
use selector::Selector;
use std::collections::{BTreeMap, BTreeSet};

/// Upstream's `DefaultRevisionLabel` and `DefaultRoleLabel`.
const REVISION_LABEL: &str = "disaggregatedset.x-k8s.io/revision";
const ROLE_LABEL: &str = "disaggregatedset.x-k8s.io/role";

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub(crate) struct RolloutScreener {
    pub(crate) scope: Scope,
    pub(crate) header_selectors: Vec<HeaderSelector>,
    pub(crate) revision_gating: Option<RevisionGating>,
    #[serde(skip)]
    parsed: Parsed,
    /// The shares the last request saw, for `/debug/snapshot`.
    #[serde(skip)]
    last: Owned<BTreeMap<String, f64>>,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub(crate) struct Scope {
    /// Selects the pods counted for cross-role revision coverage (required).
    pub(crate) label_selector: String,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub(crate) struct HeaderSelector {
    pub(crate) name: String,
    /// Request and response header (compared lower case).
    pub(crate) header_name: String,
    pub(crate) label_key: String,
    /// `strict` or `prefer`.
    pub(crate) mode: String,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub(crate) struct RevisionGating {
    pub(crate) revision_label_key: String,
    pub(crate) role_label_key: String,
    /// `sum`, `max-role` or `disabled`.
    pub(crate) mode: String,
    pub(crate) require_roles: Option<RequireRoles>,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RequireRoles {
    pub(crate) values: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Weighing {
    Sum,
    MaxRole,
}

/// The parameters as the screening reads them, filled by `validate`.
#[derive(Clone, Debug, Default, PartialEq)]
struct Parsed {
    scope: Selector,
    /// `None` with `mode: disabled`.
    gating: Option<(Weighing, Vec<String>)>,
    revision_label: String,
    role_label: String,
    /// The header names of the strict selectors, with their label keys.
    strict: Vec<(String, String)>,
}

impl RolloutScreener {
    /// Upstream's `Config.Validate`, with its messages.
    pub(crate) fn validate(mut self) -> Result<Self, Invalid> {
        let text = &self.scope.label_selector;
        if text.is_empty() {
            return Err(Invalid::new("scope", "scope.labelSelector is required"));
        }
        self.parsed.scope = Selector::parse(text).map_err(|e| {
            let m = format!("scope.labelSelector is not a valid label selector: {e}");
            Invalid::new("scope", m)
        })?;
        self.check_selectors()?;
        let Some(g) = &self.revision_gating else {
            return Err(Invalid::new("revisionGating", "revisionGating is required"));
        };
        self.parsed.gating = gating(g)?;
        self.parsed.revision_label = or_default(&g.revision_label_key, REVISION_LABEL);
        self.parsed.role_label = or_default(&g.role_label_key, ROLE_LABEL);
        Ok(self)
    }

    fn check_selectors(&mut self) -> Result<(), Invalid> {
        let bad = |m: String| Invalid::new("headerSelectors", m);
        let (mut names, mut headers) = (BTreeSet::new(), BTreeSet::new());
        for (i, s) in self.header_selectors.iter_mut().enumerate() {
            s.header_name = s.header_name.to_ascii_lowercase();
            for (field, value) in [
                ("name", &s.name),
                ("headerName", &s.header_name),
                ("labelKey", &s.label_key),
            ] {
                if value.is_empty() {
                    return Err(bad(format!("headerSelectors[{i}].{field} is required")));
                }
            }
            if !matches!(s.mode.as_str(), "strict" | "prefer") {
                let m = format!(
                    "headerSelectors[{i}].mode {:?} must be one of strict|prefer",
                    s.mode
                );
                return Err(bad(m));
            }
            if !names.insert(s.name.clone()) {
                return Err(bad(format!("headerSelectors: duplicate name {:?}", s.name)));
            }
            if !headers.insert(s.header_name.clone()) {
                let m = format!("headerSelectors: duplicate headerName {:?}", s.header_name);
                return Err(bad(m));
            }
        }
        self.parsed.strict = self
            .header_selectors
            .iter()
            .filter(|s| s.mode == "strict")
            .map(|s| (s.header_name.clone(), s.label_key.clone()))
            .collect();
        Ok(())
    }

    /// Each covered revision's share of the traffic, from the pods the scope counts.
    fn shares(&self, population: &[&BTreeMap<String, String>]) -> BTreeMap<String, f64> {
        let Some((weighing, roles)) = &self.parsed.gating else {
            return BTreeMap::new();
        };
        let mut counts: BTreeMap<&str, BTreeMap<&str, u64>> = BTreeMap::new();
        for labels in population.iter().filter(|l| self.parsed.scope.matches(l)) {
            let revision = labels.get(&self.parsed.revision_label).map(String::as_str);
            let role = labels.get(&self.parsed.role_label).map(String::as_str);
            if let (Some(rev), Some(role)) = (revision, role) {
                if !rev.is_empty() && !role.is_empty() {
                    *counts.entry(rev).or_default().entry(role).or_default() += 1;
                }
            }
        }
        let count =
            |per: &BTreeMap<&str, u64>, role: &String| per.get(role.as_str()).copied().unwrap_or(0);
        counts.retain(|_, per| roles.iter().all(|r| count(per, r) > 0));
        let weights: BTreeMap<&str, u64> = match weighing {
            Weighing::Sum => counts
                .iter()
                .map(|(rev, per)| (*rev, roles.iter().map(|r| count(per, r)).sum()))
                .collect(),
            Weighing::MaxRole => {
                let total = |r: &String| counts.values().map(|per| count(per, r)).sum::<u64>();
                // The first listed role wins a tie, as upstream's strict `>`.
                let dominant = roles.iter().rev().max_by_key(|r| total(r));
                let dominant = dominant.expect("requireRoles is never empty");
                counts
                    .iter()
                    .map(|(rev, per)| (*rev, count(per, dominant)))
                    .collect()
            }
        };
        let total: u64 = weights.values().sum();
        weights
            .into_iter()
            .filter(|_| total > 0)
            .map(|(rev, w)| (rev.to_owned(), w as f64 / total as f64))
            .collect()
    }

    /// Whether a strict selector's header is set on the request.
    fn strict_header(&self, headers: &Headers) -> bool {
        self.parsed
            .strict
            .iter()
            .any(|(h, _)| headers.get(h).is_some_and(|v| !v.is_empty()))
    }

    /// Revision gating: the covered revisions among the candidates, narrowed to one drawn by
    /// weight unless a strict header pins the revision.
    fn gate(&self, s: &Screening<'_>, candidates: &mut Vec<Candidate>) {
        let shares = self.shares(s.population);
        let key = &self.parsed.revision_label;
        let revision = |c: &Candidate| c.labels.get(key).cloned().unwrap_or_default();
        let allowed: BTreeMap<String, f64> = candidates
            .iter()
            .map(revision)
            .filter_map(|rev| shares.get(&rev).map(|share| (rev, *share)))
            .filter(|(_, share)| *share != 0.0)
            .collect();
        let chosen = match self.strict_header(s.headers) {
            true => None,
            false => pick(&allowed, s.draw),
        };
        candidates.retain(|c| {
            let rev = revision(c);
            allowed.contains_key(&rev) && chosen.is_none_or(|x| *x == rev)
        });
        *self.last.lock() = shares;
    }
}

/// `revisionGating`'s mode and required roles, checked (`None`: disabled).
fn gating(g: &RevisionGating) -> Result<Option<(Weighing, Vec<String>)>, Invalid> {
    let weighing = match g.mode.as_str() {
        "disabled" => return Ok(None),
        "sum" => Weighing::Sum,
        "max-role" => Weighing::MaxRole,
        other => {
            let m = format!("revisionGating.mode {other:?} must be one of sum|max-role|disabled");
            return Err(Invalid::new("revisionGating", m));
        }
    };
    let Some(roles) = &g.require_roles else {
        let m = format!(
            "revisionGating.requireRoles is required when revisionGating.mode={}",
            g.mode
        );
        return Err(Invalid::new("revisionGating", m));
    };
    if roles.values.is_empty() {
        let m = "revisionGating.requireRoles.values must contain at least one role";
        return Err(Invalid::new("revisionGating", m));
    }
    let mut seen = BTreeSet::new();
    for (i, role) in roles.values.iter().enumerate() {
        let m = if role.is_empty() {
            format!("revisionGating.requireRoles.values[{i}] must not be empty")
        } else if !seen.insert(role) {
            format!("revisionGating.requireRoles.values contains duplicate role {role:?}")
        } else {
            continue;
        };
        return Err(Invalid::new("revisionGating", m));
    }
    Ok(Some((weighing, roles.values.clone())))
}

fn or_default(key: &str, default: &str) -> String {
    if key.is_empty() { default } else { key }.to_owned()
}

/// Upstream's `pickWeightedRevision`: revisions in byte order, the first whose cumulative
/// share passes `draw × total`; `None` when no revision has a share.
fn pick(shares: &BTreeMap<String, f64>, draw: f64) -> Option<&String> {
    let total: f64 = shares.values().sum();
    if total == 0.0 {
        return None;
    }
    let x = draw * total;
    let mut cumulative = 0.0;
    for (rev, share) in shares {
        cumulative += share;
        if x < cumulative {
            return Some(rev);
        }
    }
    shares.keys().next_back()
}

impl Lifecycle for RolloutScreener {
    fn headers(&self) -> Vec<&str> {
        self.parsed.strict.iter().map(|(h, _)| h.as_str()).collect()
    }

    fn screens(&self) -> bool {
        true
    }

    fn screen(&self, s: &Screening<'_>, candidates: &mut Vec<Candidate>) {
        if self.parsed.gating.is_some() {
            self.gate(s, candidates);
        }
        for (header, label) in &self.parsed.strict {
            let Some(wanted) = s.headers.get(header).filter(|v| !v.is_empty()) else {
                continue;
            };
            candidates.retain(|c| c.labels.get(label).is_some_and(|v| v == wanted));
            if candidates.is_empty() {
                return;
            }
        }
    }

    /// Every selector's header, set to the serving endpoint's label.
    fn response_headers(&self, placed: &Placed<'_>, out: &mut Vec<(String, String)>) {
        let Some(served) = placed.candidates.iter().find(|c| c.id == placed.primary) else {
            return;
        };
        for s in &self.header_selectors {
            if let Some(v) = served.labels.get(&s.label_key).filter(|v| !v.is_empty()) {
                out.push((s.header_name.clone(), v.clone()));
            }
        }
    }

    fn snapshot(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({
            "type": "disaggregatedset-rollout-screener",
            "revisionShares": *self.last.lock(),
        }))
    }

    fn instance(&self) -> usize {
        self.last.instance()
    }
}

#[cfg(test)]
mod tests;

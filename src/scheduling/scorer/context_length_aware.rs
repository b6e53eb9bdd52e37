//! `context-length-aware` (llm-d): a scorer, and with `enableFiltering` also a filter, that
//! sends a prompt to the endpoints whose label (`llm-d.ai/context-length-range` by default,
//! value `min-max` in tokens) covers its length.
//!
//! The length is [`SchedulingRequest::prompt_tokens`]: the prompt as the prefix producer
//! tokenized it when one is configured, else estimated at four bytes a token (llm-d's default
//! `estimate` token producer). Score: no label 0.5; unparsable label 0; in range `[min, max]`
//! of width `w`: 1 when `w = 0`, else `0.3 + 0.7 · (0.7 / (1 + w/10000) + 0.3 · (max − L)/w)`;
//! out of range: `0.3 / (1 + distance/1000)`. Filter: keeps unlabelled endpoints and those
//! whose range covers the length; drops unparsable labels.

use crate::plugin::Invalid;
use crate::scheduling::{Candidate, SchedulingRequest};

#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ContextLengthAware {
    pub(crate) label: String,
    pub(crate) enable_filtering: bool,
}

impl Default for ContextLengthAware {
    fn default() -> Self {
        Self {
            label: "llm-d.ai/context-length-range".into(),
            enable_filtering: false,
        }
    }
}

impl ContextLengthAware {
    pub(crate) fn validate(self) -> Result<Self, Invalid> {
        if self.label.is_empty() {
            return Err(Invalid::new("label", "invalid configuration for 'context-length-aware' plugin: 'label' must be specified"));
        }
        Ok(self)
    }

    /// The range an endpoint's label declares: `None` without the label, `Some(None)` when it
    /// does not parse.
    fn range(&self, c: &Candidate) -> Option<Option<(i64, i64)>> {
        c.labels.get(&self.label).map(|v| parse_range(v))
    }

    pub(crate) fn filter<'c>(
        &self,
        req: &SchedulingRequest<'_>,
        mut pool: Vec<&'c Candidate>,
    ) -> Vec<&'c Candidate> {
        if !self.enable_filtering {
            return pool;
        }
        let len = req.prompt_tokens as i64;
        pool.retain(|c| match self.range(c) {
            None => true,
            Some(None) => false,
            Some(Some((lo, hi))) => lo <= len && len <= hi,
        });
        pool
    }

    pub(crate) fn score(&self, req: &SchedulingRequest<'_>, pool: &[&Candidate], out: &mut [f64]) {
        let len = req.prompt_tokens as i64;
        for (o, c) in out.iter_mut().zip(pool) {
            *o = match self.range(c) {
                None => 0.5,
                Some(None) => 0.0,
                Some(Some(r)) => range_score(len, r),
            };
        }
    }
}

/// `min-max`, integers (spaces around each allowed), `min ≤ max`.
fn parse_range(v: &str) -> Option<(i64, i64)> {
    let mut parts = v.split('-');
    let (lo, hi) = (parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let (lo, hi): (i64, i64) = (lo.trim().parse().ok()?, hi.trim().parse().ok()?);
    (lo <= hi).then_some((lo, hi))
}

fn range_score(len: i64, (lo, hi): (i64, i64)) -> f64 {
    const FALLBACK: f64 = 0.3;
    if lo <= len && len <= hi {
        let width = (hi - lo) as f64;
        if width == 0.0 {
            return 1.0;
        }
        let width_score = 1.0 / (1.0 + width / 10_000.0);
        let position = (hi - len) as f64 / width;
        return FALLBACK + (0.7 * width_score + 0.3 * position) * (1.0 - FALLBACK);
    }
    let distance = if len > hi { len - hi } else { lo - len };
    FALLBACK / (1.0 + distance as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::plugin::params;
    use crate::scheduling::testing::labelled;

    const L: &str = "llm-d.ai/context-length-range";

    fn pool() -> Vec<Candidate> {
        vec![
            labelled(1, &[(L, "0-4096")]),
            labelled(2, &[(L, " 4097 - 131072 ")]),
            labelled(3, &[]),
            labelled(4, &[(L, "8000-100")]),
            labelled(5, &[(L, "2000-2000")]),
        ]
    }

    fn req(tokens: usize) -> SchedulingRequest<'static> {
        SchedulingRequest {
            prompt_tokens: tokens,
            ..Default::default()
        }
    }

    #[test]
    fn scores_follow_upstream_formula() {
        let s = ContextLengthAware::default();
        let cands = pool();
        let refs: Vec<&Candidate> = cands.iter().collect();
        let mut out = [0.0; 5];
        s.score(&req(2000), &refs, &mut out);
        let in_small = 0.3 + (0.7 / (1.0 + 0.4096) + 0.3 * 2096.0 / 4096.0) * 0.7;
        let below_large = 0.3 / (1.0 + 2097.0 / 1000.0);
        let want = [in_small, below_large, 0.5, 0.0, 1.0];
        for (got, want) in out.iter().zip(want) {
            assert!((got - want).abs() < 1e-12, "{out:?}");
        }
    }

    #[test]
    fn filtering_keeps_covering_and_unlabelled_endpoints() {
        let cands = pool();
        let on = ContextLengthAware {
            enable_filtering: true,
            ..Default::default()
        };
        let table = [
            (100, vec![1, 3]),
            (50_000, vec![2, 3]),
            (2000, vec![1, 3, 5]),
        ];
        for (tokens, want) in table {
            let kept: Vec<u16> = on
                .filter(&req(tokens), cands.iter().collect())
                .iter()
                .map(|c| c.id.0.port())
                .collect();
            assert_eq!(kept, want, "{tokens}");
        }
        let off = ContextLengthAware::default();
        assert_eq!(off.filter(&req(100), cands.iter().collect()).len(), 5);
        let v: serde_norway::Value = serde_norway::from_str("label: \"\"").unwrap();
        let err = params::<ContextLengthAware>(&v)
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.ends_with("'label' must be specified"), "{err}");
    }
}

//! Usage limit policies (`flowControl.usageLimitPolicyPluginRef`, llm-d v0.10): per priority
//! level, the saturation ceiling below which flow control still dispatches that level's
//! requests. Levels are ordered highest first; on each look, flow control walks them in that
//! order and stops at the first whose ceiling the pool's saturation reaches (head-of-line
//! blocking: a lower band never overtakes a held higher one).
//!
//! - `static-usage-limit-policy` (the default): every level's ceiling is 1.0 (dispatch while
//!   the pool is not saturated).
//! - `priority-holdback-policy`: ceilings from `maxCeiling` (highest level) down to
//!   `minCeiling` (lowest), by rank (equal steps) or by value (proportional to the priority's
//!   place in the active range); one level alone gets `maxCeiling`.
//! - `soft-reflective-ceiling-policy`: the highest level always 1.0; level `i` of `n` is open
//!   while saturation < `1 − i·s/(n−1)`, shut at saturation ≥ 1, and in between (the
//!   alternating regime, saturation ≥ 0.5) open one look in `round(s/(1−s))`, so lower levels
//!   keep a trickle instead of starving.

use crate::plugin::Invalid;
use std::sync::atomic::{AtomicI64, Ordering};

/// The usage limit policy flow control applies.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum UsageLimit {
    #[default]
    Static,
    Holdback(Holdback),
    SoftReflective,
}

/// `priority-holdback-policy`'s validated parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Holdback {
    pub(crate) min_ceiling: f64,
    pub(crate) max_ceiling: f64,
    /// `domain: value` (else `rank`).
    pub(crate) by_value: bool,
}

/// `priority-holdback-policy`'s parameters as written.
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub(crate) struct HoldbackParams {
    pub(crate) shape: Option<String>,
    pub(crate) domain: Option<String>,
    pub(crate) min_ceiling: Option<f64>,
    pub(crate) max_ceiling: Option<f64>,
}

impl HoldbackParams {
    /// Upstream's checks (every one reported) and defaults: `shape: linear`, `domain: rank`,
    /// `maxCeiling: 1.0`; `minCeiling` is required.
    pub(crate) fn validate(self) -> Result<Holdback, Vec<Invalid>> {
        const PREFIX: &str = "invalid priority holdback policy configuration";
        let Some(min) = self.min_ceiling else {
            return Err(vec![Invalid::new(
                "minCeiling",
                format!("{PREFIX}: minCeiling is required"),
            )]);
        };
        let max = self.max_ceiling.unwrap_or(1.0);
        let mut problems = Vec::new();
        let mut check = |ok: bool, parameter: &'static str, message: String| {
            if !ok {
                problems.push(Invalid::new(parameter, format!("{PREFIX}: {message}")));
            }
        };
        let shape = self.shape.as_deref().unwrap_or("linear");
        check(
            shape == "linear",
            "shape",
            format!("unsupported shape {shape:?}, must be \"linear\""),
        );
        let domain = self.domain.as_deref().unwrap_or("rank");
        check(
            matches!(domain, "rank" | "value"),
            "domain",
            format!("unsupported domain {domain:?}, must be one of: \"rank\", \"value\""),
        );
        check(
            (0.0..1.0).contains(&min),
            "minCeiling",
            format!("minCeiling must be in [0.0, 1.0), got {min:.6}"),
        );
        check(
            max > 0.0 && max <= 1.0,
            "maxCeiling",
            format!("maxCeiling must be in (0.0, 1.0], got {max:.6}"),
        );
        check(
            min < max,
            "minCeiling",
            format!("minCeiling ({min:.6}) must be strictly less than maxCeiling ({max:.6})"),
        );
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Holdback {
            min_ceiling: min,
            max_ceiling: max,
            by_value: domain == "value",
        })
    }
}

/// `soft-reflective-ceiling-policy` takes no parameters.
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NoParams {}

impl UsageLimit {
    /// The ceiling of each of `priorities` (highest first) at `saturation`. `looks` counts the
    /// soft-reflective policy's looks in its alternating regime (one counter per flow control).
    pub(crate) fn ceilings(
        self,
        saturation: f64,
        priorities: &[i32],
        looks: &AtomicI64,
    ) -> Vec<f64> {
        let n = priorities.len();
        match self {
            Self::Static => vec![1.0; n],
            Self::Holdback(h) if n == 1 => vec![h.max_ceiling],
            Self::Holdback(h) => h.ceilings(priorities),
            Self::SoftReflective => soft_reflective(saturation, n, looks),
        }
    }
}

impl Holdback {
    fn ceilings(self, priorities: &[i32]) -> Vec<f64> {
        let (lo, hi) = (self.min_ceiling, self.max_ceiling);
        let spread = hi - lo;
        if !self.by_value {
            let steps = (priorities.len() - 1) as f64;
            return (0..priorities.len())
                .map(|i| hi - i as f64 * spread / steps)
                .collect();
        }
        let p_max = f64::from(priorities[0]);
        let p_min = f64::from(priorities[priorities.len() - 1]);
        if p_max == p_min {
            return vec![hi; priorities.len()];
        }
        priorities
            .iter()
            .map(|&p| lo + (f64::from(p) - p_min) / (p_max - p_min) * spread)
            .collect()
    }
}

fn soft_reflective(saturation: f64, n: usize, looks: &AtomicI64) -> Vec<f64> {
    if n <= 1 {
        return vec![1.0; n];
    }
    let alternating = saturation >= 1.0 - saturation && saturation < 1.0;
    let open = alternating && {
        let period = (saturation / (1.0 - saturation + 1e-9)).round().max(1.0) as i64;
        (looks.fetch_add(1, Ordering::Relaxed) + 1) % period == 0
    };
    (0..n)
        .map(|i| {
            let reflective = 1.0 - i as f64 * saturation / (n - 1) as f64;
            if i == 0 || saturation < reflective {
                1.0
            } else if saturation >= 1.0 || !open {
                0.0
            } else {
                1.0
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holdback(min: f64, max: f64, by_value: bool) -> UsageLimit {
        UsageLimit::Holdback(Holdback {
            min_ceiling: min,
            max_ceiling: max,
            by_value,
        })
    }

    #[test]
    fn holdback_steps_down_by_rank_or_by_value() {
        let looks = AtomicI64::new(0);
        let by_rank = holdback(0.4, 1.0, false).ceilings(0.0, &[100, 10, 0], &looks);
        assert_eq!(by_rank, vec![1.0, 0.7, 0.4]);
        let by_value = holdback(0.0, 1.0, true).ceilings(0.0, &[100, 10, 0], &looks);
        assert_eq!(by_value, vec![1.0, 0.1, 0.0]);
        assert_eq!(
            holdback(0.2, 0.9, false).ceilings(0.0, &[5], &looks),
            vec![0.9]
        );
        assert_eq!(
            holdback(0.2, 0.9, true).ceilings(0.0, &[5, 5], &looks),
            vec![0.9, 0.9]
        );
    }

    #[test]
    fn holdback_parameters_are_checked_as_upstream() {
        let ok = HoldbackParams {
            min_ceiling: Some(0.3),
            ..Default::default()
        };
        let h = ok.validate().unwrap();
        assert_eq!(
            (h.min_ceiling, h.max_ceiling, h.by_value),
            (0.3, 1.0, false)
        );
        let missing = HoldbackParams::default().validate().unwrap_err();
        assert!(missing[0].message.ends_with("minCeiling is required"));
        let bad = HoldbackParams {
            shape: Some("step".into()),
            domain: Some("log".into()),
            min_ceiling: Some(0.9),
            max_ceiling: Some(0.5),
        };
        let names: Vec<&str> = bad
            .validate()
            .unwrap_err()
            .iter()
            .map(|i| i.parameter)
            .collect();
        assert_eq!(names, ["shape", "domain", "minCeiling"]);
    }

    #[test]
    fn soft_reflective_keeps_the_top_level_open_and_alternates_the_others_when_busy() {
        let looks = AtomicI64::new(0);
        let limit = UsageLimit::SoftReflective;
        assert_eq!(limit.ceilings(0.9, &[1], &looks), vec![1.0]);
        assert_eq!(limit.ceilings(0.2, &[2, 1, 0], &looks), vec![1.0; 3]);
        assert_eq!(limit.ceilings(1.2, &[2, 1, 0], &looks), vec![1.0, 0.0, 0.0]);
        // Saturation 0.75: period 3, so one look in three opens the lower levels.
        let opened: Vec<bool> = (0..6)
            .map(|_| limit.ceilings(0.75, &[1, 0], &looks)[1] == 1.0)
            .collect();
        assert_eq!(opened, [false, false, true, false, false, true]);
    }
}

//! `utilization-filter` (llm-d, alpha): keep the endpoints at or below every configured limit.
//!
//! Metrics: `active-requests` (epp's in-flight requests there, llm-d's `InFlightLoad.Requests`),
//! `running-requests`, `waiting-queue` and `kv-cache-utilization` (a fraction) from the last
//! scrape, 0 before the first one. With `fallbackOnEmpty`, a filter that would keep no one
//! keeps everyone.

use crate::plugin::Invalid;
use crate::scheduling::Candidate;

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct UtilizationFilter {
    pub(crate) conditions: Vec<Condition>,
    pub(crate) fallback_on_empty: bool,
    /// Names the in-flight load producer; epp has one, so any name is accepted.
    pub(crate) in_flight_load_producer_name: String,
}

#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Condition {
    #[serde(default)]
    pub(crate) metric: String,
    pub(crate) max_value: Option<f64>,
}

pub(super) const ACTIVE: &str = "active-requests";
const RUNNING: &str = "running-requests";
const WAITING: &str = "waiting-queue";
const KV: &str = "kv-cache-utilization";

impl UtilizationFilter {
    /// Upstream's checks and messages.
    pub(crate) fn validate(self) -> Result<Self, Invalid> {
        if self.conditions.is_empty() {
            return Err(Invalid::new(
                "conditions",
                "utilization filter requires at least one condition",
            ));
        }
        for c in &self.conditions {
            if ![ACTIVE, RUNNING, WAITING, KV].contains(&c.metric.as_str()) {
                return Err(Invalid::new("conditions", format!("utilization filter condition metric must be one of {ACTIVE:?}, {RUNNING:?}, {WAITING:?}, {KV:?}, got {:?}", c.metric)));
            }
            let Some(max) = c.max_value else {
                return Err(Invalid::new(
                    "conditions",
                    format!(
                        "utilization filter condition for {:?} requires maxValue",
                        c.metric
                    ),
                ));
            };
            if max < 0.0 {
                return Err(Invalid::new("conditions", format!("utilization filter condition for {:?} requires a non-negative maxValue, got {max}", c.metric)));
            }
            if c.metric == KV && max > 1.0 {
                return Err(Invalid::new("conditions", format!("utilization filter maxValue for {KV:?} is a fraction and must be at most 1, got {max}")));
            }
        }
        Ok(self)
    }

    fn value(c: &Candidate, metric: &str) -> f64 {
        if metric == ACTIVE {
            return c.inflight;
        }
        c.metrics.as_ref().map_or(0.0, |m| match metric {
            RUNNING => m.running,
            WAITING => m.waiting,
            _ => m.kv_usage,
        })
    }

    fn keeps(&self, c: &Candidate) -> bool {
        self.conditions
            .iter()
            .all(|cond| Self::value(c, &cond.metric) <= cond.max_value.unwrap_or(f64::INFINITY))
    }

    pub(crate) fn filter<'c>(&self, pool: Vec<&'c Candidate>) -> Vec<&'c Candidate> {
        let kept: Vec<&Candidate> = pool.iter().copied().filter(|c| self.keeps(c)).collect();
        if kept.is_empty() && self.fallback_on_empty {
            pool
        } else {
            kept
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::plugin::params;
    use crate::scheduling::testing::{cand, metrics};

    fn filter(yaml: &str) -> Result<UtilizationFilter, String> {
        let v: serde_norway::Value = serde_norway::from_str(yaml).unwrap();
        params::<UtilizationFilter>(&v)
            .map_err(|e| e.to_string())?
            .validate()
            .map_err(|e| e.to_string())
    }

    /// (waiting, running, kv, in-flight) per candidate.
    fn pool() -> Vec<Candidate> {
        [
            (0.0, 2.0, 0.2, 1.0),
            (5.0, 8.0, 0.9, 6.0),
            (1.0, 4.0, 0.5, 3.0),
        ]
        .iter()
        .enumerate()
        .map(|(i, (q, r, kv, n))| Candidate {
            metrics: Some(metrics(*q, *r, *kv)),
            inflight: *n,
            ..cand(i as u16 + 1, 0.0, 0.0, 0)
        })
        .collect()
    }

    #[test]
    fn keeps_endpoints_within_every_limit() {
        let cands = pool();
        let table = [
            ("conditions: [{metric: waiting-queue, maxValue: 1}]", vec![1, 3]),
            ("conditions: [{metric: kv-cache-utilization, maxValue: 0.5}, {metric: running-requests, maxValue: 2}]", vec![1]),
            ("conditions: [{metric: active-requests, maxValue: 3}]", vec![1, 3]),
            ("conditions: [{metric: active-requests, maxValue: 0}]", vec![]),
            ("{conditions: [{metric: active-requests, maxValue: 0}], fallbackOnEmpty: true}", vec![1, 2, 3]),
        ];
        for (yaml, want) in table {
            let f = filter(yaml).unwrap();
            let kept: Vec<u16> = f
                .filter(cands.iter().collect())
                .iter()
                .map(|c| c.id.0.port())
                .collect();
            assert_eq!(kept, want, "{yaml}");
        }
    }

    #[test]
    fn conditions_are_checked_with_upstream_messages() {
        let bad = [
            ("~", "utilization filter requires at least one condition"),
            ("conditions: [{metric: gpu, maxValue: 1}]", "utilization filter condition metric must be one of \"active-requests\", \"running-requests\", \"waiting-queue\", \"kv-cache-utilization\", got \"gpu\""),
            ("conditions: [{metric: waiting-queue}]", "utilization filter condition for \"waiting-queue\" requires maxValue"),
            ("conditions: [{metric: waiting-queue, maxValue: -1}]", "requires a non-negative maxValue, got -1"),
            ("conditions: [{metric: kv-cache-utilization, maxValue: 80}]", "is a fraction and must be at most 1, got 80"),
            ("conditions: [{metric: waiting-queue, max: 1}]", "unknown field `max`"),
        ];
        for (yaml, want) in bad {
            let err = filter(yaml).unwrap_err();
            assert!(err.contains(want), "{yaml}: {err}");
        }
    }
}

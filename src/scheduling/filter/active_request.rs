//! `active-request-filter` (llm-d, alpha; renamed `utilization-filter` before llm-d-router
//! v0.10): keep the endpoints with at most `maxRequests` of epp's in-flight requests
//! (`Candidate::inflight`, llm-d's `InFlightLoad.Requests`). It is `utilization-filter` with
//! one `active-requests` condition, and is built as one; `fallbackOnEmpty` as there.

use super::utilization::{Condition, UtilizationFilter, ACTIVE};
use crate::plugin::Invalid;

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ActiveRequestFilter {
    /// Required and positive.
    max_requests: i64,
    fallback_on_empty: bool,
    /// Names the in-flight load producer; epp has one, so any name is accepted.
    in_flight_load_producer_name: String,
}

impl ActiveRequestFilter {
    /// Upstream's check and message; the filter it is.
    pub(crate) fn validate(self) -> Result<UtilizationFilter, Invalid> {
        if self.max_requests <= 0 {
            return Err(Invalid::new(
                "maxRequests",
                format!(
                    "active request filter requires a positive maxRequests, got {}",
                    self.max_requests
                ),
            ));
        }
        Ok(UtilizationFilter {
            conditions: vec![Condition {
                metric: ACTIVE.to_owned(),
                max_value: Some(self.max_requests as f64),
            }],
            fallback_on_empty: self.fallback_on_empty,
            in_flight_load_producer_name: self.in_flight_load_producer_name,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::plugin::params;
    use crate::scheduling::testing::cand;
    use crate::scheduling::Candidate;

    fn filter(yaml: &str) -> Result<UtilizationFilter, String> {
        let v: serde_norway::Value = serde_norway::from_str(yaml).unwrap();
        params::<ActiveRequestFilter>(&v)
            .map_err(|e| e.to_string())?
            .validate()
            .map_err(|e| e.to_string())
    }

    #[test]
    fn max_requests_is_required_and_positive() {
        for bad in ["{}", "{maxRequests: 0}", "{maxRequests: -3}"] {
            let e = filter(bad).unwrap_err();
            assert!(e.contains("requires a positive maxRequests"), "{bad}: {e}");
        }
        assert!(filter("{maxRequests: 2, bogus: 1}").is_err());
    }

    #[test]
    fn keeps_the_endpoints_at_or_below_the_cap() {
        let f = filter("{maxRequests: 2}").unwrap();
        let cands: Vec<Candidate> = [0.0, 2.0, 3.0]
            .iter()
            .enumerate()
            .map(|(i, &n)| Candidate {
                inflight: n,
                ..cand(i as u16 + 1, 0.0, 0.0, 0)
            })
            .collect();
        let kept: Vec<f64> = f
            .filter(cands.iter().collect())
            .iter()
            .map(|c| c.inflight)
            .collect();
        assert_eq!(kept, [0.0, 2.0]);
        let none = filter("{maxRequests: 1}").unwrap();
        assert!(none.filter(vec![&cands[2]]).is_empty());
        let fallback = filter("{maxRequests: 1, fallbackOnEmpty: true}").unwrap();
        assert_eq!(fallback.filter(vec![&cands[2]]).len(), 1);
    }
}

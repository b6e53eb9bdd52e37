//! `header-based-testing-filter`: the conformance suite's hook. Keeps the candidates whose IP or
//! exact `IP:port` appears in the comma-separated `test-epp-endpoint-selection` header, in
//! header order. No header keeps nothing, so scheduling fails with 429, as upstream.

use crate::scheduling::{Candidate, SchedulingRequest};

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderBasedTestingFilter {}

impl HeaderBasedTestingFilter {
    pub(crate) fn filter<'c>(
        &self,
        req: &SchedulingRequest<'_>,
        pool: Vec<&'c Candidate>,
    ) -> Vec<&'c Candidate> {
        let Some(header) = req.test_endpoint_selection else {
            return Vec::new();
        };
        let mut out: Vec<&Candidate> = Vec::new();
        for wanted in header.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            for c in &pool {
                let ip = c.id.0.ip().to_string();
                let matches = wanted == ip || wanted == c.id.to_string();
                if matches && !out.iter().any(|o| o.id == c.id) {
                    out.push(c);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::cand;

    #[test]
    fn keeps_listed_endpoints_in_header_order() {
        let cands = [
            cand(1, 0.0, 0.0, 0),
            cand(2, 0.0, 0.0, 0),
            cand(3, 0.0, 0.0, 0),
        ];
        let pool: Vec<&Candidate> = cands.iter().collect();
        let f = HeaderBasedTestingFilter {};
        let req = SchedulingRequest {
            test_endpoint_selection: Some("10.0.0.1:3, 10.0.0.1:1,10.0.0.9"),
            ..Default::default()
        };
        let kept: Vec<u16> = f
            .filter(&req, pool.clone())
            .iter()
            .map(|c| c.id.0.port())
            .collect();
        assert_eq!(kept, vec![3, 1]);
        let by_ip = SchedulingRequest {
            test_endpoint_selection: Some("10.0.0.1"),
            ..Default::default()
        };
        assert_eq!(f.filter(&by_ip, pool.clone()).len(), 3);
        assert!(f.filter(&SchedulingRequest::default(), pool).is_empty());
    }
}

//! `session-affinity-filter` (llm-d, alpha): when the request's session names an endpoint
//! that is a candidate, keep only that endpoint; otherwise keep everyone. Same parameters and
//! strategies as `session-affinity-scorer` ([`SessionAffinityParams`]).
//!
//! `multicluster-session-affinity-filter` (llm-d v0.10, alpha) is this filter on a hub: its
//! candidates are clusters, so a session pins to the cluster that served it, and upstream's
//! type delegates to this one without change (its parameters, its errors naming
//! `session-affinity-filter`).

use crate::plugin::{Invalid, PluginKind};
use crate::scheduling::scorer::SessionAffinityParams;
use crate::scheduling::{Candidate, SchedulingRequest};

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(transparent)]
pub struct SessionAffinityFilter {
    pub(crate) params: SessionAffinityParams,
}

impl SessionAffinityFilter {
    pub(crate) fn validate(self) -> Result<Self, Invalid> {
        Ok(Self {
            params: self
                .params
                .validate(PluginKind::SessionAffinityFilter, "filter")?,
        })
    }

    pub(crate) fn filter<'c>(
        &self,
        req: &SchedulingRequest<'_>,
        pool: Vec<&'c Candidate>,
    ) -> Vec<&'c Candidate> {
        match self.params.target(req) {
            Some(id) if pool.iter().any(|c| c.id == id) => {
                pool.into_iter().filter(|c| c.id == id).collect()
            }
            _ => pool,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::cand;

    #[test]
    fn keeps_only_the_session_endpoint_when_it_is_a_candidate() {
        let cands = [cand(1, 0.0, 0.0, 0), cand(2, 0.0, 0.0, 0)];
        let gone = cand(3, 0.0, 0.0, 0).id;
        let f = SessionAffinityFilter::default().validate().unwrap();
        let table = [
            (Some(cands[1].id), vec![2]),
            (Some(gone), vec![1, 2]),
            (None, vec![1, 2]),
        ];
        for (target, want) in table {
            let req = SchedulingRequest {
                session_endpoint: target,
                ..Default::default()
            };
            let kept: Vec<u16> = f
                .filter(&req, cands.iter().collect())
                .iter()
                .map(|c| c.id.0.port())
                .collect();
            assert_eq!(kept, want, "{target:?}");
        }
    }
}

//! `topology-affinity-scorer` (llm-d-router v0.10, alpha): scores a candidate by how close it
//! runs to the request's peer (the endpoint an earlier stage picked,
//! [`SchedulingRequest::peer`]): same host 1, rack 0.2, zone 0.05, region 0.02, nothing shared
//! 0; every candidate 0 without a peer or a peer topology. Topology as a `topology-extractor`
//! reads it ([`crate::scheduling::topology`]); `topologyProducerName` names the extractor.

use crate::scheduling::topology::{ExtractorRef, Level};
use crate::scheduling::{Candidate, SchedulingRequest};

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct TopologyAffinityScorerParams {
    topology_producer_name: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TopologyAffinityScorer {
    pub(crate) extractor: ExtractorRef,
}

impl From<TopologyAffinityScorerParams> for TopologyAffinityScorer {
    fn from(p: TopologyAffinityScorerParams) -> Self {
        Self {
            extractor: ExtractorRef::new(&p.topology_producer_name),
        }
    }
}

/// Upstream's score of each tier.
fn level_score(level: Level) -> f64 {
    match level {
        Level::Host => 1.0,
        Level::Rack => 0.2,
        Level::Zone => 0.05,
        Level::Region => 0.02,
        Level::None => 0.0,
    }
}

impl TopologyAffinityScorer {
    pub(crate) fn score(&self, req: &SchedulingRequest<'_>, pool: &[&Candidate], out: &mut [f64]) {
        let peer = self.extractor.peer(req.peer);
        for (o, c) in out.iter_mut().zip(pool) {
            *o = peer.as_ref().map_or(0.0, |(extractor, peer)| {
                extractor
                    .read(&c.labels)
                    .map_or(0.0, |t| level_score(Level::between(peer, &t)))
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::labelled;
    use crate::scheduling::topology::{TopologyExtractor, TopologyExtractorParams};

    #[test]
    fn closer_to_the_peer_scores_higher() {
        let mut s = TopologyAffinityScorer::from(TopologyAffinityScorerParams::default());
        s.extractor.extractor = Some(TopologyExtractor::from(TopologyExtractorParams::default()));
        let (host, rack, zone, region) = (
            "kubernetes.io/hostname",
            "topology.kubernetes.io/rack",
            "topology.kubernetes.io/zone",
            "topology.kubernetes.io/region",
        );
        let peer = labelled(
            9,
            &[(host, "n1"), (rack, "r1"), (zone, "z1"), (region, "g1")],
        );
        let pool = [
            labelled(1, &[(host, "n1")]),
            labelled(2, &[(rack, "r1")]),
            labelled(3, &[(zone, "z1")]),
            labelled(4, &[(region, "g1")]),
            labelled(5, &[(region, "g2")]),
            labelled(6, &[]),
        ];
        let refs: Vec<&Candidate> = pool.iter().collect();
        let mut out = [9.0; 6];
        let req = SchedulingRequest {
            peer: Some(&peer),
            ..SchedulingRequest::default()
        };
        s.score(&req, &refs, &mut out);
        assert_eq!(out, [1.0, 0.2, 0.05, 0.02, 0.0, 0.0]);
        s.score(&SchedulingRequest::default(), &refs, &mut out);
        assert_eq!(out, [0.0; 6], "no peer");
    }
}

//! `topology-affinity-filter` (llm-d-router v0.10, alpha): keeps the candidates at least as
//! close to the request's peer (the endpoint an earlier stage picked, [`SchedulingRequest::peer`])
//! as `minAffinity` (`host`, the default; `rack`, `zone` or `region`), by the topology a
//! `topology-extractor` reads ([`crate::scheduling::topology`]). No peer, or a peer without a
//! topology: every candidate passes; a candidate without one is dropped; when none would pass,
//! every candidate does (upstream's fallback). `topologyProducerName` names the extractor.

use crate::plugin::Invalid;
use crate::scheduling::topology::{ExtractorRef, Level};
use crate::scheduling::{Candidate, SchedulingRequest};

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct TopologyAffinityFilterParams {
    min_affinity: String,
    topology_producer_name: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TopologyAffinityFilter {
    pub(crate) min_affinity: Level,
    pub(crate) extractor: ExtractorRef,
}

impl TopologyAffinityFilterParams {
    pub(crate) fn validate(self) -> Result<TopologyAffinityFilter, Invalid> {
        let level = match self.min_affinity.as_str() {
            "" => "host",
            l => l,
        };
        let min_affinity = Level::parse(level).ok_or_else(|| {
            Invalid::new(
                "minAffinity",
                format!("invalid configuration for 'topology-affinity-filter' filter: invalid topology level {level:?}, must be one of host, rack, zone, region"),
            )
        })?;
        Ok(TopologyAffinityFilter {
            min_affinity,
            extractor: ExtractorRef::new(&self.topology_producer_name),
        })
    }
}

impl TopologyAffinityFilter {
    pub(crate) fn filter<'c>(
        &self,
        req: &SchedulingRequest<'_>,
        pool: Vec<&'c Candidate>,
    ) -> Vec<&'c Candidate> {
        let Some((extractor, peer)) = self.extractor.peer(req.peer) else {
            return pool;
        };
        let near: Vec<&Candidate> = pool
            .iter()
            .copied()
            .filter(|c| {
                extractor
                    .read(&c.labels)
                    .is_some_and(|t| Level::between(&peer, &t) <= self.min_affinity)
            })
            .collect();
        match near.is_empty() {
            true => pool,
            false => near,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::labelled;
    use crate::scheduling::topology::{TopologyExtractor, TopologyExtractorParams};

    const ZONE: &str = "topology.kubernetes.io/zone";
    const HOST: &str = "kubernetes.io/hostname";

    fn filter(min: &str) -> TopologyAffinityFilter {
        let mut f = TopologyAffinityFilterParams {
            min_affinity: min.into(),
            ..Default::default()
        }
        .validate()
        .unwrap();
        f.extractor.extractor = Some(TopologyExtractor::from(TopologyExtractorParams::default()));
        f
    }

    fn kept(f: &TopologyAffinityFilter, peer: Option<&Candidate>, pool: &[Candidate]) -> Vec<u16> {
        let req = SchedulingRequest {
            peer,
            ..SchedulingRequest::default()
        };
        f.filter(&req, pool.iter().collect())
            .iter()
            .map(|c| c.id.0.port())
            .collect()
    }

    #[test]
    fn keeps_the_candidates_close_enough_to_the_peer() {
        let peer = labelled(9, &[(HOST, "n1"), (ZONE, "z1")]);
        let pool = [
            labelled(1, &[(HOST, "n1"), (ZONE, "z1")]),
            labelled(2, &[(HOST, "n2"), (ZONE, "z1")]),
            labelled(3, &[(HOST, "n3"), (ZONE, "z2")]),
            labelled(4, &[]),
        ];
        assert_eq!(
            kept(&filter(""), Some(&peer), &pool),
            [1],
            "host by default"
        );
        assert_eq!(kept(&filter("zone"), Some(&peer), &pool), [1, 2]);
        assert_eq!(kept(&filter("region"), Some(&peer), &pool), [1, 2]);
    }

    #[test]
    fn without_a_peer_a_topology_or_a_match_every_candidate_passes() {
        let pool = [labelled(1, &[(HOST, "n2")]), labelled(2, &[])];
        let far = labelled(9, &[(HOST, "n9")]);
        assert_eq!(kept(&filter("host"), None, &pool), [1, 2]);
        assert_eq!(
            kept(&filter("host"), Some(&labelled(9, &[])), &pool),
            [1, 2]
        );
        assert_eq!(
            kept(&filter("host"), Some(&far), &pool),
            [1, 2],
            "none near: all"
        );
        let mut unresolved = filter("host");
        unresolved.extractor.extractor = None;
        let near = labelled(9, &[(HOST, "n2")]);
        assert_eq!(
            kept(&unresolved, Some(&near), &pool),
            [1, 2],
            "no extractor"
        );
    }

    #[test]
    fn an_unknown_level_is_refused_with_upstreams_words() {
        let e = TopologyAffinityFilterParams {
            min_affinity: "planet".into(),
            ..Default::default()
        }
        .validate()
        .unwrap_err();
        assert!(
            e.message.contains("invalid topology level \"planet\""),
            "{e}"
        );
    }
}

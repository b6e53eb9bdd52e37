//! `topology-extractor` (llm-d-router v0.10, alpha): where an endpoint runs (host, rack, zone,
//! region), read from its labels, for the topology-affinity filter and scorer to compare a
//! candidate against the endpoint an earlier stage of the same request picked (its *peer*: the
//! decode pick when the prefill stage runs decode-first, the prefill pick when the decode stage
//! runs after it).
//!
//! Parameters name the labels: `hostname` (default `kubernetes.io/hostname`), `rack`
//! (`topology.kubernetes.io/rack`), `zone` (`topology.kubernetes.io/zone`), `region`
//! (`topology.kubernetes.io/region`); an empty one is its default. An endpoint carrying none of
//! them has no topology. The filter and scorer find the extractor by its instance name
//! (`topologyProducerName`, default `topology-extractor`, the name of an unnamed one), when the
//! profiles are assembled; without one, they have no topology to read.
//!
//! Where epp differs: upstream, a pod without the hostname label takes its `spec.hostname`
//! (from a Pod watch); epp reads labels only.

use crate::plugin::{Parameters, PluginKind};
use std::collections::BTreeMap;

/// The labels a `topology-extractor` reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopologyExtractor {
    pub(crate) hostname: String,
    pub(crate) rack: String,
    pub(crate) zone: String,
    pub(crate) region: String,
}

/// Its parameters, decoded strictly.
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct TopologyExtractorParams {
    hostname: String,
    rack: String,
    zone: String,
    region: String,
}

impl From<TopologyExtractorParams> for TopologyExtractor {
    fn from(p: TopologyExtractorParams) -> Self {
        let or = |v: String, default: &str| match v.is_empty() {
            true => default.to_owned(),
            false => v,
        };
        Self {
            hostname: or(p.hostname, "kubernetes.io/hostname"),
            rack: or(p.rack, "topology.kubernetes.io/rack"),
            zone: or(p.zone, "topology.kubernetes.io/zone"),
            region: or(p.region, "topology.kubernetes.io/region"),
        }
    }
}

/// The extractor a `kind` plugin configures (`None` when `kind` is none). The configuration
/// decoder calls this for every plugin.
pub(crate) fn from_plugin<P: Parameters>(
    kind: PluginKind,
    p: &P,
) -> Result<Option<TopologyExtractor>, P::Error> {
    Ok(match kind {
        PluginKind::TopologyExtractor => Some(p.decode::<TopologyExtractorParams>()?.into()),
        _ => None,
    })
}

/// Where one endpoint runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Topology<'a> {
    pub(crate) hostname: &'a str,
    pub(crate) rack: &'a str,
    pub(crate) zone: &'a str,
    pub(crate) region: &'a str,
}

impl TopologyExtractor {
    /// The topology `labels` give, `None` when they carry none of the four labels.
    pub(crate) fn read<'a>(&self, labels: &'a BTreeMap<String, String>) -> Option<Topology<'a>> {
        let get = |k: &String| labels.get(k).map_or("", String::as_str);
        let t = Topology {
            hostname: get(&self.hostname),
            rack: get(&self.rack),
            zone: get(&self.zone),
            region: get(&self.region),
        };
        (t != Topology::default()).then_some(t)
    }
}

/// How close two endpoints are: the tightest tier they share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    Host,
    Rack,
    Zone,
    Region,
    /// No tier in common.
    None,
}

impl Level {
    /// `host`, `rack`, `zone` or `region` (upstream's `ParseLevel`).
    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "host" => Some(Self::Host),
            "rack" => Some(Self::Rack),
            "zone" => Some(Self::Zone),
            "region" => Some(Self::Region),
            _ => None,
        }
    }

    /// The tightest tier `peer` and `candidate` share (an empty value matches nothing).
    pub(crate) fn between(peer: &Topology<'_>, candidate: &Topology<'_>) -> Self {
        let same = |a: &str, b: &str| !a.is_empty() && a == b;
        if same(peer.hostname, candidate.hostname) {
            Self::Host
        } else if same(peer.rack, candidate.rack) {
            Self::Rack
        } else if same(peer.zone, candidate.zone) {
            Self::Zone
        } else if same(peer.region, candidate.region) {
            Self::Region
        } else {
            Self::None
        }
    }
}

/// The filter's and scorer's reference to an extractor: its name (`topologyProducerName`), and
/// the extractor itself once the profiles are assembled (`None` when no extractor has that
/// name: the plugin then reads no topology, as upstream's without a producer).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ExtractorRef {
    pub(crate) name: String,
    pub(crate) extractor: Option<TopologyExtractor>,
}

impl ExtractorRef {
    pub(crate) fn new(producer_name: &str) -> Self {
        Self {
            name: match producer_name.trim() {
                "" => PluginKind::TopologyExtractor.name().to_owned(),
                n => n.to_owned(),
            },
            extractor: None,
        }
    }

    /// The peer's topology and a reader of the candidates', when both are known.
    pub(crate) fn peer<'a>(
        &'a self,
        peer: Option<&'a super::Candidate>,
    ) -> Option<(&'a TopologyExtractor, Topology<'a>)> {
        let extractor = self.extractor.as_ref()?;
        Some((extractor, extractor.read(&peer?.labels)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_default_labels_are_kubernetes_topology_labels() {
        let e = TopologyExtractor::from(TopologyExtractorParams::default());
        let l = labels(&[
            ("kubernetes.io/hostname", "n1"),
            ("topology.kubernetes.io/zone", "z1"),
        ]);
        let t = e.read(&l).unwrap();
        assert_eq!((t.hostname, t.rack, t.zone, t.region), ("n1", "", "z1", ""));
        assert_eq!(e.read(&labels(&[("other", "x")])), None);
        let custom = TopologyExtractor::from(TopologyExtractorParams {
            rack: "rack".into(),
            ..Default::default()
        });
        assert_eq!(custom.read(&labels(&[("rack", "r9")])).unwrap().rack, "r9");
    }

    #[test]
    fn the_tightest_shared_tier_counts_and_empty_matches_nothing() {
        let t = |h, r, z, g| Topology {
            hostname: h,
            rack: r,
            zone: z,
            region: g,
        };
        let peer = t("n1", "r1", "z1", "g1");
        assert_eq!(Level::between(&peer, &t("n1", "", "", "")), Level::Host);
        assert_eq!(Level::between(&peer, &t("n2", "r1", "z9", "")), Level::Rack);
        assert_eq!(
            Level::between(&peer, &t("n2", "r2", "z1", "g1")),
            Level::Zone
        );
        assert_eq!(Level::between(&peer, &t("", "", "", "g1")), Level::Region);
        assert_eq!(
            Level::between(&t("", "", "", ""), &t("", "", "", "")),
            Level::None
        );
        assert_eq!(Level::parse("zone"), Some(Level::Zone));
        assert_eq!(Level::parse("none"), None);
    }
}

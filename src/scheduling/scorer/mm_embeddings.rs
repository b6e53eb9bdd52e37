//! `mm-embeddings-cache-scorer` (llm-d v0.10, beta): prefer the pod believed to hold the
//! encoder output of the request's multimodal items, from its `mm-embeddings-cache-producer`
//! ([`crate::scheduling::producer`]): the share of the request's items the pod holds, in
//! [0, 1]. A request without multimodal items scores 0 everywhere (upstream: no match
//! information), leaving it to the other scorers.

use crate::scheduling::producer::MmEmbeddingsCache;
use crate::scheduling::{Candidate, SchedulingRequest};

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct MmEmbeddingsScorer {
    /// The `mm-embeddings-cache-producer` instance read (empty: the configured one).
    pub(crate) producer_name: String,
    /// The producer, bound when the scheduler is assembled.
    #[serde(skip)]
    pub(crate) producer: Option<MmEmbeddingsCache>,
}

impl MmEmbeddingsScorer {
    /// The producer instance named (`None`: whichever is configured).
    pub(crate) fn producer_name(&self) -> Option<&str> {
        Some(self.producer_name.as_str()).filter(|n| !n.is_empty())
    }

    pub(crate) fn score(&self, req: &SchedulingRequest<'_>, pool: &[&Candidate], out: &mut [f64]) {
        let items = req.multimodal_items;
        for (o, c) in out.iter_mut().zip(pool) {
            *o = match (&self.producer, items.len()) {
                (Some(p), n) if n > 0 => p.matched(c.id, items) as f64 / n as f64,
                _ => 0.0,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::multimodal::{Item, Modality};
    use crate::scheduling::lifecycle::place_on;
    use crate::scheduling::testing::cand;

    #[test]
    fn scores_the_share_of_the_request_items_each_pod_holds() {
        let producer = MmEmbeddingsCache::default();
        let s = MmEmbeddingsScorer {
            producer: Some(producer.clone()),
            ..MmEmbeddingsScorer::default()
        };
        let image = |hash| Item {
            modality: Modality::Image,
            hash,
        };
        let (a, b) = (cand(1, 0.0, 0.0, 0), cand(2, 0.0, 0.0, 0));
        let first = [image(1)];
        let req = SchedulingRequest {
            multimodal_items: &first,
            ..SchedulingRequest::default()
        };
        place_on(&producer, 1, &req, &a);
        let both = [image(1), image(2)];
        let req = SchedulingRequest {
            multimodal_items: &both,
            ..SchedulingRequest::default()
        };
        let mut out = [9.0; 2];
        s.score(&req, &[&a, &b], &mut out);
        assert_eq!(out, [0.5, 0.0]);
        s.score(&SchedulingRequest::default(), &[&a, &b], &mut out);
        assert_eq!(out, [0.0, 0.0], "no items: no affinity");
    }
}

//! `p2p-source-producer` (llm-d, alpha): name a peer holding more of the prompt's prefix than
//! the pod that will compute it, so that pod pulls the cached prefix over the P2P KV tier
//! instead of recomputing it (`x-kv-cache-source-host-port`, honoured by the sidecar with the
//! `offloading` connector or NIXL v2 with `--enable-p2p-pull`).
//!
//! As upstream (`pkg/epp/framework/plugins/requestcontrol/dataproducer/p2psource`):
//! - among every candidate holding any of the prompt, those within one block of the most
//!   cached tokens are eligible; one is drawn with weight `1 / (1 + waiting queue)` (upstream
//!   draws with a hash of the request id; epp with the scheduler's random source);
//! - the computing pod is the prefill pick under P/D, else the destination; the header is set
//!   when the drawn peer is another pod holding at least `minCachedTokenDelta` more tokens
//!   (tiers are not distinguished: epp's prefix index has none); otherwise a client's value is
//!   removed.

use super::KV_SOURCE_HEADER;
use crate::endpoint::EndpointId;
use crate::plugin::Invalid;
use crate::scheduling::{Candidate, SchedulingRequest};
use rand::Rng;

#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct P2pSourceProducer {
    /// The producer of prefix match information (epp has one index per configuration).
    pub(crate) prefix_match_info_producer_name: String,
    pub(crate) min_cached_token_delta: i64,
    /// The prefill profile's name (its pick computes the prefix under P/D).
    pub(crate) prefill_profile_name: String,
}

impl Default for P2pSourceProducer {
    fn default() -> Self {
        Self {
            prefix_match_info_producer_name: String::new(),
            min_cached_token_delta: 1,
            prefill_profile_name: String::new(),
        }
    }
}

impl P2pSourceProducer {
    pub(crate) fn validate(self) -> Result<Self, Invalid> {
        if self.min_cached_token_delta < 1 {
            return Err(Invalid::new(
                "minCachedTokenDelta",
                format!(
                    "p2p-source-producer: minCachedTokenDelta must be >= 1, got {}",
                    self.min_cached_token_delta
                ),
            ));
        }
        Ok(self)
    }

    /// The header for a request computed on `computing`: `Some(peer)` or removed.
    pub(crate) fn header(
        &self,
        req: &SchedulingRequest<'_>,
        candidates: &[Candidate],
        computing: EndpointId,
        rng: &mut impl Rng,
    ) -> (&'static str, Option<String>) {
        let source = self
            .draw(req, candidates, rng)
            .filter(|(id, _)| *id != computing)
            .filter(|(_, cached)| {
                let have = candidates
                    .iter()
                    .find(|c| c.id == computing)
                    .map_or(0, |c| cached_tokens(req, c));
                (*cached as i64 - have as i64) >= self.min_cached_token_delta
            });
        (KV_SOURCE_HEADER, source.map(|(id, _)| id.to_string()))
    }

    /// A peer within one block of the most cached tokens, weighted by `1 / (1 + waiting)`.
    fn draw(
        &self,
        req: &SchedulingRequest<'_>,
        candidates: &[Candidate],
        rng: &mut impl Rng,
    ) -> Option<(EndpointId, usize)> {
        let most = candidates.iter().map(|c| cached_tokens(req, c)).max()?;
        if most == 0 {
            return None;
        }
        let eligible: Vec<(&Candidate, f64)> = candidates
            .iter()
            .filter(|c| cached_tokens(req, c) + req.block_size >= most)
            .map(|c| (c, 1.0 / (1.0 + c.waiting.max(0.0))))
            .collect();
        let total: f64 = eligible.iter().map(|(_, w)| w).sum();
        let mut target = rng.random::<f64>() * total;
        for (c, w) in &eligible {
            if target < *w {
                return Some((c.id, cached_tokens(req, c)));
            }
            target -= w;
        }
        eligible.last().map(|(c, _)| (c.id, cached_tokens(req, c)))
    }
}

fn cached_tokens(req: &SchedulingRequest<'_>, c: &Candidate) -> usize {
    c.prefix_blocks * req.block_size
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::cand;
    use rand::{rngs::SmallRng, SeedableRng};

    fn req() -> SchedulingRequest<'static> {
        SchedulingRequest {
            prompt_tokens: 1_000,
            prefix_total_blocks: 62,
            block_size: 16,
            ..Default::default()
        }
    }

    #[test]
    fn names_the_peer_holding_more_than_the_computing_pod() {
        let p = P2pSourceProducer::default().validate().unwrap();
        let mut rng = SmallRng::seed_from_u64(1);
        let cands = [
            cand(1, 0.0, 0.0, 0),
            cand(2, 0.0, 0.0, 40),
            cand(3, 0.0, 0.0, 10),
        ];
        let (name, value) = p.header(&req(), &cands, cands[0].id, &mut rng);
        assert_eq!(
            (name, value),
            (KV_SOURCE_HEADER, Some(cands[1].id.to_string()))
        );
        let (_, own) = p.header(&req(), &cands, cands[1].id, &mut rng);
        assert_eq!(own, None, "never the computing pod itself");
        let nothing = [cand(1, 0.0, 0.0, 0), cand(2, 0.0, 0.0, 0)];
        assert_eq!(p.header(&req(), &nothing, nothing[0].id, &mut rng).1, None);
    }

    #[test]
    fn the_delta_gates_and_queues_weigh_the_draw() {
        let strict = P2pSourceProducer {
            min_cached_token_delta: 200,
            ..P2pSourceProducer::default()
        };
        let mut rng = SmallRng::seed_from_u64(2);
        let cands = [cand(1, 0.0, 0.0, 30), cand(2, 0.0, 0.0, 40)];
        assert_eq!(
            strict.header(&req(), &cands, cands[0].id, &mut rng).1,
            None,
            "160 < 200"
        );
        let p = P2pSourceProducer::default();
        // Two peers tie at 40 blocks; the one with 9 queued gets 1/10 the weight of the idle one.
        let cands = [
            cand(1, 0.0, 0.0, 0),
            cand(2, 9.0, 0.0, 40),
            cand(3, 0.0, 0.0, 40),
        ];
        let idle = (0..1000)
            .filter(|_| {
                p.header(&req(), &cands, cands[0].id, &mut rng).1 == Some(cands[2].id.to_string())
            })
            .count();
        assert!((850..970).contains(&idle), "{idle}");
        let v: serde_norway::Value = serde_norway::from_str("{minCachedTokenDelta: 0}").unwrap();
        let bad: P2pSourceProducer = serde_norway::from_value(v).unwrap();
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("must be >= 1"));
    }
}

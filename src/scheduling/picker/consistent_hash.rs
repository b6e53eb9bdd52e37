//! `consistent-hash-picker`: consistent hashing with bounded loads (CHWBL, Mirrokni, Thorup and
//! Zadimoghaddam 2016), for cache affinity without a prefix index.
//!
//! # Algorithm
//! The key is [`SchedulingRequest::affinity_key`]: a hash of the `x-session-token` when the
//! client sent one, else the prompt's first block hash, so requests sharing a session or a
//! system prompt land on the same pod. Each candidate owns `virtualNodes` points on a 64-bit
//! ring; walking clockwise from the key, the first point of each endpoint gives the walk order.
//! The bound: with `L` requests outstanding over `n` candidates, an endpoint may take the
//! request only while its load is below `⌈c·(L+1)/n⌉` (`c` = `loadFactor`); the walk skips the
//! others. At least one candidate is always below the bound (the least loaded one is), and with
//! `c` → ∞ this is plain consistent hashing.
//!
//! The order is computed per request as "minimum clockwise distance over each endpoint's
//! points", which is exactly the ring walk, with no ring to build, cache or invalidate when
//! the candidate set changes: O(n·v) mixes of 64-bit words (about 1 µs for 10 endpoints × 100
//! points). Points derive from the endpoint address alone, so every epp replica agrees.
//! Fallbacks (`maxNumOfEndpoints` > 1) continue the walk, eligible endpoints first. Without a
//! key the picker behaves as `max-score-picker`.

use super::{max_score::MaxScorePicker, PickerParams};
use crate::endpoint::EndpointId;
use crate::plugin::Invalid;
use crate::scheduling::{Candidate, SchedulingRequest};
use rand::Rng;
use std::net::IpAddr;

#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub(crate) struct ConsistentHashParams {
    pub(crate) max_num_of_endpoints: usize,
    /// `c`: an endpoint is skipped while its load is at or above `⌈c × (L+1)/n⌉`.
    pub(crate) load_factor: f64,
    /// Points per endpoint on the ring; more points, more even key spread.
    pub(crate) virtual_nodes: u32,
}

impl Default for ConsistentHashParams {
    fn default() -> Self {
        Self {
            max_num_of_endpoints: 1,
            load_factor: 1.25,
            virtual_nodes: 100,
        }
    }
}

impl ConsistentHashParams {
    pub(crate) fn validate(self) -> Result<Self, Invalid> {
        if self.max_num_of_endpoints == 0 {
            return Err(Invalid::new(
                "maxNumOfEndpoints",
                "maxNumOfEndpoints must be >= 1",
            ));
        }
        if !(self.load_factor.is_finite() && self.load_factor >= 1.0) {
            return Err(Invalid::new(
                "loadFactor",
                format!(
                    "loadFactor must be a number >= 1.0, got {}",
                    self.load_factor
                ),
            ));
        }
        if !(1..=1000).contains(&self.virtual_nodes) {
            return Err(Invalid::new(
                "virtualNodes",
                format!(
                    "virtualNodes must be in 1..=1000, got {}",
                    self.virtual_nodes
                ),
            ));
        }
        Ok(self)
    }
}

#[derive(Clone, Debug)]
pub struct ConsistentHashPicker {
    pub(crate) params: ConsistentHashParams,
}

/// SplitMix64's finaliser: a cheap, well-mixed bijection on 64-bit words.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A stable hash of the address (not `std`'s randomly seeded hasher: replicas must agree).
fn address_hash(id: EndpointId) -> u64 {
    let mut buf = [0u8; 18];
    match id.0.ip() {
        IpAddr::V4(v4) => buf[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => buf[..16].copy_from_slice(&v6.octets()),
    }
    buf[16..].copy_from_slice(&id.0.port().to_be_bytes());
    xxhash_rust::xxh64::xxh64(&buf, 0x6368_776c)
}

impl ConsistentHashPicker {
    /// Clockwise distance from `key` to the endpoint's nearest point.
    fn distance(&self, id: EndpointId, key: u64) -> u64 {
        let base = address_hash(id);
        (0..u64::from(self.params.virtual_nodes))
            .map(|i| mix(base ^ mix(i + 1)).wrapping_sub(key))
            .min()
            .unwrap_or(u64::MAX)
    }

    pub(crate) fn pick(
        &self,
        req: &SchedulingRequest<'_>,
        scored: &[(&Candidate, f64)],
        rng: &mut impl Rng,
    ) -> Vec<EndpointId> {
        let Some(key) = req.affinity_key else {
            let fallback = PickerParams {
                max_num_of_endpoints: self.params.max_num_of_endpoints,
            };
            return MaxScorePicker { params: fallback }.pick(scored, rng);
        };
        let load = |c: &Candidate| (c.running + c.waiting).max(0.0);
        let total: f64 = scored.iter().map(|(c, _)| load(c)).sum();
        let bound = (self.params.load_factor * (total + 1.0) / scored.len().max(1) as f64).ceil();
        let mut walk: Vec<(bool, u64, EndpointId)> = scored
            .iter()
            .map(|(c, _)| (load(c) >= bound, self.distance(c.id, key), c.id))
            .collect();
        walk.sort_unstable();
        walk.into_iter()
            .take(self.params.max_num_of_endpoints)
            .map(|(_, _, id)| id)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::cand;
    use proptest::prelude::*;
    use rand::{rngs::SmallRng, SeedableRng};

    fn picker(load_factor: f64, n: usize) -> ConsistentHashPicker {
        ConsistentHashPicker {
            params: ConsistentHashParams {
                max_num_of_endpoints: n,
                load_factor,
                virtual_nodes: 100,
            },
        }
    }

    fn keyed(key: u64) -> SchedulingRequest<'static> {
        SchedulingRequest {
            affinity_key: Some(key),
            ..Default::default()
        }
    }

    #[test]
    fn same_key_same_endpoint_and_keys_spread() {
        let cands: Vec<_> = (1..=4).map(|p| cand(p, 0.0, 0.0, 0)).collect();
        let scored: Vec<_> = cands.iter().map(|c| (c, 0.0)).collect();
        let p = picker(1.25, 1);
        let mut rng = SmallRng::seed_from_u64(1);
        let first = p.pick(&keyed(42), &scored, &mut rng);
        assert!((0..10).all(|_| p.pick(&keyed(42), &scored, &mut rng) == first));
        let mut per = std::collections::HashMap::new();
        for k in 0..4000u64 {
            *per.entry(p.pick(&keyed(mix(k)), &scored, &mut rng)[0])
                .or_insert(0usize) += 1;
        }
        assert_eq!(per.len(), 4);
        assert!(
            per.values().all(|n| (700..1300).contains(n)),
            "uneven key spread: {per:?}"
        );
    }

    #[test]
    fn an_overloaded_owner_is_skipped_and_becomes_a_late_fallback() {
        let mut cands: Vec<_> = (1..=3).map(|p| cand(p, 0.0, 0.0, 0)).collect();
        let scored: Vec<_> = cands.iter().map(|c| (c, 0.0)).collect();
        let mut rng = SmallRng::seed_from_u64(2);
        let owner = picker(1.25, 1).pick(&keyed(7), &scored, &mut rng)[0];
        let i = cands.iter().position(|c| c.id == owner).unwrap();
        // 6 outstanding over 3 pods: the bound is ⌈1.25 × 7 / 3⌉ = 3; the owner holds 6.
        cands[i].running = 6.0;
        let scored: Vec<_> = cands.iter().map(|c| (c, 0.0)).collect();
        let picked = picker(1.25, 3).pick(&keyed(7), &scored, &mut rng);
        assert_ne!(picked[0], owner);
        assert_eq!(picked[2], owner);
        // A generous bound keeps the affinity.
        assert_eq!(picker(10.0, 1).pick(&keyed(7), &scored, &mut rng)[0], owner);
    }

    #[test]
    fn without_a_key_the_best_score_wins_and_parameters_are_checked() {
        let cands: Vec<_> = (1..=2).map(|p| cand(p, 0.0, 0.0, 0)).collect();
        let scored = [(&cands[0], 0.1), (&cands[1], 0.9)];
        let mut rng = SmallRng::seed_from_u64(3);
        assert_eq!(
            picker(1.25, 1).pick(&SchedulingRequest::default(), &scored, &mut rng),
            vec![cands[1].id]
        );
        let bad = ConsistentHashParams {
            load_factor: 0.5,
            ..Default::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("loadFactor"));
        let bad = ConsistentHashParams {
            virtual_nodes: 0,
            ..Default::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("virtualNodes"));
    }

    proptest! {
        #[test]
        fn primary_respects_the_bound_and_removing_others_keeps_it(
            loads in proptest::collection::vec(0.0f64..20.0, 2..10),
            key in any::<u64>(),
            c in 1.0f64..3.0,
        ) {
            let cands: Vec<_> = loads.iter().enumerate().map(|(i, l)| Candidate { running: l.floor(), ..cand(i as u16 + 1, 0.0, 0.0, 0) }).collect();
            let scored: Vec<_> = cands.iter().map(|c| (c, 0.0)).collect();
            let mut rng = SmallRng::seed_from_u64(0);
            let p = picker(c, 1);
            let primary = p.pick(&keyed(key), &scored, &mut rng)[0];
            let total: f64 = cands.iter().map(|c| c.running).sum();
            let bound = (c * (total + 1.0) / cands.len() as f64).ceil();
            let chosen = cands.iter().find(|x| x.id == primary).unwrap();
            prop_assert!(chosen.running < bound);
            // Consistency: with no load, dropping a non-owner leaves the owner in place.
            let idle: Vec<_> = cands.iter().map(|x| Candidate { running: 0.0, ..x.clone() }).collect();
            let all: Vec<_> = idle.iter().map(|c| (c, 0.0)).collect();
            let owner = picker(1e9, 1).pick(&keyed(key), &all, &mut rng)[0];
            let fewer: Vec<_> = all.iter().filter(|(x, _)| x.id != owner).skip(1).chain(all.iter().filter(|(x, _)| x.id == owner)).copied().collect();
            prop_assert_eq!(picker(1e9, 1).pick(&keyed(key), &fewer, &mut rng)[0], owner);
        }
    }
}

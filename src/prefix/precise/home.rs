//! The home of the part of a prompt no endpoint holds: where every epp replica sends it, without
//! talking to the others.
//!
//! Why: speculative entries ([`super::PreciseIndex::speculate`]) keep a burst on a new prefix
//! together only inside the replica that routed it. Until the chosen pod's first BlockStored
//! arrives (one prefill), the other replicas see the prefix as cold and place it by load, so a
//! burst spread over three replicas prefills the same prefix on up to three pods, and the copies
//! evict other prefixes. Rendezvous hashing on the first block nobody holds picks the same
//! endpoint in every replica. The home is credited with half of that unheld part
//! ([`HOME_CREDIT`]) on top of what it holds, so the precise scorer prefers it among pods of
//! similar load while the load scorers (and the scorer's saturation cut-off) still send the
//! prompt elsewhere when the home is busier.
//!
//! The home is chosen among the endpoints holding the longest cached prefix (all endpoints when
//! nobody holds any block), so it never pulls a prompt away from the blocks it shares with others.
//! Keying on the first *unheld* block, not the prompt's first block, matters when every prompt
//! starts alike: a chat template's fixed header, or a system prompt every pod holds, would give
//! all prompts one home, or (if only fully cold prompts had one) none at all.
//! A prompt some endpoint holds whole has no home.
//!
//! The home agrees across replicas only while its inputs stay put, and they move while the first
//! request waits for its prefill (its own load, other prompts' events). Replicas that share their
//! speculative entries (`crate::replicas`) do not depend on it after the first request.

use super::CacheShape;
use crate::endpoint::EndpointId;
use std::net::IpAddr;

/// How far above the mean scraped load (waiting + running) a home may be: CHWBL's bound.
const HOME_LOAD_FACTOR: f64 = 1.25;

/// How many of the best-ranked endpoints compete for a home; the cheapest by its cache shape
/// wins ([`HomeCandidate::cost`], [`HOME_HYSTERESIS`]). One (plain rendezvous) placed a cold
/// prefix by its hash alone: at low load the scorers' load differences were too small to
/// override it, so 48 prefixes hashed over 8 pods gave one pod 9 of them and another 2, and a
/// single replica's hit rate fell to 53% against the approximate router's 82% (quick
/// shared-prefix bench at 9 req/s: pod spread CV 0.38, TTFT p90 4.9 s). Two choices (the
/// power-of-two-choices bound) left 4 to 8 prefixes per pod; three narrow that further in a
/// placement simulation (mean max − min over 48 prefixes and 8 pods: 3.2 with two, 2.4 with
/// three). More choices spread better but give the replicas more ways to disagree.
const HOME_CHOICES: usize = 3;

/// The share of the prompt a home is credited with, as if it held that many blocks. Half, not
/// all: with the whole prompt credited, a cold prompt went to its home over any load difference
/// (prefix weight 4 against load scorers worth 3 in `hack/bench/epp-precise.yaml`), and one
/// replica's pods ended up unevenly loaded. Quick shared-prefix bench at 12 req/s, TTFT p90 of
/// one replica in 5 runs: 5.5–18 s (median 10.2 s; pod spread CV 0.25–0.36); with half, 1.1,
/// 1.4 and 16 s in 3 runs. Three replicas: 1.6–8.9 s (median 2.9 s) with the whole prompt,
/// 2.9–5.0 s with half, 5.3–8.0 s with no home at all. BENCHMARKS.md, "cold-prompt home credit".
pub(crate) const HOME_CREDIT: f64 = 0.5;

/// An endpoint as the home choice sees it: only what every replica knows alike.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HomeCandidate {
    pub id: EndpointId,
    /// Waiting + running as the pod last reported them (scraped, never this replica's own
    /// dispatch counts).
    pub load: f64,
    /// What the pod's KV events say it holds and lost ([`super::PreciseIndex::shapes`]).
    pub cache: CacheShape,
}

impl HomeCandidate {
    /// Prompt beginnings held plus those evicted lately, each against its pool mean (+1, so an
    /// idle pool compares counts rather than dividing by zero). A prefix homed on a pod keeps
    /// coming back to it, so what a pod holds is what it will serve; a pod that evicts prompt
    /// beginnings holds more than its cache fits, and sending the evicted prompt back to it
    /// evicts the next one (the thrash that made a single precise replica's eviction misses
    /// 2–16 per 354 requests against the approximate router's 0–1).
    ///
    /// Only event-derived figures, never the scraped load: a replica's own request raises its
    /// home's load at the next scrape, long before the pod's BlockStored makes the prompt warm,
    /// so a load term flipped the next replica's choice to the other rank and the prefix was
    /// prefilled on both (three replicas' hit rate 64–72% against one's 78–81%). Load enters
    /// through the bound in [`home`] and the profile's load scorers.
    fn cost(&self, mean_prefixes: f64, mean_lost: f64) -> f64 {
        f64::from(self.cache.prefixes) / (mean_prefixes + 1.0) + self.cache.lost / (mean_lost + 1.0)
    }
}

/// Another of the best ranks becomes the home only when it is cheaper than the best rank by more
/// than this, in units of one
/// prefix at the pool mean: one prompt beginning arriving or leaving elsewhere between two
/// replicas' decisions does not flip the choice, two do (1.5 rather than 1: floating-point
/// equality at exactly one). A wider margin (3 and 3.5, 7 pairs of runs) did not help three replicas
/// (mean TTFT 349 ms against 347) and hurt one (442 ms against 262: its pods evened out less);
/// BENCHMARKS.md, "Where a home goes".
const HOME_HYSTERESIS: f64 = 1.5;

/// `(home, blocks credited)` for a prompt of `keys` whose longest held prefix (over `matches`,
/// the held and speculative runs per endpoint) is shorter than the prompt: the home holds that
/// prefix, and is credited with it plus [`HOME_CREDIT`] of the rest, at least one block more.
///
/// Ranks are by the key of the first block nobody holds. The home is the best rank, or the
/// cheapest of the [`HOME_CHOICES`] best when its cache is clearly less committed
/// ([`HomeCandidate::cost`], [`HOME_HYSTERESIS`]), among the candidates whose load is within [`HOME_LOAD_FACTOR`] × the mean load + 1 (bounded-load
/// rendezvous, as CHWBL bounds consistent hashing). Plain rendezvous ignores load, and a home's
/// credit outweighs the load scorers in prefix-heavy profiles: with it the precise router's pods
/// served 13 to 61 of 345 requests in the quick bench (CV 0.40), with the bound CV 0.20
/// (BENCHMARKS.md, "Three replicas behind a real Envoy"). Everything compared is what every
/// replica scrapes and receives alike, so the replicas agree (up to one scrape interval and
/// event delivery).
pub fn home(
    keys: &[u64],
    matches: &[(EndpointId, usize)],
    candidates: impl IntoIterator<Item = HomeCandidate>,
) -> Option<(EndpointId, usize)> {
    let held = matches.iter().map(|(_, n)| *n).max().unwrap_or(0);
    let first = *keys.get(held)?;
    // Sorted, so the check is O(log holders): scanning every match per candidate was
    // O(endpoints × holders), 11.6 µs over 100 endpoints that each hold part of the prompt.
    let mut longest: Vec<EndpointId> = matches
        .iter()
        .filter(|(_, n)| held > 0 && *n == held)
        .map(|(id, _)| *id)
        .collect();
    longest.sort_unstable();
    let holds = |c: &HomeCandidate| held == 0 || longest.binary_search(&c.id).is_ok();
    let all: Vec<HomeCandidate> = candidates.into_iter().collect();
    let n = all.len().max(1) as f64;
    let mean_load = all.iter().map(|c| c.load.max(0.0)).sum::<f64>() / n;
    let mean_prefixes = all.iter().map(|c| f64::from(c.cache.prefixes)).sum::<f64>() / n;
    let mean_lost = all.iter().map(|c| c.cache.lost).sum::<f64>() / n;
    let bound = mean_load * HOME_LOAD_FACTOR + 1.0;
    // With nothing held, the least loaded candidate is always within the bound; holders may all
    // be over it, and then there is no home: the scorers place the prompt by load.
    let mut ranked: Vec<(u64, HomeCandidate)> = all
        .iter()
        .filter(|c| holds(c) && c.load <= bound)
        .map(|c| (mix(first ^ endpoint_hash(c.id)), *c))
        .collect();
    // Only the best few are compared: select them (linear), then order those.
    let by_rank = |(rank, c): &(u64, HomeCandidate)| std::cmp::Reverse((*rank, c.id));
    if ranked.len() > HOME_CHOICES {
        ranked.select_nth_unstable_by_key(HOME_CHOICES - 1, by_rank);
        ranked.truncate(HOME_CHOICES);
    }
    ranked.sort_unstable_by_key(by_rank);
    let (_, top) = ranked.first()?;
    let cost = |c: &HomeCandidate| c.cost(mean_prefixes, mean_lost);
    // `min_by` keeps the first of equal costs: the better rank.
    let cheapest = ranked
        .iter()
        .map(|(_, c)| c)
        .min_by(|a, b| cost(a).total_cmp(&cost(b)))?;
    let home = if cost(cheapest) + HOME_HYSTERESIS / (mean_prefixes + 1.0) < cost(top) {
        cheapest
    } else {
        top
    };
    let credit = held + ((keys.len() - held) as f64 * HOME_CREDIT).round() as usize;
    Some((home.id, credit.max(held + 1)))
}

/// A hash of the endpoint's address that every replica computes alike (no per-process seed).
fn endpoint_hash(id: EndpointId) -> u64 {
    let ip = match id.0.ip() {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    };
    mix((ip as u64) ^ mix((ip >> 64) as u64) ^ (u64::from(id.0.port()) << 48))
}

/// SplitMix64's finalizer: a bijective, well-mixed 64-bit hash.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: u8) -> Vec<HomeCandidate> {
        (1..=n)
            .map(|i| HomeCandidate {
                id: EndpointId(format!("10.0.0.{i}:8000").parse().unwrap()),
                load: 0.0,
                cache: CacheShape::default(),
            })
            .collect()
    }

    #[test]
    fn every_replica_picks_the_same_home_whatever_the_candidate_order() {
        let mut c = ids(4);
        let first = home(&[7, 8, 9, 10], &[], c.clone()).unwrap();
        c.reverse();
        assert_eq!(home(&[7, 8, 9, 10], &[], c).unwrap(), first);
        assert_eq!(first.1, 2, "credited with half the prompt");
        assert_eq!(home(&[7], &[], ids(4)).unwrap().1, 1, "at least one block");
    }

    #[test]
    fn first_blocks_spread_over_the_endpoints() {
        let c = ids(4);
        let mut per = std::collections::HashMap::new();
        for key in 0..4000u64 {
            *per.entry(
                home(&[key.wrapping_mul(0x2545_f491_4f6c_dd1d)], &[], c.clone())
                    .unwrap()
                    .0,
            )
            .or_insert(0) += 1;
        }
        assert_eq!(per.len(), 4);
        assert!(per.values().all(|n| (800..1200).contains(n)), "{per:?}");
    }

    #[test]
    fn wholly_held_or_empty_prompts_have_no_home() {
        let c = ids(3);
        assert_eq!(
            home(&[1, 2], &[(c[0].id, 2), (c[1].id, 1)], c.clone()),
            None
        );
        assert_eq!(home(&[], &[], c.clone()), None);
        assert_eq!(home(&[1], &[], Vec::new()), None);
    }

    #[test]
    fn a_header_every_pod_holds_does_not_give_every_prompt_one_home() {
        // Every prompt starts with the same block (a chat template's header), held everywhere.
        let c = ids(8);
        let all_hold: Vec<(EndpointId, usize)> = c.iter().map(|x| (x.id, 1)).collect();
        let mut per = std::collections::HashMap::new();
        for k in 0..800u64 {
            let keys = [7, k.wrapping_mul(0x2545_f491_4f6c_dd1d), 9, 10];
            let (h, credit) = home(&keys, &all_hold, c.clone()).unwrap();
            assert_eq!(
                credit,
                1 + 2,
                "the header plus half of the other three blocks"
            );
            *per.entry(h).or_insert(0) += 1;
        }
        assert_eq!(per.len(), 8, "{per:?}");
    }

    #[test]
    fn the_home_is_one_of_the_longest_holders() {
        let c = ids(8);
        let matches = [(c[2].id, 3), (c[5].id, 3), (c[6].id, 1)];
        let mut seen = std::collections::HashSet::new();
        for k in 0..200u64 {
            let keys = [1, 2, 3, k.wrapping_mul(0x9e37_79b9), 5, 6, 7];
            let (h, credit) = home(&keys, &matches, c.clone()).unwrap();
            assert_eq!(credit, 3 + 2, "held 3, half of the other 4");
            seen.insert(h);
        }
        assert_eq!(
            seen,
            [c[2].id, c[5].id].into_iter().collect(),
            "never a pod without the shared prefix"
        );
        let mut busy = c.clone();
        busy[2].load = 20.0;
        busy[5].load = 20.0; // mean 5, bound 7.25: both holders over it
        assert_eq!(
            home(&[1, 2, 3, 4], &matches, busy),
            None,
            "busy holders: the scorers place it"
        );
    }

    #[test]
    fn removing_an_endpoint_moves_only_its_homes() {
        let c = ids(4);
        let keys: Vec<u64> = (0..400u64).map(|k| k.wrapping_mul(0x9e37_79b9)).collect();
        let before: Vec<EndpointId> = keys
            .iter()
            .map(|k| home(&[*k], &[], c.clone()).unwrap().0)
            .collect();
        let after: Vec<EndpointId> = keys
            .iter()
            .map(|k| home(&[*k], &[], c[..3].to_vec()).unwrap().0)
            .collect();
        let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count();
        assert_eq!(moved, before.iter().filter(|b| **b == c[3].id).count());
    }

    #[test]
    fn a_home_far_above_the_mean_load_passes_to_the_next_in_rank() {
        let mut c = ids(4);
        let keys: Vec<u64> = (0..400u64).map(|k| k.wrapping_mul(0x9e37_79b9)).collect();
        let idle: Vec<EndpointId> = keys
            .iter()
            .map(|k| home(&[*k], &[], c.clone()).unwrap().0)
            .collect();
        c[0].load = 12.0; // mean 3, bound 4.75: pod 0 is over it; the others (0) are not
        let busy: Vec<EndpointId> = keys
            .iter()
            .map(|k| home(&[*k], &[], c.clone()).unwrap().0)
            .collect();
        assert!(
            busy.iter().all(|h| *h != c[0].id),
            "no new home on the overloaded pod"
        );
        let kept = idle
            .iter()
            .zip(&busy)
            .filter(|(i, b)| **i != c[0].id && i == b)
            .count();
        assert_eq!(
            kept,
            idle.iter().filter(|i| **i != c[0].id).count(),
            "other homes stay put"
        );
        c[0].load = 1.0; // mean 0.25, bound 1.31: within it, so its homes come back
        let near: Vec<EndpointId> = keys
            .iter()
            .map(|k| home(&[*k], &[], c.clone()).unwrap().0)
            .collect();
        assert_eq!(near, idle);
    }

    #[test]
    fn the_least_committed_of_the_best_ranks_is_the_home() {
        let key = [42u64];
        let base: Vec<HomeCandidate> = ids(5)
            .into_iter()
            .map(|mut x| {
                x.cache.prefixes = 6;
                x
            })
            .collect();
        // Rank order: with equal costs the best rank wins; remove it and ask again.
        let mut ranks: Vec<EndpointId> = Vec::new();
        let mut probe = base.clone();
        while ranks.len() < 4 {
            let h = home(&key, &[], probe.clone()).unwrap().0;
            ranks.push(h);
            probe.retain(|x| x.id != h);
        }
        let with = |f: &dyn Fn(&mut HomeCandidate, usize)| {
            let mut c = base.clone();
            for x in &mut c {
                let r = ranks.iter().position(|id| *id == x.id).unwrap_or(9);
                f(x, r);
            }
            home(&key, &[], c).unwrap().0
        };
        assert_eq!(with(&|_, _| {}), ranks[0]);
        assert_eq!(
            with(&|x, r| if r == 0 {
                x.load = 1.0
            }),
            ranks[0],
            "load within the bound does not move a home"
        );
        assert_eq!(
            with(&|x, r| if r == 0 {
                x.cache.prefixes = 7
            }),
            ranks[0],
            "one prefix more is within the hysteresis"
        );
        assert_eq!(
            with(&|x, r| if r == 0 {
                x.cache.prefixes = 8
            }),
            ranks[1],
            "two more: the next rank"
        );
        assert_eq!(
            with(&|x, r| if r == 0 {
                x.cache.lost = 3.0
            }),
            ranks[1],
            "a pod that evicts prompt beginnings is avoided"
        );
        assert_eq!(
            with(&|x, r| if r < 2 {
                x.cache.lost = 3.0
            }),
            ranks[2]
        );
        assert_eq!(
            with(&|x, r| if r < 3 {
                x.cache.lost = 3.0
            }),
            ranks[0],
            "the three best evict alike: the best rank"
        );
        let only_three =
            |x: &mut HomeCandidate, r: usize| x.cache.prefixes = if r == 3 { 0 } else { 9 };
        assert_eq!(
            with(&only_three),
            ranks[0],
            "the fourth holds fewer, but only three ranks compete"
        );
    }

    #[test]
    fn homes_placed_one_by_one_stay_even() {
        // Idle pods: each new home holds one more prefix.
        let mut c = ids(8);
        for key in 0..480u64 {
            let home = home(&[key.wrapping_mul(0x2545_f491_4f6c_dd1d)], &[], c.clone())
                .unwrap()
                .0;
            c.iter_mut().find(|x| x.id == home).unwrap().cache.prefixes += 1;
        }
        let held: Vec<u32> = c.iter().map(|x| x.cache.prefixes).collect();
        let (min, max) = (held.iter().min().unwrap(), held.iter().max().unwrap());
        assert!(max - min <= 6, "{held:?}");
    }
}

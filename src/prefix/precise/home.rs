//! A cold prompt's home endpoint: where every epp replica sends a prompt that no endpoint holds
//! any block of, without talking to the others.
//!
//! Why: speculative entries ([`super::PreciseIndex::speculate`]) keep a burst on a new prefix
//! together only inside the replica that routed it. Until the chosen pod's first BlockStored
//! arrives (one prefill), the other replicas see the prefix as cold and place it by load, so a
//! burst spread over three replicas prefills the same prefix on up to three pods, and the copies
//! evict other prefixes. Rendezvous hashing on the prompt's first block key picks the same
//! endpoint in every replica. The home is credited with half the prompt ([`HOME_CREDIT`]), so
//! the precise scorer prefers it among pods of similar load while the load scorers (and the
//! scorer's saturation cut-off) still send the prompt elsewhere when the home is busier.
//!
//! Only fully cold prompts get a home: once any endpoint holds (or speculatively holds) the first
//! block, real matches decide, so a warm prefix is never pulled away from its holders.

use super::CacheShape;
use crate::endpoint::EndpointId;
use std::net::IpAddr;

/// How far above the mean scraped load (waiting + running) a home may be: CHWBL's bound.
const HOME_LOAD_FACTOR: f64 = 1.25;

/// How many of the best-ranked endpoints compete for a home; the cheaper one by its cache shape
/// wins ([`HomeCandidate::cost`]). One (plain rendezvous) placed a cold prefix by its hash alone:
/// at low load the scorers' load differences were too small to override it, so 48 prefixes
/// hashed over 8 pods gave one pod 9 of them and another 2, and a single replica's hit rate fell
/// to 53% against the approximate router's 82% (quick shared-prefix bench at 9 req/s: pod spread
/// CV 0.38, TTFT p90 4.9 s). Two choices is the power-of-two-choices bound on the fullest bin.
const HOME_CHOICES: usize = 2;

/// The share of the prompt a home is credited with, as if it held that many blocks. Half, not
/// all: with the whole prompt credited, a cold prompt went to its home over any load difference
/// (prefix weight 4 against load scorers worth 3 in `hack/bench/epp-precise.yaml`), and one
/// replica's pods ended up unevenly loaded. Quick shared-prefix bench at 12 req/s, TTFT p90 of
/// one replica in 5 runs: 5.5–18 s (median 10.2 s; pod spread CV 0.25–0.36); with half, 1.1,
/// 1.4 and 16 s in 3 runs. Three replicas: 1.6–8.9 s (median 2.9 s) with the whole prompt,
/// 2.9–5.0 s with half, 5.3–8.0 s with no home at all. BENCHMARKS.md, "cold-prompt home credit".
pub const HOME_CREDIT: f64 = 0.5;

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
    /// through the bound in [`cold_home`] and the profile's load scorers.
    fn cost(&self, mean_prefixes: f64, mean_lost: f64) -> f64 {
        f64::from(self.cache.prefixes) / (mean_prefixes + 1.0) + self.cache.lost / (mean_lost + 1.0)
    }
}

/// The second rank becomes the home only when it is cheaper by more than this, in units of one
/// prefix at the pool mean: one prompt beginning arriving or leaving elsewhere between two
/// replicas' decisions does not flip the choice, two do (1.5 rather than 1: floating-point
/// equality at exactly one).
const HOME_HYSTERESIS: f64 = 1.5;

/// `(home, blocks credited)` when `matches` is empty and there are keys and candidates: the
/// credit is [`HOME_CREDIT`] of `keys.len()`, at least one block.
///
/// The home is the better-ranked of the [`HOME_CHOICES`] rendezvous winners, or the other when
/// its cache is clearly less committed ([`HomeCandidate::cost`], [`HOME_HYSTERESIS`]), among the
/// candidates whose load is within [`HOME_LOAD_FACTOR`] × the mean load + 1 (bounded-load
/// rendezvous, as CHWBL bounds consistent hashing). Plain rendezvous ignores load, and a home's
/// credit outweighs the load scorers in prefix-heavy profiles: with it the precise router's pods
/// served 13 to 61 of 345 requests in the quick bench (CV 0.40), with the bound CV 0.20
/// (BENCHMARKS.md, "Three replicas behind a real Envoy"). Everything compared is what every
/// replica scrapes and receives alike, so the replicas agree (up to one scrape interval and
/// event delivery).
pub fn cold_home(keys: &[u64], matches: &[(EndpointId, usize)], candidates: impl IntoIterator<Item = HomeCandidate>) -> Option<(EndpointId, usize)> {
    let first = *keys.first()?;
    if !matches.is_empty() {
        return None;
    }
    let all: Vec<HomeCandidate> = candidates.into_iter().collect();
    let n = all.len().max(1) as f64;
    let mean_load = all.iter().map(|c| c.load.max(0.0)).sum::<f64>() / n;
    let mean_prefixes = all.iter().map(|c| f64::from(c.cache.prefixes)).sum::<f64>() / n;
    let mean_lost = all.iter().map(|c| c.cache.lost).sum::<f64>() / n;
    let bound = mean_load * HOME_LOAD_FACTOR + 1.0;
    // The least loaded candidate is always within the bound, so the filter never empties.
    let mut ranked: Vec<(u64, HomeCandidate)> = all.iter().filter(|c| c.load <= bound).map(|c| (mix(first ^ endpoint_hash(c.id)), *c)).collect();
    ranked.sort_unstable_by(|a, b| (b.0, b.1.id).cmp(&(a.0, a.1.id)));
    let mut choices = ranked.iter().take(HOME_CHOICES).map(|(_, c)| c);
    let mut home = choices.next()?;
    let unit = 1.0 / (mean_prefixes + 1.0);
    for other in choices {
        if other.cost(mean_prefixes, mean_lost) + HOME_HYSTERESIS * unit < home.cost(mean_prefixes, mean_lost) {
            home = other;
        }
    }
    let credit = (keys.len() as f64 * HOME_CREDIT).round() as usize;
    Some((home.id, credit.max(1)))
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
        (1..=n).map(|i| HomeCandidate { id: EndpointId(format!("10.0.0.{i}:8000").parse().unwrap()), load: 0.0, cache: CacheShape::default() }).collect()
    }

    #[test]
    fn every_replica_picks_the_same_home_whatever_the_candidate_order() {
        let mut c = ids(4);
        let home = cold_home(&[7, 8, 9, 10], &[], c.clone()).unwrap();
        c.reverse();
        assert_eq!(cold_home(&[7, 8, 9, 10], &[], c).unwrap(), home);
        assert_eq!(home.1, 2, "credited with half the prompt");
        assert_eq!(cold_home(&[7], &[], ids(4)).unwrap().1, 1, "at least one block");
    }

    #[test]
    fn first_blocks_spread_over_the_endpoints() {
        let c = ids(4);
        let mut per = std::collections::HashMap::new();
        for key in 0..4000u64 {
            *per.entry(cold_home(&[key.wrapping_mul(0x2545_f491_4f6c_dd1d)], &[], c.clone()).unwrap().0).or_insert(0) += 1;
        }
        assert_eq!(per.len(), 4);
        assert!(per.values().all(|n| (800..1200).contains(n)), "{per:?}");
    }

    #[test]
    fn held_or_empty_prompts_have_no_home() {
        let c = ids(3);
        assert_eq!(cold_home(&[1, 2], &[(c[0].id, 1)], c.clone()), None);
        assert_eq!(cold_home(&[], &[], c.clone()), None);
        assert_eq!(cold_home(&[1], &[], Vec::new()), None);
    }

    #[test]
    fn removing_an_endpoint_moves_only_its_homes() {
        let c = ids(4);
        let keys: Vec<u64> = (0..400u64).map(|k| k.wrapping_mul(0x9e37_79b9)).collect();
        let before: Vec<EndpointId> = keys.iter().map(|k| cold_home(&[*k], &[], c.clone()).unwrap().0).collect();
        let after: Vec<EndpointId> = keys.iter().map(|k| cold_home(&[*k], &[], c[..3].to_vec()).unwrap().0).collect();
        let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count();
        assert_eq!(moved, before.iter().filter(|b| **b == c[3].id).count());
    }

    #[test]
    fn a_home_far_above_the_mean_load_passes_to_the_next_in_rank() {
        let mut c = ids(4);
        let keys: Vec<u64> = (0..400u64).map(|k| k.wrapping_mul(0x9e37_79b9)).collect();
        let idle: Vec<EndpointId> = keys.iter().map(|k| cold_home(&[*k], &[], c.clone()).unwrap().0).collect();
        c[0].load = 12.0; // mean 3, bound 4.75: pod 0 is over it; the others (0) are not
        let busy: Vec<EndpointId> = keys.iter().map(|k| cold_home(&[*k], &[], c.clone()).unwrap().0).collect();
        assert!(busy.iter().all(|h| *h != c[0].id), "no new home on the overloaded pod");
        let kept = idle.iter().zip(&busy).filter(|(i, b)| **i != c[0].id && i == b).count();
        assert_eq!(kept, idle.iter().filter(|i| **i != c[0].id).count(), "other homes stay put");
        c[0].load = 1.0; // mean 0.25, bound 1.31: within it, so its homes come back
        let near: Vec<EndpointId> = keys.iter().map(|k| cold_home(&[*k], &[], c.clone()).unwrap().0).collect();
        assert_eq!(near, idle);
    }

    #[test]
    fn the_less_committed_of_the_two_best_ranks_is_the_home() {
        let mut c = ids(4);
        for x in &mut c {
            x.cache.prefixes = 6;
        }
        let key = [42u64];
        let at = |c: &[HomeCandidate], id: EndpointId| c.iter().position(|x| x.id == id).unwrap();
        let first = cold_home(&key, &[], c.clone()).unwrap().0;
        let i = at(&c, first);
        c[i].load = 1.0; // mean 0.25, bound 1.31: within it
        assert_eq!(cold_home(&key, &[], c.clone()).unwrap().0, first, "load alone does not move a home within the bound");
        c[i].cache.prefixes = 7;
        assert_eq!(cold_home(&key, &[], c.clone()).unwrap().0, first, "one prefix more is within the hysteresis");
        c[i].cache.prefixes = 8;
        let second = cold_home(&key, &[], c.clone()).unwrap().0;
        assert_ne!(second, first, "two prefixes more: the other rank");
        c[i].cache.prefixes = 6;
        c[i].cache.lost = 3.0;
        assert_eq!(cold_home(&key, &[], c.clone()).unwrap().0, second, "a pod that evicts prompt beginnings is avoided");
        let j = at(&c, second);
        c[j].cache.lost = 3.0;
        assert_eq!(cold_home(&key, &[], c.clone()).unwrap().0, first, "both evict alike: the better rank");
        c[i].cache.prefixes = 9;
        c[j].cache.prefixes = 9;
        // The other two hold fewer, but only the two best ranks compete.
        assert_eq!(cold_home(&key, &[], c.clone()).unwrap().0, first);
    }

    #[test]
    fn homes_placed_one_by_one_stay_even() {
        // Idle pods: each new home holds one more prefix.
        let mut c = ids(8);
        for key in 0..480u64 {
            let home = cold_home(&[key.wrapping_mul(0x2545_f491_4f6c_dd1d)], &[], c.clone()).unwrap().0;
            c.iter_mut().find(|x| x.id == home).unwrap().cache.prefixes += 1;
        }
        let held: Vec<u32> = c.iter().map(|x| x.cache.prefixes).collect();
        let (min, max) = (held.iter().min().unwrap(), held.iter().max().unwrap());
        assert!(max - min <= 6, "{held:?}");
    }
}

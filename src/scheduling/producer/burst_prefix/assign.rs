//! The joint placement of one window's requests (llm-d v0.10's burst assignment, its rules
//! written anew): group identical prompts, place whole groups first and prefix-sharing single
//! requests after them, each on the least-loaded replica, a unit preferring a replica that
//! already holds a long enough shared prefix while that replica is under its fair share.

use crate::endpoint::EndpointId;
use std::collections::{HashMap, HashSet};

/// One request of a window: its prompt's chained block hashes and, once the window is placed,
/// the replica it goes to (`None`: no affinity, left to the other scorers).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) hashes: Vec<u64>,
    pub(super) assigned: Option<EndpointId>,
}

/// A replica as the window weighs it: ties go to fewer running requests (scraped), then to
/// the lower name.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Replica {
    pub(super) id: EndpointId,
    pub(super) name: String,
    pub(super) running: f64,
}

/// How a window places its units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Rules {
    /// Requests of one group a replica takes at most (`None`: the whole group on one).
    pub(super) per_replica: Option<usize>,
    /// Shared leading blocks that make two units co-locate (0: identical groups only).
    pub(super) min_colocate: usize,
    /// Balance prefix blocks (a prefix charged once per replica) instead of requests.
    pub(super) by_tokens: bool,
}

/// Places the window's `entries` over `replicas`, filling in each entry's `assigned`.
pub(super) fn assign(entries: &mut [Entry], replicas: &[Replica], rules: Rules) {
    if replicas.is_empty() {
        return;
    }
    let groups = group(entries);
    let shared = shared_prefixes(entries, &groups, rules.min_colocate);
    let cost = |g: &Vec<usize>| entries[g[0]].hashes.len();
    let (mut whole, mut single): (Vec<usize>, Vec<usize>) = (0..groups.len())
        .filter(|&g| groups[g].len() >= 2 || shared.contains(&g))
        .partition(|&g| groups[g].len() >= 2);
    // Longest prefix first (stable), so shorter units match against the most placed blocks.
    whole.sort_by_key(|&g| std::cmp::Reverse(cost(&groups[g])));
    single.sort_by_key(|&g| std::cmp::Reverse(cost(&groups[g])));
    let total: usize = whole
        .iter()
        .chain(&single)
        .map(|&g| match rules.by_tokens {
            true => cost(&groups[g]),
            false => groups[g].len(),
        })
        .sum();
    let mut window = Placing {
        replicas,
        rules,
        fair_share: total.div_ceil(replicas.len()),
        load: vec![0; replicas.len()],
        holders: HashMap::new(),
    };
    for g in whole.into_iter().chain(single) {
        window.place(entries, &groups[g]);
    }
}

/// The entries with a prompt, grouped by identical block hashes, in order of first arrival.
fn group(entries: &[Entry]) -> Vec<Vec<usize>> {
    let mut index: HashMap<&[u64], usize> = HashMap::new();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if e.hashes.is_empty() {
            continue;
        }
        let g = *index.entry(&e.hashes).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(i);
    }
    groups
}

/// The groups sharing at least `min` leading blocks with another request of the window (none
/// when `min` is 0): a single request takes part only then.
fn shared_prefixes(entries: &[Entry], groups: &[Vec<usize>], min: usize) -> HashSet<usize> {
    if min == 0 {
        return HashSet::new();
    }
    let lead = |g: &Vec<usize>| &entries[g[0]].hashes[..min];
    let long: Vec<usize> = (0..groups.len())
        .filter(|&g| entries[groups[g][0]].hashes.len() >= min)
        .collect();
    let mut requests: HashMap<&[u64], usize> = HashMap::new();
    for &g in &long {
        *requests.entry(lead(&groups[g])).or_default() += groups[g].len();
    }
    long.into_iter()
        .filter(|&g| requests[lead(&groups[g])] >= 2)
        .collect()
}

/// A window being placed: each replica's load and which replicas hold which blocks.
struct Placing<'r> {
    replicas: &'r [Replica],
    rules: Rules,
    /// A replica at this load takes no prefix-preferred unit (ceil of the total over replicas).
    fair_share: usize,
    /// Per replica, in the balanced quantity (requests, or prefix blocks).
    load: Vec<usize>,
    holders: HashMap<u64, HashSet<usize>>,
}

impl Placing<'_> {
    /// Places one unit (an identical group, or one prefix-sharing request): its first run on
    /// the replica its prefix prefers, the rest (past `per_replica`) on the least loaded.
    fn place(&mut self, entries: &mut [Entry], members: &[usize]) {
        let hashes = entries[members[0]].hashes.clone();
        let mut prefer = self.rules.min_colocate > 0;
        let matches = match prefer || self.rules.by_tokens {
            true => self.matches(&hashes),
            false => vec![0; self.replicas.len()],
        };
        let mut mine = vec![0usize; self.replicas.len()];
        let mut placed = 0;
        while placed < members.len() {
            let r = match prefer {
                true => self.preferred(&mine, &matches),
                false => None,
            };
            let r = r.unwrap_or_else(|| self.least_loaded(&mine));
            let mut run = members.len() - placed;
            if let Some(k) = self.rules.per_replica {
                // Past k on every replica: one more each, rebalancing.
                run = run.min(k.saturating_sub(mine[r]).max(1));
            }
            for &m in &members[placed..placed + run] {
                entries[m].assigned = Some(self.replicas[r].id);
            }
            self.charge(
                r,
                run,
                mine[r] == 0,
                hashes.len().saturating_sub(matches[r]),
            );
            mine[r] += run;
            placed += run;
            prefer = false;
        }
        for (r, n) in mine.iter().enumerate() {
            if *n > 0 {
                for h in &hashes {
                    self.holders.entry(*h).or_default().insert(r);
                }
            }
        }
    }

    /// Adds a run of `run` requests to replica `r`: requests, or (by tokens) the blocks it
    /// must still prefill, once per replica a unit lands on.
    fn charge(&mut self, r: usize, run: usize, first: bool, unheld: usize) {
        match (self.rules.by_tokens, first) {
            (false, _) => self.load[r] += run,
            (true, true) => self.load[r] += unheld,
            (true, false) => {}
        }
    }

    /// Per replica, the leading blocks of `hashes` it holds, up to the first block no replica
    /// of the window holds.
    fn matches(&self, hashes: &[u64]) -> Vec<usize> {
        let mut out = vec![0; self.replicas.len()];
        for h in hashes {
            let Some(held) = self.holders.get(h).filter(|s| !s.is_empty()) else {
                break;
            };
            for &r in held {
                out[r] += 1;
            }
        }
        out
    }

    /// Whether replica `r` takes more of this unit (under `per_replica`).
    fn has_room(&self, mine: &[usize], r: usize) -> bool {
        self.rules.per_replica.is_none_or(|k| mine[r] < k)
    }

    /// The replica sharing the longest prefix (at least `min_colocate` blocks) that has room
    /// and is under its fair share; ties to the less loaded.
    fn preferred(&self, mine: &[usize], matches: &[usize]) -> Option<usize> {
        (0..self.replicas.len())
            .filter(|&r| self.has_room(mine, r) && self.load[r] < self.fair_share)
            .filter(|&r| matches[r] >= self.rules.min_colocate)
            .reduce(|best, r| match matches[r].cmp(&matches[best]) {
                std::cmp::Ordering::Greater => r,
                std::cmp::Ordering::Equal if self.before(r, best) => r,
                _ => best,
            })
    }

    /// The least loaded replica with room for this unit, else the least loaded of all.
    fn least_loaded(&self, mine: &[usize]) -> usize {
        let pick = |room: bool| {
            (0..self.replicas.len())
                .filter(|&r| !room || self.has_room(mine, r))
                .reduce(|best, r| if self.before(r, best) { r } else { best })
        };
        pick(true).or_else(|| pick(false)).unwrap_or(0)
    }

    /// Whether replica `a` goes before `b`: less load in this window, then fewer running
    /// requests, then the lower name.
    fn before(&self, a: usize, b: usize) -> bool {
        let (ra, rb) = (&self.replicas[a], &self.replicas[b]);
        (self.load[a], ra.running, &ra.name) < (self.load[b], rb.running, &rb.name)
    }
}

#[cfg(test)]
mod tests;

//! The approximate index's tests: behaviour, capacity, the token scale, and the linked
//! structure held to a plain list per endpoint.

use super::*;
use proptest::prelude::*;

fn ep(n: u16) -> EndpointId {
    format!("10.0.0.1:{n}").parse().unwrap()
}

#[test]
fn counts_only_consecutive_blocks_per_endpoint() {
    let idx = PrefixIndex::new();
    idx.record(ep(1), &[1, 2, 3, 4], 100);
    idx.record(ep(2), &[1, 9, 3, 4], 100);
    let mut m = idx.longest_prefix(&[1, 2, 3, 4]);
    m.sort();
    assert_eq!(m, vec![(ep(1), 4), (ep(2), 1)]);
    assert!(
        idx.longest_prefix(&[7, 1]).is_empty(),
        "a miss on block 0 matches nothing"
    );
}

#[test]
fn lru_evicts_oldest_and_forgets_removed_endpoints() {
    let idx = PrefixIndex::new();
    idx.record(ep(1), &[1], 2);
    idx.record(ep(1), &[2], 2);
    idx.record(ep(1), &[3], 2);
    assert!(
        idx.longest_prefix(&[1]).is_empty(),
        "block 1 was least recently used"
    );
    assert_eq!(idx.longest_prefix(&[2]), vec![(ep(1), 1)]);
    idx.record(ep(2), &[2], 10);
    idx.retain(&[ep(2)].into_iter().collect());
    assert_eq!(idx.longest_prefix(&[2]), vec![(ep(2), 1)]);
    assert_eq!(idx.size(), 1);
}

#[test]
fn a_full_lru_evicts_a_prompts_tail_before_its_head() {
    let idx = PrefixIndex::new();
    idx.record(ep(1), &[1, 2, 3], 3);
    idx.record(ep(1), &[9], 3);
    assert_eq!(
        idx.longest_prefix(&[1, 2, 3]),
        vec![(ep(1), 2)],
        "the tail block went, the head stayed (as the pod frees them)"
    );
    idx.record(ep(1), &[7], 3);
    assert_eq!(idx.longest_prefix(&[1, 2, 3]), vec![(ep(1), 1)]);
    assert_eq!(idx.longest_prefix(&[7]), vec![(ep(1), 1)]);
}

#[test]
fn a_tail_past_the_cap_fills_the_lane_and_goes_with_its_last_block() {
    let idx = PrefixIndex::new();
    idx.record_with_tail(ep(1), &[1, 2], 6, 10);
    assert_eq!(idx.size(), 8, "two blocks and a six-block tail");
    assert_eq!(idx.tails_at(2), vec![(ep(1), 6)]);
    assert!(idx.tails_at(1).is_empty(), "only the last block carries it");
    idx.record(ep(1), &[5, 6], 10);
    assert_eq!(
        (idx.size(), idx.longest_prefix(&[1, 2])),
        (10, vec![(ep(1), 2)])
    );
    // One block more: the oldest block is the tail's (recorded first), and it takes the whole
    // tail with it.
    idx.record(ep(1), &[7], 10);
    assert_eq!(idx.size(), 4);
    assert_eq!(idx.longest_prefix(&[1, 2]), vec![(ep(1), 1)]);
    assert!(idx.tails_at(2).is_empty());
    assert_eq!(
        idx.free_blocks([ep(2), ep(1)].into_iter()),
        vec![None, Some(6)],
        "an endpoint never recorded is absent"
    );
}

#[test]
fn a_chain_recorded_again_keeps_its_longer_tail_per_endpoint() {
    let idx = PrefixIndex::new();
    idx.record_with_tail(ep(1), &[1, 2], 6, 100);
    idx.record_with_tail(ep(1), &[1, 2], 3, 100);
    idx.record_with_tail(ep(2), &[1, 2], 4, 100);
    idx.record(ep(3), &[1, 2], 100);
    let mut t = idx.tails_at(2);
    t.sort();
    assert_eq!(t, vec![(ep(1), 6), (ep(2), 4)]);
    assert_eq!(idx.size(), 2 + 6 + 2 + 4 + 2);
    idx.retain(&[ep(2), ep(3)].into_iter().collect());
    assert_eq!(idx.tails_at(2), vec![(ep(2), 4)]);
    assert_eq!(idx.size(), 2 + 4 + 2);
}

#[test]
fn a_tail_larger_than_the_cache_is_not_held() {
    let idx = PrefixIndex::new();
    idx.record(ep(1), &[9], 10);
    idx.record_with_tail(ep(1), &[1, 2], 20, 10);
    assert_eq!(idx.longest_prefix(&[9]), Vec::new());
    assert!(idx.tails_at(2).is_empty());
    assert_eq!(
        idx.longest_prefix(&[1, 2]),
        vec![(ep(1), 1)],
        "the head survives its tail"
    );
}

#[test]
fn token_scale_starts_at_one_learns_a_tenth_at_a_time_and_stays_bounded() {
    let s = PrefixIndex::new().scale;
    assert_eq!((s.get(), s.blocks(1000)), (1.0, None));
    s.observe(0, 10);
    s.observe(10, 0);
    assert_eq!(s.get(), 1.0, "empty observations teach nothing");
    s.observe(1180, 1000);
    assert_eq!(
        s.blocks(1000),
        Some(1187),
        "the first sets it, in 1/64 steps (76/64)"
    );
    s.observe(2000, 1000);
    assert_eq!(
        s.get(),
        81.0 / 64.0,
        "a tenth of the way: 76 + (128 - 76) / 10 ≈ 81"
    );
    let s = PrefixIndex::new().scale;
    s.observe(1_000_000, 1);
    assert_eq!(s.get(), 4.0);
    s.observe(1, 1_000_000);
    assert!(s.get() > 0.25 && s.get() < 4.0);
}

/// The index as a list per endpoint, newest first: what the linked structure must match.
#[derive(Default)]
struct Model(Vec<(EndpointId, usize, Vec<u64>)>);

impl Model {
    fn record(&mut self, e: EndpointId, hashes: &[u64], cap: usize) {
        if hashes.is_empty() {
            return;
        }
        let cap = cap.max(1);
        let at = match self.0.iter().position(|(id, ..)| *id == e) {
            Some(at) => at,
            None => {
                self.0.push((e, cap, Vec::new()));
                self.0.len() - 1
            }
        };
        let (_, c, list) = &mut self.0[at];
        *c = cap;
        list.truncate(cap);
        for h in hashes.iter().rev() {
            list.retain(|x| x != h);
            list.insert(0, *h);
            list.truncate(cap);
        }
    }

    fn longest_prefix(&self, hashes: &[u64]) -> Vec<(EndpointId, usize)> {
        let mut out: Vec<_> = self
            .0
            .iter()
            .map(|(id, _, list)| {
                let n = hashes.iter().take_while(|h| list.contains(h)).count();
                (*id, n)
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        out.sort();
        out
    }
}

impl PrefixIndex {
    /// Every link agrees with every other: lanes newest to oldest and back, lengths, holder
    /// lists and their heads' flags, and the free list holds the rest.
    fn check_links(&self) {
        let inner = self.inner.read().unwrap();
        let mut seen = 0;
        for (slot, lane) in inner.lanes.iter().enumerate() {
            let Some(lane) = lane else { continue };
            let (mut n, mut prev, mut len) = (lane.newest, NIL, 0);
            while n != NIL {
                let node = inner.nodes[n as usize];
                assert_eq!((node.slot as usize, node.newer), (slot, prev));
                let mut holders = SmallVec::new();
                inner.holders(node.hash, &mut holders);
                assert!(
                    holders.contains(&node.slot),
                    "a lane's block lists its holder"
                );
                (prev, n, len) = (n, node.older, len + 1);
            }
            assert_eq!((lane.oldest, lane.len), (prev, len));
            assert!(lane.len <= lane.cap);
            seen += len;
        }
        let mut in_chains = 0;
        for (hash, head) in &inner.heads {
            let mut n = head.node;
            let first = inner.nodes[n as usize];
            let more = if first.next_holder == NIL { 0 } else { MORE };
            assert_eq!(head.first_slot, first.slot | more);
            while n != NIL {
                assert_eq!(inner.nodes[n as usize].hash, *hash);
                in_chains += 1;
                n = inner.nodes[n as usize].next_holder;
            }
        }
        let (mut free, mut n) = (0, inner.free);
        while n != NIL {
            free += 1;
            n = inner.nodes[n as usize].older;
        }
        assert_eq!((seen, seen + free), (in_chains, inner.nodes.len()));
    }
}

#[derive(Debug, Clone)]
enum Op {
    Record(u16, Vec<u64>, usize),
    Retain(Vec<u16>),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u16..5, proptest::collection::vec(0u64..24, 0..12), 1usize..10)
            .prop_map(|(e, h, c)| Op::Record(e, h, c)),
        1 => proptest::collection::vec(1u16..5, 0..4).prop_map(Op::Retain),
    ]
}

proptest! {
    #[test]
    fn the_linked_index_behaves_as_lists_per_endpoint(ops in proptest::collection::vec(op(), 0..60), probes in proptest::collection::vec(proptest::collection::vec(0u64..24, 1..6), 1..6)) {
        let (idx, mut model) = (PrefixIndex::new(), Model::default());
        for o in &ops {
            match o {
                Op::Record(e, hashes, cap) => {
                    idx.record(ep(*e), hashes, *cap);
                    model.record(ep(*e), hashes, *cap);
                }
                Op::Retain(live) => {
                    let live: HashSet<_> = live.iter().map(|e| ep(*e)).collect();
                    idx.retain(&live);
                    model.0.retain(|(id, ..)| live.contains(id));
                }
            }
            idx.check_links();
            prop_assert_eq!(idx.size(), model.0.iter().map(|(.., l)| l.len()).sum::<usize>());
            for p in &probes {
                let mut got = idx.longest_prefix(p);
                got.sort();
                prop_assert_eq!(got, model.longest_prefix(p), "after {:?}", o);
            }
        }
    }

    #[test]
    fn index_respects_capacity(records in proptest::collection::vec((1u16..4, proptest::collection::vec(0u64..50, 0..20)), 0..40), cap in 1usize..16) {
        let idx = PrefixIndex::new();
        for (e, hashes) in &records {
            idx.record(ep(*e), hashes, cap);
        }
        prop_assert!(idx.size() <= 3 * cap);
        for (e, n) in idx.longest_prefix(&[0, 1, 2, 3]) {
            prop_assert!(n <= 4 && e.0.port() < 4);
        }
    }
}

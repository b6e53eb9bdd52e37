use super::*;
use crate::prefix::block_hashes;

fn ep(n: u16) -> EndpointId {
    format!("10.0.0.1:{n}").parse().unwrap()
}

/// A BlockStored for `tokens` (whole blocks of 4) with engine hashes `base + i`.
fn store(idx: &PreciseIndex, e: EndpointId, parent: Option<u64>, hashes: &[u64], tokens: &[u32]) {
    idx.writer(e).store(&Stored {
        model: "m",
        parent,
        hashes,
        tokens,
        block_size: 4,
    });
}

fn keys(tokens: &[u32]) -> Vec<u64> {
    block_hashes("m", None, tokens, 4, 100)
}

#[test]
fn event_keys_match_request_keys_whatever_the_engine_hashes() {
    let idx = PreciseIndex::new();
    let t: Vec<u32> = (0..12).collect();
    store(&idx, ep(1), None, &[901, 902], &t[..8]);
    store(&idx, ep(1), Some(902), &[903], &t[8..]);
    store(&idx, ep(2), None, &[5], &t[..4]);
    let now = Instant::now();
    let mut m = idx.longest_prefix(&keys(&t), now);
    m.sort();
    assert_eq!(m, vec![(ep(1), 3), (ep(2), 1)]);
    assert_eq!(idx.block_size(), 4);
}

#[test]
fn a_zero_parent_that_names_no_block_is_a_root_as_llm_d_reads_it() {
    // llm-d-inference-sim's positional events send parent 0 for "no parent".
    let idx = PreciseIndex::new();
    let t: Vec<u32> = (0..8).collect();
    store(&idx, ep(1), Some(0), &[11, 12], &t);
    let now = Instant::now();
    assert_eq!(idx.longest_prefix(&keys(&t), now), vec![(ep(1), 2)]);
    // A stored block whose engine hash is 0 is still a parent.
    let idx = PreciseIndex::new();
    store(&idx, ep(2), None, &[0], &t[..4]);
    store(&idx, ep(2), Some(0), &[21], &t[4..]);
    assert_eq!(idx.longest_prefix(&keys(&t), now), vec![(ep(2), 2)]);
    // Any other unknown parent still drops the event (its chain is unknown).
    let idx = PreciseIndex::new();
    store(&idx, ep(3), Some(77), &[31], &t[4..]);
    assert_eq!(idx.entries(), 0);
}

#[test]
fn a_hash_stored_twice_survives_one_removal() {
    let idx = PreciseIndex::new();
    let t: Vec<u32> = (0..4).collect();
    store(&idx, ep(1), None, &[7], &t);
    store(&idx, ep(1), None, &[7], &t);
    let now = Instant::now();
    idx.writer(ep(1)).remove(&[7]);
    assert_eq!(idx.longest_prefix(&keys(&t), now), vec![(ep(1), 1)]);
    idx.writer(ep(1)).remove(&[7]);
    assert!(idx.longest_prefix(&keys(&t), now).is_empty());
    assert_eq!(idx.entries(), 0);
}

#[test]
fn eviction_of_a_middle_block_cuts_the_consecutive_prefix() {
    let idx = PreciseIndex::new();
    let t: Vec<u32> = (0..12).collect();
    store(&idx, ep(1), None, &[1, 2, 3], &t);
    idx.writer(ep(1)).remove(&[2]);
    assert_eq!(
        idx.longest_prefix(&keys(&t), Instant::now()),
        vec![(ep(1), 1)]
    );
}

#[test]
fn clear_empties_one_endpoint_only() {
    let idx = PreciseIndex::new();
    let t: Vec<u32> = (0..8).collect();
    store(&idx, ep(1), None, &[1, 2], &t);
    store(&idx, ep(2), None, &[1, 2], &t);
    idx.writer(ep(1)).clear();
    assert_eq!(
        idx.longest_prefix(&keys(&t), Instant::now()),
        vec![(ep(2), 2)]
    );
    idx.retain(&[ep(1)].into_iter().collect());
    assert!(idx.longest_prefix(&keys(&t), Instant::now()).is_empty());
    assert_eq!(idx.entries(), 0);
}

#[test]
fn a_block_with_an_unknown_parent_is_skipped() {
    let idx = PreciseIndex::new();
    let t: Vec<u32> = (0..8).collect();
    store(&idx, ep(1), Some(999), &[2], &t[4..]);
    assert_eq!(idx.entries(), 0);
}

#[test]
fn speculative_entries_count_until_their_ttl() {
    let idx = PreciseIndex::new();
    let t: Vec<u32> = (0..8).collect();
    let now = Instant::now();
    idx.speculate(ep(3), &keys(&t), now, Duration::from_secs(2));
    assert_eq!(
        idx.longest_prefix(&keys(&t), now + Duration::from_secs(1)),
        vec![(ep(3), 2)]
    );
    assert!(idx
        .longest_prefix(&keys(&t), now + Duration::from_secs(3))
        .is_empty());
    store(&idx, ep(1), None, &[1], &t[..4]);
    idx.speculate(ep(1), &keys(&t), now, Duration::from_secs(2));
    let m = idx.longest_prefix(&keys(&t), now);
    assert!(
        m.contains(&(ep(1), 2)),
        "confirmed and speculative blocks chain: {m:?}"
    );
}

#[test]
fn memory_per_entry_stays_within_budget() {
    let idx = PreciseIndex::new();
    let tokens: Vec<u32> = (0..4 * 20_000).collect();
    let hashes: Vec<u64> = (1..=20_000).collect();
    for e in 0..10 {
        let mut w = idx.writer(ep(e));
        // Each endpoint holds its own prompt: a different first token makes every key distinct.
        let mut t = tokens.clone();
        t[0] = 1_000_000 + u32::from(e);
        w.store(&Stored {
            model: "m",
            parent: None,
            hashes: &hashes,
            tokens: &t,
            block_size: 4,
        });
    }
    assert_eq!(idx.entries(), 200_000);
    let per_entry = idx.heap_bytes() as f64 / idx.entries() as f64;
    assert!(per_entry <= 128.0, "{per_entry} bytes per entry");
}

#[test]
fn a_key_with_one_holder_costs_a_24_byte_table_entry() {
    assert_eq!(std::mem::size_of::<(u64, Holders)>(), 24);
}

#[test]
fn a_confirmed_guess_does_not_outlive_the_eviction() {
    let idx = PreciseIndex::new();
    let t: Vec<u32> = (0..8).collect();
    let now = Instant::now();
    idx.speculate(ep(1), &keys(&t), now, Duration::from_secs(2));
    assert_eq!(
        idx.longest_prefix(&keys(&t), now),
        vec![(ep(1), 2)],
        "routed, not yet stored"
    );
    store(&idx, ep(1), None, &[11, 12], &t);
    assert_eq!(
        idx.longest_prefix(&keys(&t), now),
        vec![(ep(1), 2)],
        "stored"
    );
    idx.writer(ep(1)).remove(&[11, 12]);
    assert_eq!(
        idx.longest_prefix(&keys(&t), now),
        vec![],
        "evicted: the speculative entry went with the BlockStored"
    );
    idx.speculate(ep(2), &keys(&t), now, Duration::from_secs(2));
    store(&idx, ep(1), None, &[11, 12], &t);
    let mut m = idx.longest_prefix(&keys(&t), now);
    m.sort();
    assert_eq!(
        m,
        vec![(ep(1), 2), (ep(2), 2)],
        "another endpoint's store leaves ep(2)'s guess alone"
    );
}

fn prefixes(idx: &PreciseIndex, ids: &[EndpointId]) -> Vec<u32> {
    idx.shapes(ids.iter().copied(), Instant::now())
        .iter()
        .map(|s| s.prefixes)
        .collect()
}

#[test]
fn prefixes_count_distinct_first_blocks_per_endpoint() {
    let idx = PreciseIndex::new();
    let a: Vec<u32> = (0..8).collect();
    let b: Vec<u32> = (100..108).collect();
    store(&idx, ep(1), None, &[1, 2], &a);
    store(&idx, ep(1), Some(2), &[3], &b[..4]); // a continuation, not a beginning
    store(&idx, ep(1), None, &[1], &a[..4]); // the same first block again: a second reference
    store(&idx, ep(1), None, &[11, 12], &b);
    store(&idx, ep(2), None, &[1], &a[..4]);
    assert_eq!(prefixes(&idx, &[ep(1), ep(2), ep(3)]), vec![2, 1, 0]);
    idx.writer(ep(1)).remove(&[1]);
    assert_eq!(
        prefixes(&idx, &[ep(1)]),
        vec![2],
        "one of two references left"
    );
    idx.writer(ep(1)).remove(&[1, 3]);
    assert_eq!(prefixes(&idx, &[ep(1), ep(2)]), vec![1, 1]);
    idx.writer(ep(2)).clear();
    assert_eq!(prefixes(&idx, &[ep(1), ep(2)]), vec![1, 0]);
    idx.retain(&[ep(2)].into_iter().collect());
    assert_eq!(
        prefixes(&idx, &[ep(1), ep(2)]),
        vec![0, 0],
        "a gone endpoint holds nothing"
    );
    store(&idx, ep(3), None, &[11], &b[..4]);
    assert_eq!(
        prefixes(&idx, &[ep(3)]),
        vec![1],
        "a reused slot starts from zero"
    );
}

#[test]
fn evicted_prompt_beginnings_count_and_fade() {
    let idx = PreciseIndex::new();
    let t0 = Instant::now();
    let a: Vec<u32> = (0..8).collect();
    let b: Vec<u32> = (100..104).collect();
    store(&idx, ep(1), None, &[1, 2], &a);
    store(&idx, ep(1), None, &[3], &b);
    store(&idx, ep(2), None, &[3], &b);
    idx.writer_at(ep(1), t0).remove(&[2]); // a tail block: not a beginning
    let lost = |at: Instant| {
        idx.shapes([ep(1), ep(2)], at)
            .iter()
            .map(|s| s.lost)
            .collect::<Vec<f64>>()
    };
    assert_eq!(lost(t0), vec![0.0, 0.0]);
    idx.writer_at(ep(1), t0).remove(&[1, 3]);
    assert_eq!(
        lost(t0),
        vec![2.0, 0.0],
        "two beginnings evicted; the other holder of one is untouched"
    );
    let later = lost(t0 + LOST_DECAY);
    assert!(
        (later[0] - 2.0 / std::f64::consts::E).abs() < 1e-9,
        "{later:?}"
    );
    idx.writer_at(ep(2), t0 + LOST_DECAY).remove(&[3]);
    assert_eq!(lost(t0 + LOST_DECAY)[1], 1.0);
    idx.writer(ep(1)).clear();
    assert!(
        lost(Instant::now())[0] > 0.0,
        "a cleared cache keeps its eviction history"
    );
}

#[test]
fn placed_prompt_beginnings_count_until_confirmed_or_stale() {
    let idx = PreciseIndex::new();
    let t0 = Instant::now();
    let a: Vec<u32> = (0..8).collect();
    let b: Vec<u32> = (100..108).collect();
    let shape = |at: Instant| {
        idx.shapes([ep(1), ep(2)], at)
            .iter()
            .map(|s| s.prefixes)
            .collect::<Vec<u32>>()
    };
    idx.speculate(ep(1), &keys(&a), t0, Duration::from_secs(30));
    idx.speculate(ep(1), &keys(&a), t0, Duration::from_secs(30)); // the same beginning again
    idx.speculate(ep(1), &keys(&b), t0, Duration::from_secs(30));
    assert_eq!(
        shape(t0),
        vec![2, 0],
        "two beginnings placed, none confirmed yet"
    );
    store(&idx, ep(1), None, &[1, 2], &a);
    assert_eq!(shape(t0), vec![2, 0], "a confirmed one counts once");
    idx.speculate(ep(1), &keys(&a), t0, Duration::from_secs(30));
    assert_eq!(
        shape(t0),
        vec![2, 0],
        "placing a held beginning adds nothing"
    );
    assert_eq!(
        shape(t0 + PLACED_WINDOW),
        vec![1, 0],
        "the unconfirmed one no longer counts"
    );
    idx.speculate(
        ep(2),
        &keys(&b),
        t0 + PLACED_WINDOW,
        Duration::from_secs(30),
    );
    assert_eq!(shape(t0 + PLACED_WINDOW), vec![1, 1]);
}

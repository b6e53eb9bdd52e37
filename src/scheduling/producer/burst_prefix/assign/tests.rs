use super::*;

fn replicas(n: usize) -> Vec<Replica> {
    (0..n)
        .map(|i| Replica {
            id: format!("10.0.0.1:{}", 8000 + i).parse().unwrap(),
            name: format!("pod-{i}"),
            running: 0.0,
        })
        .collect()
}

/// An entry whose prompt is the blocks `blocks` (a shared leading block is the same number).
fn entry(blocks: &[u64]) -> Entry {
    // Chain the blocks, as the producer's hashes are chained.
    let mut parent = 0u64;
    let hashes = blocks
        .iter()
        .map(|b| {
            parent = parent.wrapping_mul(31).wrapping_add(*b + 1);
            parent
        })
        .collect();
    Entry {
        hashes,
        assigned: None,
    }
}

const IDENTICAL: Rules = Rules {
    per_replica: None,
    min_colocate: 0,
    by_tokens: false,
};

/// The replica index each entry went to (`None`: no affinity).
fn placed(entries: &[Entry], reps: &[Replica]) -> Vec<Option<usize>> {
    entries
        .iter()
        .map(|e| {
            e.assigned
                .map(|a| reps.iter().position(|r| r.id == a).unwrap())
        })
        .collect()
}

fn run(mut entries: Vec<Entry>, reps: &[Replica], rules: Rules) -> Vec<Option<usize>> {
    assign(&mut entries, reps, rules);
    placed(&entries, reps)
}

#[test]
fn an_identical_group_goes_whole_to_one_replica_and_singletons_get_no_affinity() {
    let reps = replicas(3);
    let mut es: Vec<Entry> = (0..4).map(|_| entry(&[1, 2, 3])).collect();
    es.push(entry(&[7, 8]));
    es.push(entry(&[]));
    assert_eq!(
        run(es, &reps, IDENTICAL),
        vec![Some(0), Some(0), Some(0), Some(0), None, None]
    );
}

#[test]
fn distinct_groups_spread_over_the_least_loaded_replicas() {
    let reps = replicas(3);
    let mut es = Vec::new();
    for g in 0..3u64 {
        es.extend((0..2).map(|_| entry(&[g * 10, g * 10 + 1])));
    }
    let got = run(es, &reps, IDENTICAL);
    assert_eq!(
        got,
        vec![Some(0), Some(0), Some(1), Some(1), Some(2), Some(2)]
    );
}

#[test]
fn ties_go_to_fewer_running_requests_then_the_lower_name() {
    let mut reps = replicas(3);
    reps[0].running = 5.0;
    reps[2].name = "a-first".into();
    let es: Vec<Entry> = (0..2).map(|_| entry(&[1])).collect();
    assert_eq!(run(es, &reps, IDENTICAL), vec![Some(2), Some(2)]);
}

#[test]
fn max_per_replica_spills_a_group_to_the_next_least_loaded_replica() {
    let reps = replicas(3);
    let rules = Rules {
        per_replica: Some(2),
        ..IDENTICAL
    };
    let es: Vec<Entry> = (0..5).map(|_| entry(&[1, 2])).collect();
    assert_eq!(
        run(es, &reps, rules),
        vec![Some(0), Some(0), Some(1), Some(1), Some(2)]
    );
    // More members than k × replicas: one more each, rebalancing.
    let es: Vec<Entry> = (0..4).map(|_| entry(&[1, 2])).collect();
    let rules = Rules {
        per_replica: Some(1),
        ..IDENTICAL
    };
    assert_eq!(
        run(es, &replicas(2), rules),
        vec![Some(0), Some(1), Some(0), Some(1)]
    );
}

#[test]
fn min_colocate_blocks_places_prefix_sharing_singles_with_their_prefix() {
    let reps = replicas(2);
    let rules = Rules {
        min_colocate: 2,
        ..IDENTICAL
    };
    // A group on [1,2,3], a single sharing [1,2], a single sharing only [1], a lone one.
    let es = vec![
        entry(&[1, 2, 3]),
        entry(&[1, 2, 3]),
        entry(&[1, 2, 9]),
        entry(&[1, 5, 6]),
        entry(&[4, 4, 4]),
    ];
    // Total 3 requests placed (the group and the [1,2] single): fair share 2 per replica, so
    // the single cannot join the group's replica (already at 2) and goes to the other.
    assert_eq!(
        run(es.clone(), &reps, rules),
        vec![Some(0), Some(0), Some(1), None, None]
    );
    // With three replicas and a share of 1... and with a larger pool of singles the prefix
    // wins while under the share: two singles sharing [1,2] with no group join each other.
    let singles = vec![entry(&[1, 2, 3, 4]), entry(&[1, 2, 5]), entry(&[1, 2, 6])];
    let got = run(singles, &replicas(2), rules);
    assert_eq!(
        got,
        vec![Some(0), Some(0), Some(1)],
        "share is 2 per replica"
    );
    // Without minColocateBlocks no single gets an affinity.
    assert_eq!(
        run(es, &reps, IDENTICAL),
        vec![Some(0), Some(0), None, None, None]
    );
}

#[test]
fn balancing_by_tokens_spreads_long_prefixes() {
    let reps = replicas(2);
    let rules = Rules {
        by_tokens: true,
        ..IDENTICAL
    };
    let long: Vec<u64> = (0..10).collect();
    // One long group (10 blocks) and two short ones (1 block each): by requests the second
    // short group would go to the long group's replica's peer and the third back next to the
    // long one; by tokens both short groups go to the other replica.
    let mut es: Vec<Entry> = (0..2).map(|_| entry(&long)).collect();
    es.extend((0..2).map(|_| entry(&[100])));
    es.extend((0..2).map(|_| entry(&[200])));
    assert_eq!(
        run(es.clone(), &reps, rules),
        vec![Some(0), Some(0), Some(1), Some(1), Some(1), Some(1)]
    );
    assert_eq!(
        run(es, &reps, IDENTICAL),
        vec![Some(0), Some(0), Some(1), Some(1), Some(0), Some(0)]
    );
}

#[test]
fn no_replica_no_placement() {
    let es: Vec<Entry> = (0..2).map(|_| entry(&[1])).collect();
    assert_eq!(run(es, &[], IDENTICAL), vec![None, None]);
}

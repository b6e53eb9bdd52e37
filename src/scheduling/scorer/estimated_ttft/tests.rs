//! The estimated-TTFT scorer's tests: which candidate each term makes the earliest first token.

use super::*;
use crate::scheduling::testing::cand;

fn req(prompt_tokens: usize) -> SchedulingRequest<'static> {
    SchedulingRequest {
        prompt_tokens,
        prefix_total_blocks: prompt_tokens / 16,
        block_size: 16,
        ..Default::default()
    }
}

/// The scorer pricing this request's own TTFT only (no in-flight delay).
fn selfish() -> EstimatedTtftScorer {
    EstimatedTtftScorer {
        in_flight_delay_weight: 0.0,
        ..EstimatedTtftScorer::default()
    }
}

/// The scorer with the congestion price on (`congestionCostWeight: 1`) and no in-flight
/// delay, as the congestion price was measured.
fn congested() -> EstimatedTtftScorer {
    EstimatedTtftScorer {
        congestion_cost_weight: 1.0,
        ..selfish()
    }
}

fn pick(s: &EstimatedTtftScorer, r: &SchedulingRequest<'_>, cands: &[Candidate]) -> usize {
    let pool: Vec<&Candidate> = cands.iter().collect();
    let mut out = vec![0.0; cands.len()];
    s.score(r, &pool, &mut out);
    for v in &out {
        assert!((0.0..=1.0).contains(v), "{out:?}");
    }
    (0..out.len())
        .max_by(|a, b| out[*a].total_cmp(&out[*b]))
        .unwrap()
}

#[test]
fn a_short_match_behind_a_deep_queue_loses_to_an_idle_pod() {
    let s = EstimatedTtftScorer::default();
    // The first 16-token block is held by pod 0, which reports 4 waiting requests.
    let cands = [cand(1, 4.0, 0.3, 1), cand(2, 0.0, 0.3, 0)];
    assert_eq!(pick(&s, &req(40), &cands), 1);
}

#[test]
fn a_long_conversation_stays_home_behind_a_short_queue() {
    let s = EstimatedTtftScorer::default();
    let mut home = cand(1, 1.0, 0.9, 500);
    home.prefill.pending_tokens = 200.0;
    home.prefill.pending_requests = 1.0;
    let cands = [home, cand(2, 0.0, 0.2, 0)];
    assert_eq!(pick(&s, &req(8_100), &cands), 0);
}

#[test]
fn a_prompt_past_the_cap_counts_the_tail_its_home_holds() {
    let s = EstimatedTtftScorer::default();
    // A 100,000-token prompt hashed to a 32,768-token cap; its home holds every hashed
    // block and was last sent 62,000 tokens past them, and has 40,000 tokens ahead.
    let mut home = cand(1, 1.0, 0.3, 2_048);
    home.prefill.pending_tokens = 40_000.0;
    home.prefill.pending_requests = 1.0;
    let cold = cand(2, 0.0, 0.0, 0);
    let r = req(100_000);
    // Without the tail it looks 67,232 tokens cold at home, behind 40,000: the idle pod.
    assert_eq!(pick(&s, &r, &[home.clone(), cold.clone()]), 1);
    home.prefill.held_past_cap = 62_000.0;
    assert_eq!(pick(&s, &r, &[home.clone(), cold]), 0);
    assert_eq!(
        s.inputs(&r, &home).own_tokens,
        100_000.0 - 32_768.0 - 62_000.0
    );
    // Never more than the prompt.
    home.prefill.held_past_cap = 1e9;
    assert_eq!(s.inputs(&r, &home).own_tokens, 0.0);
}

#[test]
fn a_new_prefix_goes_where_it_evicts_nothing_though_a_full_pod_looks_faster() {
    let s = EstimatedTtftScorer::default();
    // Pod 1 is idle (KV in use 0) but its cache, 128,000 tokens, holds another group's
    // 100,000-token prefix; and it learned a rate 5% above the seed, so on time alone it wins.
    let seed = s.seed();
    let mut full = cand(1, 0.0, 0.0, 0);
    full.prefill.learned = Some(TtftRates {
        per_token: seed.per_token / 1.05,
        ..seed
    });
    let mut empty = cand(2, 0.0, 0.0, 0);
    empty.prefill.learned = Some(seed);
    let r = req(100_000);
    assert_eq!(pick(&s, &r, &[full.clone(), empty.clone()]), 0);
    full.prefill.cache_free_tokens = Some(28_000.0);
    assert_eq!(pick(&s, &r, &[full.clone(), empty.clone()]), 1);
    // Room for the whole prompt: nothing evicted, the faster pod again.
    full.prefill.cache_free_tokens = Some(100_000.0);
    assert_eq!(pick(&s, &r, &[full, empty]), 0);
}

#[test]
fn a_popular_prefix_spreads_when_its_home_queue_costs_more_than_recomputing_it() {
    let s = EstimatedTtftScorer::default();
    let mut home = cand(1, 0.0, 0.5, 125);
    // 2,000 tokens held; 30,000 tokens of other requests' prefill already queued there.
    home.prefill.pending_tokens = 30_000.0;
    home.prefill.pending_requests = 15.0;
    let cands = [home, cand(2, 0.0, 0.5, 0)];
    assert_eq!(pick(&s, &req(2_200), &cands), 1);
}

#[test]
fn over_capacity_a_session_stays_home_rather_than_recompute_on_another_busy_pod() {
    let queued = |port, waiting: f64, held_blocks| {
        let mut c = cand(port, waiting, 0.5, held_blocks);
        c.prefill.pending_tokens = 200.0 * waiting;
        c.prefill.pending_requests = waiting;
        c
    };
    // Home holds 3,792 of 4,000 tokens behind 6 queued requests; the other pod has 3 queued.
    let cands = [queued(1, 6.0, 237), queued(2, 3.0, 0)];
    assert_eq!(
        pick(&selfish(), &req(4_000), &cands),
        1,
        "its own TTFT alone moves it"
    );
    assert_eq!(pick(&congested(), &req(4_000), &cands), 0);
}

#[test]
fn in_a_saturated_pool_a_momentarily_empty_queue_does_not_pull_a_session_from_home() {
    let queued = |port, waiting: f64, held_blocks| {
        let mut c = cand(port, waiting, 0.5, held_blocks);
        c.prefill.pending_tokens = 200.0 * waiting;
        c.prefill.pending_requests = waiting;
        c
    };
    // Home holds 3,792 of 4,000 tokens; six more pods are as queued; one just drained.
    let mut cands = vec![queued(1, 6.0, 237)];
    cands.extend((2..8).map(|p| queued(p, 6.0, 0)));
    cands.push(queued(8, 0.0, 0));
    assert_eq!(pick(&selfish(), &req(4_000), &cands), 7);
    assert_eq!(pick(&congested(), &req(4_000), &cands), 0);
}

#[test]
fn a_home_queue_spills_to_an_idle_pod_but_not_to_a_queued_one() {
    let s = congested();
    let mut home = cand(1, 12.0, 0.5, 125);
    home.prefill.pending_tokens = 24_000.0;
    home.prefill.pending_requests = 12.0;
    // 2,200-token prompt, 2,000 held at home; an idle pod is worth the recomputation.
    assert_eq!(
        pick(&s, &req(2_200), &[home.clone(), cand(2, 0.0, 0.5, 0)]),
        1
    );
    // A pod queued three quarters as deep is not, though this request alone would gain:
    // recomputing there delays its queue too.
    let mut busy = cand(2, 9.0, 0.5, 0);
    busy.prefill.pending_tokens = 18_000.0;
    busy.prefill.pending_requests = 9.0;
    assert_eq!(
        pick(&selfish(), &req(2_200), &[home.clone(), busy.clone()]),
        1
    );
    assert_eq!(pick(&s, &req(2_200), &[home, busy]), 0);
}

#[test]
fn a_long_prompt_goes_where_its_prefill_stalls_the_fewest_sequences() {
    // Pod 0 has no prefill ahead but 30 sequences decoding; pod 1 has 500 tokens ahead and 2.
    let mut crowded = cand(1, 0.0, 0.5, 0);
    crowded.running = 30.0;
    let mut quiet = cand(2, 0.0, 0.5, 0);
    quiet.running = 2.0;
    quiet.prefill.pending_tokens = 500.0;
    quiet.prefill.pending_requests = 1.0;
    let cands = [crowded, quiet];
    assert_eq!(pick(&selfish(), &req(6_000), &cands), 0, "its own TTFT");
    assert_eq!(
        pick(&EstimatedTtftScorer::default(), &req(6_000), &cands),
        1
    );
}

#[test]
fn a_popular_prefix_stays_home_rather_than_recompute_where_it_stalls_others() {
    // 2,000 of 2,200 tokens held at home, 4,000 tokens queued there; the other pod has no
    // queue but as many sequences decoding.
    let mut home = cand(1, 2.0, 0.5, 125);
    home.running = 8.0;
    home.prefill.pending_tokens = 4_000.0;
    home.prefill.pending_requests = 2.0;
    let mut other = cand(2, 0.0, 0.5, 0);
    other.running = 8.0;
    let cands = [home, other];
    assert_eq!(pick(&selfish(), &req(2_200), &cands), 1, "its own TTFT");
    assert_eq!(
        pick(&EstimatedTtftScorer::default(), &req(2_200), &cands),
        0
    );
    // An idle pod is still worth the recomputation: it holds nobody up.
    let idle = cand(3, 0.0, 0.1, 0);
    let with_idle = [cands[0].clone(), idle];
    assert_eq!(
        pick(&EstimatedTtftScorer::default(), &req(2_200), &with_idle),
        1
    );
}

#[test]
fn a_pod_learned_slow_gets_work_only_when_it_is_still_the_earliest() {
    let s = EstimatedTtftScorer::default();
    let fast = TtftRates {
        mean_tokens: 500.0,
        ..s.seed()
    };
    let slow = TtftRates {
        per_token: fast.per_token * 2.0,
        ..fast
    };
    let mut a = cand(1, 0.0, 0.1, 0);
    a.prefill.learned = Some(slow);
    let mut b = cand(2, 0.0, 0.1, 0);
    b.prefill.learned = Some(fast);
    assert_eq!(pick(&s, &req(1_000), &[a.clone(), b.clone()]), 1);
    b.prefill.pending_tokens = 3_000.0;
    b.prefill.pending_requests = 3.0;
    assert_eq!(pick(&s, &req(1_000), &[a, b]), 0);
}

#[test]
fn a_pod_not_observed_yet_is_priced_like_the_learned_ones_not_like_the_seed() {
    let s = EstimatedTtftScorer::default();
    // The seed is 8 times too fast for these pods: the learned ones say so.
    let learned = TtftRates {
        base: s.seed().base * 8.0,
        per_token: s.seed().per_token * 8.0,
        per_running: s.seed().per_running * 8.0,
        per_waiting: s.seed().per_waiting * 8.0,
        mean_tokens: 1000.0,
    };
    let mut a = cand(1, 0.0, 0.1, 0);
    a.prefill.learned = Some(learned);
    a.prefill.pending_tokens = 500.0;
    let new = cand(2, 0.0, 0.1, 0);
    let mut busy_new = new.clone();
    busy_new.prefill.pending_tokens = 1500.0;
    // Unobserved but busier: it is no faster for being unobserved.
    assert_eq!(pick(&s, &req(1_000), &[a, busy_new]), 0);
}

#[test]
fn a_pod_not_observed_yet_ties_with_the_fastest_learned_one_and_its_other_costs_decide() {
    let s = EstimatedTtftScorer::default();
    let seed = s.seed();
    let scaled = |f: f64| TtftRates {
        base: seed.base * f,
        per_token: seed.per_token * f,
        per_running: seed.per_running * f,
        per_waiting: seed.per_waiting * f,
        mean_tokens: 1000.0,
    };
    let mut fast = cand(1, 0.0, 0.0, 0);
    fast.prefill.learned = Some(scaled(0.5));
    // Half of a cold 10,000-token prompt would evict what the index recorded there.
    fast.prefill.cache_free_tokens = Some(5_000.0);
    let mut slow = cand(2, 0.0, 0.0, 0);
    slow.prefill.learned = Some(scaled(2.0));
    let unobserved = cand(3, 0.0, 0.0, 0);
    // Priced at the pool's median (the slow pod's rates), the unobserved pod lost to the
    // fast one whatever that one evicted; at the fastest rates it ties and evicts nothing.
    assert_eq!(pick(&s, &req(10_000), &[fast, slow, unobserved]), 2);
}

#[test]
fn where_every_cache_is_full_the_index_prices_nothing_more_than_kv_usage() {
    let s = EstimatedTtftScorer::default();
    let mut home = cand(1, 2.0, 0.3, 100);
    home.prefill.pending_tokens = 3_000.0;
    home.prefill.pending_requests = 2.0;
    let pool = [home, cand(2, 0.0, 0.1, 0), cand(3, 1.0, 0.6, 20)];
    let scores = |free: Option<f64>| {
        let cands: Vec<Candidate> = pool
            .iter()
            .cloned()
            .map(|mut c| {
                c.prefill.cache_free_tokens = free;
                c
            })
            .collect();
        let refs: Vec<&Candidate> = cands.iter().collect();
        let mut out = vec![0.0; cands.len()];
        s.score(&req(2_000), &refs, &mut out);
        out
    };
    assert_eq!(scores(Some(0.0)), scores(None));
    assert_ne!(
        scores(Some(1_000.0)),
        scores(None),
        "the room differs per own"
    );
}

#[test]
fn a_sheddable_request_no_pod_can_serve_in_time_is_rejected_unless_one_is_idle() {
    let s = EstimatedTtftScorer::default();
    let busy = |port| {
        let mut c = cand(port, 10.0, 0.5, 0);
        c.running = 20.0;
        c
    };
    let cands = [busy(1), busy(2)];
    let pool: Vec<&Candidate> = cands.iter().collect();
    let mut r = req(1_000);
    r.slo_ttft_s = Some(0.2);
    assert!(!s.rejects(&r, &pool), "not sheddable");
    r.sheddable = true;
    assert!(s.rejects(&r, &pool));
    r.slo_ttft_s = Some(60.0);
    assert!(!s.rejects(&r, &pool), "a lax SLO is met");
    r.slo_ttft_s = Some(0.2);
    let idle = cand(3, 0.0, 0.5, 0);
    let with_idle = [&cands[0], &cands[1], &idle];
    assert!(!s.rejects(&r, &with_idle));
}

#[test]
fn parameters_are_strict_and_checked() {
    let yaml = |s: &str| serde_norway::from_str::<serde_norway::Value>(s).unwrap();
    let p: EstimatedTtftScorer =
        crate::config::plugin::params(&yaml("{peakPrefillThroughput: 4000}")).unwrap();
    assert_eq!(p.validate().unwrap().seed().per_token, 1.0 / 4000.0);
    let bad: EstimatedTtftScorer =
        crate::config::plugin::params(&yaml("{peakPrefillThroughput: 0}")).unwrap();
    assert!(bad.validate().is_err());
    assert!(crate::config::plugin::params::<EstimatedTtftScorer>(&yaml("{bogus: 1}")).is_err());
}

//! The scheduler through its configuration: profiles, staleness, slow start, examples.

use super::testing::cand;
use super::*;
use crate::config::{self, LoadOptions};
use crate::plugin::{Category, PluginKind};
use proptest::prelude::*;
use rand::{rngs::SmallRng, SeedableRng};

fn default_scheduler() -> Scheduler {
    build(&config::parse(config::UPSTREAM_DEFAULT_CONFIG).unwrap()).unwrap()
}

fn req(total: usize) -> SchedulingRequest<'static> {
    SchedulingRequest {
        target_model: "m",
        prefix_total_blocks: total,
        block_size: 16,
        ..Default::default()
    }
}

#[test]
fn default_profile_prefers_short_queue_then_prefix() {
    let s = default_scheduler();
    let mut rng = SmallRng::seed_from_u64(1);
    let cands = [cand(1, 10.0, 0.5, 0), cand(2, 0.0, 0.5, 0)];
    assert_eq!(
        s.schedule(&req(0), &cands, &mut rng).unwrap().endpoints,
        vec![cands[1].id]
    );
    let cands = [cand(1, 1.0, 0.2, 8), cand(2, 0.0, 0.2, 0)];
    assert_eq!(
        s.schedule(&req(8), &cands, &mut rng).unwrap().endpoints,
        vec![cands[0].id],
        "prefix 3 beats queue 2"
    );
}

#[test]
fn stale_endpoints_are_a_last_resort() {
    let s = default_scheduler();
    let mut rng = SmallRng::seed_from_u64(2);
    let mut idle_but_stale = cand(1, 0.0, 0.0, 0);
    idle_but_stale.fresh = false;
    let busy = cand(2, 50.0, 0.9, 0);
    let d = s
        .schedule(&req(0), &[idle_but_stale.clone(), busy.clone()], &mut rng)
        .unwrap();
    assert_eq!(d.endpoints, vec![busy.id]);
    let d = s
        .schedule(&req(0), &[idle_but_stale.clone()], &mut rng)
        .unwrap();
    assert_eq!(d.endpoints, vec![idle_but_stale.id]);
}

#[test]
fn a_warming_endpoint_gets_about_its_ramp_share() {
    let s = build(&config::parse("apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: random-picker\n").unwrap()).unwrap();
    let mut rng = SmallRng::seed_from_u64(4);
    let mut cold = cand(1, 0.0, 0.0, 0);
    cold.ramp = 0.2;
    let cands = [cold.clone(), cand(2, 0.0, 0.0, 0)];
    let picked = (0..4000)
        .filter(|_| s.schedule(&req(0), &cands, &mut rng).unwrap().endpoints[0] == cold.id)
        .count();
    // Full share would be 1/2; at ramp 0.2 the cold pod takes part in 20% of selections: 10%.
    assert!((300..500).contains(&picked), "{picked}");
    let only_cold = [cold.clone()];
    assert_eq!(
        s.schedule(&req(0), &only_cold, &mut rng).unwrap().endpoints,
        vec![cold.id],
        "never emptied"
    );
}

#[test]
fn balancing_policy_examples_build() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/config/examples");
    for name in ["chwbl.yaml", "gpu-aware.yaml", "weighted.yaml"] {
        let text = std::fs::read_to_string(format!("{dir}/{name}")).unwrap();
        // gpu-aware.yaml uses session-affinity-scorer, an alpha plugin upstream.
        let load = LoadOptions {
            allow_experimental: true,
        };
        let doc = config::parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let s = build_with(&doc, load).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        assert_eq!(s.max_endpoints(), 2, "{name}");
    }
}

#[test]
fn llm_d_optimized_baseline_sticks_to_the_prefix_until_the_ttft_gate() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/examples/llm-d-optimized-baseline.yaml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let s = build(&config::parse(&text).unwrap()).unwrap();
    assert_eq!(
        s.prefix_params().unwrap().max_prefix_tokens_to_match,
        40_960
    );
    let r = SchedulingRequest {
        prompt_tokens: 160,
        ..req(10)
    };
    let mut rng = SmallRng::seed_from_u64(5);
    // (in-flight tokens on the pod holding 9 of 10 blocks, expected pick): 100k tokens ahead
    // is 6.3 s at 15928 tokens/s, under the 18 s penalty; 400k (25 s) breaks the gate and
    // token load decides.
    for (ahead, want) in [(100_000.0, 1), (400_000.0, 2)] {
        let mut home = cand(1, 0.0, 0.0, 9);
        home.prefill.pending_tokens = ahead;
        let cands = [home, cand(2, 0.0, 0.0, 0)];
        let d = s.schedule(&r, &cands, &mut rng).unwrap();
        assert_eq!(d.endpoints, vec![cands[want - 1].id], "{ahead}");
    }
}

#[test]
fn every_filter_scorer_and_picker_epp_supports_builds_from_its_type() {
    // Parameters a plugin cannot go without; every other one builds from its defaults.
    let required = |k: PluginKind| {
        match k {
        PluginKind::ByLabel => "\n  parameters: {label: tier, validValues: [a]}",
        PluginKind::HeaderLabelAffinityScorer => {
            "\n  parameters: {headerName: x-zone, labelKey: zone}"
        }
        PluginKind::UtilizationFilter => {
            "\n  parameters: {conditions: [{metric: waiting-queue, maxValue: 4}]}"
        }
        PluginKind::ActiveRequestFilter => "\n  parameters: {maxRequests: 4}",
        // A scorer reading what an observer learns needs that observer.
        PluginKind::LatencyObservationScorerHub => "\n- type: latency-observer-producer-hub",
        PluginKind::MrlScorerHub => "\n- type: sojourn-time-observer-hub",
        PluginKind::MmEmbeddingsCacheScorer => "\n- type: mm-embeddings-cache-producer",
        PluginKind::EndpointAttributeFilter => {
            "\n  parameters: {attribute: a, algorithm: {type: threshold, threshold: {operator: Equal, value: 1}}}"
        }
        PluginKind::EndpointAttributeScorer => {
            "\n  parameters: {attributeKey: a, algorithm: {type: linear_higher_is_better}}"
        }
        _ => "",
    }
    };
    let load = LoadOptions {
        allow_experimental: true,
    };
    for &k in PluginKind::ALL {
        let built = matches!(
            k.category(),
            Category::Filter | Category::Scorer | Category::Picker
        );
        if !built || k.support() != config::Support::Plugin {
            continue;
        }
        let text = format!(
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: {k}{}\n",
            required(k)
        );
        let s = build_with(&config::parse(&text).unwrap(), load)
            .unwrap_or_else(|e| panic!("{k}: {e:?}"));
        let mut rng = SmallRng::seed_from_u64(1);
        let cands = [cand(1, 0.0, 0.0, 0), cand(2, 1.0, 0.5, 0)];
        let d = s.schedule(&req(0), &cands, &mut rng);
        assert!(
            matches!(&d, Ok(_) | Err(ScheduleError::AllFiltered)),
            "{k}: {d:?}"
        );
        if k.category() == Category::Filter {
            assert!(!s.filters.is_empty(), "{k} is not a filter of the profile");
        } else if k.category() == Category::Scorer {
            assert!(!s.scorers.is_empty(), "{k} is not a scorer of the profile");
        }
    }
}

#[test]
fn empty_candidates_and_unknown_types_are_errors() {
    let s = default_scheduler();
    let mut rng = SmallRng::seed_from_u64(3);
    assert_eq!(
        s.schedule(&req(0), &[], &mut rng),
        Err(ScheduleError::NoCandidates)
    );
    let text = config::UPSTREAM_DEFAULT_CONFIG.replace(
        "- type: queue-scorer",
        "- type: queue-scorer\n- type: magic-scorer",
    );
    let problems = build(&config::parse(&text).unwrap()).unwrap_err();
    assert!(problems[0]
        .to_string()
        .contains("unknown type \"magic-scorer\""));
}

proptest! {
    #[test]
    fn never_picks_a_filtered_out_endpoint(
        loads in proptest::collection::vec((0.0f64..100.0, 0.0f64..1.0, 0usize..10, any::<bool>()), 1..12),
        allow in proptest::collection::vec(any::<bool>(), 12),
        seed in any::<u64>(),
    ) {
        let text = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: header-based-testing-filter\n- type: queue-scorer\n- type: prefix-cache-scorer\n- type: weighted-random-picker\n  parameters: {maxNumOfEndpoints: 3}\n";
        let s = build(&config::parse(text).unwrap()).unwrap();
        let cands: Vec<Candidate> = loads.iter().enumerate().map(|(i, (q, kv, p, fresh))| {
            let mut c = cand(i as u16 + 1, *q, *kv, *p);
            c.fresh = *fresh;
            c
        }).collect();
        let allowed: Vec<String> = cands.iter().zip(&allow).filter(|(_, a)| **a).map(|(c, _)| c.id.to_string()).collect();
        let header = allowed.join(",");
        let r = SchedulingRequest { test_endpoint_selection: Some(&header), ..req(10) };
        let mut rng = SmallRng::seed_from_u64(seed);
        match s.schedule(&r, &cands, &mut rng) {
            Ok(d) => {
                prop_assert!(!d.endpoints.is_empty() && d.endpoints.len() <= 3);
                for e in &d.endpoints { prop_assert!(allowed.contains(&e.to_string())); }
                for (_, score) in &d.scores { prop_assert!(score.is_finite() && *score >= 0.0 && *score <= 2.0); }
            }
            Err(e) => prop_assert_eq!(e, ScheduleError::AllFiltered),
        }
    }
}

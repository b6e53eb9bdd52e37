//! Tests of `bench::plan`.

/// The bench's defaults in `mode`, no upstream EPPs, seed 1.
pub(crate) fn options(mode: Mode) -> PlanOptions {
    PlanOptions {
        mode,
        shared_prefix_rate: 17.0,
        random_rate: 5.5,
        duration_s: 18.0,
        warmup_s: 6.0,
        peers: false,
        profile: "llmd-h100-8b".into(),
        time_scale: 0.5,
        extra_epp: Vec::new(),
        epp_replicas: Vec::new(),
        share_speculative: false,
        upstream: false,
        seed: 1,
    }
}

use super::*;

#[test]
fn configs_with_the_precise_scorer_run_with_kv_events() {
    assert!(epp_router("precise", &config("epp-precise.yaml")).needs_kv_events());
    assert!(!epp_router("best", &config("epp-best.yaml")).needs_kv_events());
    let llmd = epp_router("llmd-precise", &config("epp-llmd-precise.yaml"));
    assert!(llmd.binds_kv_events() && !llmd.needs_kv_events());
    assert_eq!(llmd.label(), "epp-llmd-precise");
    let labels: Vec<String> = routers(false).iter().map(Router::label).collect();
    assert!(labels.contains(&"epp-precise".to_owned()) && labels.contains(&"epp-best".to_owned()));
}

#[test]
fn replica_counts_multiply_the_epp_routers_only() {
    let base = vec![Router::EnvoyRoundRobin, epp("default", "epp-default.yaml")];
    let labels: Vec<String> = with_replicas(base.clone(), &[1, 3], false)
        .iter()
        .map(Router::label)
        .collect();
    assert_eq!(
        labels,
        ["envoy-round-robin", "epp-default", "epp-default-x3"]
    );
    assert_eq!(with_replicas(base.clone(), &[], false), base);
}

#[test]
fn sharing_adds_a_shared_run_of_multi_replica_precise_routers_only() {
    let base = vec![
        epp_router("precise", &config("epp-precise.yaml")),
        epp("best", "epp-best.yaml"),
    ];
    let labels: Vec<String> = with_replicas(base, &[1, 3], true)
        .iter()
        .map(Router::label)
        .collect();
    assert_eq!(
        labels,
        [
            "epp-precise",
            "epp-precise-x3",
            "epp-precise-x3-shared",
            "epp-best",
            "epp-best-x3"
        ]
    );
}

#[test]
fn the_llmd_sim_scenarios_run_llm_ds_precise_configuration_on_both_epps() {
    let o = PlanOptions {
        epp_replicas: vec![1, 3],
        upstream: true,
        seed: 1,
        ..options(Mode::Full)
    };
    let all = scenarios(&o);
    let precise = |name: &str| -> Vec<String> {
        all.iter()
            .find(|s| s.name == name)
            .unwrap()
            .routers
            .iter()
            .filter(|r| r.binds_kv_events())
            .map(Router::label)
            .collect()
    };
    for name in ["shared-prefix-llmd-sim", "multi-turn-llmd-sim"] {
        assert_eq!(precise(name), ["llm-d-epp-precise", "epp-llmd-precise"]);
        let s = all.iter().find(|s| s.name == name).unwrap();
        assert_eq!(s.sim.engine, crate::bench::cluster::Engine::LlmdSim);
        // Not the inference-sim PUB sockets: the port is chosen per router run.
        assert!(!s.sim.kv_events && s.sim.kv_events_sub.is_none());
    }
    // And on inference-sim pods, for the two workloads the llm-d-sim scenarios repeat.
    for name in ["shared-prefix", "multi-turn"] {
        assert_eq!(precise(name), ["llm-d-epp-precise", "epp-llmd-precise"]);
    }
    assert!(precise("no-sharing").is_empty());
    for r in llmd_precise_routers() {
        assert!(r.binds_kv_events() && !r.needs_kv_events(), "{}", r.label());
        let (Router::LlmdEppPrecise { config, .. } | Router::EppLlmdPrecise { config, .. }) = &r
        else {
            unreachable!()
        };
        assert!(config.is_file(), "{}", config.display());
    }
}

#[test]
fn the_seed_reaches_every_workload() {
    let o = PlanOptions {
        epp_replicas: Vec::new(),
        upstream: false,
        seed: 42,
        ..options(Mode::Full)
    };
    for s in scenarios(&o) {
        let at = s.loadgen_args.iter().position(|a| a == "--seed");
        let seed = at.and_then(|i| s.loadgen_args.get(i + 1));
        assert_eq!(seed.map(String::as_str), Some("42"), "{}", s.name);
    }
}

#[test]
fn quick_mode_runs_the_precise_router_only_when_asked() {
    let mut o = PlanOptions {
        epp_replicas: Vec::new(),
        upstream: true,
        seed: 1,
        ..options(Mode::Quick)
    };
    let precise = |o: &PlanOptions| {
        scenarios(o)[0]
            .routers
            .iter()
            .filter(|r| r.label() == "epp-precise")
            .count()
    };
    assert_eq!(precise(&o), 0);
    o.extra_epp
        .push(("precise".into(), config("epp-precise.yaml")));
    assert_eq!(
        precise(&o),
        1,
        "the extra configuration replaces the built-in one"
    );
    o.mode = Mode::Full;
    o.extra_epp.clear();
    assert_eq!(precise(&o), 1);
}

#[test]
fn quick_mode_has_one_upstream_epp_and_full_mode_all_three() {
    let mut o = PlanOptions {
        epp_replicas: Vec::new(),
        upstream: true,
        seed: 1,
        ..options(Mode::Quick)
    };
    let upstream = |o: &PlanOptions| -> Vec<String> {
        scenarios(o)[0]
            .routers
            .iter()
            .filter(|r| matches!(r, Router::GieEpp { .. } | Router::LlmdEpp { .. }))
            .map(Router::label)
            .collect()
    };
    assert_eq!(upstream(&o), ["gie-epp-default"]);
    o.mode = Mode::Full;
    assert_eq!(
        upstream(&o),
        [
            "gie-epp-default",
            "llm-d-epp-default",
            "llm-d-epp-optimized-baseline"
        ]
    );
    o.upstream = false;
    assert!(upstream(&o).is_empty());
}

//! The simulator in the test command: a run is deterministic for its seed, the bounds bound,
//! and a small grid (the `--small` plan, cut to three routers) runs and is reported.

use routesim::grid::{self, Plan};
use routesim::report::{self, GridArgs};
use routesim::traffic::Traffic;
use routesim::{Router, Sim};
use std::path::PathBuf;
use std::time::Duration;

fn out_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("routesim")
}

fn small_args() -> GridArgs {
    GridArgs {
        seeds: 2,
        loads: vec![1.0],
        rates: Vec::new(),
        time_scale: 1.0,
        pods: 4,
        speeds: Vec::new(),
        secs: 10.0,
        warmup: 2.0,
        drain: None,
        workloads: vec!["shared-prefix".into(), "agentic".into()],
        routers: Vec::new(),
        only: vec![
            report::DEFAULT_ROUTER.into(),
            "llmd-optimized-baseline".into(),
            "round-robin".into(),
        ],
        small: false,
        verdict_for: vec![report::DEFAULT_ROUTER.into()],
        out: out_dir().join("grid.md"),
        traces: out_dir().join("traces"),
    }
}

fn one(plan: &Plan, router: &Router, seed: u64) -> Vec<routesim::Record> {
    let shape = &plan.shapes[0];
    let rate = shape.capacity(&plan.cluster);
    let traffic = Traffic::plan(&shape.workload, rate, plan.secs, 10_000, seed);
    Sim::new(&plan.cluster, router, traffic, seed, Duration::from_secs(5))
        .expect("sim")
        .run()
}

#[test]
fn a_run_is_the_same_for_its_seed_and_differs_between_seeds() {
    let plan = small_args().plan().expect("plan");
    let epp = plan.routers[0].clone();
    let (a, b, c) = (
        one(&plan, &epp, 7),
        one(&plan, &epp, 7),
        one(&plan, &epp, 8),
    );
    assert!(a.len() > 20, "{} requests", a.len());
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert!(a.iter().all(|r| r.ok()), "{:?}", a.iter().find(|r| !r.ok()));
}

#[test]
fn no_request_beats_its_own_prefill_floor_and_the_ideal_cache_holds_most() {
    let plan = small_args().plan().expect("plan");
    for router in &plan.routers {
        for r in one(&plan, router, 3) {
            let bound = r.bound.expect("every sent request has its bound");
            let ttft = r.ttft.expect("answered");
            assert!(ttft + 1e-9 >= bound.floor_ttft, "{router:?}: {r:?}");
            assert!(r.cached_tokens <= bound.ideal_cached, "{router:?}: {r:?}");
            assert!(bound.oracle_cached.expect("few pods") <= bound.ideal_cached);
        }
    }
}

#[test]
fn the_small_grid_runs_and_cache_aware_routing_beats_round_robin_on_hits() {
    let args = small_args();
    let plan = args.plan().expect("plan");
    let cells = grid::run(&plan, |_| {}).expect("grid");
    assert_eq!(
        cells.len(),
        plan.shapes.len() * plan.loads.len() * plan.routers.len()
    );
    report::write(&args.out, &plan, &cells).expect("report");
    let md = std::fs::read_to_string(&args.out).expect("table");
    assert!(md.contains("| shared-prefix | 100% |"), "{md}");
    // The verdict judges the default against the best other router, also seed by seed.
    assert!(md.contains("Verdict for `epp-default`"), "{md}");
    assert!(md.contains("paired: epp-default / best, per seed"), "{md}");
    assert!(cells.iter().all(|c| c.ttft_p90_runs.len() == 2), "{md}");
    // Shared prefixes: a cache-aware router keeps groups on their pods, round robin cannot.
    // (Agentic sessions need minutes, not this test's seconds, to come back to a pod.)
    let hit = |r: &str| {
        cells
            .iter()
            .find(|c| c.workload == "shared-prefix" && c.router == r)
            .map(|c| c.hit_rate.mean)
            .expect("cell")
    };
    assert!(
        hit(report::DEFAULT_ROUTER) > hit("round-robin") + 0.05,
        "{md}"
    );
    assert!(cells.iter().all(|c| c.speed > 1.0), "{md}");
}

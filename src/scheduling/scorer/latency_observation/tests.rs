use super::*;
use crate::config::plugin::params_yaml;

fn scorer(yaml: &str) -> Result<LatencyObservationScorer, String> {
    params_yaml::<LatencyObservationScorer>(yaml)?
        .validate()
        .map_err(|e| e.to_string())
}

/// A trusted endpoint: floor 0.1 s, 0.2 s at 2 in flight, 0.6 s at 6.
fn curve() -> Percentiles {
    Percentiles {
        floor_ttft: 0.1,
        window_floor_ttft: 0.1,
        low_load_ttft: 0.2,
        typical_load_ttft: 0.6,
        inflight_at_low_load: 2.0,
        inflight_at_typical_load: 6.0,
        recent: 50,
        observations: 500,
        threshold: 10,
    }
}

#[test]
fn defaults_are_upstreams_and_bad_parameters_are_named() {
    let d = scorer("{}").unwrap();
    assert_eq!(
        (d.exploration_rate, d.min_inflight_gap, d.round_ttft_step),
        (0.1, 2.0, 0.0)
    );
    for (yaml, named) in [
        ("{explorationRate: 1.5}", "explorationRate"),
        ("{minInflightGap: 0}", "minInflightGap"),
        ("{roundTTFTStep: -0.01}", "roundTTFTStep"),
    ] {
        let err = scorer(yaml).unwrap_err();
        assert!(err.contains(named), "{yaml}: {err}");
    }
    let named = scorer("{ttftPercentilesProducerName: obs}").unwrap();
    assert_eq!(named.producer_name(), Some("obs"));
    assert_eq!(d.producer_name(), None);
}

#[test]
fn the_prediction_follows_the_curve_at_the_current_load() {
    let s = scorer("{}").unwrap();
    let p = curve();
    let at = |load: f64| s.eval(Some(&p), load).pred;
    assert!((at(0.0) - 0.1).abs() < 1e-12, "A: the floor when idle");
    assert!((at(1.0) - 0.15).abs() < 1e-12, "on A→B");
    assert!((at(2.0) - 0.2).abs() < 1e-12, "B");
    assert!((at(4.0) - 0.4).abs() < 1e-12, "on B→C");
    assert!((at(10.0) - 1.0).abs() < 1e-12, "B→C extended past C");
    // Anchors closer than minInflightGap: the chord A→C instead.
    let close = Percentiles {
        inflight_at_low_load: 5.0,
        ..curve()
    };
    let chord = s.eval(Some(&close), 3.0).pred;
    assert!((chord - (0.1 + 3.0 * 0.5 / 6.0)).abs() < 1e-12);
}

#[test]
fn cold_seed_and_trusted_endpoints_are_told_apart() {
    let s = scorer("{}").unwrap();
    assert_eq!(s.eval(None, 3.0), Eval::default(), "never observed: cold");
    let few = Percentiles {
        observations: 5,
        ..curve()
    };
    assert!(!s.eval(Some(&few), 3.0).warm, "below minRequests: cold");
    let stale = Percentiles {
        recent: 3,
        ..curve()
    };
    let e = s.eval(Some(&stale), 5.0);
    assert!(
        e.warm && !e.trusted && e.pred == 0.1,
        "a floor alone: {e:?}"
    );
}

#[test]
fn the_least_predicted_ttft_scores_best_and_cold_endpoints_explore() {
    let s = scorer("{explorationRate: 0.5}").unwrap();
    let p = curve();
    // Idle, loaded, cold.
    let evals = [
        s.eval(Some(&p), 0.0),
        s.eval(Some(&p), 6.0),
        s.eval(None, 0.0),
    ];
    let mut out = [0.0; 3];
    s.normalise(&evals, &mut out, || 0.9);
    assert_eq!(
        out,
        [1.0, 0.0, 0.0],
        "no probe: the cold one yields to the trusted"
    );
    s.normalise(&evals, &mut out, || 0.1);
    assert_eq!(out, [1.0, 0.0, 1.0], "a probe");
    let none = scorer("{explorationRate: 0}").unwrap();
    none.normalise(&evals, &mut out, || 0.0);
    assert_eq!(out, [1.0, 0.0, 1.0], "seeded at the best prediction");
    none.normalise(&[Eval::default(); 3], &mut out, || 0.0);
    assert_eq!(out, [1.0; 3], "all cold: all tie");
}

#[test]
fn rounding_ties_endpoints_closer_than_the_step() {
    let s = scorer("{roundTTFTStep: 0.1, explorationRate: 0}").unwrap();
    let p = curve();
    let evals = [s.eval(Some(&p), 0.0), s.eval(Some(&p), 0.2)];
    let mut out = [0.0; 2];
    s.normalise(&evals, &mut out, || 0.0);
    assert_eq!(out, [1.0, 1.0]);
}

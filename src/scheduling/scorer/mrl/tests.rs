use super::*;
use crate::config::plugin::params_yaml;
use crate::scheduling::lifecycle::{FirstToken, Lifecycle};
use crate::scheduling::testing::cand;
use std::time::Duration;

fn scorer(yaml: &str) -> Result<MrlScorer, String> {
    params_yaml::<MrlScorer>(yaml)?
        .validate()
        .map_err(|e| e.to_string())
}

fn observer(min_samples: u64) -> SojournObserver {
    params_yaml::<SojournObserver>(&format!("{{minSamples: {min_samples}}}"))
        .unwrap()
        .validate()
        .unwrap()
}

fn place(o: &SojournObserver, id: u64, pod: &Candidate, now: Instant) {
    let req = SchedulingRequest {
        now,
        ..Default::default()
    };
    crate::scheduling::lifecycle::place_on(o, id, &req, pod);
}

fn first(o: &SojournObserver, id: u64, pod: &Candidate, now: Instant) {
    o.first_token(&FirstToken {
        id,
        served: pod.id,
        stream: true,
        now,
    });
}

fn end(o: &SojournObserver, id: u64, pod: &Candidate, now: Instant) {
    o.response_complete(&crate::scheduling::lifecycle::Completed {
        id,
        headers: &crate::scheduling::lifecycle::NO_HEADERS,
        served: pod.id,
        started: now,
        now,
        ok: true,
        stream: true,
    });
}

/// Teaches `pod` one exchange: TTFT 1 s, decode `decode` s.
fn teach(o: &SojournObserver, id: u64, pod: &Candidate, t: Instant, decode: f64) {
    place(o, id, pod, t);
    let f = t + Duration::from_secs(1);
    first(o, id, pod, f);
    end(o, id, pod, f + Duration::from_secs_f64(decode));
}

#[test]
fn defaults_are_upstreams_and_bad_parameters_are_named() {
    let d = scorer("{}").unwrap();
    assert_eq!(d.exploration_rate, 0.1);
    assert_eq!(d.producer_name(), None);
    let err = scorer("{explorationRate: -0.1}").unwrap_err();
    assert!(err.contains("explorationRate"), "{err}");
    let named = scorer("{sojournTimeObserverProducerName: s}").unwrap();
    assert_eq!(named.producer_name(), Some("s"));
}

#[test]
fn the_residual_ages_each_request_in_its_phase() {
    let o = observer(1);
    let a = cand(1, 0.0, 0.0, 0);
    let t0 = Instant::now();
    // TTFTs of 1 s; decodes of 2 s and 4 s.
    teach(&o, 1, &a, t0, 2.0);
    teach(&o, 2, &a, t0, 4.0);
    let now = t0 + Duration::from_secs(100);
    // One request waiting 0.5 s for its first chunk: 0.5 s of TTFT + a 3 s decode.
    place(&o, 3, &a, now - Duration::from_millis(500));
    let r = o.read(a.id, |s| residual(s, now)).unwrap();
    assert!((r - 3.5).abs() < 1e-9, "{r}");
    // Another decoding for 3 s (after a TTFT of 1 s, as learned): only the 4 s decode lies
    // past it, 1 s left.
    place(&o, 4, &a, now - Duration::from_secs(4));
    first(&o, 4, &a, now - Duration::from_secs(3));
    let r = o.read(a.id, |s| residual(s, now)).unwrap();
    assert!((r - 4.5).abs() < 1e-9, "{r}");
}

#[test]
fn the_endpoint_owing_least_work_scores_best() {
    let o = observer(2);
    let (a, b, c) = (
        cand(1, 0.0, 0.0, 0),
        cand(2, 0.0, 0.0, 0),
        cand(3, 0.0, 0.0, 0),
    );
    let t0 = Instant::now();
    for (i, pod) in [&a, &a, &b, &b].into_iter().enumerate() {
        teach(&o, i as u64, pod, t0, 2.0);
    }
    let now = t0 + Duration::from_secs(60);
    // Both hold one request, a's just started, b's nearly done decoding.
    place(&o, 10, &a, now);
    place(&o, 11, &b, now - Duration::from_secs(3));
    first(&o, 11, &b, now - Duration::from_millis(2900));
    let mut s = scorer("{explorationRate: 0}").unwrap();
    s.observer = Some(o.clone());
    let req = SchedulingRequest {
        now,
        ..Default::default()
    };
    let mut out = [0.0; 3];
    s.score(&req, &[&a, &b, &c], &mut out, &mut rand::rng());
    // c is cold: seeded at the least residual (b's).
    assert_eq!(out, [0.0, 1.0, 1.0]);
    let mut probing = scorer("{explorationRate: 0.5}").unwrap();
    probing.observer = Some(o);
    let residuals = [Some(3.0), Some(1.0), None];
    probing.normalise(&residuals, &mut out, || 0.9);
    assert_eq!(out, [0.0, 1.0, 0.0], "no probe: the cold one scores 0");
    probing.normalise(&residuals, &mut out, || 0.2);
    assert_eq!(out[2], 1.0, "a probe");
    probing.normalise(&[None, None], &mut out[..2], || 0.9);
    assert_eq!(out[..2], [1.0, 1.0], "all cold: all tie");
}

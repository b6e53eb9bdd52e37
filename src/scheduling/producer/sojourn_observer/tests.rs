use super::*;
use crate::config::plugin::params_yaml;
use crate::scheduling::lifecycle::NO_HEADERS;
use crate::scheduling::testing::cand;
use crate::scheduling::{Candidate, SchedulingRequest};

fn observer(yaml: &str) -> Result<SojournObserver, String> {
    params_yaml::<SojournObserver>(yaml)?
        .validate()
        .map_err(|e| e.to_string())
}

pub(crate) fn place(o: &SojournObserver, id: u64, pod: &Candidate, now: Instant) {
    let req = SchedulingRequest {
        now,
        ..Default::default()
    };
    crate::scheduling::lifecycle::place_on(o, id, &req, pod);
}

fn complete(o: &SojournObserver, id: u64, pod: EndpointId, now: Instant, ok: bool) {
    end(o, id, pod, now, (ok, true));
}

fn end(o: &SojournObserver, id: u64, pod: EndpointId, now: Instant, (ok, stream): (bool, bool)) {
    o.response_complete(&Completed {
        id,
        headers: &NO_HEADERS,
        served: pod,
        started: now,
        now,
        ok,
        stream,
    });
}

#[test]
fn defaults_are_upstreams_and_bad_parameters_are_named() {
    let d = observer("{}").unwrap();
    assert_eq!((d.compression, d.min_samples), (200.0, 60));
    assert_eq!(d.interval_duration, "5s");
    for (yaml, named) in [
        ("{compression: 0.5}", "compression"),
        ("{minSamples: 0}", "minSamples"),
        ("{intervalDuration: 0s}", "intervalDuration"),
        ("{intervalDuration: often}", "intervalDuration"),
    ] {
        let err = observer(yaml).unwrap_err();
        assert!(err.contains(named), "{yaml}: {err}");
    }
}

#[test]
fn the_mean_residual_life_of_a_digest() {
    let mut d = Digest::new(200.0);
    for x in [1.0, 2.0, 3.0, 4.0] {
        d.add(x);
    }
    assert_eq!(d.mean(), 2.5);
    // Past 2.5 s, only 3 and 4 remain possible: 3.5 − 2.5 = 1 s.
    assert!((d.mrl(2.5) - 1.0).abs() < 1e-12);
    assert_eq!(d.mrl(0.0), 2.5);
    assert_eq!(d.mrl(9.0), 0.0, "older than every sample");
    assert_eq!(Digest::new(10.0).mrl(1.0), 0.0, "empty");
}

#[test]
fn a_digest_stays_bounded_and_keeps_its_mean_and_tail() {
    let mut d = Digest::new(20.0);
    // Exponential-like: most short, a long tail.
    let samples: Vec<f64> = (0..2000)
        .map(|i| -(1.0 - (i as f64 + 0.5) / 2000.0).ln())
        .collect();
    // Added in a shuffled order (7919 is prime to 2000: a permutation).
    for i in 0..samples.len() {
        d.add(samples[(i * 7919) % samples.len()]);
    }
    assert!(d.centroids.len() <= 20);
    assert_eq!(d.count(), 2000);
    let mean = samples.iter().sum::<f64>() / 2000.0;
    assert!((d.mean() - mean).abs() < 1e-9, "merging keeps the mean");
    // Memoryless: the residual life at 1 s is about the mean (1 s), within the digest's
    // resolution.
    assert!((d.mrl(1.0) - 1.0).abs() < 0.25, "{}", d.mrl(1.0));
}

#[test]
fn dispatch_first_chunk_and_end_feed_the_two_digests() {
    let o = observer("{minSamples: 1}").unwrap();
    let (a, t0) = (cand(1, 0.0, 0.0, 0), Instant::now());
    place(&o, 1, &a, t0);
    let phase = |o: &SojournObserver| o.read(a.id, |s| s.inflight().next().copied()).flatten();
    assert_eq!(phase(&o).unwrap().first_chunk, None);
    let first = t0 + Duration::from_millis(200);
    o.first_token(&FirstToken {
        id: 1,
        served: a.id,
        stream: true,
        now: first,
    });
    assert_eq!(phase(&o).unwrap().first_chunk, Some(first));
    complete(&o, 1, a.id, first + Duration::from_secs(2), true);
    let (warm, ttft, decode, left) = o
        .read(a.id, |s| {
            (s.warm, s.ttft.mean(), s.decode.mean(), s.inflight().count())
        })
        .unwrap();
    assert!(warm);
    assert!((ttft - 0.2).abs() < 1e-9 && (decode - 2.0).abs() < 1e-9);
    assert_eq!(left, 0);
    // A failed exchange leaves no sample, only its in-flight record goes.
    place(&o, 2, &a, t0);
    complete(&o, 2, a.id, t0 + Duration::from_secs(1), false);
    let counts = o.read(a.id, |s| {
        (s.ttft.count(), s.decode.count(), s.inflight().count())
    });
    assert_eq!(counts, Some((1, 1, 0)));
    // An answer not streamed: its first chunk is its TTFT, its decode 0 however long the
    // rest of the body took to arrive.
    place(&o, 3, &a, t0);
    let chunk = FirstToken {
        id: 3,
        served: a.id,
        stream: false,
        now: t0 + Duration::from_secs(1),
    };
    o.first_token(&chunk);
    end(&o, 3, a.id, t0 + Duration::from_secs(2), (true, false));
    let decode = o
        .read(a.id, |s| (s.decode.count(), s.decode.mean()))
        .unwrap();
    assert_eq!(decode, (2, 1.0), "samples 2 s and 0 s");
}

#[test]
fn an_endpoint_gone_from_the_pool_is_forgotten_with_its_requests() {
    let o = observer("{}").unwrap();
    let (a, b, t0) = (cand(1, 0.0, 0.0, 0), cand(2, 0.0, 0.0, 0), Instant::now());
    place(&o, 1, &a, t0);
    place(&o, 2, &b, t0 + FORGET_AFTER + Duration::from_secs(1));
    assert!(o.read(a.id, |_| ()).is_none());
    assert!(!o.state.lock().owner.contains_key(&1));
    assert!(o.read(b.id, |_| ()).is_some());
}

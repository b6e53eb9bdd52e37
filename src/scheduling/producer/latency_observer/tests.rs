use super::*;
use crate::config::plugin::params_yaml;
use crate::scheduling::testing::cand;
use crate::scheduling::{Candidate, SchedulingRequest};

fn observer(yaml: &str) -> Result<LatencyObserver, String> {
    params_yaml::<LatencyObserver>(yaml)?
        .validate()
        .map_err(|e| e.to_string())
}

/// Places request `id` on `pod` (carrying `inflight` requests) at `now`.
fn place(o: &LatencyObserver, id: u64, pod: &Candidate, now: Instant) {
    let req = SchedulingRequest {
        now,
        ..Default::default()
    };
    crate::scheduling::lifecycle::place_on(o, id, &req, pod);
}

fn pod(port: u16, inflight: f64) -> Candidate {
    Candidate {
        inflight,
        ..cand(port, 0.0, 0.0, 0)
    }
}

#[test]
fn defaults_are_upstreams_and_bad_parameters_are_named() {
    let d = observer("{}").unwrap();
    assert_eq!(d.settings, LatencyObserver::default().settings);
    assert_eq!(
        (d.max_requests, d.min_requests, d.window_size),
        (100, 10, 5000)
    );
    assert_eq!(d.settings.interval, Duration::from_secs(1));
    assert_eq!(d.settings.max_age, Duration::from_secs(180));
    for (yaml, named) in [
        ("{lowPercentile: 60}", "lowPercentile"),
        ("{typicalPercentile: 100}", "typicalPercentile"),
        ("{maxRequests: 6000}", "maxRequests"),
        ("{minRequests: 0}", "minRequests"),
        ("{bucketHistorySize: 1}", "bucketHistorySize"),
        ("{intervalDuration: 0s}", "intervalDuration"),
        ("{maxObservationAge: soon}", "maxObservationAge"),
        ("{bucketDuration: -1m}", "bucketDuration"),
    ] {
        let err = observer(yaml).unwrap_err();
        assert!(err.contains(named), "{yaml}: {err}");
    }
    assert!(observer("{windowSizes: 3}")
        .unwrap_err()
        .contains("windowSizes"));
}

#[test]
fn percentiles_interpolate_and_the_band_averages_load() {
    let sorted: Vec<f64> = (1..=11).map(f64::from).collect();
    assert_eq!(percentile(&sorted, 0.5), 6.0);
    assert!((percentile(&sorted, 0.25) - 3.5).abs() < 1e-12);
    assert_eq!(percentile(&[], 0.5), 0.0);
    let at = Instant::now();
    let obs: Vec<Observation> = (0..11)
        .map(|i| Observation {
            ttft: f64::from(i),
            inflight: f64::from(i * 2),
            at,
        })
        .collect();
    // p = 0.5 over 11: indices 4..=6, loads 8, 10, 12.
    assert_eq!(band_inflight(&obs, 0.5), 10.0);
}

#[test]
fn a_streamed_first_chunk_is_a_ttft_observation_under_the_load_at_dispatch() {
    let o = observer("{minRequests: 2, intervalDuration: 1ms}").unwrap();
    let t0 = Instant::now();
    let a = pod(1, 0.0);
    // Five requests at rising load, each slower: TTFT = 0.1 × (1 + load).
    for (i, load) in [0.0, 1.0, 2.0, 3.0, 4.0].into_iter().enumerate() {
        let at = t0 + Duration::from_secs(i as u64);
        place(&o, i as u64, &pod(1, load), at);
        let ttft = Duration::from_secs_f64(0.1 * (1.0 + load));
        o.first_token(&FirstToken {
            id: i as u64,
            served: a.id,
            stream: true,
            now: at + ttft,
        });
    }
    let p = o.percentiles(a.id).unwrap();
    assert_eq!((p.recent, p.observations, p.threshold), (5, 5, 2));
    assert!((p.typical_load_ttft - 0.3).abs() < 1e-6, "{p:?}");
    assert!((p.low_load_ttft - 0.2).abs() < 1e-6, "{p:?}");
    assert!(p.inflight_at_typical_load > p.inflight_at_low_load, "{p:?}");
    // No bucket has closed: the short window's P10 is the floor.
    assert!((p.floor() - p.window_floor_ttft).abs() < 1e-12 && p.floor() > 0.09);
}

#[test]
fn an_answer_in_one_chunk_and_a_completion_teach_nothing() {
    let o = observer("{minRequests: 1}").unwrap();
    let (a, t0) = (pod(1, 0.0), Instant::now());
    place(&o, 7, &a, t0);
    let whole = FirstToken {
        id: 7,
        served: a.id,
        stream: false,
        now: t0 + Duration::from_secs(3),
    };
    o.first_token(&whole);
    assert_eq!(o.percentiles(a.id), None);
    place(&o, 8, &a, t0);
    o.response_complete(&Completed {
        id: 8,
        headers: &crate::scheduling::lifecycle::NO_HEADERS,
        served: a.id,
        started: t0,
        now: t0 + Duration::from_secs(1),
        ok: true,
        stream: true,
    });
    assert!(o.state.lock().pending.is_empty());
    assert_eq!(o.percentiles(a.id), None);
}

#[test]
fn the_floor_remembers_quiet_buckets_and_gone_endpoints_are_forgotten() {
    let o = observer("{minRequests: 1, intervalDuration: 1ms, bucketDuration: 10s}").unwrap();
    let (a, t0) = (pod(1, 0.0), Instant::now());
    let mut now = t0;
    // A quiet bucket at 0.1 s, then a loaded one at 1 s.
    for (i, ttft) in [0.1, 0.1, 0.1, 1.0, 1.0, 1.0, 1.0].into_iter().enumerate() {
        now = t0 + Duration::from_secs(6 * i as u64);
        o.observe(a.id, ttft, 0.0, now);
    }
    let p = o.percentiles(a.id).unwrap();
    assert!(p.floor_ttft > 0.0 && p.floor_ttft < 0.5, "{p:?}");
    assert!(p.typical_load_ttft >= 1.0, "{p:?}");
    // Requests whose candidates no longer include it: after FORGET_AFTER it is gone.
    let b = pod(2, 0.0);
    place(&o, 1, &b, now + FORGET_AFTER + Duration::from_secs(1));
    assert_eq!(o.percentiles(a.id), None);
}

#[test]
fn the_window_is_bounded_by_its_size() {
    let o = observer("{windowSize: 4, maxRequests: 4}").unwrap();
    let t0 = Instant::now();
    let a = pod(1, 0.0);
    for i in 0..10 {
        o.observe(a.id, 0.1, 0.0, t0 + Duration::from_millis(i));
    }
    assert_eq!(o.state.lock().map[&a.id].ring.len(), 4);
}

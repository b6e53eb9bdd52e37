//! The datastore: snapshots, one writer per source, passive health and slow start applied.

use super::*;
use std::time::Instant;

fn ep(port: u16) -> Endpoint {
    Endpoint::from_id(format!("127.0.0.1:{port}").parse().unwrap())
}

fn metrics() -> EndpointMetrics {
    crate::fixtures::metrics()
        .waiting(1.0)
        .running(2.0)
        .kv_usage(0.5)
        .build()
}

#[test]
fn unchanged_endpoints_keep_state_and_do_not_signal() {
    let ds = Datastore::new();
    let mut rx = ds.subscribe();
    ds.set_endpoints(vec![ep(1), ep(2)]);
    assert!(rx.has_changed().unwrap());
    rx.borrow_and_update();
    let s1 = Arc::clone(ds.snapshot().get(&ep(1).id).unwrap());
    s1.store_metrics(metrics());
    ds.set_endpoints(vec![ep(2), ep(1)]);
    assert!(!rx.has_changed().unwrap(), "same set, no signal");
    let mut relabelled = ep(1);
    relabelled.weight = 3;
    ds.set_endpoints(vec![relabelled, ep(3)]);
    let snap = ds.snapshot();
    assert_eq!(snap.len(), 2);
    assert!(snap.get(&ep(2).id).is_none());
    assert_eq!(snap.get(&ep(1).id).unwrap().metrics().unwrap().waiting, 1.0);
}

#[test]
fn guards_count_inflight_and_scrapes_reset_dispatch_count() {
    let ds = Datastore::new();
    ds.set_endpoints(vec![ep(1)]);
    let s = Arc::clone(ds.snapshot().get(&ep(1).id).unwrap());
    let g1 = s.acquire(Instant::now());
    let g2 = s.acquire(Instant::now());
    assert_eq!((s.inflight(), s.dispatched_since_scrape()), (2, 2));
    s.store_metrics(metrics());
    drop(g1);
    assert_eq!((s.inflight(), s.dispatched_since_scrape()), (1, 0));
    drop(g2);
    assert_eq!(s.inflight(), 0);
}

#[test]
fn prefill_guards_count_pending_tokens_until_released() {
    let ds = Datastore::new();
    ds.set_endpoints(vec![ep(1)]);
    let s = Arc::clone(ds.snapshot().get(&ep(1).id).unwrap());
    let a = s.start_prefill(1000);
    let b = s.start_prefill(24);
    assert_eq!(s.prefill_pending(), (1024, 2));
    drop(a);
    assert_eq!(s.prefill_pending(), (24, 1));
    drop(b);
    assert_eq!(s.prefill_pending(), (0, 0));
}

fn policy() -> HealthPolicy {
    let outlier = ejection::OutlierParams {
        consecutive_5xx: 2,
        consecutive_local_origin_failure: 2,
        base_ejection_time: Duration::from_secs(5),
        max_ejection_time: Duration::from_secs(60),
    };
    let slow_start = ejection::SlowStartParams {
        slow_start_window: Duration::from_secs(10),
        aggression: 1.0,
        min_weight_percent: 10.0,
    };
    HealthPolicy {
        outlier: Some(outlier),
        slow_start: Some(slow_start),
    }
}

fn status(code: u16) -> Observation {
    Observation {
        status: Some(code),
        ttft: Some(Duration::from_millis(20)),
        ..Default::default()
    }
}

#[test]
fn client_errors_never_eject_but_server_errors_do_and_count_as_slow() {
    let (ds, p, t0) = (Datastore::new(), policy(), Instant::now());
    ds.set_endpoints(vec![ep(1)]);
    let s = Arc::clone(ds.snapshot().get(&ep(1).id).unwrap());
    for _ in 0..10 {
        assert_eq!(s.record(&status(400), &p, t0), Transition::None);
        assert_eq!(s.record(&status(501), &p, t0), Transition::None);
    }
    assert!(s.available(&p, t0) && !s.ejected());
    assert!(s.latency(t0).0.unwrap() < 0.1);
    s.record(&status(500), &p, t0);
    assert!(s.latency(t0).0.unwrap() >= 1.0, "an error is slow");
    assert!(matches!(
        s.record(&status(503), &p, t0),
        Transition::Ejected { .. }
    ));
    assert!(!s.available(&p, t0 + Duration::from_secs(1)));
}

#[test]
fn a_restored_endpoint_ramps_up_again_and_state_survives_a_set_replacement() {
    let (ds, p) = (Datastore::new(), policy());
    ds.set_endpoints(vec![ep(1)]);
    let s = Arc::clone(ds.snapshot().get(&ep(1).id).unwrap());
    let t0 = Instant::now();
    let connect = Observation {
        failure: Some(Failure::Connect),
        ..Default::default()
    };
    s.record(&connect, &p, t0);
    s.record(&connect, &p, t0);
    let mut relabelled = ep(1);
    relabelled.weight = 2;
    ds.set_endpoints(vec![relabelled]);
    let s = Arc::clone(ds.snapshot().get(&ep(1).id).unwrap());
    assert!(s.ejected() && !s.available(&p, t0), "carried over");
    let t1 = t0 + Duration::from_secs(5);
    assert!(s.available(&p, t1));
    drop(s.acquire(Instant::now()));
    assert!(!s.available(&p, t1), "half-open: the one probe is out");
    assert_eq!(s.record(&status(200), &p, t1), Transition::Restored);
    assert!(
        (s.ramp(&p, t1) - 0.1).abs() < 1e-9,
        "restored: back to the minimum share"
    );
    assert!((s.ramp(&p, t1 + Duration::from_secs(5)) - 0.5).abs() < 1e-9);
    assert_eq!(
        s.ramp(&HealthPolicy::default(), t1),
        1.0,
        "no slow start configured"
    );
}

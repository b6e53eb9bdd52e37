use super::*;
use crate::config::{Fairness, Las, QueueOrder};
use crate::metrics::Metrics;
use std::sync::atomic::{AtomicU64, Ordering};

fn ticket(priority: Priority, flow: &str, bytes: u64) -> Ticket {
    Ticket {
        priority,
        fairness_id: flow.into(),
        bytes,
        model_name: "m".into(),
        slo_deadline: None,
    }
}

/// The order `config` releases seven requests in: three of key `a` and two of `b` in band 0,
/// queued a1 a2 a3 b1 b2 with a band -1 and a band 10 request between them.
fn release_order(config: FlowConfig) -> Vec<&'static str> {
    let mut q = Queues::new(config);
    for (p, f, name) in [
        (0, "a", "a1"),
        (0, "a", "a2"),
        (0, "a", "a3"),
        (0, "b", "b1"),
        (-1, "a", "shed"),
        (10, "c", "crit"),
        (0, "b", "b2"),
    ] {
        q.push(&ticket(p, f, 1), name).unwrap();
    }
    let order: Vec<&str> = std::iter::from_fn(|| q.pop().map(|(_, n)| n)).collect();
    assert!(q.is_empty());
    assert_eq!(q.bytes(), 0);
    order
}

/// Higher bands first; in a band, upstream's default (global strict) releases the oldest
/// request whatever its key, round robin takes the keys in turn; first in, first out within a
/// key either way. A band's own policy wins over the default band's.
#[test]
fn higher_bands_first_then_the_bands_fairness_policy_then_fifo() {
    assert_eq!(
        release_order(FlowConfig::default()),
        ["crit", "a1", "a2", "a3", "b1", "b2", "shed"]
    );
    let policy = |fairness| BandPolicy {
        fairness,
        order: QueueOrder::Fcfs,
    };
    let round_robin = FlowConfig {
        default_band: policy(Fairness::RoundRobin),
        ..FlowConfig::default()
    };
    assert_eq!(
        release_order(round_robin.clone()),
        ["crit", "a1", "b1", "a2", "b2", "a3", "shed"]
    );
    let band_0_strict = FlowConfig {
        bands: vec![(0, policy(Fairness::GlobalStrict))],
        ..round_robin
    };
    assert_eq!(
        release_order(band_0_strict),
        ["crit", "a1", "a2", "a3", "b1", "b2", "shed"]
    );
    let band_0_round_robin = FlowConfig {
        bands: vec![(0, policy(Fairness::RoundRobin))],
        ..FlowConfig::default()
    };
    assert_eq!(
        release_order(band_0_round_robin),
        ["crit", "a1", "b1", "a2", "b2", "a3", "shed"]
    );
}

/// `slo-deadline-ordering-policy`: within a key the earliest SLO deadline first, requests
/// without one after, first come first among equals; global strict compares the keys' firsts
/// by the same order, round robin still takes the keys in turn.
#[test]
fn the_slo_deadline_ordering_serves_the_earliest_deadline_first() {
    let now = Instant::now();
    let at = |ms: u64| Some(now + Duration::from_millis(ms));
    let order = |fairness| {
        let mut q = Queues::new(FlowConfig {
            default_band: BandPolicy {
                fairness,
                order: QueueOrder::SloDeadline,
            },
            ..FlowConfig::default()
        });
        for (f, deadline, name) in [
            ("a", None, "a-none"),
            ("a", at(900), "a-900"),
            ("a", at(100), "a-100"),
            ("b", at(500), "b-500"),
            ("b", None, "b-none"),
            ("a", at(100), "a-100-later"),
        ] {
            let t = Ticket {
                slo_deadline: deadline,
                ..ticket(0, f, 1)
            };
            q.push(&t, name).unwrap();
        }
        std::iter::from_fn(|| q.pop().map(|(_, n)| n)).collect::<Vec<_>>()
    };
    assert_eq!(
        order(Fairness::GlobalStrict),
        ["a-100", "a-100-later", "b-500", "a-900", "a-none", "b-none"]
    );
    assert_eq!(
        order(Fairness::RoundRobin),
        ["a-100", "b-500", "a-100-later", "b-none", "a-900", "a-none"]
    );
}

#[test]
fn capacity_is_counted_in_requests_total_bytes_and_band_bytes() {
    let config = FlowConfig {
        max_requests: 3,
        max_bytes: 100,
        band_max_bytes: 60,
        ..FlowConfig::default()
    };
    let mut q = Queues::new(config);
    q.push(&ticket(0, "a", 50), ()).unwrap();
    assert_eq!(
        q.push(&ticket(0, "a", 11), ()),
        Err(FlowError::Full {
            limit: "priority band maxBytes",
            value: 60
        })
    );
    q.push(&ticket(1, "a", 40), ()).unwrap();
    assert_eq!(
        q.push(&ticket(2, "a", 11), ()),
        Err(FlowError::Full {
            limit: "maxBytes",
            value: 100
        })
    );
    q.push(&ticket(2, "a", 1), ()).unwrap();
    assert_eq!(
        q.push(&ticket(3, "a", 0), ()),
        Err(FlowError::Full {
            limit: "maxRequests",
            value: 3
        })
    );
    assert!(q.push(&ticket(0, "a", 0), ()).unwrap_err().is_capacity());
    assert_eq!((q.len(), q.bytes()), (3, 91));
}

#[test]
fn removal_frees_capacity_and_keeps_the_rotation() {
    let mut q = Queues::new(FlowConfig {
        max_requests: 2,
        ..FlowConfig::default()
    });
    let a = q.push(&ticket(0, "a", 5), "a").unwrap();
    q.push(&ticket(0, "b", 5), "b").unwrap();
    assert_eq!(q.remove(a), Some("a"));
    assert_eq!(q.remove(a), None);
    q.push(&ticket(0, "c", 5), "c").unwrap();
    assert_eq!(q.pop().map(|(_, n)| n), Some("b"));
    assert_eq!(q.pop().map(|(_, n)| n), Some("c"));
    assert_eq!((q.len(), q.bytes()), (0, 0));
}

/// A flow control whose saturation the test sets (in thousandths).
fn flow(config: FlowConfig) -> (Arc<FlowControl>, Arc<AtomicU64>) {
    let level = Arc::new(AtomicU64::new(0));
    let read = Arc::clone(&level);
    let metrics = Arc::new(Metrics::register(
        &mut prometheus_client::registry::Registry::default(),
    ));
    (
        FlowControl::new(
            config,
            move || read.load(Ordering::SeqCst) as f64 / 1000.0,
            metrics,
            "pool".into(),
        ),
        level,
    )
}

#[tokio::test(start_paused = true)]
async fn passes_at_once_when_idle_and_waits_while_saturated() {
    let (fc, level) = flow(FlowConfig::default());
    fc.admit(ticket(0, "a", 1)).await.unwrap();
    level.store(1000, Ordering::SeqCst);
    let shutdown = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(Arc::clone(&fc).run(shutdown.clone()));
    let mut waiter = tokio::task::JoinSet::new();
    let fc2 = Arc::clone(&fc);
    waiter.spawn(async move { fc2.admit(ticket(0, "a", 1)).await });
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(fc.len(), 1, "still waiting while saturated");
    level.store(500, Ordering::SeqCst);
    waiter.join_next().await.unwrap().unwrap().unwrap();
    assert!(fc.is_empty());
    shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn critical_is_released_before_sheddable_and_expiry_is_503() {
    let config = FlowConfig {
        ttl: Duration::from_secs(30),
        ..FlowConfig::default()
    };
    let (fc, level) = flow(config);
    level.store(1000, Ordering::SeqCst);
    let released = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = tokio::task::JoinSet::new();
    for (p, name) in [(-1, "sheddable"), (0, "standard"), (10, "critical")] {
        let (fc, released) = (Arc::clone(&fc), Arc::clone(&released));
        waiters.spawn(async move {
            let r = fc.admit(ticket(p, "t", 1)).await;
            released.lock().unwrap().push(name);
            r
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let shutdown = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(Arc::clone(&fc).run(shutdown.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    level.store(0, Ordering::SeqCst);
    while let Some(r) = waiters.join_next().await {
        r.unwrap().unwrap();
    }
    assert_eq!(
        *released.lock().unwrap(),
        ["critical", "standard", "sheddable"]
    );
    level.store(1000, Ordering::SeqCst);
    let started = tokio::time::Instant::now();
    assert_eq!(
        fc.admit(ticket(0, "t", 1)).await,
        Err(FlowError::Expired(Duration::from_secs(30)))
    );
    assert_eq!(started.elapsed(), Duration::from_secs(30));
    assert!(fc.is_empty(), "an expired request leaves the queue");
    shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_leaves_the_queue_and_a_full_queue_refuses() {
    let (fc, level) = flow(FlowConfig {
        max_requests: 1,
        ..FlowConfig::default()
    });
    level.store(2000, Ordering::SeqCst);
    let mut set = tokio::task::JoinSet::new();
    let fc2 = Arc::clone(&fc);
    let first = set.spawn(async move { fc2.admit(ticket(0, "a", 1)).await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(fc.len(), 1);
    assert!(matches!(
        fc.admit(ticket(5, "b", 1)).await,
        Err(FlowError::Full {
            limit: "maxRequests",
            ..
        })
    ));
    first.abort();
    assert!(set.join_next().await.unwrap().unwrap_err().is_cancelled());
    assert!(
        fc.is_empty(),
        "the client left: its request is gone from the queue"
    );
}

/// The value of the series `name{labels}` in the registry's text, if present.
fn value(registry: &prometheus_client::registry::Registry, series: &str) -> Option<f64> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test(start_paused = true)]
async fn queue_gauges_and_wait_times_by_outcome_are_recorded() {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Arc::new(Metrics::register(&mut registry));
    let level = Arc::new(AtomicU64::new(2000));
    let read = Arc::clone(&level);
    let config = FlowConfig {
        max_requests: 2,
        ttl: Duration::from_secs(30),
        ..FlowConfig::default()
    };
    let fc = FlowControl::new(
        config,
        move || read.load(Ordering::SeqCst) as f64 / 1000.0,
        metrics,
        "pool".into(),
    );
    let series = |name: &str, flow: &str, priority: &str, outcome: Option<&str>| {
        let outcome = outcome
            .map(|o| format!(",outcome=\"{o}\""))
            .unwrap_or_default();
        let labels = format!("fairness_id=\"{flow}\",priority=\"{priority}\"{outcome},inference_pool=\"pool\",model_name=\"m\",target_model_name=\"m\"");
        format!("inference_extension_flow_control_{name}{{{labels}}}")
    };
    let mut set = tokio::task::JoinSet::new();
    let (a, b) = (Arc::clone(&fc), Arc::clone(&fc));
    set.spawn(async move { a.admit(ticket(5, "a", 100)).await });
    let gone = set.spawn(async move { b.admit(ticket(0, "b", 7)).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        value(&registry, &series("queue_size", "a", "5", None)),
        Some(1.0)
    );
    assert_eq!(
        value(&registry, &series("queue_bytes", "a", "5", None)),
        Some(100.0)
    );
    assert_eq!(
        value(&registry, &series("queue_bytes", "b", "0", None)),
        Some(7.0)
    );
    assert_eq!(
        value(
            &registry,
            "inference_extension_flow_control_pool_saturation{inference_pool=\"pool\"}"
        ),
        Some(2.0)
    );
    assert!(fc.admit(ticket(5, "a", 1)).await.unwrap_err().is_capacity());
    let duration = |flow, priority, outcome, part: &str| {
        value(
            &registry,
            &series(
                &format!("request_queue_duration_seconds_{part}"),
                flow,
                priority,
                Some(outcome),
            ),
        )
    };
    assert_eq!(duration("a", "5", "RejectedCapacity", "count"), Some(1.0));

    gone.abort();
    assert!(set.join_next().await.unwrap().unwrap_err().is_cancelled());
    assert_eq!(
        value(&registry, &series("queue_size", "b", "0", None)),
        Some(0.0),
        "the client left"
    );
    assert_eq!(
        duration("b", "0", "EvictedContextCancelled", "sum"),
        Some(1.0)
    );
    let shutdown = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(Arc::clone(&fc).run(shutdown.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    level.store(0, Ordering::SeqCst);
    set.join_next().await.unwrap().unwrap().unwrap();
    assert_eq!(
        value(&registry, &series("queue_size", "a", "5", None)),
        Some(0.0)
    );
    assert_eq!(
        value(&registry, &series("queue_bytes", "a", "5", None)),
        Some(0.0)
    );
    assert!(
        duration("a", "5", "Dispatched", "sum").is_some_and(|s| (2.0..2.01).contains(&s)),
        "waited 2 s"
    );

    level.store(1000, Ordering::SeqCst);
    assert!(fc.admit(ticket(5, "a", 1)).await.is_err());
    assert_eq!(duration("a", "5", "EvictedTTL", "sum"), Some(30.0));
    assert_eq!(
        value(
            &registry,
            "inference_extension_flow_control_pool_saturation{inference_pool=\"pool\"}"
        ),
        Some(1.0)
    );
    shutdown.cancel();
}

/// A configuration whose default band is program-aware with upstream's default parameters.
fn program_aware() -> FlowConfig {
    let las = Las {
        weight_service: 0.8,
        weight_head_wait: 0.2,
        half_life_s: 60.0,
        eviction_ttl: Duration::from_secs(3600),
        eviction_sweep: Duration::from_secs(300),
    };
    FlowConfig {
        default_band: BandPolicy {
            fairness: Fairness::ProgramAware(las),
            order: QueueOrder::Fcfs,
        },
        ..FlowConfig::default()
    }
}

/// `program-aware-fairness` (LAS): of the keys waiting in a band, the one with the least
/// attained service goes first (service weighs 0.8 against the first request's wait 0.2);
/// service decays with its half-life; with no service anywhere the longest wait wins; no
/// service is kept without a program-aware band, and idle programs are swept after the TTL.
#[test]
fn program_aware_fairness_serves_the_least_attained_program_first() {
    let config = program_aware();
    let now = Instant::now();
    let mut q = Queues::new(config);
    // Nothing attained yet: the first request's wait decides (a arrived first).
    q.push(&ticket(0, "a", 1), "a1").unwrap();
    q.push(&ticket(0, "b", 1), "b1").unwrap();
    assert_eq!(q.pop().map(|(_, n)| n), Some("a1"));
    assert_eq!(q.pop().map(|(_, n)| n), Some("b1"));
    // a used 1,000 prompt tokens and 500 output (2,000 weighted), b 100: b goes first although
    // a's request is older.
    assert_eq!(q.attained("a", 2_000.0, now), Some(2_000.0));
    assert_eq!(q.attained("b", 100.0, now), Some(100.0));
    q.push(&ticket(0, "a", 1), "a2").unwrap();
    q.push(&ticket(0, "b", 1), "b2").unwrap();
    q.push(&ticket(0, "a", 1), "a3").unwrap();
    let order: Vec<&str> = std::iter::from_fn(|| q.pop().map(|(_, n)| n)).collect();
    assert_eq!(order, ["b2", "a2", "a3"]);
    // Decay: two half-lives later a's 2,000 is 500, plus 100 more.
    let later = now + Duration::from_secs(120);
    let got = q.attained("a", 100.0, later).unwrap();
    assert!((got - 600.0).abs() < 1e-6, "{got}");
    // The sweep forgets programs idle past the TTL, not before.
    assert!(q.sweep_programs(later).is_empty());
    let mut gone = q.sweep_programs(later + Duration::from_secs(3601));
    gone.sort();
    assert_eq!(gone, ["a", "b"]);
    // Without a program-aware band nothing is kept.
    let mut plain = Queues::<()>::new(FlowConfig::default());
    assert_eq!(plain.attained("a", 1.0, now), None);
    plain.push(&ticket(0, "a", 1), ()).unwrap();
    plain.pop();
    assert!(plain.program_waits().0.is_empty());
}

/// The program-aware gauges: each program's mean wait over its released requests, and Jain's
/// index over those means (1 when equal, 1/n at the most unequal).
#[test]
fn program_waits_are_running_means_and_jains_index_rates_them() {
    let mut q = Queues::new(program_aware());
    assert_eq!(q.program_waits(), (Vec::new(), 1.0));
    q.push(&ticket(0, "a", 1), ()).unwrap();
    q.push(&ticket(0, "b", 1), ()).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    q.pop();
    q.pop();
    let (mut waits, jain) = q.program_waits();
    waits.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(waits.len(), 2);
    for (program, wait) in &waits {
        assert!(*wait >= 30.0 && *wait < 10_000.0, "{program}: {wait} ms");
    }
    assert!(jain > 0.99 && jain <= 1.0 + 1e-9, "{jain}");
}

/// `priority-holdback-policy` (ceilings 1.0 for band 10, 0.4 for band 0): at saturation 0.5
/// band 0 waits while band 10 passes at once; below 0.4 band 0 is released too.
#[tokio::test(start_paused = true)]
async fn a_holdback_policy_holds_lower_bands_back_below_saturation() {
    let config = FlowConfig {
        usage_limit: UsageLimit::Holdback(crate::config::usage_limit::Holdback {
            min_ceiling: 0.4,
            max_ceiling: 1.0,
            by_value: false,
        }),
        bands: vec![(10, BandPolicy::default()), (0, BandPolicy::default())],
        ..FlowConfig::default()
    };
    let (fc, level) = flow(config);
    level.store(500, Ordering::SeqCst);
    fc.admit(ticket(10, "a", 1)).await.unwrap();
    let shutdown = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(Arc::clone(&fc).run(shutdown.clone()));
    let mut waiter = tokio::task::JoinSet::new();
    let fc2 = Arc::clone(&fc);
    waiter.spawn(async move { fc2.admit(ticket(0, "a", 1)).await });
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(fc.len(), 1, "band 0 is held back at saturation 0.5");
    level.store(300, Ordering::SeqCst);
    waiter.join_next().await.unwrap().unwrap().unwrap();
    assert!(fc.is_empty());
    shutdown.cancel();
}

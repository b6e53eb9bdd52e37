use super::*;
use crate::endpoint::Endpoint;
use prometheus_client::registry::Registry;

fn id(s: &str) -> EndpointId {
    EndpointId(s.parse().unwrap())
}

fn placement(endpoint: &str, keys: Vec<u64>) -> Placement {
    Placement {
        endpoint: id(endpoint),
        keys,
        ttl: Duration::from_millis(30_000),
    }
}

fn store(endpoints: &[&str]) -> Arc<Datastore> {
    let ds = Arc::new(Datastore::new());
    ds.set_endpoints(endpoints.iter().map(|e| Endpoint::from_id(id(e))).collect());
    ds
}

fn metrics() -> Arc<Metrics> {
    Arc::new(Metrics::register(&mut Registry::default()))
}

fn counted(m: &Metrics, outcome: PeerOutcome) -> u64 {
    m.peer_messages.get_or_create(&PeerLabels { outcome }).get()
}

#[test]
fn datagrams_round_trip_for_ipv4_and_ipv6_endpoints() {
    for p in [
        placement("10.1.2.3:8000", vec![1, u64::MAX, 42]),
        placement("[fd00::7]:9000", vec![7]),
        placement("10.0.0.1:1", vec![]),
    ] {
        let datagram = encode(0xfeed, &p);
        assert_eq!(datagram.len(), HEADER + p.keys.len() * 8);
        assert_eq!(decode(&datagram), Ok((0xfeed, p)));
    }
}

#[test]
fn ttl_beyond_u32_milliseconds_saturates() {
    let mut p = placement("10.0.0.1:8000", vec![1]);
    p.ttl = Duration::from_secs(u64::MAX / 2);
    let (_, got) = decode(&encode(1, &p)).unwrap();
    assert_eq!(got.ttl, Duration::from_millis(u64::from(u32::MAX)));
}

#[test]
fn keys_beyond_the_limit_are_left_out() {
    let p = placement("10.0.0.1:8000", (0..MAX_KEYS as u64 + 10).collect());
    let (_, got) = decode(&encode(1, &p)).unwrap();
    assert_eq!(got.keys, p.keys[..MAX_KEYS]);
}

#[test]
fn malformed_datagrams_are_errors() {
    let good = encode(9, &placement("10.0.0.1:8000", vec![1, 2]));
    assert_eq!(
        decode(&good[..HEADER - 1]),
        Err(PeerError::Short(HEADER - 1))
    );
    let mut foreign = good.clone();
    foreign[0] = b'X';
    assert_eq!(decode(&foreign), Err(PeerError::Foreign));
    let mut version = good.clone();
    version[4] = 2;
    assert_eq!(decode(&version), Err(PeerError::Foreign));
    assert_eq!(
        decode(&good[..good.len() - 3]),
        Err(PeerError::Length { said: 2, bytes: 13 })
    );
    let mut extra = good.clone();
    extra.push(0);
    assert_eq!(
        decode(&extra),
        Err(PeerError::Length { said: 2, bytes: 17 })
    );
    let mut many = good;
    many[36..38].copy_from_slice(&(MAX_KEYS as u16 + 1).to_le_bytes());
    assert_eq!(decode(&many), Err(PeerError::TooMany(MAX_KEYS + 1)));
}

#[test]
fn every_truncation_and_byte_flip_decodes_or_errs_without_panicking() {
    let good = encode(3, &placement("10.0.0.1:8000", vec![5, 6, 7]));
    for n in 0..good.len() {
        assert!(decode(&good[..n]).is_err(), "truncated to {n} bytes");
    }
    for i in 0..good.len() {
        let mut b = good.clone();
        b[i] ^= 0xff;
        let _ = decode(&b);
    }
}

#[test]
fn another_replicas_placement_for_a_known_endpoint_is_recorded() {
    let ds = store(&["10.0.0.1:8000", "10.0.0.2:8000"]);
    let index = PreciseIndex::new();
    let datagram = encode(2, &placement("10.0.0.2:8000", vec![11, 12, 13]));
    assert_eq!(apply(&datagram, 1, &ds, &index), PeerOutcome::applied);
    assert_eq!(
        index.longest_prefix(&[11, 12, 13, 14], Instant::now()),
        vec![(id("10.0.0.2:8000"), 3)]
    );
}

#[test]
fn own_unknown_and_malformed_datagrams_change_nothing() {
    let ds = store(&["10.0.0.1:8000"]);
    let index = PreciseIndex::new();
    assert_eq!(
        apply(
            &encode(1, &placement("10.0.0.1:8000", vec![11])),
            1,
            &ds,
            &index
        ),
        PeerOutcome::own
    );
    assert_eq!(
        apply(
            &encode(2, &placement("10.0.0.9:8000", vec![11])),
            1,
            &ds,
            &index
        ),
        PeerOutcome::unknown_endpoint
    );
    assert_eq!(apply(b"EPPS\x01", 1, &ds, &index), PeerOutcome::rejected);
    assert!(index.longest_prefix(&[11], Instant::now()).is_empty());
}

#[test]
fn a_received_ttl_is_capped() {
    let ds = store(&["10.0.0.1:8000"]);
    let index = PreciseIndex::new();
    let mut p = placement("10.0.0.1:8000", vec![11]);
    p.ttl = Duration::from_secs(3600);
    assert_eq!(apply(&encode(2, &p), 1, &ds, &index), PeerOutcome::applied);
    assert_eq!(
        index
            .longest_prefix(&[11], Instant::now() + MAX_TTL - Duration::from_secs(1))
            .len(),
        1
    );
    assert!(index
        .longest_prefix(&[11], Instant::now() + MAX_TTL + Duration::from_secs(1))
        .is_empty());
}

#[test]
fn a_full_send_queue_drops_placements_and_counts_them() {
    let m = metrics();
    let (outbox, _rx) = outbox(Arc::clone(&m));
    for _ in 0..QUEUE + 3 {
        outbox.placed(id("10.0.0.1:8000"), &[1, 2], Duration::from_secs(1));
    }
    assert_eq!(counted(&m, PeerOutcome::dropped), 3);
}

/// Two replicas' sockets on loopback: what one places, the other records; the sender's own
/// datagram (its peer list names itself, as a headless Service would) is ignored.
#[tokio::test]
async fn placements_cross_between_replicas_over_udp() {
    let ds = store(&["10.0.0.1:8000", "10.0.0.2:8000"]);
    let (ma, mb) = (metrics(), metrics());
    let a = PeerSocket {
        socket: Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap()),
        sender: 1,
        metrics: Arc::clone(&ma),
    };
    let b = PeerSocket {
        socket: Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap()),
        sender: 2,
        metrics: Arc::clone(&mb),
    };
    let peers = vec![
        a.socket.local_addr().unwrap().to_string(),
        b.socket.local_addr().unwrap().to_string(),
    ];
    let (index_a, index_b) = (Arc::new(PreciseIndex::new()), Arc::new(PreciseIndex::new()));
    let (shutdown, tracker) = (
        CancellationToken::new(),
        tokio_util::task::TaskTracker::new(),
    );
    tracker.spawn(receive(
        a.clone(),
        Arc::clone(&ds),
        Arc::clone(&index_a),
        shutdown.clone(),
    ));
    tracker.spawn(receive(
        b,
        Arc::clone(&ds),
        Arc::clone(&index_b),
        shutdown.clone(),
    ));
    let (outbox, rx) = outbox(Arc::clone(&ma));
    tracker.spawn(send(a, peers, rx, shutdown.clone()));
    outbox.placed(id("10.0.0.2:8000"), &[21, 22], Duration::from_secs(30));
    let deadline = Instant::now() + Duration::from_secs(10);
    while counted(&mb, PeerOutcome::applied) == 0 || counted(&ma, PeerOutcome::own) == 0 {
        assert!(Instant::now() < deadline, "the placement did not arrive");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        index_b.longest_prefix(&[21, 22], Instant::now()),
        vec![(id("10.0.0.2:8000"), 2)]
    );
    assert!(
        index_a.longest_prefix(&[21, 22], Instant::now()).is_empty(),
        "own datagram applied"
    );
    assert_eq!(counted(&ma, PeerOutcome::sent), 2);
    shutdown.cancel();
    tracker.close();
    tracker.wait().await;
}

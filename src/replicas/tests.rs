use super::wire::{BytesOut, ShareSummary, REPLICA_HEADER, SHARE_PATH};
use super::*;
use crate::endpoint::Endpoint;
use bytes::Bytes;
use prometheus_client::registry::Registry;
use prost::Message;
use std::net::SocketAddr;
use tonic::codegen::http;

fn id(s: &str) -> EndpointId {
    EndpointId(s.parse().unwrap())
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

fn receiver(endpoints: &[&str]) -> server::Receiver {
    server::Receiver {
        datastore: store(endpoints),
        index: Arc::new(PreciseIndex::new()),
        metrics: metrics(),
        own: 1,
        log: LogLimit::new(LOG_EVERY),
    }
}

/// Polls `done` every 5 ms for at most 10 s (the work happens on other tasks and sockets).
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
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

#[test]
fn the_log_limit_lets_one_line_through_per_period_and_counts_the_rest() {
    let log = LogLimit::new(Duration::from_secs(10));
    let t0 = Instant::now();
    assert_eq!(log.allow_at(t0), Some(0));
    assert_eq!(log.allow_at(t0 + Duration::from_secs(1)), None);
    assert_eq!(log.allow_at(t0 + Duration::from_secs(9)), None);
    assert_eq!(log.allow_at(t0 + Duration::from_secs(10)), Some(2));
    assert_eq!(log.allow_at(t0 + Duration::from_secs(11)), None);
}

#[test]
fn a_placement_for_a_known_endpoint_is_recorded() {
    let r = receiver(&["10.0.0.1:8000", "10.0.0.2:8000"]);
    let msg = wire::encode_placement(id("10.0.0.2:8000"), &[11, 12, 13], Duration::from_secs(30));
    assert_eq!(r.apply(&msg), PeerOutcome::applied);
    assert_eq!(
        r.index.longest_prefix(&[11, 12, 13, 14], Instant::now()),
        vec![(id("10.0.0.2:8000"), 3)]
    );
}

#[test]
fn unknown_endpoints_and_malformed_messages_change_nothing() {
    let r = receiver(&["10.0.0.1:8000"]);
    let unknown = wire::encode_placement(id("10.0.0.9:8000"), &[11], Duration::from_secs(1));
    assert_eq!(r.apply(&unknown), PeerOutcome::unknown_endpoint);
    assert_eq!(r.apply(b"EPPS\x01"), PeerOutcome::rejected);
    assert!(r.index.longest_prefix(&[11], Instant::now()).is_empty());
}

#[test]
fn a_received_ttl_is_capped() {
    let r = receiver(&["10.0.0.1:8000"]);
    let msg = wire::encode_placement(id("10.0.0.1:8000"), &[11], Duration::from_secs(3600));
    assert_eq!(r.apply(&msg), PeerOutcome::applied);
    let held_at = |d: Duration| r.index.longest_prefix(&[11], Instant::now() + d).len();
    assert_eq!(held_at(MAX_TTL - Duration::from_secs(1)), 1);
    assert_eq!(held_at(MAX_TTL + Duration::from_secs(1)), 0);
}

/// One replica on loopback: its listener, index and counts, and the outbox its director
/// would be given.
struct Replica {
    addr: SocketAddr,
    index: Arc<PreciseIndex>,
    metrics: Arc<Metrics>,
    outbox: Option<Outbox>,
}

const ENDPOINTS: [&str; 2] = ["10.0.0.1:8000", "10.0.0.2:8000"];

async fn bind() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.unwrap()
}

fn start(
    listener: TcpListener,
    peers: &[SocketAddr],
    creds: &Credentials,
    tasks: &(TaskTracker, CancellationToken),
) -> Replica {
    let addr = listener.local_addr().unwrap();
    let shared = Shared {
        datastore: store(&ENDPOINTS),
        index: Arc::new(PreciseIndex::new()),
        metrics: metrics(),
    };
    let (index, metrics) = (Arc::clone(&shared.index), Arc::clone(&shared.metrics));
    let sharing = Sharing {
        listener: Some(listener),
        peers: peers
            .iter()
            .map(|a| PeerName::parse(&a.to_string()).unwrap())
            .collect(),
        tls: PeerTls::new(creds).unwrap(),
    };
    let outbox = share(sharing, shared, &tasks.0, &tasks.1);
    Replica {
        addr,
        index,
        metrics,
        outbox,
    }
}

fn tasks() -> (TaskTracker, CancellationToken) {
    (TaskTracker::new(), CancellationToken::new())
}

async fn stop(tasks: (TaskTracker, CancellationToken)) {
    tasks.1.cancel();
    tasks.0.close();
    tasks.0.wait().await;
}

fn creds() -> Credentials {
    Credentials::generate(&["127.0.0.1"]).unwrap()
}

/// Two replicas on loopback, each listing both (as a headless Service would): what A places,
/// B records; A's stream to itself is refused as its own and nothing is applied there.
#[tokio::test]
async fn a_placement_recorded_on_one_replica_is_applied_on_the_other() {
    let (la, lb) = (bind().await, bind().await);
    let peers = [la.local_addr().unwrap(), lb.local_addr().unwrap()];
    let (creds, t) = (creds(), tasks());
    let a = start(la, &peers, &creds, &t);
    let b = start(lb, &peers, &creds, &t);
    let outbox = a.outbox.as_ref().unwrap();
    outbox.placed(id("10.0.0.2:8000"), &[21, 22], Duration::from_secs(30));
    until(
        "B applies A's placement and A refuses its own stream",
        || {
            counted(&b.metrics, PeerOutcome::applied) == 1
                && counted(&a.metrics, PeerOutcome::own) >= 2
        },
    )
    .await;
    assert_eq!(
        b.index.longest_prefix(&[21, 22], Instant::now()),
        vec![(id("10.0.0.2:8000"), 2)]
    );
    assert!(a.index.longest_prefix(&[21, 22], Instant::now()).is_empty());
    // The stream stays open: a second placement travels on it.
    outbox.placed(id("10.0.0.1:8000"), &[31], Duration::from_secs(30));
    until("the second placement", || {
        counted(&b.metrics, PeerOutcome::applied) == 2
    })
    .await;
    assert_eq!(counted(&b.metrics, PeerOutcome::unauthenticated), 0);
    assert_eq!(counted(&a.metrics, PeerOutcome::connect_failed), 0);
    stop(t).await;
}

/// A client presenting a certificate of another CA (while trusting B's), and one that speaks
/// no TLS at all, are refused at the handshake and counted; nothing they send is applied.
#[tokio::test]
async fn a_peer_without_a_certificate_of_the_sharing_ca_is_refused_and_counted() {
    let (creds, t) = (creds(), tasks());
    let b = start(bind().await, &[], &creds, &t);
    let other = Credentials::generate(&["127.0.0.1"]).unwrap();
    let impostor = PeerTls::new(&Credentials {
        ca: creds.ca.clone(),
        ..other
    })
    .unwrap();
    let result = send_raw(
        b.addr,
        &impostor,
        Some(2),
        vec![wire::encode_placement(
            id("10.0.0.1:8000"),
            &[41],
            Duration::from_secs(30),
        )],
    )
    .await;
    assert!(
        result.is_err(),
        "an impostor's stream succeeded: {result:?}"
    );
    let mut plain = tokio::net::TcpStream::connect(b.addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut plain, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    until("both refusals counted", || {
        counted(&b.metrics, PeerOutcome::unauthenticated) == 2
    })
    .await;
    assert!(b.index.longest_prefix(&[41], Instant::now()).is_empty());
    assert_eq!(counted(&b.metrics, PeerOutcome::applied), 0);
    stop(t).await;
}

/// An authenticated peer's bytes that are not a `Placement` (or name no replica) are refused
/// and counted; its well-formed message on the same stream is still applied.
#[tokio::test]
async fn malformed_messages_are_refused_counted_and_never_applied() {
    let (creds, t) = (creds(), tasks());
    let b = start(bind().await, &[], &creds, &t);
    let tls = PeerTls::new(&creds).unwrap();
    let msgs = vec![
        Bytes::from_static(b"\xff\xff\xff\xff"),
        wire::Placement {
            ip: vec![10, 0, 0],
            port: 8000,
            ttl_ms: 1000,
            keys: vec![51],
        }
        .encode_to_vec()
        .into(),
        wire::encode_placement(id("10.0.0.9:8000"), &[52], Duration::from_secs(30)),
        wire::encode_placement(id("10.0.0.1:8000"), &[53], Duration::from_secs(30)),
    ];
    let summary = send_raw(b.addr, &tls, Some(2), msgs).await.unwrap();
    assert_eq!((summary.applied, summary.refused), (1, 3));
    assert_eq!(counted(&b.metrics, PeerOutcome::rejected), 2);
    assert_eq!(counted(&b.metrics, PeerOutcome::unknown_endpoint), 1);
    assert!(b.index.longest_prefix(&[51], Instant::now()).is_empty());
    assert!(b.index.longest_prefix(&[52], Instant::now()).is_empty());
    assert_eq!(b.index.longest_prefix(&[53], Instant::now()).len(), 1);
    let anonymous = send_raw(b.addr, &tls, None, vec![]).await;
    assert_eq!(
        anonymous.map_err(|s| s.code()),
        Err(tonic::Code::InvalidArgument)
    );
    assert_eq!(counted(&b.metrics, PeerOutcome::rejected), 3);
    stop(t).await;
}

/// A peer that is down is retried with backoff and counted; once it is up, what is placed
/// reaches it.
#[tokio::test]
async fn a_peer_that_comes_up_late_is_reconnected_and_then_receives() {
    let (creds, t) = (creds(), tasks());
    let late = bind().await;
    let late_addr = late.local_addr().unwrap();
    drop(late);
    let a = start(bind().await, &[late_addr], &creds, &t);
    let outbox = a.outbox.as_ref().unwrap();
    outbox.placed(id("10.0.0.1:8000"), &[61], Duration::from_secs(30));
    until("failed connections counted", || {
        counted(&a.metrics, PeerOutcome::connect_failed) >= 2
    })
    .await;
    let b = start(TcpListener::bind(late_addr).await.unwrap(), &[], &creds, &t);
    let deadline = Instant::now() + Duration::from_secs(15);
    while counted(&b.metrics, PeerOutcome::applied) == 0 {
        assert!(Instant::now() < deadline, "never reconnected");
        outbox.placed(id("10.0.0.1:8000"), &[62], Duration::from_secs(30));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(b.index.longest_prefix(&[62], Instant::now()).len(), 1);
    assert!(counted(&a.metrics, PeerOutcome::send_failed) >= 1);
    stop(t).await;
}

/// A `Share` call with `tls`'s client side, naming replica `from` (`None`: no metadata),
/// carrying `msgs` as they are.
async fn send_raw(
    addr: SocketAddr,
    tls: &PeerTls,
    from: Option<u64>,
    msgs: Vec<Bytes>,
) -> Result<ShareSummary, tonic::Status> {
    let name = PeerName::parse(&addr.to_string()).unwrap().server_name;
    let channel = client::connect(addr, name, Arc::clone(&tls.client))
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut req = tonic::Request::new(tokio_stream::iter(msgs));
    if let Some(from) = from {
        req.metadata_mut()
            .insert(REPLICA_HEADER, format!("{from:016x}").parse().unwrap());
    }
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let path = http::uri::PathAndQuery::from_static(SHARE_PATH);
    grpc.client_streaming(req, path, BytesOut::<ShareSummary>::default())
        .await
        .map(tonic::Response::into_inner)
}

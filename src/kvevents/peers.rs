//! Speculative entries shared between epp replicas (active-active, precise prefix).
//!
//! Why: the KV events make every replica's index agree on what the pods hold, but only once a
//! pod has stored the blocks, which is after the request's prefill (and its wait in the pod's
//! queue). Until then a replica knows the placement only from its own speculative entry
//! ([`PreciseIndex::speculate`]), and a prompt's next request, arriving at another replica,
//! finds it cold and may start a second copy elsewhere. In the quick shared-prefix bench (a cold
//! prefill of about 1.1 s, queues of several seconds while the caches fill) three replicas
//! started 3–7 such copies per run where one replica started 1–2 (BENCHMARKS.md, "Sharing
//! speculative entries"). Each replica therefore sends every placement it records to the others,
//! which record it as their own speculative entry with the same TTL.
//!
//! The channel is best effort by design: one UDP datagram per placement and peer, nothing
//! acknowledged or retried. A lost datagram costs what no sharing costs (the events still correct
//! the index within a prefill); a peer that is down costs a failed send. A placement never waits
//! for the network: the director hands it to a bounded queue ([`Outbox`]) and a task sends it,
//! so a full queue drops placements (counted) instead of slowing requests.
//!
//! Peers are `host:port` names resolved every [`RESOLVE_EVERY`]: a headless Service name reaches
//! every replica, this one included; a replica knows its own datagrams by the random sender id
//! they carry and ignores them. A received placement is applied only for an endpoint this
//! replica's datastore knows, with its TTL capped at [`MAX_TTL`].
//!
//! Datagram (little-endian): `b"EPPS"`, version `1`, a reserved zero byte, the sender id (u64),
//! the TTL in milliseconds (u32), the endpoint's IPv6 (or IPv4-mapped) address (16 bytes) and
//! port (u16), the key count (u16), then the block keys (u64 each), at most [`MAX_KEYS`].
//!
//! Counted in `epp_speculative_peer_messages_total{outcome}` ([`PeerOutcome`]).

use crate::datastore::Datastore;
use crate::director::PlacementSink;
use crate::endpoint::EndpointId;
use crate::metrics::{Metrics, PeerLabels, PeerOutcome};
use crate::prefix::precise::PreciseIndex;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const MAGIC: &[u8; 4] = b"EPPS";
const VERSION: u8 = 1;
const HEADER: usize = 4 + 1 + 1 + 8 + 4 + 16 + 2 + 2;
/// Keys sent per placement: the rest of a longer prompt is left out (its first blocks are what
/// keeps the prompt's next request together). 4,096 keys make a 32 KB datagram.
pub const MAX_KEYS: usize = 4096;
/// The longest TTL a received placement is given, whatever the sender says.
pub const MAX_TTL: Duration = Duration::from_secs(60);
/// How often peer names are resolved again (replicas come and go).
pub const RESOLVE_EVERY: Duration = Duration::from_secs(5);
/// Placements waiting to be sent; beyond this they are dropped.
const QUEUE: usize = 1024;

/// One recorded placement: `endpoint` is counted as holding `keys` for `ttl`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub endpoint: EndpointId,
    pub keys: Vec<u64>,
    pub ttl: Duration,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    #[error("datagram of {0} bytes is shorter than the header")]
    Short(usize),
    #[error("not an epp placement (magic or version)")]
    Foreign,
    #[error("datagram says {said} keys but carries {bytes} bytes of them")]
    Length { said: usize, bytes: usize },
    #[error("datagram carries {0} keys (at most {MAX_KEYS})")]
    TooMany(usize),
}

/// The datagram for `p` from `sender`.
pub fn encode(sender: u64, p: &Placement) -> Vec<u8> {
    let keys = &p.keys[..p.keys.len().min(MAX_KEYS)];
    let mut out = Vec::with_capacity(HEADER + keys.len() * 8);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[VERSION, 0]);
    out.extend_from_slice(&sender.to_le_bytes());
    let ttl_ms = u32::try_from(p.ttl.as_millis()).unwrap_or(u32::MAX);
    out.extend_from_slice(&ttl_ms.to_le_bytes());
    let ip = match p.endpoint.0.ip() {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    out.extend_from_slice(&ip.octets());
    out.extend_from_slice(&p.endpoint.0.port().to_le_bytes());
    out.extend_from_slice(&(keys.len() as u16).to_le_bytes());
    for k in keys {
        out.extend_from_slice(&k.to_le_bytes());
    }
    out
}

/// `(sender, placement)` from a datagram; any malformed one is an error, never a panic.
pub fn decode(buf: &[u8]) -> Result<(u64, Placement), PeerError> {
    let head = buf.get(..HEADER).ok_or(PeerError::Short(buf.len()))?;
    if &head[..4] != MAGIC || head[4] != VERSION {
        return Err(PeerError::Foreign);
    }
    let u64_at = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
    let sender = u64_at(&head[6..14]);
    let ttl = Duration::from_millis(u64::from(u32::from_le_bytes(
        head[14..18].try_into().unwrap_or([0; 4]),
    )));
    let mut octets = [0u8; 16];
    octets.copy_from_slice(&head[18..34]);
    let v6 = Ipv6Addr::from(octets);
    let ip = v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4);
    let port = u16::from_le_bytes([head[34], head[35]]);
    let n = usize::from(u16::from_le_bytes([head[36], head[37]]));
    if n > MAX_KEYS {
        return Err(PeerError::TooMany(n));
    }
    let body = &buf[HEADER..];
    if body.len() != n * 8 {
        return Err(PeerError::Length {
            said: n,
            bytes: body.len(),
        });
    }
    let keys = body.chunks_exact(8).map(u64_at).collect();
    Ok((
        sender,
        Placement {
            endpoint: EndpointId(SocketAddr::new(ip, port)),
            keys,
            ttl,
        },
    ))
}

/// The director's side: placements queued for [`send`], dropped (and counted) when the queue
/// is full.
pub struct Outbox {
    tx: mpsc::Sender<Placement>,
    metrics: Arc<Metrics>,
}

impl PlacementSink for Outbox {
    fn placed(&self, endpoint: EndpointId, keys: &[u64], ttl: Duration) {
        let p = Placement {
            endpoint,
            keys: keys.to_vec(),
            ttl,
        };
        if self.tx.try_send(p).is_err() {
            count(&self.metrics, PeerOutcome::dropped);
        }
    }
}

/// A queue for placements: the [`Outbox`] the director writes and the receiver [`send`] reads.
pub fn outbox(metrics: Arc<Metrics>) -> (Outbox, mpsc::Receiver<Placement>) {
    let (tx, rx) = mpsc::channel(QUEUE);
    (Outbox { tx, metrics }, rx)
}

/// Wires sharing for this replica: applies the other replicas' placements to `precise` and,
/// when `peers` names any, returns the [`Outbox`] the director sends its own placements to. The
/// tasks run on `tracker` until `shutdown`.
pub fn share(
    socket: UdpSocket,
    peers: Vec<String>,
    datastore: Arc<Datastore>,
    precise: Arc<PreciseIndex>,
    metrics: Arc<Metrics>,
    tasks: (&TaskTracker, &CancellationToken),
) -> Option<Box<dyn PlacementSink>> {
    let (tracker, shutdown) = tasks;
    let sock = PeerSocket {
        socket: Arc::new(socket),
        sender: rand::random(),
        metrics: Arc::clone(&metrics),
    };
    tracker.spawn(receive(sock.clone(), datastore, precise, shutdown.clone()));
    if peers.is_empty() {
        return None;
    }
    let (outbox, rx) = outbox(metrics);
    tracker.spawn(send(sock, peers, rx, shutdown.clone()));
    Some(Box::new(outbox))
}

/// What the peer tasks share: the socket, this replica's id and the counts.
#[derive(Clone)]
pub struct PeerSocket {
    pub socket: Arc<UdpSocket>,
    /// Random per process: tells this replica's datagrams from the others'.
    pub sender: u64,
    pub metrics: Arc<Metrics>,
}

/// Sends every queued placement to every address `peers` resolve to, until `shutdown`.
pub async fn send(
    sock: PeerSocket,
    peers: Vec<String>,
    mut rx: mpsc::Receiver<Placement>,
    shutdown: CancellationToken,
) {
    let mut addrs: Vec<SocketAddr> = Vec::new();
    let mut resolved_at: Option<Instant> = None;
    loop {
        let p = tokio::select! {
            () = shutdown.cancelled() => return,
            p = rx.recv() => match p { Some(p) => p, None => return },
        };
        if resolved_at.is_none_or(|t| t.elapsed() >= RESOLVE_EVERY) {
            addrs = resolve(&peers).await;
            resolved_at = Some(Instant::now());
        }
        let datagram = encode(sock.sender, &p);
        for addr in &addrs {
            let outcome = match sock.socket.send_to(&datagram, addr).await {
                Ok(_) => PeerOutcome::sent,
                Err(e) => {
                    tracing::debug!(peer = %addr, error = %e, "sending a placement failed");
                    PeerOutcome::send_failed
                }
            };
            count(&sock.metrics, outcome);
        }
    }
}

/// Every address the peer names resolve to now; a name that does not resolve is skipped (and
/// logged), as a replica that is not up yet would be.
async fn resolve(peers: &[String]) -> Vec<SocketAddr> {
    let mut out = Vec::new();
    for name in peers {
        match tokio::net::lookup_host(name.as_str()).await {
            Ok(addrs) => out.extend(addrs),
            Err(e) => tracing::warn!(peer = %name, error = %e, "speculative peer does not resolve"),
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Applies the placements other replicas send to `index`, until `shutdown`.
pub async fn receive(
    sock: PeerSocket,
    datastore: Arc<Datastore>,
    index: Arc<PreciseIndex>,
    shutdown: CancellationToken,
) {
    let mut buf = vec![0u8; HEADER + MAX_KEYS * 8 + 1];
    loop {
        let n = tokio::select! {
            () = shutdown.cancelled() => return,
            r = sock.socket.recv_from(&mut buf) => match r {
                Ok((n, _)) => n,
                Err(e) => {
                    tracing::debug!(error = %e, "receiving a placement failed");
                    continue;
                }
            },
        };
        let outcome = apply(&buf[..n], sock.sender, &datastore, &index);
        count(&sock.metrics, outcome);
    }
}

/// Records one datagram's placement in `index` if it is another replica's, for a known endpoint.
fn apply(datagram: &[u8], own: u64, datastore: &Datastore, index: &PreciseIndex) -> PeerOutcome {
    match decode(datagram) {
        Err(e) => {
            tracing::debug!(error = %e, "ignoring a malformed placement");
            PeerOutcome::rejected
        }
        Ok((sender, _)) if sender == own => PeerOutcome::own,
        Ok((_, p)) if datastore.snapshot().get(&p.endpoint).is_none() => {
            PeerOutcome::unknown_endpoint
        }
        Ok((_, p)) => {
            index.speculate(p.endpoint, &p.keys, Instant::now(), p.ttl.min(MAX_TTL));
            PeerOutcome::applied
        }
    }
}

fn count(metrics: &Metrics, outcome: PeerOutcome) {
    metrics
        .peer_messages
        .get_or_create(&PeerLabels { outcome })
        .inc();
}

#[cfg(test)]
mod tests;

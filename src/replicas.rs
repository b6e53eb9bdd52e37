//! Replica sharing: speculative entries shared between epp replicas (active-active, precise
//! prefix). An adapter of its own: it writes what peers send into the precise index, as
//! `kvevents` writes what pods publish, but its transport, trust and peers are its own.
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
//! Wire: the `ReplicaSharing.Share` client stream of `proto/epp/peers/v1/replica_sharing.proto`
//! ([`wire`]), one long-lived stream per peer address, over mutual TLS ([`tls`]): a replica
//! accepts a connection only from a holder of a certificate of the sharing CA, and sends only to
//! one. A refused handshake (`unauthenticated`) and a malformed message (`rejected`) are counted
//! and logged at most once per [`LOG_EVERY`], and never applied.
//!
//! Best effort by design: nothing is acknowledged or retried. A lost placement costs what no
//! sharing costs (the events still correct the index within a prefill). A placement never waits
//! for the network: the director hands it to a bounded queue ([`Outbox`]), a task offers it to
//! every peer's stream, and a full queue or a peer that is down drops it (counted). A peer that
//! is down is reconnected with backoff ([`client`]); routing does not notice.
//!
//! Peers are `host:port` names resolved every [`RESOLVE_EVERY`]: a headless Service name reaches
//! every replica, this one included; a replica refuses a stream carrying its own random id, and
//! the caller then leaves that address alone. A received placement is applied only for an
//! endpoint this replica's datastore knows, with its TTL capped at [`MAX_TTL`].
//!
//! Counted in `epp_speculative_peer_messages_total{outcome}` ([`PeerOutcome`]).

pub(crate) mod client;
pub(crate) mod server;
pub(crate) mod tls;
pub(crate) mod wire;

use crate::datastore::Datastore;
use crate::director::PlacementSink;
use crate::endpoint::EndpointId;
use crate::metrics::{Metrics, PeerLabels, PeerOutcome};
use crate::prefix::precise::PreciseIndex;
pub use crate::telemetry::LogLimit;
pub use client::PeerName;
use std::sync::Arc;
use std::time::{Duration, Instant};
pub use tls::{CredentialErrors, Credentials, PeerTls};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
pub(crate) use wire::MAX_KEYS;

/// The longest TTL a received placement is given, whatever the sender says.
pub(crate) const MAX_TTL: Duration = Duration::from_secs(60);
/// How often peer names are resolved again (replicas come and go).
pub(crate) const RESOLVE_EVERY: Duration = Duration::from_secs(5);
/// At most one warning per kind of trouble (refused, malformed, unreachable) in this period.
pub const LOG_EVERY: Duration = Duration::from_secs(10);
/// Placements waiting to be sent; beyond this they are dropped.
const QUEUE: usize = 1024;

/// One recorded placement: `endpoint` is counted as holding `keys` for `ttl`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub(crate) endpoint: EndpointId,
    pub(crate) keys: Vec<u64>,
    pub ttl: Duration,
}

/// A placement waiting to be sent, with when it was recorded: the TTL sent is what is left.
#[derive(Debug)]
pub struct Queued {
    pub placement: Placement,
    pub at: Instant,
}

/// The director's side: placements queued for [`client::send`], dropped (and counted) when the
/// queue is full.
pub struct Outbox {
    tx: mpsc::Sender<Queued>,
    metrics: Arc<Metrics>,
}

impl PlacementSink for Outbox {
    fn placed(&self, endpoint: EndpointId, keys: &[u64], ttl: Duration) {
        let placement = Placement {
            endpoint,
            keys: keys[..keys.len().min(MAX_KEYS)].to_vec(),
            ttl,
        };
        let q = Queued {
            placement,
            at: Instant::now(),
        };
        if self.tx.try_send(q).is_err() {
            count(&self.metrics, PeerOutcome::dropped);
        }
    }
}

/// A queue for placements: the [`Outbox`] the director writes and the receiver
/// [`client::send`] reads.
pub fn outbox(metrics: Arc<Metrics>) -> (Outbox, mpsc::Receiver<Queued>) {
    let (tx, rx) = mpsc::channel(QUEUE);
    (Outbox { tx, metrics }, rx)
}

/// How this replica shares: where it listens (`None`: it only sends), whom it sends to (empty:
/// it only receives), and its credentials.
pub struct Sharing {
    pub listener: Option<TcpListener>,
    pub peers: Vec<PeerName>,
    pub tls: PeerTls,
}

/// What received placements are applied to and checked against, and where they are counted.
pub struct Shared {
    pub datastore: Arc<Datastore>,
    pub index: Arc<PreciseIndex>,
    pub metrics: Arc<Metrics>,
}

/// Starts sharing on `tracker` until `shutdown`: the server when there is a listener, the
/// sender when there are peers. Returns the [`Outbox`] the director is to be given (`None`
/// when this replica sends to nobody).
pub fn share(
    sharing: Sharing,
    shared: Shared,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
) -> Option<Outbox> {
    let own: u64 = rand::random();
    if let Some(listener) = sharing.listener {
        let receiver = server::Receiver {
            datastore: shared.datastore,
            index: shared.index,
            metrics: Arc::clone(&shared.metrics),
            own,
            log: LogLimit::new(LOG_EVERY),
        };
        tracker.spawn(server::serve(
            listener,
            Arc::clone(&sharing.tls.server),
            Arc::new(receiver),
            tracker.clone(),
            shutdown.clone(),
        ));
    }
    if sharing.peers.is_empty() {
        return None;
    }
    let (outbox, rx) = outbox(Arc::clone(&shared.metrics));
    let sender = client::Sender {
        peers: sharing.peers,
        tls: sharing.tls.client,
        own,
        metrics: shared.metrics,
        log: LogLimit::new(LOG_EVERY),
    };
    tracker.spawn(client::send(
        Arc::new(sender),
        rx,
        tracker.clone(),
        shutdown.clone(),
    ));
    Some(outbox)
}

fn count(metrics: &Metrics, outcome: PeerOutcome) {
    metrics
        .peer_messages
        .get_or_create(&PeerLabels { outcome })
        .inc();
}

#[cfg(test)]
mod tests;

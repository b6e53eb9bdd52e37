//! The sending side: one `Share` stream per peer address, each kept open by its own task that
//! reconnects with backoff.
//!
//! [`send`] takes placements from the director's [`super::Outbox`], encodes each once, and
//! offers it to every peer's [`link`] without waiting: a link whose queue is full drops it
//! (`dropped`), a link that is not connected drops what it is offered (`send_failed`), so a
//! peer that is down or slow never holds back the others or a request. Peer names are resolved
//! again every [`super::RESOLVE_EVERY`]; an address that no longer resolves has its link ended.
//! A link that finds its own replica at the other end (the server answers `ALREADY_EXISTS`)
//! stays idle until its address goes away.

use super::wire::{self, BytesOut, ShareSummary, REPLICA_HEADER, SHARE_PATH};
use super::{count, LogLimit, Queued, RESOLVE_EVERY};
use crate::metrics::{Metrics, PeerOutcome};
use bytes::Bytes;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::codegen::{http, BoxFuture, Context, Poll, Service};
use tonic::transport::{Channel, Endpoint};

/// Placements waiting for one peer's stream; beyond this they are dropped.
const LINK_QUEUE: usize = 256;
/// The first wait after a failed connection; it doubles up to [`BACKOFF_MAX`].
pub(crate) const BACKOFF_MIN: Duration = Duration::from_millis(100);
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A stream that lived this long was healthy: the next failure starts the backoff again.
const HEALTHY: Duration = Duration::from_secs(2);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// HTTP/2 pings find a peer that vanished without closing its connection.
const KEEPALIVE: Duration = Duration::from_secs(10);

/// A peer entry of `--speculative-peers`: the name to resolve and the name its certificate
/// must carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerName {
    /// `host:port`, as given.
    pub(crate) addr: String,
    /// The host, checked against the peer's certificate.
    pub server_name: ServerName<'static>,
}

/// Why a `--speculative-peers` entry is unusable.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PeerNameError {
    #[error("--speculative-peers entry {0:?} is not host:port")]
    NotHostPort(String),
    #[error("--speculative-peers entry {0:?}: the port is not 1 to 65535")]
    Port(String),
    #[error("--speculative-peers entry {0:?}: the host is neither a DNS name nor an IP address")]
    Host(String),
}

impl PeerName {
    /// Parses `host:port` (`[v6]:port` for an IPv6 address).
    pub fn parse(entry: &str) -> Result<Self, PeerNameError> {
        let (host, port) = entry
            .rsplit_once(':')
            .filter(|(h, _)| !h.is_empty())
            .ok_or_else(|| PeerNameError::NotHostPort(entry.to_owned()))?;
        if !matches!(port.parse::<u16>(), Ok(p) if p != 0) {
            return Err(PeerNameError::Port(entry.to_owned()));
        }
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let server_name = ServerName::try_from(host.to_owned())
            .map_err(|_| PeerNameError::Host(entry.to_owned()))?;
        Ok(Self {
            addr: entry.to_owned(),
            server_name,
        })
    }
}

/// What every link shares.
pub(crate) struct Sender {
    pub(crate) peers: Vec<PeerName>,
    pub(crate) tls: Arc<rustls::ClientConfig>,
    /// This replica's id, sent as `x-epp-replica`.
    pub(crate) own: u64,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) log: LogLimit,
}

/// Sends every queued placement to every address the peers resolve to, until `shutdown`.
pub(crate) async fn send(
    sender: Arc<Sender>,
    mut rx: mpsc::Receiver<Queued>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
) {
    let mut links: HashMap<SocketAddr, mpsc::Sender<Bytes>> = HashMap::new();
    let mut resolved_at: Option<Instant> = None;
    loop {
        let q = tokio::select! {
            () = shutdown.cancelled() => return,
            q = rx.recv() => match q { Some(q) => q, None => return },
        };
        if resolved_at.is_none_or(|t| t.elapsed() >= RESOLVE_EVERY) {
            let addrs = resolve(&sender.peers).await;
            links.retain(|a, _| addrs.contains_key(a));
            for (addr, name) in addrs {
                links.entry(addr).or_insert_with(|| {
                    let (tx, link_rx) = mpsc::channel(LINK_QUEUE);
                    let job = link(addr, name, Arc::clone(&sender), link_rx, shutdown.clone());
                    tracker.spawn(job);
                    tx
                });
            }
            resolved_at = Some(Instant::now());
        }
        let left = q.placement.ttl.checked_sub(q.at.elapsed());
        let Some(ttl) = left.filter(|t| !t.is_zero()) else {
            count(&sender.metrics, PeerOutcome::dropped);
            continue;
        };
        let msg = wire::encode_placement(q.placement.endpoint, &q.placement.keys, ttl);
        for tx in links.values() {
            if tx.try_send(msg.clone()).is_err() {
                count(&sender.metrics, PeerOutcome::dropped);
            }
        }
    }
}

/// Every address the peer names resolve to now, with the name each was found under; a name
/// that does not resolve is skipped (and logged), as a replica that is not up yet would be.
async fn resolve(peers: &[PeerName]) -> HashMap<SocketAddr, ServerName<'static>> {
    let mut out = HashMap::new();
    for p in peers {
        match tokio::net::lookup_host(p.addr.as_str()).await {
            Ok(addrs) => {
                for a in addrs {
                    out.entry(a).or_insert_with(|| p.server_name.clone());
                }
            }
            Err(e) => {
                tracing::warn!(peer = %p.addr, error = %e, "speculative peer does not resolve")
            }
        }
    }
    out
}

/// How a stream to a peer ended.
enum End {
    /// Shutdown, or the address went away: the link ends.
    Stop,
    /// The peer is this replica.
    Own,
    /// The connection or the stream broke after `lived`.
    Broken { lived: Duration },
}

/// Keeps a `Share` stream open to `addr` and feeds it what `rx` offers, until `rx` closes (the
/// address went away) or `shutdown`.
async fn link(
    addr: SocketAddr,
    name: ServerName<'static>,
    sender: Arc<Sender>,
    mut rx: mpsc::Receiver<Bytes>,
    shutdown: CancellationToken,
) {
    let mut backoff = BACKOFF_MIN;
    loop {
        let connected = tokio::select! {
            () = shutdown.cancelled() => return,
            c = connect(addr, name.clone(), Arc::clone(&sender.tls)) => c,
        };
        let failure = match connected {
            Ok(channel) => match stream(channel, &sender, &mut rx, &shutdown).await {
                End::Stop => return,
                End::Own => {
                    while rx.recv().await.is_some() {}
                    return;
                }
                End::Broken { lived } => {
                    if lived >= HEALTHY {
                        backoff = BACKOFF_MIN;
                    }
                    count(&sender.metrics, PeerOutcome::disconnected);
                    "stream ended".to_owned()
                }
            },
            Err(e) => {
                count(&sender.metrics, PeerOutcome::connect_failed);
                error_chain(&e)
            }
        };
        if let Some(skipped) = sender.log.allow() {
            tracing::warn!(peer = %addr, error = %failure, retry_in = ?backoff, skipped, "replica-sharing peer unreachable");
        }
        if !wait(backoff, &sender.metrics, &mut rx, &shutdown).await {
            return;
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Waits `d` before reconnecting, dropping (and counting) what is offered meanwhile; `false`
/// when the link is to end.
async fn wait(
    d: Duration,
    metrics: &Metrics,
    rx: &mut mpsc::Receiver<Bytes>,
    shutdown: &CancellationToken,
) -> bool {
    let sleep = tokio::time::sleep(d);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return false,
            () = &mut sleep => return true,
            m = rx.recv() => match m {
                Some(_) => count(metrics, PeerOutcome::send_failed),
                None => return false,
            },
        }
    }
}

/// One `Share` call on `channel`, fed from `rx` until it ends.
async fn stream(
    channel: Channel,
    sender: &Sender,
    rx: &mut mpsc::Receiver<Bytes>,
    shutdown: &CancellationToken,
) -> End {
    let started = Instant::now();
    let (tx, body) = mpsc::channel::<Bytes>(LINK_QUEUE);
    let mut req = tonic::Request::new(ReceiverStream::new(body));
    if let Ok(v) = format!("{:016x}", sender.own).parse::<tonic::metadata::AsciiMetadataValue>() {
        req.metadata_mut().insert(REPLICA_HEADER, v);
    }
    let mut grpc = tonic::client::Grpc::new(channel);
    let call = async move {
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let path = http::uri::PathAndQuery::from_static(SHARE_PATH);
        grpc.client_streaming(req, path, BytesOut::<ShareSummary>::default())
            .await
    };
    tokio::pin!(call);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return End::Stop,
            r = &mut call => return match r {
                Err(s) if s.code() == tonic::Code::AlreadyExists => {
                    count(&sender.metrics, PeerOutcome::own);
                    End::Own
                }
                _ => End::Broken { lived: started.elapsed() },
            },
            m = rx.recv() => match m {
                None => return End::Stop,
                Some(msg) => count(&sender.metrics, match tx.try_send(msg) {
                    Ok(()) => PeerOutcome::sent,
                    Err(_) => PeerOutcome::dropped,
                }),
            },
        }
    }
}

/// A channel to `addr` over mutual TLS, the certificate checked for `name`.
pub(super) async fn connect(
    addr: SocketAddr,
    name: ServerName<'static>,
    tls: Arc<rustls::ClientConfig>,
) -> Result<Channel, tonic::transport::Error> {
    let connector = Connector {
        addr,
        name,
        tls: TlsConnector::from(tls),
    };
    // The scheme is http: TLS is the connector's, which tonic does not see.
    Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(KEEPALIVE)
        .keep_alive_timeout(KEEPALIVE)
        .connect_with_connector(connector)
        .await
}

/// TCP, then the TLS handshake, for tonic's channel.
#[derive(Clone)]
struct Connector {
    addr: SocketAddr,
    name: ServerName<'static>,
    tls: TlsConnector,
}

impl Service<http::Uri> for Connector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = BoxFuture<Self::Response, std::io::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), std::io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let tcp = TcpStream::connect(this.addr).await?;
            tcp.set_nodelay(true)?;
            let tls = this.tls.connect(this.name, tcp).await?;
            Ok(TokioIo::new(tls))
        })
    }
}

/// An error with its causes, for the log (the TLS reason is a cause of tonic's error).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_entries_parse_as_host_and_port() {
        let p = PeerName::parse("epp-peers.ns.svc:9004").unwrap();
        assert_eq!(
            p.server_name,
            ServerName::try_from("epp-peers.ns.svc").unwrap()
        );
        let v6 = PeerName::parse("[fd00::1]:9004").unwrap();
        assert_eq!(v6.server_name, ServerName::try_from("fd00::1").unwrap());
        assert_eq!(v6.addr, "[fd00::1]:9004");
    }

    #[test]
    fn bad_peer_entries_are_named() {
        for (entry, want) in [
            ("epp-peers", PeerNameError::NotHostPort("epp-peers".into())),
            (":9004", PeerNameError::NotHostPort(":9004".into())),
            ("epp:0", PeerNameError::Port("epp:0".into())),
            ("epp:x", PeerNameError::Port("epp:x".into())),
            ("epp:70000", PeerNameError::Port("epp:70000".into())),
            (
                "bad host!:9004",
                PeerNameError::Host("bad host!:9004".into()),
            ),
        ] {
            assert_eq!(PeerName::parse(entry), Err(want), "{entry}");
        }
    }
}

//! TLS connections of a listener, handshaken by epp and handed to tonic's `serve_with_incoming`
//! (tonic's `tls-connect-info` feature serves tokio-rustls streams). Used for ext_proc
//! (`app::tls`: a certificate that can be reloaded, the minimum version) and for replica
//! sharing (`replicas::server`: mutual TLS, refusals counted).
//!
//! Handshakes run concurrently, at most [`HANDSHAKES`] at once (the accept loop waits beyond
//! that), so a slow client does not hold the others back; each is bounded by a timeout. A
//! refused or timed-out one goes to the caller's `refused` and is dropped.

use std::fmt::Display;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Handshakes in progress at once.
pub(crate) const HANDSHAKES: usize = 64;

/// The connections of `listener` that finish a handshake with `acceptor` within `timeout`
/// (TCP_NODELAY set), until `shutdown`; `refused(peer, why)` hears of every other one.
pub(crate) fn incoming(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    timeout: Duration,
    refused: impl Fn(SocketAddr, &dyn Display) + Send + Sync + 'static,
    tracker: &TaskTracker,
    shutdown: CancellationToken,
) -> ReceiverStream<std::io::Result<TlsStream<TcpStream>>> {
    let (tx, rx) = mpsc::channel(HANDSHAKES);
    let refused = Arc::new(refused);
    let handshakes = tracker.clone();
    tracker.spawn(async move {
        let slots = Arc::new(Semaphore::new(HANDSHAKES));
        loop {
            let (tcp, peer) = tokio::select! {
                () = shutdown.cancelled() => return,
                r = listener.accept() => match r {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::debug!(error = %e, "accepting a TLS connection failed");
                        continue;
                    }
                },
            };
            let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                return;
            };
            let (acceptor, tx, refused) = (acceptor.clone(), tx.clone(), Arc::clone(&refused));
            handshakes.spawn(async move {
                let _slot = slot;
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::debug!(error = %e, "TCP_NODELAY not set");
                }
                match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(tls)).await;
                    }
                    Ok(Err(e)) => refused(peer, &e),
                    Err(_) => refused(peer, &"handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

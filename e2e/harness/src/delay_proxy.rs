//! A TCP proxy that puts a region's distance between two loopback processes: every byte waits
//! `one_way` before it is written on, in each direction, and a new connection first waits one
//! round trip (TCP's handshake), so a request through it takes at least `2 × one_way` longer
//! and keeps its byte order (the delay is pipelined: bytes read while others wait are stamped
//! and follow them). [`DelayProxy::cut`] loses the region: every connection is closed and new
//! ones are refused, as a partition would.
//!
//! Only loopback addresses: it listens on 127.0.0.1 and refuses a target that is not loopback.
//! Bounded: at most [`MAX_CONNECTIONS`] connections at once (more are closed on accept), and at
//! most [`MAX_QUEUED_CHUNKS`] chunks of [`CHUNK`] bytes waiting per direction (a reader that
//! gets ahead waits for its writer).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Connections open at once; more are closed as they are accepted.
pub const MAX_CONNECTIONS: usize = 1024;
/// Chunks waiting out their delay per direction of one connection.
pub const MAX_QUEUED_CHUNKS: usize = 64;
/// The largest chunk read at once.
pub const CHUNK: usize = 16 * 1024;

/// Why a proxy did not start.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("the delay proxy targets loopback addresses only, not {0}")]
    NotLoopback(SocketAddr),
    #[error("binding the delay proxy: {0}")]
    Bind(#[from] std::io::Error),
}

/// A running proxy; [`stop`](Self::stop) (or dropping it) ends every connection.
pub struct DelayProxy {
    addr: SocketAddr,
    one_way: Duration,
    /// Cancelled by [`cut`](Self::cut) and [`stop`](Self::stop).
    cut: CancellationToken,
    tasks: TaskTracker,
    open: Arc<AtomicUsize>,
}

impl DelayProxy {
    /// Listens on 127.0.0.1 (an ephemeral port) and forwards to `target` with `one_way` delay
    /// each way.
    pub async fn start(target: SocketAddr, one_way: Duration) -> Result<Self, ProxyError> {
        if !target.ip().is_loopback() {
            return Err(ProxyError::NotLoopback(target));
        }
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (cut, tasks) = (CancellationToken::new(), TaskTracker::new());
        let open = Arc::new(AtomicUsize::new(0));
        let link = Link {
            target,
            one_way,
            cut: cut.clone(),
            open: Arc::clone(&open),
        };
        tasks.spawn(accept_loop(listener, link, tasks.clone()));
        Ok(Self {
            addr,
            one_way,
            cut,
            tasks,
            open,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The round trip it adds.
    pub fn rtt(&self) -> Duration {
        self.one_way * 2
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Loses the region: closes every connection and refuses new ones (the listener is closed).
    pub fn cut(&self) {
        self.cut.cancel();
    }

    /// Cuts, and waits until every task has ended.
    pub async fn stop(self) {
        self.cut.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.cut.cancel();
    }
}

/// What every connection of one proxy shares.
#[derive(Clone)]
struct Link {
    target: SocketAddr,
    one_way: Duration,
    cut: CancellationToken,
    open: Arc<AtomicUsize>,
}

async fn accept_loop(listener: TcpListener, link: Link, tasks: TaskTracker) {
    loop {
        let client = tokio::select! {
            _ = link.cut.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((sock, _)) => sock,
                Err(_) => return,
            },
        };
        if link.open.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
            continue;
        }
        link.open.fetch_add(1, Ordering::SeqCst);
        let link = link.clone();
        tasks.spawn(async move {
            tokio::select! {
                _ = link.cut.cancelled() => {}
                _ = connection(client, &link) => {}
            }
            link.open.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// One proxied connection: the handshake's round trip, then both directions delayed.
async fn connection(client: TcpStream, link: &Link) {
    tokio::time::sleep(link.one_way * 2).await;
    let Ok(upstream) = TcpStream::connect(link.target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (client_rx, client_tx) = client.into_split();
    let (upstream_rx, upstream_tx) = upstream.into_split();
    tokio::join!(
        direction(client_rx, upstream_tx, link.one_way),
        direction(upstream_rx, client_tx, link.one_way),
    );
}

/// Copies `from` to `to`, each chunk written `delay` after it was read; the end of `from` shuts
/// `to`'s writing half once the chunks before it are written.
async fn direction(from: OwnedReadHalf, to: OwnedWriteHalf, delay: Duration) {
    let (tx, rx) = mpsc::channel(MAX_QUEUED_CHUNKS);
    tokio::join!(read_side(from, tx, delay), write_side(rx, to));
}

async fn read_side(mut from: OwnedReadHalf, tx: mpsc::Sender<(Instant, Vec<u8>)>, delay: Duration) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if tx
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
    }
}

async fn write_side(mut rx: mpsc::Receiver<(Instant, Vec<u8>)>, mut to: OwnedWriteHalf) {
    while let Some((due, bytes)) = rx.recv().await {
        tokio::time::sleep_until(due).await;
        if to.write_all(&bytes).await.is_err() {
            return;
        }
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::disallowed_methods)] // the test's own echo server
    async fn echo() -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let h = tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut b = [0u8; 1024];
                    while let Ok(n) = s.read(&mut b).await {
                        if n == 0 || s.write_all(&b[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, h)
    }

    #[tokio::test]
    async fn a_round_trip_takes_the_delay_both_ways_and_a_cut_refuses() {
        let (target, server) = echo().await;
        let proxy = DelayProxy::start(target, Duration::from_millis(40))
            .await
            .unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut b = [0u8; 5];
        // The first exchange carries the handshake's round trip too.
        s.write_all(b"hello").await.unwrap();
        s.read_exact(&mut b).await.unwrap();
        let start = std::time::Instant::now();
        s.write_all(b"again").await.unwrap();
        s.read_exact(&mut b).await.unwrap();
        let rtt = start.elapsed();
        assert_eq!(&b, b"again");
        assert!(
            rtt >= Duration::from_millis(80) && rtt < Duration::from_millis(400),
            "{rtt:?}"
        );
        proxy.cut();
        let n = s.read(&mut b).await.unwrap_or(0);
        assert_eq!(n, 0, "the connection is closed");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(TcpStream::connect(proxy.addr()).await.is_err(), "refused");
        proxy.stop().await;
        server.abort();
    }

    #[tokio::test]
    async fn a_target_off_loopback_is_refused() {
        let far: SocketAddr = "10.1.2.3:80".parse().unwrap();
        assert!(matches!(
            DelayProxy::start(far, Duration::ZERO).await,
            Err(ProxyError::NotLoopback(_))
        ));
    }
}

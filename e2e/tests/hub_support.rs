//! Stand-ins for the spoke EPPs of a multi-cluster hub (the differential suite's hub cases,
//! `multicluster`): one loopback HTTPS server per cluster answering every `GET` with the two
//! pool gauges a spoke EPP publishes (`llm_d_epp_average_kv_cache_utilization`,
//! `llm_d_epp_average_queue_size`), at values the test sets, or, silenced, closing each
//! connection unanswered. They stand in for a spoke's `/metrics` only: the requests a hub
//! routes go to the cluster's gateway, a recording inference-sim pod in these tests.
//!
//! TLS is what a user sets up: a CA (generated here) signs each server's certificate, for
//! `localhost` and `127.0.0.1`; both hubs load its PEM file as
//! `multicluster-metrics-data-source`'s `caCertPath` and verify the peer (upstream's default).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// One spoke's pool aggregates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pool {
    pub kv: f64,
    pub queue: f64,
}

struct Spoke {
    addr: SocketAddr,
    pool: Arc<Mutex<Pool>>,
    answered: Arc<AtomicUsize>,
    /// Silenced: connections are closed unanswered.
    silent: Arc<AtomicBool>,
}

/// The spokes of one case, with the CA file that verifies them.
pub struct Spokes {
    spokes: Vec<Spoke>,
    pub ca: PathBuf,
    tasks: TaskTracker,
    stop: CancellationToken,
}

impl Spokes {
    /// One server per entry of `pools`; the CA is written to `dir/spokes-ca.pem`.
    pub async fn start(pools: &[Pool], dir: &Path) -> anyhow::Result<Self> {
        let creds = epp::replicas::Credentials::generate(&["localhost", "127.0.0.1"])?;
        let ca = dir.join("spokes-ca.pem");
        std::fs::write(&ca, &creds.ca)?;
        let config = server_config(&creds)?;
        let (tasks, stop) = (TaskTracker::new(), CancellationToken::new());
        let mut spokes = Vec::new();
        for pool in pools {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let spoke = Spoke {
                addr: listener.local_addr()?,
                pool: Arc::new(Mutex::new(*pool)),
                answered: Arc::new(AtomicUsize::new(0)),
                silent: Arc::new(AtomicBool::new(false)),
            };
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(&config));
            let state = Served {
                pool: Arc::clone(&spoke.pool),
                answered: Arc::clone(&spoke.answered),
                silent: Arc::clone(&spoke.silent),
            };
            tasks.spawn(serve(
                listener,
                acceptor,
                state,
                stop.clone(),
                tasks.clone(),
            ));
            spokes.push(spoke);
        }
        Ok(Self {
            spokes,
            ca,
            tasks,
            stop,
        })
    }

    /// Spoke `i`'s metrics port.
    pub fn port(&self, i: usize) -> u16 {
        self.spokes[i].addr.port()
    }

    /// Sets every spoke's pool to `pools` (in order).
    pub fn set(&self, pools: &[Pool]) {
        for (s, p) in self.spokes.iter().zip(pools) {
            *s.pool.lock().expect("the spoke's pool") = *p;
        }
    }

    /// Spoke `i` stops answering (`true`) or answers again.
    pub fn silence(&self, i: usize, silent: bool) {
        self.spokes[i].silent.store(silent, Ordering::SeqCst);
    }

    /// Sets the spokes' queues, keeping their KV utilization.
    pub fn set_queues(&self, queues: &[u64]) {
        for (s, q) in self.spokes.iter().zip(queues) {
            s.pool.lock().expect("the spoke's pool").queue = *q as f64;
        }
    }

    /// Waits (bounded: 10 s) until every spoke has answered three more scrapes, so the hub has
    /// read the values set before the call.
    pub async fn scraped(&self) -> anyhow::Result<()> {
        let start: Vec<usize> = self.spokes.iter().map(|s| s.answered()).collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self
            .spokes
            .iter()
            .zip(&start)
            .any(|(s, n)| s.answered() < n + 3)
        {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the hub did not scrape every spoke in 10 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    pub async fn shutdown(self) {
        self.stop.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

impl Spoke {
    fn answered(&self) -> usize {
        self.answered.load(Ordering::SeqCst)
    }
}

fn server_config(creds: &epp::replicas::Credentials) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let chain = vec![CertificateDer::from_pem_slice(creds.cert.as_bytes())?];
    let key = PrivateKeyDer::from_pem_slice(creds.key.as_bytes())?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    Ok(Arc::new(config))
}

/// What one spoke's connections share.
#[derive(Clone)]
struct Served {
    pool: Arc<Mutex<Pool>>,
    answered: Arc<AtomicUsize>,
    silent: Arc<AtomicBool>,
}

async fn serve(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    state: Served,
    stop: CancellationToken,
    tasks: TaskTracker,
) {
    loop {
        let sock = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((sock, _)) => sock,
                Err(_) => return,
            },
        };
        let (acceptor, state, stop) = (acceptor.clone(), state.clone(), stop.clone());
        tasks.spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = answer(sock, acceptor, state) => {}
            }
        });
    }
}

/// Answers each request of one connection with the pool's page.
async fn answer(sock: tokio::net::TcpStream, acceptor: tokio_rustls::TlsAcceptor, state: Served) {
    if state.silent.load(Ordering::SeqCst) {
        return;
    }
    let Ok(mut tls) = acceptor.accept(sock).await else {
        return;
    };
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            match tls.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.clear();
        if state.silent.load(Ordering::SeqCst) {
            return;
        }
        let p = *state.pool.lock().expect("the spoke's pool");
        let page = format!(
            "# TYPE llm_d_epp_average_kv_cache_utilization gauge\n\
             llm_d_epp_average_kv_cache_utilization{{name=\"spoke\"}} {}\n\
             # TYPE llm_d_epp_average_queue_size gauge\n\
             llm_d_epp_average_queue_size{{name=\"spoke\"}} {}\n",
            p.kv, p.queue
        );
        let resp = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\n\r\n{page}",
            page.len()
        );
        if tls.write_all(resp.as_bytes()).await.is_err() {
            return;
        }
        state.answered.fetch_add(1, Ordering::SeqCst);
    }
}

//! `sim-load`: a small closed-loop load generator for measuring inference-sim's
//! own throughput (requests/s one process sustains). Each worker keeps one
//! HTTP/1.1 keep-alive connection to one pod (round-robin over the targets)
//! and sends tiny completions back to back. Bounded by `--requests` and
//! `--duration-secs`, whichever comes first; loopback targets only.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use clap::Parser;
use http::{header, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::JoinSet;

/// Closed-loop load against inference-sim pods on 127.0.0.1.
#[derive(Debug, Parser)]
#[command(name = "sim-load", about)]
struct Args {
    /// Port of the first pod.
    #[arg(long, default_value_t = 8000)]
    base_port: u16,
    /// Number of pods (ports base-port .. base-port + pods - 1).
    #[arg(long, default_value_t = 1)]
    pods: u16,
    /// Concurrent connections (workers), spread round-robin over the pods.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Stop after this many requests in total.
    #[arg(long, default_value_t = 100_000)]
    requests: u64,
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 10)]
    duration_secs: u64,
    /// max_tokens of each request.
    #[arg(long, default_value_t = 1)]
    max_tokens: u32,
    /// Model name to send.
    #[arg(long, default_value = "meta-llama/Llama-3.1-8B-Instruct")]
    model: String,
}

struct Shared {
    sent: AtomicU64,
    ok: AtomicU64,
    failed: AtomicU64,
    limit: u64,
    deadline: Instant,
}

impl Shared {
    /// Claims one request slot, or `None` when the run is over.
    fn claim(&self) -> Option<u64> {
        if Instant::now() >= self.deadline {
            return None;
        }
        let n = self.sent.fetch_add(1, Ordering::Relaxed);
        (n < self.limit).then_some(n)
    }
}

async fn worker(
    addr: SocketAddr,
    body: Bytes,
    shared: Arc<Shared>,
) -> anyhow::Result<Vec<Duration>> {
    let stream = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connect {addr}"))?;
    stream.set_nodelay(true)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let mut latencies = Vec::new();
    let requests = async {
        while let Some(n) = shared.claim() {
            let req = Request::builder()
                .method(Method::POST)
                .uri("/v1/completions")
                .header(header::HOST, "localhost")
                .header(header::CONTENT_TYPE, "application/json")
                .header("x-request-id", n.to_string())
                .body(Full::new(body.clone()))?;
            let start = Instant::now();
            let resp = sender.send_request(req).await?;
            let ok = resp.status().is_success();
            resp.into_body().collect().await?;
            latencies.push(start.elapsed());
            let counter = if ok { &shared.ok } else { &shared.failed };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        anyhow::Ok(())
    };
    tokio::select! {
        r = requests => r?,
        r = conn => r?,
    }
    Ok(latencies)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.pods > 0 && args.concurrency > 0,
        "--pods and --concurrency must be > 0"
    );
    let body = Bytes::from(
        serde_json::json!({"model": args.model, "prompt": "Say hi", "max_tokens": args.max_tokens})
            .to_string(),
    );
    let start = Instant::now();
    let shared = Arc::new(Shared {
        sent: AtomicU64::new(0),
        ok: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        limit: args.requests,
        deadline: start + Duration::from_secs(args.duration_secs),
    });
    let mut workers = JoinSet::new();
    for w in 0..args.concurrency {
        let port = args.base_port + (w as u16 % args.pods);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        workers.spawn(worker(addr, body.clone(), shared.clone()));
    }
    let mut latencies = Vec::new();
    while let Some(r) = workers.join_next().await {
        match r? {
            Ok(l) => latencies.extend(l),
            Err(e) => eprintln!("worker failed: {e:#}"),
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    latencies.sort();
    let ok = shared.ok.load(Ordering::Relaxed);
    println!(
        "requests_ok={ok} failed={} elapsed_s={elapsed:.2} rps={:.0} p50_ms={:.2} p99_ms={:.2}",
        shared.failed.load(Ordering::Relaxed),
        ok as f64 / elapsed,
        percentile(&latencies, 0.5).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
    );
    Ok(())
}

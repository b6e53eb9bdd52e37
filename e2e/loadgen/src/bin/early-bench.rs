//! TTFT added by epp for long prompts, with and without the early decision (issue #8).
//!
//! One inference-sim pod (one output token, a million times faster than real time, a 1M-token
//! context so the largest prompt is served; tokenizing it is the pod's real cost in every
//! case), then per case a real Envoy:
//! Envoy alone (STATIC round robin, the baseline), Envoy + epp deciding on the whole body
//! (`--early-decision=false`, upstream's behaviour) and Envoy + epp deciding early (default).
//! epp runs in this process with its default configuration (prefix scorer on). For each
//! prompt size the client sends sequential non-streaming completions over HTTP/1.1 and times
//! the first response byte from the first request byte. Two uploads: as fast as loopback
//! allows, and paced at 16 KiB per 2 ms (≈ 8 MB/s, a client link), where deciding early lets
//! epp's work overlap the upload.
//!
//! Run: `EPP_ENVOY=$(hack/install-envoy.sh) cargo run --release -p loadgen --bin early-bench -- [requests]`

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use harness::envoy::{Envoy, EnvoyConfig, Template};
use harness::sim_pod::{test_pod_config, SimPod};
use harness::stack::Epp;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SIZES: [(&str, usize); 3] = [("10KB", 10_000), ("220KB", 220_000), ("1MB", 1_000_000)];
const PACE: Option<(usize, Duration)> = Some((16 << 10, Duration::from_millis(2)));

fn body(prompt_bytes: usize) -> Vec<u8> {
    const WORDS: [&str; 8] = [
        "river", "copper", "lantern", "meadow", "signal", "harbor", "violet", "engine",
    ];
    let mut prompt = String::with_capacity(prompt_bytes + 8);
    let mut i = 0usize;
    while prompt.len() < prompt_bytes {
        prompt.push_str(WORDS[(i * 7 + i / 3) % WORDS.len()]);
        prompt.push(' ');
        i += 1;
    }
    serde_json::json!({"model": "test-model", "prompt": prompt, "max_tokens": 1})
        .to_string()
        .into_bytes()
}

/// One request; the time from its first byte to the first response byte.
async fn ttft(addr: SocketAddr, body: &[u8], pace: Option<(usize, Duration)>) -> Duration {
    let head = format!("POST /v1/completions HTTP/1.1\r\nhost: b\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n", body.len());
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    let start = Instant::now();
    s.write_all(head.as_bytes()).await.unwrap();
    match pace {
        None => s.write_all(body).await.unwrap(),
        Some((chunk, every)) => {
            for (i, part) in body.chunks(chunk).enumerate() {
                tokio::time::sleep_until((start + every * i as u32).into()).await;
                s.write_all(part).await.unwrap();
            }
        }
    }
    let mut first = [0u8; 1];
    s.read_exact(&mut first).await.unwrap();
    let at = start.elapsed();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).await.unwrap();
    assert!(
        first[0] == b'H' && rest.starts_with(b"TTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&rest)
    );
    at
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

async fn measure(
    addr: SocketAddr,
    body: &[u8],
    pace: Option<(usize, Duration)>,
    n: usize,
) -> (f64, f64) {
    for _ in 0..3 {
        ttft(addr, body, pace).await;
    }
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        times.push(ttft(addr, body, pace).await);
    }
    times.sort();
    (percentile(&times, 0.5), percentile(&times, 0.9))
}

struct Case {
    name: &'static str,
    envoy: Envoy,
    epp: Option<Epp>,
}

async fn case(name: &'static str, pod: SocketAddr, early: Option<bool>) -> Case {
    let Some(early) = early else {
        let envoy = EnvoyConfig::new(Template::RoundRobin)
            .pool([pod])
            .start()
            .await
            .unwrap();
        return Case {
            name,
            envoy,
            epp: None,
        };
    };
    let args: Vec<String> = [
        "--static-endpoints",
        &pod.to_string(),
        "--secure-serving=false",
        &format!("--early-decision={early}"),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let epp = Epp::start(&args).await.unwrap();
    let envoy = EnvoyConfig::new(Template::Duplex)
        .epp(epp.grpc)
        .pool([pod])
        .start()
        .await
        .unwrap();
    Case {
        name,
        envoy,
        epp: Some(epp),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(30);
    let mut cfg = test_pod_config("pod-0");
    cfg.record_requests = false;
    cfg.engine.max_model_len = 1 << 20;
    cfg.engine.num_gpu_blocks = 70_000;
    cfg.engine.time_scale = 1e6;
    let pod = SimPod::bind(cfg).await.unwrap();
    let cases = [
        case("envoy alone", pod.addr(), None).await,
        case("epp, whole body", pod.addr(), Some(false)).await,
        case("epp, early", pod.addr(), Some(true)).await,
    ];
    println!("| prompt | upload | path | TTFT p50 ms | TTFT p90 ms | added by epp p50 ms |");
    println!("|---|---|---|---|---|---|");
    for (label, size) in SIZES {
        let b = body(size);
        for (upload, pace) in [("loopback", None), ("8 MB/s", PACE)] {
            let mut base = 0.0;
            for c in &cases {
                let (p50, p90) = measure(c.envoy.listener_addr(), &b, pace, n).await;
                if c.epp.is_none() {
                    base = p50;
                }
                println!(
                    "| {label} | {upload} | {} | {p50:.2} | {p90:.2} | {:+.2} |",
                    c.name,
                    p50 - base
                );
            }
        }
    }
    for c in cases {
        drop(c.envoy);
        if let Some(e) = c.epp {
            e.stop().await;
        }
    }
    pod.shutdown().await;
}

//! A stand-in for llm-d's decode-side disaggregation sidecar (`pd-sidecar`), for the
//! end-to-end P/D tests and benchmarks.
//!
//! # Why a stand-in
//! The real sidecar is `github.com/llm-d/llm-d-router/cmd/pd-sidecar` v0.10.0. The Go module
//! proxy refuses `github.com/llm-d/llm-d-router` (HTTP 403 at every version);
//! `hack/install-peers.sh pd-sidecar` builds it from the v0.10.0 source archive instead, and
//! `hack/test.sh` points `EPP_PD_SIDECAR` at it, so the P/D tests run the real one
//! ([`real`], [`DecodeSidecar`]). This stand-in stays for a plain `cargo test` without Go or the
//! archive (`EPP_PD_SIDECAR` unset) and for the P/D benchmark's runs without it; every P/D test
//! passes with both.
//! This module follows its NIXL v2 path as `pkg/sidecar/proxy/proxy_helpers.go`,
//! `chat_completions.go` and `connector_nixlv2.go` (v0.10.0) implement it; it is not that
//! program, and a test that passes here says nothing about the Go code's bugs.
//!
//! # The protocol (what is reproduced)
//! The sidecar listens on the decode pod's serving port; the model server listens beside it
//! (`--model-server-port`). For `POST /v1/chat/completions` and `/v1/completions`:
//! 1. `x-prefiller-host-port` (removed before forwarding; a comma-separated value takes the
//!    first entry) absent: the request goes to the local model server unchanged.
//! 2. Present: the *prefill leg* is the client's JSON with `kv_transfer_params =
//!    {do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null,
//!    remote_block_ids: null, remote_host: null, remote_port: null}`, `stream: false`, no
//!    `stream_options`, and `max_tokens`, `max_completion_tokens`, `min_tokens` all 1, sent to
//!    the prefill pod with the sidecar's own `x-request-id` *added* after the gateway's (both
//!    legs carry both values). A 502/503/504 (a refused connection is a 502, as
//!    Go's reverse proxy reports it) is retried `--prefill-max-retries` times (default 0) after
//!    `--prefill-retry-backoff`; any other error status is final.
//! 3. The *decode leg* is the client's JSON with its own stream and token fields restored and
//!    `kv_transfer_params` = the prefill response's `kv_transfer_params`, sent to the local
//!    model server; its answer streams back, with `usage.prompt_tokens_details.cached_tokens`
//!    rewritten to the prefill response's (upstream's cached-tokens rewriter).
//! 4. A final prefill error is returned to the client with the prefill pod's status and body
//!    (v0.10 retries instead of decoding locally, llm-d-router #1206); a prefill pod that
//!    cannot be reached is a 502 with an empty body, as Go's reverse proxy answers.
//!
//! `GET /health` is answered by the sidecar itself; every other path is proxied to the model
//! server (so `/metrics` scrapes reach it).
//!
//! # Data parallelism (`--data-parallel-size N`, `pkg/sidecar/proxy/data_parallel.go`)
//! The sidecar serves rank `r` on its port + `r` and sends that rank's requests (both the
//! decode-only ones and the decode leg after a remote prefill) to the model server's port + `r`,
//! vLLM's rank `r` API server; the gateway routes to the rank's port (one InferencePool
//! targetPort per rank). The rank-0 port also honours the deprecated `x-data-parallel-host-port`
//! (`POD_IP:port+r`, set by upstream's `data-parallel-profile-handler`, which epp refuses): it
//! sends the request's decode to the named rank's model server, and answers 400 with an empty body
//! when no rank has that address. The header is left on the request, as upstream leaves it.
//!
//! # Checked against the real sidecar
//! With `EPP_PD_SIDECAR` set, [`real`] runs llm-d's `pd-sidecar` instead, and the e2e tests
//! (`e2e/tests/pd.rs`) pass against both; what running it taught is in BENCHMARKS.md
//! ("Disaggregated serving (#21)"). Not reproduced: TLS, SSRF allow-listing, prefiller
//! sampling, the other connectors (shared-storage, sglang, mooncake,
//! offloading), encoders, MoRI-IO, tracing.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Map, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::server::ServerHandle;

mod decode;
pub mod real;

pub use decode::DecodeSidecar;

/// The header naming the prefill pod, set by the endpoint picker.
pub const PREFILLER_HEADER: &str = "x-prefiller-host-port";
/// The deprecated header naming the data-parallel rank (`ip:port`) to decode on.
pub const DATA_PARALLEL_HEADER: &str = "x-data-parallel-host-port";
const MAX_BODY: usize = 64 << 20;
/// Token-limit fields of the chat and completions APIs (upstream's
/// `chatCompletionTokenLimitFields`).
const TOKEN_FIELDS: [&str; 3] = ["max_tokens", "max_completion_tokens", "min_tokens"];

type Body = BoxBody<Bytes, hyper::Error>;

/// How the stand-in is configured (upstream's flag names in the field docs).
#[derive(Clone, Debug)]
pub struct SidecarConfig {
    /// The local model server (`--model-server-port` on localhost).
    pub decoder: SocketAddr,
    /// `--prefill-max-retries`: retries of a prefill answered 502/503/504.
    pub prefill_max_retries: u32,
    /// `--prefill-retry-backoff` (upstream's default 200 ms).
    pub prefill_retry_backoff: Duration,
    /// `--data-parallel-size`: ranks served on consecutive ports, rank `r` decoding on the
    /// model server's port + `r` (default 1).
    pub data_parallel_size: u16,
}

impl SidecarConfig {
    pub fn new(decoder: SocketAddr) -> Self {
        Self {
            decoder,
            prefill_max_retries: 0,
            prefill_retry_backoff: Duration::from_millis(200),
            data_parallel_size: 1,
        }
    }

    /// Rank `r`'s model server: the model server's port + `r`.
    pub fn rank_decoder(&self, r: u16) -> std::io::Result<SocketAddr> {
        let port = self.decoder.port().checked_add(r).ok_or_else(|| {
            std::io::Error::other(format!(
                "model server port {} + rank {r} is past 65535",
                self.decoder.port()
            ))
        })?;
        Ok(SocketAddr::new(self.decoder.ip(), port))
    }
}

/// What the stand-in did, for tests and the benchmark.
#[derive(Debug, Default)]
pub struct SidecarStats {
    /// Requests run as prefill (remote) + decode (local).
    pub disaggregated: AtomicU64,
    /// Requests without `x-prefiller-host-port`, sent to the model server as they came.
    pub decode_only: AtomicU64,
    /// Prefill attempts retried after a 502/503/504.
    pub prefill_retries: AtomicU64,
    /// Prefill legs that finally failed (the client got the prefill's error).
    pub prefill_failures: AtomicU64,
}

impl SidecarStats {
    /// The counters now.
    pub fn counts(&self) -> SidecarCounts {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SidecarCounts {
            disaggregated: load(&self.disaggregated),
            decode_only: load(&self.decode_only),
            prefill_retries: load(&self.prefill_retries),
            prefill_failures: load(&self.prefill_failures),
        }
    }
}

/// What a decode sidecar did so far, whichever sidecar it is ([`DecodeSidecar::counts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SidecarCounts {
    /// Requests run as prefill (remote) + decode (local).
    pub disaggregated: u64,
    /// Requests without `x-prefiller-host-port`, sent to the model server as they came.
    pub decode_only: u64,
    /// Prefill attempts retried after a 502/503/504.
    pub prefill_retries: u64,
    /// Prefill legs that finally failed.
    pub prefill_failures: u64,
}

impl SidecarCounts {
    fn add(self, o: Self) -> Self {
        Self {
            disaggregated: self.disaggregated + o.disaggregated,
            decode_only: self.decode_only + o.decode_only,
            prefill_retries: self.prefill_retries + o.prefill_retries,
            prefill_failures: self.prefill_failures + o.prefill_failures,
        }
    }
}

/// One rank's server state.
struct Shared {
    cfg: SidecarConfig,
    /// This rank's model server.
    decoder: SocketAddr,
    /// This rank's counters.
    stats: SidecarStats,
    next_id: Arc<AtomicU64>,
    /// On rank 0 only: each rank's address and model server, for `x-data-parallel-host-port`.
    ranks: Option<Arc<Vec<(SocketAddr, SocketAddr)>>>,
}

/// A running stand-in sidecar; dropping it stops the servers.
pub struct Sidecar {
    /// One per rank.
    ranks: Vec<(Arc<Shared>, ServerHandle)>,
}

impl Sidecar {
    /// Serves on `listener` until [`shutdown`](Self::shutdown) or drop (one rank).
    pub fn start(listener: TcpListener, cfg: SidecarConfig) -> std::io::Result<Self> {
        Self::start_ranks(vec![listener], cfg)
    }

    /// Serves rank `r` on `listeners[r]`, one per `cfg.data_parallel_size` rank.
    pub fn start_ranks(listeners: Vec<TcpListener>, cfg: SidecarConfig) -> std::io::Result<Self> {
        if listeners.len() != usize::from(cfg.data_parallel_size) {
            return Err(std::io::Error::other(format!(
                "--data-parallel-size {} needs as many listeners, got {}",
                cfg.data_parallel_size,
                listeners.len()
            )));
        }
        let mut ranks = Vec::with_capacity(listeners.len());
        for (r, l) in (0u16..).zip(&listeners) {
            ranks.push((l.local_addr()?, cfg.rank_decoder(r)?));
        }
        let table = Arc::new(ranks);
        let next_id = Arc::new(AtomicU64::new(0));
        let ranks = listeners
            .into_iter()
            .zip(table.iter())
            .enumerate()
            .map(|(r, (listener, &(addr, decoder)))| {
                let shared = Arc::new(Shared {
                    cfg: cfg.clone(),
                    decoder,
                    stats: SidecarStats::default(),
                    next_id: Arc::clone(&next_id),
                    ranks: (r == 0).then(|| Arc::clone(&table)),
                });
                let for_server = Arc::clone(&shared);
                let server = ServerHandle::spawn(addr, move |tracker, cancel| {
                    serve(listener, for_server, tracker, cancel)
                });
                (shared, server)
            })
            .collect();
        Ok(Self { ranks })
    }

    /// Rank 0's address (the pod's serving port).
    pub fn addr(&self) -> SocketAddr {
        self.ranks[0].1.addr()
    }

    /// Every rank's address, rank order.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.ranks.iter().map(|(_, s)| s.addr()).collect()
    }

    /// What every rank did so far.
    pub fn counts(&self) -> SidecarCounts {
        self.ranks
            .iter()
            .map(|(shared, _)| shared.stats.counts())
            .fold(SidecarCounts::default(), SidecarCounts::add)
    }

    /// What rank `r`'s server did so far (zero for a rank it does not have).
    pub fn rank_counts(&self, r: u16) -> SidecarCounts {
        self.ranks
            .get(usize::from(r))
            .map_or_else(SidecarCounts::default, |(shared, _)| shared.stats.counts())
    }

    pub async fn shutdown(self) {
        for (_, server) in self.ranks {
            server.shutdown().await;
        }
    }
}

async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    tracker: TaskTracker,
    cancel: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            () = cancel.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let shared = Arc::clone(&shared);
        let (cancel, conn_tracker) = (cancel.clone(), tracker.clone());
        tracker.spawn(async move {
            let service =
                service_fn(move |req| handle(Arc::clone(&shared), conn_tracker.clone(), req));
            let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                () = cancel.cancelled() => {}
                _ = conn => {}
            }
        });
    }
}

fn full(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()).map_err(|e| match e {}).boxed());
    *r.status_mut() = status;
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    r
}

fn error(status: StatusCode, message: &str) -> Response<Body> {
    full(status, json!({"error": {"message": message}}).to_string())
}

async fn handle(
    shared: Arc<Shared>,
    tracker: TaskTracker,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    if req.method() == Method::GET && req.uri().path() == "/health" {
        // The sidecar's own liveness answer (it does not ask the model server).
        return Ok(full(StatusCode::OK, Bytes::new()));
    }
    let pd_path = matches!(req.uri().path(), "/v1/chat/completions" | "/v1/completions");
    let (mut parts, body) = req.into_parts();
    let prefiller = parts
        .headers
        .remove(PREFILLER_HEADER)
        .and_then(|v| v.to_str().ok().map(str::to_owned))
        .and_then(|v| v.split(',').next().map(|s| s.trim().to_owned()))
        .filter(|v| !v.is_empty());
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return Ok(error(
                StatusCode::BAD_REQUEST,
                "cannot read the request body",
            ))
        }
    };
    // Upstream consults the rank header where it decodes: after the prefill leg, if any.
    let decoder = if pd_path {
        data_parallel_decoder(&shared, &parts.headers)
    } else {
        Some(shared.decoder)
    };
    let response = match prefiller.filter(|_| pd_path && parts.method == Method::POST) {
        None => {
            let Some(decoder) = decoder else {
                return Ok(full(StatusCode::BAD_REQUEST, Bytes::new()));
            };
            if pd_path {
                shared.stats.decode_only.fetch_add(1, Ordering::Relaxed);
            }
            forward(&tracker, decoder, &parts, body, None).await
        }
        Some(prefill) => disaggregate(&shared, &tracker, &mut parts, body, &prefill, decoder).await,
    };
    Ok(response.unwrap_or_else(|e| error(StatusCode::BAD_GATEWAY, &e)))
}

/// The model server this request decodes on: the rank `x-data-parallel-host-port` names when
/// it arrives on rank 0's port, else this rank's; `None` when the named rank does not exist.
fn data_parallel_decoder(shared: &Shared, headers: &HeaderMap) -> Option<SocketAddr> {
    let named = headers
        .get(DATA_PARALLEL_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty());
    match (named, &shared.ranks) {
        (Some(named), Some(ranks)) => ranks
            .iter()
            .find(|(addr, _)| addr.to_string() == named)
            .map(|&(_, decoder)| decoder),
        _ => Some(shared.decoder),
    }
}

/// The NIXL v2 exchange: prefill leg, then decode leg with the prefill's KV parameters.
async fn disaggregate(
    shared: &Shared,
    tracker: &TaskTracker,
    parts: &mut http::request::Parts,
    body: Bytes,
    prefill: &str,
    decoder: Option<SocketAddr>,
) -> Result<Response<Body>, String> {
    let Ok(Value::Object(original)) = serde_json::from_slice::<Value>(&body) else {
        return Ok(error(
            StatusCode::BAD_REQUEST,
            "request body is not a JSON object",
        ));
    };
    let id = format!(
        "pd-standin-{}",
        shared.next_id.fetch_add(1, Ordering::Relaxed)
    );
    // Added, not replaced: the legs carry the gateway's id first, then the sidecar's (as the
    // real sidecar's `Header.Add`).
    parts.headers.append(
        "x-request-id",
        HeaderValue::from_str(&id).map_err(|e| e.to_string())?,
    );
    let prefill_body = prefill_leg(&original);
    let outcome = match prefill.parse::<SocketAddr>() {
        Ok(addr) => run_prefill(shared, tracker, parts, &prefill_body, addr).await,
        Err(_) => (
            StatusCode::BAD_GATEWAY,
            Bytes::from("invalid prefill address"),
        ),
    };
    let (status, answer) = outcome;
    if !status.is_success() {
        shared
            .stats
            .prefill_failures
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(%prefill, %status, request_id = %id, "prefill request failed");
        return Ok(full(status, answer));
    }
    let response: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
    let kv = response.get("kv_transfer_params").cloned();
    if kv.is_none() {
        tracing::info!("warning: missing 'kv_transfer_params' field in prefiller response");
    }
    let cached = response
        .pointer("/usage/prompt_tokens_details/cached_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let Some(decoder) = decoder else {
        return Ok(full(StatusCode::BAD_REQUEST, Bytes::new()));
    };
    let mut decode = original;
    decode.insert("kv_transfer_params".into(), kv.unwrap_or(Value::Null));
    let decode = Bytes::from(Value::Object(decode).to_string());
    shared.stats.disaggregated.fetch_add(1, Ordering::Relaxed);
    forward(tracker, decoder, parts, decode, Some(cached)).await
}

/// The prefill leg's body (see the module docs).
fn prefill_leg(original: &Map<String, Value>) -> Bytes {
    let mut p = original.clone();
    p.insert(
        "kv_transfer_params".into(),
        json!({"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
            "remote_block_ids": null, "remote_host": null, "remote_port": null}),
    );
    p.insert("stream".into(), Value::Bool(false));
    p.remove("stream_options");
    for f in TOKEN_FIELDS {
        p.insert(f.into(), json!(1));
    }
    Bytes::from(Value::Object(p).to_string())
}

/// Sends the prefill leg, retrying 502/503/504 as configured; the final status and body.
async fn run_prefill(
    shared: &Shared,
    tracker: &TaskTracker,
    parts: &http::request::Parts,
    body: &Bytes,
    addr: SocketAddr,
) -> (StatusCode, Bytes) {
    let cfg = &shared.cfg;
    let mut attempt = 0;
    loop {
        let (status, answer) = match forward(tracker, addr, parts, body.clone(), None).await {
            Ok(r) => {
                let status = r.status();
                let answer = r.into_body().collect().await.map(|b| b.to_bytes());
                (status, answer.unwrap_or_default())
            }
            Err(e) => {
                // Go's reverse proxy logs the error and answers an empty 502.
                tracing::warn!(target = %addr, error = %e, "http: proxy error");
                (StatusCode::BAD_GATEWAY, Bytes::new())
            }
        };
        let retryable = matches!(status.as_u16(), 502..=504);
        if status.is_success() || !retryable || attempt >= cfg.prefill_max_retries {
            return (status, answer);
        }
        attempt += 1;
        shared.stats.prefill_retries.fetch_add(1, Ordering::Relaxed);
        tracing::info!(attempt, target = %addr, previous_code = %status, "retrying prefill request");
        tokio::time::sleep(cfg.prefill_retry_backoff).await;
    }
}

/// Sends one request to `addr` and streams its answer back; with `cached`, rewrites
/// `usage.prompt_tokens_details.cached_tokens` in the answer (JSON or SSE).
async fn forward(
    tracker: &TaskTracker,
    addr: SocketAddr,
    parts: &http::request::Parts,
    body: Bytes,
    cached: Option<u64>,
) -> Result<Response<Body>, String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connecting to {addr}: {e}"))?;
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tracker.spawn(async move {
        let _ = conn.await;
    });
    let mut req = Request::builder()
        .method(parts.method.clone())
        .uri(parts.uri.clone())
        .body(Full::new(body.clone()))
        .map_err(|e| e.to_string())?;
    *req.headers_mut() = forwarded_headers(&parts.headers, body.len());
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let (mut rparts, rbody) = resp.into_parts();
    let body = match cached {
        None => rbody.boxed(),
        Some(n) => {
            rparts.headers.remove("content-length");
            rbody
                .map_frame(move |f| match f.into_data() {
                    Ok(d) => Frame::data(rewrite_cached(&d, n)),
                    Err(f) => f,
                })
                .boxed()
        }
    };
    Ok(Response::from_parts(rparts, body))
}

fn forwarded_headers(headers: &HeaderMap, len: usize) -> HeaderMap {
    let mut h = headers.clone();
    h.remove("content-length");
    h.remove("transfer-encoding");
    h.insert("content-length", HeaderValue::from(len));
    h
}

/// Replaces `usage.prompt_tokens_details.cached_tokens` in a JSON body or in each SSE
/// `data:` event of a chunk (the simulator sends whole events per chunk).
fn rewrite_cached(data: &Bytes, cached: u64) -> Bytes {
    let text = String::from_utf8_lossy(data);
    if !text.contains("prompt_tokens_details") {
        return data.clone();
    }
    let fix = |s: &str| -> Option<String> {
        let mut v: Value = serde_json::from_str(s).ok()?;
        let details = v.pointer_mut("/usage/prompt_tokens_details")?;
        details["cached_tokens"] = json!(cached);
        Some(v.to_string())
    };
    if let Some(json) = fix(text.trim()) {
        return Bytes::from(json);
    }
    let lines: Vec<String> = text
        .split('\n')
        .map(|l| match l.strip_prefix("data: ").and_then(fix) {
            Some(j) => format!("data: {j}"),
            None => l.to_owned(),
        })
        .collect();
    Bytes::from(lines.join("\n"))
}

#[cfg(test)]
mod tests;

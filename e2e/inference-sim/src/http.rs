//! The pod's HTTP surface (vLLM's OpenAI-compatible server plus the
//! llm-d-inference-sim headers), as one hyper service function.
//!
//! Routes: `POST /v1/completions`, `/v1/chat/completions` (JSON or SSE),
//! `/v1/responses`, `/inference/v1/generate`, `/v1/messages` (Anthropic; not a vLLM route,
//! see [`crate::apis`]), `/v1/embeddings`, `/v1/completions/render`, `/v1/chat/completions/render`, `/tokenize`,
//! `/detokenize`, `/v1/load_lora_adapter`, `/v1/unload_lora_adapter`,
//! `/reset_prefix_cache`; `GET /v1/models`, `/health`, `/ping`, `/version`,
//! `/metrics`; `GET /v1/realtime` upgraded to a WebSocket (vLLM's Realtime API, [`realtime`]).
//! Every response carries `x-inference-pod` and `x-inference-port`. Any other
//! path is a 404, as on vLLM serving a generative model: no pooling routes (`/v1/rerank`,
//! `/v1/score`), no HTTP `POST /v1/realtime`, no SGLang `/generate`.
//! During the start-up delay `/health` and all model routes answer 503 and
//! `/metrics` has no `cache_config_info` yet.

use std::convert::Infallible;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use rand::rngs::SmallRng;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::config::PodConfig;
use super::faults::FaultSwitch;
use super::hook::{MetricsMode, RecordedRequest, TestHook};
use super::lora::LoraRegistry;
use super::metrics::{render, PodMetrics};
use super::openai::{Api, ApiError, LoraRequest, TokenizeRequest};
use super::runner::{Command, SimClock};
use super::tokenizer::{render_chat, Tokenizer};

mod embeddings;
mod inference;
pub mod query;
pub mod realtime;

/// Response body type of every route.
pub type Body = BoxBody<Bytes, Infallible>;

/// Request body type of the routes: as received, or already read by the test hook.
pub type ReqBody = UnsyncBoxBody<Bytes, hyper::Error>;

const MAX_BODY: usize = 64 << 20;
const VERSION: &str = "0.10.1.1+inference-sim";

/// Everything the handlers of one pod share.
pub struct PodState {
    pub cfg: Arc<PodConfig>,
    pub port: u16,
    pub tokenizer: Tokenizer,
    pub engine: mpsc::UnboundedSender<Command>,
    pub metrics: Arc<Mutex<PodMetrics>>,
    /// `/metrics` text frozen by the `stall_metrics` fault.
    pub frozen: Mutex<Option<String>>,
    pub faults: FaultSwitch,
    pub loras: Mutex<LoraRegistry>,
    pub rng: Mutex<SmallRng>,
    pub ready_at: Instant,
    pub clock: SimClock,
    pub next_id: AtomicU64,
    /// What tests see and force ([`TestHook`]).
    pub hook: TestHook,
}

impl PodState {
    fn ready(&self) -> bool {
        Instant::now() >= self.ready_at
    }
}

pub fn full(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Body> {
    let mut resp = Response::new(Full::new(body.into()).boxed());
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

pub fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    full(status, "application/json", value.to_string())
}

fn error_response(e: &ApiError) -> Response<Body> {
    json_response(e.status(), &e.body())
}

/// Serves one request; never fails (errors become OpenAI error bodies).
pub async fn handle(
    state: Arc<PodState>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let request_id = req.headers().get("x-request-id").cloned();
    let mut resp = route(&state, req)
        .await
        .unwrap_or_else(|e| error_response(&e));
    let headers = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&state.cfg.pod_name) {
        headers.insert("x-inference-pod", v);
    }
    headers.insert("x-inference-port", HeaderValue::from(state.port));
    if let Some(ns) = state
        .cfg
        .namespace
        .as_deref()
        .and_then(|n| HeaderValue::from_str(n).ok())
    {
        headers.insert("x-inference-namespace", ns);
    }
    if let Some(id) = request_id {
        headers.insert("x-request-id", id);
    }
    Ok(resp)
}

async fn route(state: &Arc<PodState>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let req = receive(&state.hook, req).await?;
    let path = req.uri().path().to_owned();
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/health" | "/ping") | (Method::POST, "/ping") => health(state),
        (Method::GET, "/version") => {
            Ok(json_response(StatusCode::OK, &json!({"version": VERSION})))
        }
        (Method::GET, "/metrics" | "/metrics/" | "/prometheus/metrics") => {
            let names = super::metrics::filter::requested_names(req.uri().query());
            metrics(state, names.as_deref()).await
        }
        _ if !state.ready() => Err(ApiError::Unavailable("the engine is starting")),
        (Method::GET, "/v1/models") => Ok(models(state)),
        (Method::GET, realtime::PATH) => realtime::accept(state, req),
        (Method::POST, "/v1/completions") => inference::serve(state, req, Api::Completions).await,
        (Method::POST, "/v1/chat/completions") => inference::serve(state, req, Api::Chat).await,
        (Method::POST, "/v1/responses") => inference::serve(state, req, Api::Responses).await,
        (Method::POST, "/inference/v1/generate") => {
            inference::serve(state, req, Api::Generate).await
        }
        (Method::POST, "/v1/messages") => inference::serve(state, req, Api::Messages).await,
        (Method::POST, "/v1/embeddings") => embeddings::serve(state, req).await,
        (Method::POST, "/v1/completions/render") => {
            inference::render(state, req, Api::Completions).await
        }
        (Method::POST, "/v1/chat/completions/render") => {
            inference::render(state, req, Api::Chat).await
        }
        (Method::POST, "/tokenize") => tokenize(state, read_json(req).await?),
        (Method::POST, "/detokenize") => detokenize(state, read_json(req).await?),
        (Method::POST, "/v1/load_lora_adapter") => load_lora(state, read_json(req).await?),
        (Method::POST, "/v1/unload_lora_adapter") => unload_lora(state, read_json(req).await?),
        (Method::POST, "/reset_prefix_cache") => reset_prefix_cache(state).await,
        _ => Err(ApiError::NoRoute),
    }
}

/// The request with its body boxed; read and recorded first when the hook records.
async fn receive(hook: &TestHook, req: Request<Incoming>) -> Result<Request<ReqBody>, ApiError> {
    if !hook.records() {
        return Ok(req.map(BodyExt::boxed_unsync));
    }
    let received_at = std::time::Instant::now();
    let (parts, body) = req.into_parts();
    let body = Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map_err(|_| ApiError::Body)?
        .to_bytes();
    hook.record(RecordedRequest {
        method: parts.method.clone(),
        path: parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned(),
        headers: parts.headers.clone(),
        body: body.clone(),
        received_at,
    });
    let never = |e: Infallible| -> hyper::Error { match e {} };
    let body = Full::new(body).map_err(never).boxed_unsync();
    Ok(Request::from_parts(parts, body))
}

pub async fn read_json<T, B>(req: Request<B>) -> Result<T, ApiError>
where
    T: DeserializeOwned,
    B: hyper::body::Body<Data = Bytes, Error = hyper::Error>,
{
    Ok(serde_json::from_slice(&read_body(req).await?)?)
}

/// The whole request body (at most 64 MiB).
pub async fn read_body<B>(req: Request<B>) -> Result<Bytes, ApiError>
where
    B: hyper::body::Body<Data = Bytes, Error = hyper::Error>,
{
    let body = Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|_| ApiError::Body)?;
    Ok(body.to_bytes())
}

fn health(state: &PodState) -> Result<Response<Body>, ApiError> {
    if !state.ready() {
        return Err(ApiError::Unavailable("the engine is starting"));
    }
    if state.faults.current().unhealthy {
        return Err(ApiError::Unavailable(
            "the engine is unhealthy (fault injected)",
        ));
    }
    Ok(full(StatusCode::OK, "text/plain", ""))
}

async fn metrics(state: &PodState, names: Option<&[String]>) -> Result<Response<Body>, ApiError> {
    let mut mode = state.hook.metrics_mode();
    loop {
        match *mode.borrow_and_update() {
            MetricsMode::Normal => break,
            MetricsMode::Error => {
                return Err(ApiError::Injected(StatusCode::INTERNAL_SERVER_ERROR))
            }
            MetricsMode::Hang => {}
        }
        if mode.changed().await.is_err() {
            return Err(ApiError::Unavailable("the pod has stopped"));
        }
    }
    Ok(metrics_text(state, names))
}

fn metrics_text(state: &PodState, names: Option<&[String]>) -> Response<Body> {
    let stalled = state.faults.current().stall_metrics;
    let mut frozen = state.frozen.lock().unwrap_or_else(|e| e.into_inner());
    if !stalled {
        *frozen = None;
    }
    let text = match frozen.as_ref() {
        Some(text) => text.clone(),
        None => {
            let mut m = state.metrics.lock().unwrap_or_else(|e| e.into_inner());
            m.initialised = state.ready();
            let now = state.clock.unix(Instant::now());
            let forced = state.hook.forced_view(&m, state.cfg.enable_lora, now);
            let mut text = render(forced.as_ref().unwrap_or(&m), &state.cfg);
            if state.cfg.metrics.dcgm {
                let exhausted = state.faults.current().gpu_memory_exhausted;
                super::metrics::dcgm::append(&mut text, &m.gauges, &state.cfg, exhausted);
            }
            if stalled {
                *frozen = Some(text.clone());
            }
            text
        }
    };
    let text = match names {
        Some(names) => super::metrics::filter::restrict(&text, names),
        None => text,
    };
    full(
        StatusCode::OK,
        "text/plain; version=0.0.4; charset=utf-8",
        text,
    )
}

fn models(state: &PodState) -> Response<Body> {
    let created = state.clock.unix(Instant::now()) as u64;
    let model = &state.cfg.engine.model;
    let max_len = state.cfg.engine.max_model_len;
    let entry = |id: &str, parent: Value| {
        json!({"id": id, "object": "model", "created": created, "owned_by": "vllm", "root": id,
            "parent": parent, "max_model_len": max_len, "permission": []})
    };
    let mut data = vec![entry(model, Value::Null)];
    let loras = state.loras.lock().unwrap_or_else(|e| e.into_inner());
    data.extend(loras.loaded().iter().map(|l| entry(&l.name, json!(model))));
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

fn tokenize(state: &PodState, req: TokenizeRequest) -> Result<Response<Body>, ApiError> {
    let text = match (req.prompt, req.messages) {
        (Some(prompt), _) => prompt,
        (None, Some(messages)) => {
            let turns: Vec<_> = messages.iter().map(|m| m.turn()).collect();
            render_chat(&turns, req.add_generation_prompt.unwrap_or(true))
        }
        (None, None) => {
            return Err(ApiError::BadRequest(
                "either `prompt` or `messages` is required".into(),
            ))
        }
    };
    let _ = req.model;
    let tokens = state.tokenizer.encode(&text);
    let body = json!({"count": tokens.len(), "max_model_len": state.cfg.engine.max_model_len,
        "tokens": tokens, "token_strs": null});
    Ok(json_response(StatusCode::OK, &body))
}

fn detokenize(state: &PodState, req: TokenizeRequest) -> Result<Response<Body>, ApiError> {
    let tokens = req
        .tokens
        .ok_or_else(|| ApiError::BadRequest("`tokens` is required".into()))?;
    let prompt = state.tokenizer.decode(&tokens)?;
    Ok(json_response(StatusCode::OK, &json!({"prompt": prompt})))
}

fn load_lora(state: &PodState, req: LoraRequest) -> Result<Response<Body>, ApiError> {
    let _ = req.lora_path;
    state
        .loras
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .load(&req.lora_name)?;
    let msg = format!(
        "Success: LoRA adapter '{}' added successfully.",
        req.lora_name
    );
    Ok(full(StatusCode::OK, "text/plain", msg))
}

fn unload_lora(state: &PodState, req: LoraRequest) -> Result<Response<Body>, ApiError> {
    state
        .loras
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .unload(&req.lora_name)?;
    let msg = format!(
        "Success: LoRA adapter '{}' removed successfully.",
        req.lora_name
    );
    Ok(full(StatusCode::OK, "text/plain", msg))
}

async fn reset_prefix_cache(state: &PodState) -> Result<Response<Body>, ApiError> {
    let (tx, rx) = oneshot::channel();
    state
        .engine
        .send(Command::ResetPrefixCache(tx))
        .map_err(|_| ApiError::Unavailable("the engine has stopped"))?;
    let _reset = rx
        .await
        .map_err(|_| ApiError::Unavailable("the engine has stopped"))?;
    Ok(full(StatusCode::OK, "text/plain", ""))
}

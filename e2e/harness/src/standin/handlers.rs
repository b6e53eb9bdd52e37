//! One HTTP request to the stand-in: record it, route it by method and path, answer, and stamp
//! the `x-inference-pod` / `x-inference-port` headers on every response.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::json;

use super::openai::{self, Api, Reply};
use super::prometheus;
use super::state::{InFlight, MetricsMode, RecordedRequest, Shared};

/// The response body type: a whole body or an SSE stream.
pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Request header that makes the stand-in answer with that status (as llm-d-inference-sim does).
pub const RETURN_ERROR_HEADER: &str = "x-return-error";

/// The hyper service function.
pub async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let (parts, body) = req.into_parts();
    let received_at = Instant::now();
    let mut response = match body.collect().await {
        Ok(collected) => {
            let body = collected.to_bytes();
            shared.record(RecordedRequest {
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
            route(&shared, &parts, body).await
        }
        Err(err) => error(
            StatusCode::BAD_REQUEST,
            &format!("reading the request body: {err}"),
        ),
    };
    let headers = response.headers_mut();
    headers.insert("x-inference-pod", header_value(&shared.opts.name));
    headers.insert("x-inference-port", HeaderValue::from(shared.port));
    Ok(response)
}

async fn route(shared: &Arc<Shared>, parts: &http::request::Parts, body: Bytes) -> Response<Body> {
    if let Some(status) = forced_status(parts) {
        return error(status, "error forced by x-return-error");
    }
    let path = parts.uri.path();
    match (&parts.method, path) {
        (&Method::POST, _) if Api::from_path(path).is_some() => match Api::from_path(path) {
            Some(api) => inference(shared, api, &body).await,
            None => error(StatusCode::NOT_FOUND, "not found"),
        },
        (&Method::POST, _) if NATIVE_PATHS.contains(&path) => native(shared, path, &body),
        (&Method::GET, "/v1/models") => json_response(StatusCode::OK, models(shared)),
        (&Method::GET, "/health") => full(StatusCode::OK, "text/plain", Bytes::new()),
        (&Method::GET, "/metrics") => metrics(shared).await,
        (_, "/v1/models" | "/health" | "/metrics") => {
            error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
        }
        (_, _) if Api::from_path(path).is_some() => {
            error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
        }
        _ => error(StatusCode::NOT_FOUND, &format!("no route for {path}")),
    }
}

/// Paths served by [`native`]: llm-d-router v0.10's other parsers (Anthropic Messages, vLLM and
/// SGLang token-in generate), OpenAI's Realtime path and a path only the passthrough parser
/// takes.
const NATIVE_PATHS: [&str; 6] = [
    "/v1/realtime",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/inference/v1/generate",
    "/generate",
    "/v1/rerank",
];

/// A minimal 200 for the non-OpenAI APIs: the stand-in only needs to be reachable there (the
/// tests assert on what it received); the answer names the path, the model and the body size.
fn native(shared: &Shared, path: &str, body: &[u8]) -> Response<Body> {
    let model = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("model").cloned());
    json_response(
        StatusCode::OK,
        json!({"object": "native", "path": path, "model": model, "bytes": body.len(), "pod": shared.opts.name}),
    )
}

fn forced_status(parts: &http::request::Parts) -> Option<StatusCode> {
    let value = parts.headers.get(RETURN_ERROR_HEADER)?.to_str().ok()?;
    StatusCode::from_u16(value.trim().parse().ok()?).ok()
}

async fn inference(shared: &Arc<Shared>, api: Api, body: &[u8]) -> Response<Body> {
    let parsed = match openai::parse(api, body) {
        Ok(parsed) => parsed,
        Err(message) => return error(StatusCode::BAD_REQUEST, &message),
    };
    let opts = &shared.opts;
    let completion_tokens = match api {
        Api::Embeddings => 0,
        _ => parsed.max_tokens.map_or(opts.completion_tokens, |max| {
            max.min(opts.completion_tokens)
        }),
    };
    let in_flight = shared.start_request(&parsed.model, parsed.prompt_tokens, completion_tokens);
    let reply = Reply {
        api,
        id: format!("cmpl-{}-{}", opts.name, shared.next_id()),
        pod: &opts.name,
        model: &parsed.model,
        created: unix_seconds(),
        prompt_tokens: parsed.prompt_tokens,
        completion_tokens,
    };
    if parsed.stream {
        let events = reply.events(parsed.include_usage);
        return sse(
            events,
            completion_tokens,
            opts.latency,
            opts.stream_interval,
            in_flight,
        );
    }
    if !opts.latency.is_zero() {
        tokio::time::sleep(opts.latency).await;
    }
    drop(in_flight);
    full(StatusCode::OK, "application/json", reply.full())
}

/// Streams `events`: the first after `latency`, each further token event after `interval`, and
/// the closing events (usage, `[DONE]`) right after the last token. Each event is its own
/// chunk. `in_flight` is released when the stream ends or the client goes away.
fn sse(
    events: Vec<Bytes>,
    tokens: u64,
    latency: Duration,
    interval: Duration,
    in_flight: InFlight,
) -> Response<Body> {
    let delays = (0..events.len()).map(move |i| match i {
        0 => latency,
        i if (i as u64) < tokens => interval,
        _ => Duration::ZERO,
    });
    let state = (events.into_iter().zip(delays), in_flight);
    let stream = futures::stream::unfold(state, |(mut events, in_flight)| async move {
        let (event, delay) = events.next()?;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        Some((Ok::<_, Infallible>(Frame::data(event)), (events, in_flight)))
    });
    let mut response = Response::new(BodyExt::boxed_unsync(StreamBody::new(stream)));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

async fn metrics(shared: &Shared) -> Response<Body> {
    let mut mode = shared.metrics_mode.subscribe();
    loop {
        let current = *mode.borrow_and_update();
        match current {
            MetricsMode::Normal => break,
            MetricsMode::Error => {
                return error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "metrics failure injected",
                )
            }
            // Wait for the test to change the mode; a server shutdown drops the connection.
            MetricsMode::Hang if mode.changed().await.is_err() => {
                return error(StatusCode::SERVICE_UNAVAILABLE, "shutting down")
            }
            MetricsMode::Hang => {}
        }
    }
    let text = prometheus::render(&shared.opts, &shared.metric_values());
    full(
        StatusCode::OK,
        "text/plain; version=0.0.4; charset=utf-8",
        Bytes::from(text),
    )
}

fn models(shared: &Shared) -> serde_json::Value {
    let opts = &shared.opts;
    let created = unix_seconds();
    let card = |id: &str, parent: Option<&str>| {
        json!({"id": id, "object": "model", "created": created, "owned_by": "vllm",
               "root": id, "parent": parent, "max_model_len": 8192})
    };
    let mut data = vec![card(&opts.model, None)];
    data.extend(
        opts.lora_adapters
            .iter()
            .map(|a| card(a, Some(&opts.model))),
    );
    json!({"object": "list", "data": data})
}

fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn header_value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

fn full(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Body> {
    let mut response = Response::new(BodyExt::boxed_unsync(Full::new(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn json_response(status: StatusCode, body: serde_json::Value) -> Response<Body> {
    full(status, "application/json", Bytes::from(body.to_string()))
}

/// vLLM's error shape.
fn error(status: StatusCode, message: &str) -> Response<Body> {
    let kind = if status.is_client_error() {
        "BadRequestError"
    } else {
        "InternalServerError"
    };
    json_response(
        status,
        json!({"object": "error", "message": message, "type": kind, "param": null, "code": status.as_u16()}),
    )
}

//! Completions and chat completions (and the Responses, Anthropic Messages and token-in generate
//! requests [`crate::apis`] maps onto them): admission (faults, model, tokens, context length),
//! hand-off to the engine, and the JSON or SSE answer.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use rand::Rng;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{json_response, read_body, read_json, Body, PodState, ReqBody};
use crate::apis;
use crate::engine::{FinishReason, KvTransfer, LoraRef, NewRequest, SeqOutput, Usage};
use crate::faults::Faults;
use crate::openai::{Api, ApiError, InferenceRequest, Prompt, PromptInput, ResponseMeta};
use crate::runner::Command;
use crate::tokenizer::{render_chat, TokenId};

/// A validated request, ready for the engine.
struct Prepared {
    prompt: Vec<TokenId>,
    lora: Option<LoraRef>,
    model: String,
    max_output: usize,
    reason_at_limit: FinishReason,
    params_max_tokens: Option<usize>,
    cache_salt: Option<String>,
    stream: bool,
    include_usage: bool,
    kv: KvTransfer,
}

/// `POST /v1/completions`, `/v1/chat/completions`, and the APIs of [`crate::apis`].
pub async fn serve(
    state: &Arc<PodState>,
    req: Request<ReqBody>,
    api: Api,
) -> Result<Response<Body>, ApiError> {
    let faults = state.faults.current();
    injected_failure(state, &faults, &req)?;
    let body = api.parse(&read_body(req).await?)?;
    let p = prepare(state, api, body)?;
    if !faults.added_latency().is_zero() {
        tokio::time::sleep(faults.added_latency().div_f64(state.cfg.engine.time_scale)).await;
    }
    state.faults.wait_unhung().await;
    let (stream, include_usage) = (p.stream, p.include_usage);
    let remote_decode = p.kv == KvTransfer::RemoteDecode;
    let (meta, rx) = submit(state, api, p)?;
    if stream {
        Ok(sse(state, meta, rx, include_usage))
    } else {
        collect(state, meta, rx, remote_decode).await
    }
}

/// The failure `X-Return-Error` or the pod's failure rate injects into this request, if any.
pub fn injected_failure(
    state: &PodState,
    faults: &Faults,
    req: &Request<ReqBody>,
) -> Result<(), ApiError> {
    let return_error = req
        .headers()
        .get(crate::faults::RETURN_ERROR_HEADER)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let injected = {
        let mut rng = state.rng.lock().unwrap_or_else(|e| e.into_inner());
        faults.injected_failure(return_error.as_deref(), &mut *rng)?
    };
    match injected {
        Some(status) => Err(ApiError::Injected(status)),
        None => Ok(()),
    }
}

/// Hands a prepared request to the engine; returns the response identity and
/// the channel its tokens arrive on.
fn submit(
    state: &PodState,
    api: Api,
    p: Prepared,
) -> Result<(ResponseMeta, mpsc::UnboundedReceiver<SeqOutput>), ApiError> {
    let (tx, rx) = mpsc::unbounded_channel();
    let meta = ResponseMeta {
        api,
        id: response_id(state, api),
        created: state.clock.unix(Instant::now()) as u64,
        model: p.model,
        prompt_tokens_details: state.cfg.prompt_tokens_details,
    };
    let request = NewRequest {
        prompt: p.prompt,
        max_output: p.max_output,
        reason_at_limit: p.reason_at_limit,
        params_max_tokens: p.params_max_tokens,
        lora: p.lora,
        cache_salt: p.cache_salt,
        arrival: Instant::now(),
        output: tx,
        kv: p.kv,
    };
    state
        .engine
        .send(Command::Submit(Box::new(request)))
        .map_err(|_| ApiError::Unavailable("the engine has stopped"))?;
    Ok((meta, rx))
}

/// `POST /v1/completions/render` and `/v1/chat/completions/render` (vLLM's render API, what
/// llm-d-router's `token-producer` calls): the token ids the pod would prefill the request with,
/// from the same tokenizer and chat template as [`serve`] (so block hashes computed from them
/// match the pod's prefix cache and KV events), without generating. Completions answer a JSON
/// array with one `{"token_ids"}` object per prompt (a prompt list is rendered prompt by prompt,
/// token-id prompts pass through); chat answers one `{"token_ids"}` object. The model must be the
/// base model or a loaded adapter (404 otherwise); no prompt or messages, or an empty prompt, is
/// a 400.
pub async fn render(
    state: &Arc<PodState>,
    req: Request<ReqBody>,
    api: Api,
) -> Result<Response<Body>, ApiError> {
    let body: InferenceRequest = read_json(req).await?;
    let model = body
        .model
        .clone()
        .unwrap_or_else(|| state.cfg.engine.model.clone());
    resolve_model(state, &model)?;
    let non_empty = |ids: Vec<TokenId>| {
        if ids.is_empty() {
            Err(ApiError::BadRequest("The prompt cannot be empty.".into()))
        } else {
            Ok(ids)
        }
    };
    if api.is_chat() {
        let ids = non_empty(prompt_tokens(state, api, &body)?)?;
        return Ok(json_response(StatusCode::OK, &json!({"token_ids": ids})));
    }
    let prompt = body
        .prompt
        .ok_or_else(|| ApiError::BadRequest("`prompt` is required".into()))?;
    let inputs = match prompt {
        Prompt::Text(t) => vec![PromptInput::Text(t)],
        Prompt::Tokens(t) => vec![PromptInput::Tokens(t)],
        Prompt::Texts(v) => v.into_iter().map(PromptInput::Text).collect(),
        Prompt::TokenLists(v) => v.into_iter().map(PromptInput::Tokens).collect(),
    };
    if inputs.is_empty() {
        return Err(ApiError::BadRequest(
            "prompt array must contain at least one prompt".into(),
        ));
    }
    let out = inputs
        .into_iter()
        .map(|p| {
            let ids = match p {
                PromptInput::Text(text) => state.tokenizer.encode(&text),
                PromptInput::Tokens(ids) => ids,
            };
            non_empty(ids).map(|ids| json!({"token_ids": ids}))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(json_response(
        StatusCode::OK,
        &serde_json::Value::Array(out),
    ))
}

fn response_id(state: &PodState, api: Api) -> String {
    let n = state.next_id.fetch_add(1, Ordering::Relaxed);
    format!("{}-{}-{n}", api.id_prefix(), state.cfg.pod_name)
}

fn prepare(state: &PodState, api: Api, body: InferenceRequest) -> Result<Prepared, ApiError> {
    let cfg = &state.cfg.engine;
    let model = body.model.clone().unwrap_or_else(|| cfg.model.clone());
    let lora = resolve_model(state, &model)?;
    if body.n.is_some_and(|n| n != 1) {
        return Err(ApiError::BadRequest(
            "inference-sim supports only n = 1".into(),
        ));
    }
    let prompt = prompt_tokens(state, api, &body)?;
    if prompt.is_empty() {
        return Err(ApiError::BadRequest("The prompt cannot be empty.".into()));
    }
    let requested = body.max_completion_tokens.or(body.max_tokens);
    if requested == Some(0) {
        return Err(ApiError::BadRequest(
            "max_tokens must be at least 1, got 0.".into(),
        ));
    }
    let output = requested.unwrap_or(1);
    if prompt.len() + output > cfg.max_model_len {
        let (max, p) = (cfg.max_model_len, prompt.len());
        return Err(ApiError::ContextTooLong {
            max,
            total: p + output,
            prompt: p,
            output,
        });
    }
    let (max_output, reason_at_limit) = output_length(state, requested, prompt.len());
    // vLLM records the effective limit (max_model_len - prompt when unset).
    let limit = requested.unwrap_or(cfg.max_model_len - prompt.len());
    Ok(Prepared {
        prompt,
        lora,
        model,
        max_output,
        reason_at_limit,
        params_max_tokens: Some(limit),
        cache_salt: body.cache_salt,
        stream: body.stream,
        include_usage: body.stream_options.is_some_and(|o| o.include_usage),
        kv: kv_transfer(state, body.kv_transfer_params.as_ref())?,
    })
}

/// The request's part in a prefill/decode split, from vLLM's `kv_transfer_params` as the
/// llm-d sidecar sends them with the NIXL connector: `do_remote_decode: true` on the prefill
/// leg, the prefill response's own params (`do_remote_prefill: true`, `remote_block_ids`,
/// `remote_engine_id`, `remote_host`, `remote_port`) on the decode leg. Without a connector
/// they are ignored, as vLLM does; a leg the pod's `kv_role` does not take is a 400.
fn kv_transfer(
    state: &PodState,
    params: Option<&serde_json::Value>,
) -> Result<KvTransfer, ApiError> {
    let (Some(cfg), Some(p)) = (&state.cfg.engine.kv_transfer, params) else {
        return Ok(KvTransfer::None);
    };
    let flag = |k: &str| {
        p.get(k)
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false)
    };
    let bad = |m: &str| Err(ApiError::BadRequest(format!("kv_transfer_params: {m}")));
    match (flag("do_remote_decode"), flag("do_remote_prefill")) {
        (true, true) => bad("do_remote_decode and do_remote_prefill are exclusive"),
        (true, false) if !cfg.produces() => bad("this pod's kv_role does not produce KV"),
        (true, false) => Ok(KvTransfer::RemoteDecode),
        (false, true) if !cfg.consumes() => bad("this pod's kv_role does not consume KV"),
        (false, true) => {
            let blocks = p
                .get("remote_block_ids")
                .and_then(serde_json::Value::as_array);
            let engine = p
                .get("remote_engine_id")
                .and_then(serde_json::Value::as_str);
            match (blocks, engine) {
                (Some(b), Some(_)) => Ok(KvTransfer::RemotePrefill { blocks: b.len() }),
                _ => bad("do_remote_prefill needs remote_block_ids and remote_engine_id"),
            }
        }
        (false, false) => Ok(KvTransfer::None),
    }
}

/// Generate exactly `max_tokens` (finish "length"), or, when unset, a seeded
/// random length up to `default_max_output` (finish "stop").
fn output_length(
    state: &PodState,
    requested: Option<usize>,
    prompt_len: usize,
) -> (usize, FinishReason) {
    let cfg = &state.cfg.engine;
    match requested {
        Some(n) => (n, FinishReason::Length),
        None => {
            let mut rng = state.rng.lock().unwrap_or_else(|e| e.into_inner());
            let n = rng.random_range(1..=cfg.default_max_output);
            (n.min(cfg.max_model_len - prompt_len), FinishReason::Stop)
        }
    }
}

pub fn resolve_model(state: &PodState, model: &str) -> Result<Option<LoraRef>, ApiError> {
    if model == state.cfg.engine.model {
        return Ok(None);
    }
    let loras = state.loras.lock().unwrap_or_else(|e| e.into_inner());
    loras
        .get(model)
        .map(Some)
        .ok_or_else(|| ApiError::ModelNotFound(model.to_owned()))
}

fn prompt_tokens(
    state: &PodState,
    api: Api,
    body: &InferenceRequest,
) -> Result<Vec<TokenId>, ApiError> {
    if api.is_chat() {
        let messages = body
            .messages
            .as_ref()
            .ok_or_else(|| ApiError::BadRequest("`messages` is required".into()))?;
        let turns: Vec<_> = messages.iter().map(|m| m.turn()).collect();
        let text = render_chat(&turns, body.add_generation_prompt.unwrap_or(true));
        return Ok(state.tokenizer.encode(&text));
    }
    let prompt = body
        .prompt
        .clone()
        .ok_or_else(|| ApiError::BadRequest("`prompt` is required".into()))?;
    match prompt.single()? {
        PromptInput::Text(text) => Ok(state.tokenizer.encode(&text)),
        PromptInput::Tokens(tokens) => Ok(tokens),
    }
}

async fn collect(
    state: &PodState,
    meta: ResponseMeta,
    mut rx: mpsc::UnboundedReceiver<SeqOutput>,
    remote_decode: bool,
) -> Result<Response<Body>, ApiError> {
    let mut tokens = Vec::new();
    while let Some(out) = rx.recv().await {
        match out {
            SeqOutput::Token(t) => tokens.push(t),
            SeqOutput::Last(t, usage) => {
                tokens.push(t);
                return finish(state, &meta, &tokens, &usage, remote_decode);
            }
            SeqOutput::Finished(usage) => {
                return finish(state, &meta, &tokens, &usage, remote_decode)
            }
            SeqOutput::Rejected => break,
        }
    }
    Err(ApiError::Unavailable(
        "the engine could not take the request",
    ))
}

fn finish(
    state: &PodState,
    meta: &ResponseMeta,
    tokens: &[TokenId],
    usage: &Usage,
    remote_decode: bool,
) -> Result<Response<Body>, ApiError> {
    let text = state.tokenizer.decode(tokens)?;
    let (id, created, model) = (&meta.id, meta.created, &meta.model);
    let mut body = apis::full(meta.api, id, created, model, &text, tokens, usage)
        .unwrap_or_else(|| meta.full(&text, usage));
    if let Some(cfg) = state
        .cfg
        .engine
        .kv_transfer
        .as_ref()
        .filter(|_| remote_decode)
    {
        // vLLM NixlConnector.request_finished: what the decode leg needs to pull the KV.
        body["kv_transfer_params"] = json!({
            "do_remote_prefill": true,
            "do_remote_decode": false,
            "remote_block_ids": usage.block_ids,
            "remote_engine_id": cfg.engine_id,
            "remote_request_id": meta.id,
            "remote_host": cfg.host,
            "remote_port": cfg.port,
            "tp_size": 1,
        });
    }
    Ok(json_response(StatusCode::OK, &body))
}

/// Streams tokens as SSE: one `data:` event per token, the finish reason on
/// the last, then the usage chunk (if asked) and `data: [DONE]` together.
fn sse(
    state: &Arc<PodState>,
    meta: ResponseMeta,
    rx: mpsc::UnboundedReceiver<SeqOutput>,
    include_usage: bool,
) -> Response<Body> {
    let tokenizer = state.tokenizer;
    let init = (rx, true, false);
    let events = stream::unfold(init, move |(mut rx, first, done)| {
        let meta = meta.clone();
        async move {
            if done {
                return None;
            }
            let out = rx.recv().await;
            let event = |value: serde_json::Value| format!("data: {value}\n\n");
            let text = |t: TokenId| tokenizer.decode(&[t]).unwrap_or_default();
            let (chunk, done) = match out {
                Some(SeqOutput::Token(t)) => (event(meta.chunk(&text(t), None, first)), false),
                Some(SeqOutput::Last(t, usage)) => (
                    last_events(&meta, &text(t), &usage, first, include_usage),
                    true,
                ),
                Some(SeqOutput::Finished(usage)) => {
                    (last_events(&meta, "", &usage, first, include_usage), true)
                }
                Some(SeqOutput::Rejected) | None => {
                    let err = ApiError::Unavailable("the engine could not take the request");
                    (format!("{}data: [DONE]\n\n", event(err.body())), true)
                }
            };
            let frame: Result<Frame<Bytes>, std::convert::Infallible> =
                Ok(Frame::data(Bytes::from(chunk)));
            Some((frame, (rx, false, done)))
        }
    });
    let mut resp = Response::new(StreamBody::new(events).boxed());
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

fn last_events(
    meta: &ResponseMeta,
    text: &str,
    usage: &Usage,
    first: bool,
    include_usage: bool,
) -> String {
    let mut out = format!("data: {}\n\n", meta.chunk(text, Some(usage.reason), first));
    if include_usage {
        out.push_str(&format!("data: {}\n\n", meta.usage_chunk(usage)));
    }
    out.push_str("data: [DONE]\n\n");
    out
}

#[cfg(test)]
mod render_tests;

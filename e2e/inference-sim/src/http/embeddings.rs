//! `POST /v1/embeddings`: vLLM's embeddings API, as a pooling model answers it.
//!
//! `input` is a string, a list of strings, a token-id list or a list of those; every input is
//! tokenized (usage counts tokens, as vLLM does) and checked against the context length.
//! Simplified (honestly): the simulated pod is a generative model, so an embedding does not
//! enter the engine (no queue, no KV cache, no step time); the vector is a deterministic unit
//! vector derived from the input's token ids, 16 floats unless `dimensions` asks for another
//! size; `encoding_format: "base64"` is refused.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use serde::Deserialize;
use serde_json::json;
use tokio::time::Instant;

use super::inference::injected_failure;
use super::{json_response, read_body, Body, PodState, ReqBody};
use crate::openai::{ApiError, Prompt, PromptInput};
use crate::tokenizer::TokenId;

const DEFAULT_DIMENSIONS: usize = 16;
const MAX_DIMENSIONS: usize = 8192;

#[derive(Debug, Deserialize)]
struct EmbeddingsRequest {
    model: Option<String>,
    input: Option<Prompt>,
    encoding_format: Option<String>,
    dimensions: Option<usize>,
}

/// `POST /v1/embeddings`.
pub async fn serve(
    state: &Arc<PodState>,
    req: Request<ReqBody>,
) -> Result<Response<Body>, ApiError> {
    injected_failure(state, &state.faults.current(), &req)?;
    let body: EmbeddingsRequest = serde_json::from_slice(&read_body(req).await?)?;
    let cfg = &state.cfg.engine;
    let model = body.model.unwrap_or_else(|| cfg.model.clone());
    super::inference::resolve_model(state, &model)?;
    let input = body
        .input
        .ok_or_else(|| ApiError::BadRequest("`input` is required".into()))?;
    if body
        .encoding_format
        .as_deref()
        .is_some_and(|f| f != "float")
    {
        return Err(ApiError::BadRequest(
            "inference-sim answers encoding_format \"float\" only".into(),
        ));
    }
    let dimensions = body.dimensions.unwrap_or(DEFAULT_DIMENSIONS);
    if !(1..=MAX_DIMENSIONS).contains(&dimensions) {
        return Err(ApiError::BadRequest(format!(
            "dimensions must be in 1..={MAX_DIMENSIONS}, got {dimensions}"
        )));
    }
    let inputs: Vec<Vec<TokenId>> = inputs(input)
        .into_iter()
        .map(|i| match i {
            PromptInput::Text(text) => state.tokenizer.encode(&text),
            PromptInput::Tokens(tokens) => tokens,
        })
        .collect();
    let mut data = Vec::with_capacity(inputs.len());
    let mut prompt_tokens = 0;
    for (index, tokens) in inputs.iter().enumerate() {
        if tokens.is_empty() {
            return Err(ApiError::BadRequest("an input cannot be empty".into()));
        }
        if tokens.len() > cfg.max_model_len {
            return Err(ApiError::BadRequest(format!(
                "This model's maximum context length is {} tokens. However, you requested {} \
                 tokens in the input for embedding generation. Please reduce the length of the input.",
                cfg.max_model_len,
                tokens.len()
            )));
        }
        prompt_tokens += tokens.len();
        data.push(json!({"object": "embedding", "index": index,
            "embedding": embedding(tokens, dimensions)}));
    }
    let n = state.next_id.fetch_add(1, Ordering::Relaxed);
    let created = state.clock.unix(Instant::now()) as u64;
    let body = json!({"id": format!("embd-{}-{n}", state.cfg.pod_name), "object": "list",
        "created": created, "model": model, "data": data,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens,
            "completion_tokens": 0, "prompt_tokens_details": null}});
    Ok(json_response(StatusCode::OK, &body))
}

/// Every input of a (possibly batched) `input`.
fn inputs(input: Prompt) -> Vec<PromptInput> {
    match input {
        Prompt::Text(t) => vec![PromptInput::Text(t)],
        Prompt::Tokens(t) => vec![PromptInput::Tokens(t)],
        Prompt::Texts(v) => v.into_iter().map(PromptInput::Text).collect(),
        Prompt::TokenLists(v) => v.into_iter().map(PromptInput::Tokens).collect(),
    }
}

/// A unit vector that depends on every token id and its position (splitmix64 of a running
/// hash), so equal inputs embed equally and different ones differently.
fn embedding(tokens: &[TokenId], dimensions: usize) -> Vec<f64> {
    let mut h: u64 = 0x9e37_79b9_7f4a_7c15;
    for &t in tokens {
        h = splitmix(h ^ u64::from(t));
    }
    let raw: Vec<f64> = (0..dimensions)
        .map(|i| {
            let x = splitmix(h.wrapping_add(i as u64));
            (x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect();
    let norm = raw
        .iter()
        .map(|x| x * x)
        .sum::<f64>()
        .sqrt()
        .max(f64::MIN_POSITIVE);
    raw.into_iter().map(|x| x / norm).collect()
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embeddings_are_deterministic_unit_vectors_of_the_asked_size() {
        let a = embedding(&[1, 2, 3], 16);
        assert_eq!(a.len(), 16);
        let norm: f64 = a.iter().map(|x| x * x).sum();
        assert!((norm - 1.0).abs() < 1e-9, "{norm}");
        assert_eq!(a, embedding(&[1, 2, 3], 16));
        assert_ne!(a, embedding(&[1, 2, 4], 16));
        assert_eq!(embedding(&[7], 3).len(), 3);
    }
}

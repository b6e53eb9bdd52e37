//! llm-d's `token-producer` with its `vllm` backend: the prompt's token ids come from the model
//! server's own renderer (`POST /v1/completions/render`, `POST /v1/chat/completions/render`,
//! vLLM's GPU-less render endpoints, `vllm launch render <model>`), so the precise prefix index
//! hashes exactly the tokens the pods hash, for any model, including one whose tokenizer epp does
//! not embed.
//!
//! As llm-d-router v0.10 (`dataproducer/tokenizer/vllm_http.go`): the request body is forwarded
//! with `model` set to the configured `modelName` (the render server knows the base model
//! only); completions answer an array with one `{token_ids}` per prompt (the first is used),
//! chat answers one `{token_ids}`. Only completions and chat are rendered; token-in requests
//! carry their ids, and the other APIs keep epp's in-process tokenizer.
//!
//! This module is the protocol (parameters, what is sent, what is read); `crate::extproc::render`
//! makes the call, once per request, after the body is complete and before the decision (the
//! stream parks the decision meanwhile); a failure (refused, timed out, a bad answer) leaves the
//! prompt to epp's in-process tokenizer, and is counted and logged.

use super::ApiKind;
use crate::plugin::Invalid;
use std::time::Duration;

/// Upstream's defaults.
const DEFAULT_URL: &str = "http://localhost:8000";
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
const COMPLETIONS_PATH: &str = "/v1/completions/render";
const CHAT_PATH: &str = "/v1/chat/completions/render";

/// `token-producer` parameters (llm-d v0.10). The backend is `vllm` when `vllm` or
/// `modelName` is set, else upstream's `estimate`, which epp's in-process tokenizer replaces.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct TokenProducerParams {
    pub(crate) model_name: Option<String>,
    pub(crate) vllm: Option<VllmParams>,
    /// The `estimate` backend's image and video settings: accepted, unused (epp tokenizes).
    pub(crate) estimate: Option<serde_norway::Value>,
    /// The deprecated gRPC-over-UDS tokenizer sidecar.
    pub(crate) uds_tokenizer_config: Option<serde_norway::Value>,
}

/// `token-producer` `vllm` block.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct VllmParams {
    pub(crate) url: Option<String>,
    /// Go duration (`5s`, `500ms`).
    pub(crate) timeout: Option<String>,
    /// Multimodal requests' timeout: accepted; epp renders text prompts only.
    pub mm_timeout: Option<String>,
}

/// The render backend a `token-producer` configures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderParams {
    /// Base URL, no trailing slash.
    pub(crate) url: String,
    pub(crate) model_name: String,
    pub(crate) timeout: Duration,
}

impl TokenProducerParams {
    /// The render backend, `None` for upstream's `estimate` backend; every problem named.
    pub(crate) fn render(&self) -> Result<Option<RenderParams>, Invalid> {
        if self.uds_tokenizer_config.is_some() {
            return Err(Invalid::new("udsTokenizerConfig", "udsTokenizerConfig (the deprecated gRPC-over-UDS tokenizer sidecar) is not supported by epp: use vllm.url (a vLLM render endpoint), or no backend for epp's in-process tokenizer"));
        }
        if self.vllm.is_none() && self.model_name.is_none() {
            return Ok(None);
        }
        let model_name = self
            .model_name
            .clone()
            .filter(|m| !m.is_empty())
            .ok_or_else(|| {
                Invalid::new("modelName", "modelName is required with the vllm backend")
            })?;
        let vllm = self.vllm.clone().unwrap_or_default();
        let url = vllm
            .url
            .as_deref()
            .unwrap_or(DEFAULT_URL)
            .trim_end_matches('/');
        let uri: http::Uri = url
            .parse()
            .map_err(|e| Invalid::new("vllm.url", format!("vllm.url {url:?} is not a URL: {e}")))?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err(Invalid::new("vllm.url", format!(
                "vllm.url {url:?} must be an http:// URL with a host (TLS is not supported, as upstream)"
            )));
        }
        let timeout = match vllm.timeout.as_deref() {
            None | Some("") => DEFAULT_TIMEOUT,
            Some(t) => crate::duration::parse(t)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    Invalid::new(
                        "vllm.timeout",
                        format!("vllm.timeout {t:?} is not a positive duration (e.g. 5s, 500ms)"),
                    )
                })?,
        };
        if let Some(t) = vllm.mm_timeout.as_deref().filter(|t| !t.is_empty()) {
            crate::duration::parse(t)
                .map_err(|e| Invalid::new("vllm.mmTimeout", format!("vllm.mmTimeout: {e}")))?;
        }
        Ok(Some(RenderParams {
            url: url.to_owned(),
            model_name,
            timeout,
        }))
    }
}

/// Why a render call gave no token ids.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RenderError {
    #[error("the request body is not a JSON object")]
    NotObject,
    #[error("render call failed: {0}")]
    Call(String),
    #[error("render call timed out after {0:?}")]
    Timeout(Duration),
    #[error("render answered HTTP {status}: {snippet}")]
    Status { status: u16, snippet: String },
    #[error("render answer has no token_ids: {0}")]
    Answer(String),
}

impl RenderError {
    /// The metric label of the failure.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Timeout(_) => "timeout",
            Self::Status { .. } => "status",
            Self::NotObject | Self::Answer(_) => "answer",
            Self::Call(_) => "call",
        }
    }
}

impl RenderParams {
    /// Whether a request of `api` is rendered (its body read whole before the decision).
    pub(crate) fn renders(api: ApiKind) -> bool {
        matches!(api, ApiKind::Completions | ApiKind::ChatCompletions)
    }

    /// The URL a request of `api` is rendered at.
    pub(crate) fn url_for(&self, api: ApiKind) -> String {
        let path = match api {
            ApiKind::ChatCompletions => CHAT_PATH,
            _ => COMPLETIONS_PATH,
        };
        format!("{}{path}", self.url)
    }

    /// What is sent for `body`: the body with the configured model stamped in.
    pub(crate) fn payload(&self, body: &[u8]) -> Result<Vec<u8>, RenderError> {
        stamp_model(body, &self.model_name)
    }
}

/// The body with its `model` replaced by `model` (every other field forwarded as sent).
fn stamp_model(body: &[u8], model: &str) -> Result<Vec<u8>, RenderError> {
    let mut map: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(body).map_err(|_| RenderError::NotObject)?;
    map.insert("model".into(), serde_json::Value::String(model.to_owned()));
    serde_json::to_vec(&map).map_err(|e| RenderError::Call(e.to_string()))
}

#[derive(serde::Deserialize)]
struct Rendered {
    token_ids: Vec<u32>,
}

/// The ids of a render answer: completions answer one object per prompt (the first is the
/// request's), chat one object.
pub(crate) fn token_ids(api: ApiKind, bytes: &[u8]) -> Result<Vec<u32>, RenderError> {
    let bad = |e: serde_json::Error| RenderError::Answer(e.to_string());
    match api {
        ApiKind::ChatCompletions => Ok(serde_json::from_slice::<Rendered>(bytes)
            .map_err(bad)?
            .token_ids),
        _ => serde_json::from_slice::<Vec<Rendered>>(bytes)
            .map_err(bad)?
            .into_iter()
            .next()
            .map(|r| r.token_ids)
            .ok_or_else(|| RenderError::Answer("an empty array".into())),
    }
}

#[cfg(test)]
mod tests;

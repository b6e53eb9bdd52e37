//! The render call of llm-d's `token-producer` (`vllm` backend, [`crate::request::render`]):
//! one pooled HTTP/1 client for every stream, one call per request, bounded by the configured
//! timeout.

use crate::request::render::{token_ids, RenderError, RenderParams};
use crate::request::ApiKind;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::time::Duration;

/// The largest render answer read (token ids of a very long prompt as JSON).
const MAX_ANSWER_BYTES: usize = 64 << 20;
/// Bytes of an error answer quoted in the error.
const ERROR_SNIPPET: usize = 256;
/// A connection not made by then has failed (the call's own timeout may be shorter).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The client every stream's render calls share (connections pooled per render server).
#[derive(Clone)]
pub(crate) struct RenderClient {
    client: Client<HttpConnector, Full<Bytes>>,
    /// Failures are logged at most once a second (with the count held back): a render server
    /// that is down must not turn every request into a log line.
    log: Arc<crate::telemetry::LogLimit>,
}

impl std::fmt::Debug for RenderClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RenderClient").finish_non_exhaustive()
    }
}

impl Default for RenderClient {
    fn default() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(16)
            .build(connector);
        Self {
            client,
            log: Arc::new(crate::telemetry::LogLimit::new(Duration::from_secs(1))),
        }
    }
}

impl RenderClient {
    /// Logs a failed render call, at most once a second.
    pub(crate) fn log_failure(&self, e: &RenderError) {
        if let Some(held_back) = self.log.allow() {
            tracing::warn!(error = %e, kind = e.kind(), held_back, "token-producer: render failed; the prompt is tokenized in-process");
        }
    }

    /// The token ids of the prompt of `body`, a request of `api`.
    #[cfg(test)]
    pub(crate) async fn render(
        &self,
        params: &RenderParams,
        api: ApiKind,
        body: &[u8],
    ) -> Result<Vec<u32>, RenderError> {
        self.send(params, api, params.payload(body)?).await
    }

    /// Sends a [`RenderParams::payload`]; the token ids answered.
    pub(crate) async fn send(
        &self,
        params: &RenderParams,
        api: ApiKind,
        payload: Vec<u8>,
    ) -> Result<Vec<u32>, RenderError> {
        let request = http::Request::post(params.url_for(api))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(payload)))
            .map_err(|e| RenderError::Call(e.to_string()))?;
        let call = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| RenderError::Call(e.to_string()))?;
            let status = response.status();
            let bytes = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| RenderError::Call(e.to_string()))?
                .to_bytes();
            Ok::<_, RenderError>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(params.timeout, call)
            .await
            .map_err(|_| RenderError::Timeout(params.timeout))??;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes);
            let snippet: String = text.chars().take(ERROR_SNIPPET).collect();
            return Err(RenderError::Status {
                status: status.as_u16(),
                snippet,
            });
        }
        token_ids(api, &bytes)
    }
}

/// One render call a parked decision waits for (the stream hands it to its driver).
pub(crate) struct RenderJob {
    pub(crate) client: RenderClient,
    pub(crate) params: Arc<RenderParams>,
    pub(crate) api: ApiKind,
    pub(crate) payload: Result<Vec<u8>, RenderError>,
}

impl RenderJob {
    pub(crate) async fn run(self) -> Result<Vec<u32>, RenderError> {
        self.client
            .send(&self.params, self.api, self.payload?)
            .await
    }
}

/// A render server for tests (real HTTP on loopback).
#[cfg(test)]
pub(crate) mod testing {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper::server::conn::http1;
    use hyper_util::rt::TokioIo;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// What the server saw: (path, body).
    pub(crate) type Seen = Arc<Mutex<Vec<(String, serde_json::Value)>>>;

    /// A loopback server answering every request with `answer(path, body)` after `delay`.
    #[allow(clippy::disallowed_methods)] // the test's own HTTP server
    pub(crate) async fn server(
        answer: fn(&str, &serde_json::Value) -> (u16, String),
        delay: Duration,
    ) -> (String, Seen) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Seen = Arc::default();
        let log = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let log = Arc::clone(&log);
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(
                        move |req: http::Request<hyper::body::Incoming>| {
                            let log = Arc::clone(&log);
                            async move {
                                let path = req.uri().path().to_owned();
                                let body = req.into_body().collect().await?.to_bytes();
                                let json: serde_json::Value = serde_json::from_slice(&body)
                                    .unwrap_or(serde_json::Value::Null);
                                log.lock().unwrap().push((path.clone(), json.clone()));
                                tokio::time::sleep(delay).await;
                                let (status, text) = answer(&path, &json);
                                Ok::<_, hyper::Error>(
                                    http::Response::builder()
                                        .status(status)
                                        .body(Full::new(Bytes::from(text)))
                                        .unwrap(),
                                )
                            }
                        },
                    );
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        (format!("http://{addr}"), seen)
    }
}

#[cfg(test)]
mod tests;

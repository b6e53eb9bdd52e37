//! A minimal HTTP/1.1 client for tests: one connection per request, the whole body collected,
//! or every body chunk kept with its arrival time (to check that streaming is not buffered).
//!
//! Built on `hyper::client::conn::http1` so that no background task is needed: the connection
//! future is driven alongside the request in the caller's task.

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, HOST};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Why a request failed before a full response arrived.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The TCP connection could not be opened.
    #[error("connecting to {addr}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The request could not be built (bad header name or value).
    #[error("building the request")]
    Build(#[from] http::Error),
    /// HTTP-level failure while sending or receiving.
    #[error("HTTP exchange with {addr}")]
    Http {
        addr: SocketAddr,
        #[source]
        source: hyper::Error,
    },
    /// The response body was not the JSON the caller asked for.
    #[error("response body is not JSON")]
    Json(#[from] serde_json::Error),
}

/// A complete response.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl HttpResponse {
    /// The value of a header, if present and valid UTF-8.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The body as (lossy) UTF-8 text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON.
    pub fn json(&self) -> Result<serde_json::Value, ClientError> {
        Ok(serde_json::from_slice(&self.body)?)
    }
}

/// One body chunk and when it arrived, measured from the moment the request was sent.
#[derive(Debug, Clone)]
pub struct TimedChunk {
    pub at: Duration,
    pub data: Bytes,
}

/// A response whose body chunks were kept apart, each with its arrival time.
#[derive(Debug, Clone)]
pub struct StreamedResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub chunks: Vec<TimedChunk>,
}

impl StreamedResponse {
    /// All chunks joined.
    pub fn body(&self) -> Bytes {
        let mut all = BytesMut::new();
        for chunk in &self.chunks {
            all.extend_from_slice(&chunk.data);
        }
        all.freeze()
    }
}

/// Builds a request with a `host` header (HTTP/1.1 requires one) and, for a non-empty body,
/// `content-type: application/json`.
pub fn request(
    method: Method,
    path: &str,
    body: impl Into<Bytes>,
) -> Result<Request<Full<Bytes>>, ClientError> {
    let body = body.into();
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header(HOST, "localhost");
    if !body.is_empty() {
        builder = builder.header(CONTENT_TYPE, "application/json");
    }
    Ok(builder.body(Full::new(body))?)
}

/// Adds a header to a request built by [`request`].
pub fn with_header(
    mut req: Request<Full<Bytes>>,
    name: &'static str,
    value: &str,
) -> Result<Request<Full<Bytes>>, ClientError> {
    let value = HeaderValue::from_str(value).map_err(http::Error::from)?;
    req.headers_mut()
        .insert(HeaderName::from_static(name), value);
    Ok(req)
}

/// `GET path` and collect the body.
pub async fn get(addr: SocketAddr, path: &str) -> Result<HttpResponse, ClientError> {
    send(addr, request(Method::GET, path, Bytes::new())?).await
}

/// `POST path` with a JSON body and collect the response body.
pub async fn post_json(
    addr: SocketAddr,
    path: &str,
    body: impl Into<Bytes>,
) -> Result<HttpResponse, ClientError> {
    send(addr, request(Method::POST, path, body)?).await
}

/// Sends `req` on a new connection and collects the whole response.
pub async fn send(
    addr: SocketAddr,
    req: Request<Full<Bytes>>,
) -> Result<HttpResponse, ClientError> {
    exchange(addr, req, |response| async move {
        let (parts, body) = response.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok(HttpResponse {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    })
    .await
}

/// Sends `req` on a new connection and keeps every body chunk with its arrival time.
pub async fn send_streaming(
    addr: SocketAddr,
    req: Request<Full<Bytes>>,
) -> Result<StreamedResponse, ClientError> {
    let start = Instant::now();
    exchange(addr, req, move |response| async move {
        let (parts, mut body) = response.into_parts();
        let mut chunks = Vec::new();
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame?.into_data() {
                chunks.push(TimedChunk {
                    at: start.elapsed(),
                    data,
                });
            }
        }
        Ok(StreamedResponse {
            status: parts.status,
            headers: parts.headers,
            chunks,
        })
    })
    .await
}

/// Opens a connection, sends `req` and runs `read` on the response while driving the connection.
async fn exchange<T, F, Fut>(
    addr: SocketAddr,
    req: Request<Full<Bytes>>,
    read: F,
) -> Result<T, ClientError>
where
    F: FnOnce(hyper::Response<Incoming>) -> Fut,
    Fut: Future<Output = Result<T, hyper::Error>>,
{
    let http_err = |source| ClientError::Http { addr, source };
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|source| ClientError::Connect { addr, source })?;
    stream
        .set_nodelay(true)
        .map_err(|source| ClientError::Connect { addr, source })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(http_err)?;
    let work = async move { read(sender.send_request(req).await?).await };
    let mut work = std::pin::pin!(work);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        biased;
        result = &mut work => return result.map_err(http_err),
        // The connection closed first: whatever arrived is queued for `work` to read.
        closed = &mut conn => closed.map_err(http_err)?,
    }
    work.await.map_err(http_err)
}

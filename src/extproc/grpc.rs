//! The `Process` method's gRPC framing, done here instead of by tonic's generated server.
//!
//! Why: tonic's decoder copies every incoming message into one buffer per stream, reserved to
//! the message's length and kept for the stream's life. An ext_proc stream lives as long as its
//! HTTP request, model time included, so each in-flight request with a 400 KB body (100K
//! tokens, which Envoy sends as one message) held 400 KB there long after epp had routed it:
//! the largest item of epp's heap under 100K-token load once the poller's buffers were gone
//! (heaptrack, BENCHMARKS.md "Peak RSS: the poller's connections, tonic's buffer, the allocator's delay").
//! Here a message is read from the HTTP/2 frames as they come, decoded, and its bytes dropped;
//! a message within one frame is not even copied.
//!
//! What is kept of gRPC: 5-byte message prefixes (compressed flag, big-endian length), the
//! receive and send size limits (`--grpc-max-recv-msg-size`, `--grpc-max-send-msg-size`,
//! refused as tonic refuses them: OUT_OF_RANGE), `grpc-status` in trailers, UNIMPLEMENTED for
//! any other method or a compressed message (Envoy compresses nothing on this stream).
//! The transport (HTTP/2, TLS, the listener) is still tonic's.

use super::ExtProc;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::service::ext_proc::v3::ProcessingRequest;
use http_body_util::BodyExt;
use hyper::body::Frame;
use prost::Message;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::body::Body;
use tonic::Status;

/// The one method served.
pub(crate) const PROCESS_PATH: &str = "/envoy.service.ext_proc.v3.ExternalProcessor/Process";
/// tonic's defaults, kept.
const DEFAULT_MAX_SEND: usize = usize::MAX;
const PREFIX: usize = 5;

/// The ext_proc gRPC service, as tonic's router serves it.
#[derive(Clone)]
pub(crate) struct ExtProcServer {
    ext: Arc<ExtProc>,
    max_recv: usize,
    max_send: usize,
}

impl ExtProcServer {
    pub(super) fn new(ext: ExtProc, max_recv: usize) -> Self {
        Self {
            ext: Arc::new(ext),
            max_recv,
            max_send: DEFAULT_MAX_SEND,
        }
    }

    /// The largest message accepted (`--grpc-max-recv-msg-size`).
    pub(crate) fn max_decoding_message_size(mut self, n: usize) -> Self {
        self.max_recv = n;
        self
    }

    /// The largest message sent (`--grpc-max-send-msg-size`).
    pub(crate) fn max_encoding_message_size(mut self, n: usize) -> Self {
        self.max_send = n;
        self
    }
}

impl tonic::server::NamedService for ExtProcServer {
    const NAME: &'static str = super::SERVICE_NAME;
}

impl tonic::codegen::Service<http::Request<Body>> for ExtProcServer {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let refused = if req.uri().path() != PROCESS_PATH {
            Some(Status::unimplemented(format!(
                "{} is not served",
                req.uri().path()
            )))
        } else {
            compressed(req.headers())
        };
        if let Some(status) = refused {
            return Box::pin(async move { Ok(status.into_http()) });
        }
        let inbound = Inbound::new(req.into_body(), self.max_recv);
        let driver = self.ext.driver(inbound);
        let max_send = self.max_send;
        let frames = futures::stream::unfold(Some(driver), move |state| async move {
            let mut driver = state?;
            match driver.next().await {
                Some(msg) => match encode(&msg, max_send) {
                    Ok(data) => Some((Ok::<_, Status>(Frame::data(data)), Some(driver))),
                    Err(status) => Some((Ok(Frame::trailers(trailers(&status))), None)),
                },
                None => Some((Ok(Frame::trailers(trailers(&Status::ok("")))), None)),
            }
        });
        let body = Body::new(http_body_util::StreamBody::new(frames));
        let mut resp = http::Response::new(body);
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/grpc"),
        );
        Box::pin(async move { Ok(resp) })
    }
}

/// A compressed stream is refused: Envoy sends none, and nothing here decompresses.
fn compressed(headers: &http::HeaderMap) -> Option<Status> {
    let encoding = headers.get("grpc-encoding")?.to_str().unwrap_or("?");
    (encoding != "identity")
        .then(|| Status::unimplemented(format!("grpc-encoding {encoding:?} is not supported")))
}

fn trailers(status: &Status) -> http::HeaderMap {
    let mut map = http::HeaderMap::new();
    // Only a status whose message cannot be a header value fails here; its code still goes.
    if status.add_header(&mut map).is_err() {
        map.insert(
            Status::GRPC_STATUS,
            http::HeaderValue::from(status.code() as i32),
        );
    }
    map
}

/// One message, prefixed.
fn encode(msg: &impl Message, max: usize) -> Result<Bytes, Status> {
    let len = msg.encoded_len();
    if len > max {
        return Err(Status::out_of_range(format!(
            "Error, encoded message length too large: found {len} bytes, the limit is: {max} bytes"
        )));
    }
    let mut buf = BytesMut::with_capacity(PREFIX + len);
    buf.put_u8(0);
    buf.put_u32(u32::try_from(len).map_err(|_| Status::out_of_range("message over 4 GiB"))?);
    msg.encode(&mut buf)
        .map_err(|e| Status::internal(format!("encoding: {e}")))?;
    Ok(buf.freeze())
}

/// The incoming messages of one stream, read from its HTTP/2 data frames.
pub(crate) struct Inbound {
    body: Body,
    /// Data frames not yet decoded, oldest first.
    chunks: VecDeque<Bytes>,
    buffered: usize,
    max: usize,
    ended: bool,
}

impl Inbound {
    pub(crate) fn new(body: Body, max: usize) -> Self {
        Self {
            body,
            chunks: VecDeque::new(),
            buffered: 0,
            max,
            ended: false,
        }
    }

    /// The next message; `None` at the stream's clean end.
    pub(crate) async fn message(&mut self) -> Result<Option<ProcessingRequest>, Status> {
        loop {
            if let Some(bytes) = self.take_message()? {
                return ProcessingRequest::decode(bytes)
                    .map(Some)
                    .map_err(|e| Status::internal(format!("decoding ProcessingRequest: {e}")));
            }
            if self.ended {
                return match self.buffered {
                    0 => Ok(None),
                    n => Err(Status::internal(format!(
                        "the stream ended inside a message ({n} bytes left)"
                    ))),
                };
            }
            match self.body.frame().await {
                None => self.ended = true,
                Some(Err(status)) => return Err(status),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        if !data.is_empty() {
                            self.buffered += data.len();
                            self.chunks.push_back(data);
                        }
                    }
                }
            }
        }
    }

    /// The bytes of the next message once all of it is buffered.
    fn take_message(&mut self) -> Result<Option<Bytes>, Status> {
        if self.buffered < PREFIX {
            return Ok(None);
        }
        let mut prefix = [0u8; PREFIX];
        self.peek(&mut prefix);
        let [flag, len @ ..] = prefix;
        if flag != 0 {
            return Err(Status::unimplemented(
                "compressed messages are not supported",
            ));
        }
        let len = u32::from_be_bytes(len) as usize;
        if len > self.max {
            return Err(Status::out_of_range(format!(
                "Error, decoded message length too large: found {len} bytes, the limit is: {} bytes",
                self.max
            )));
        }
        if self.buffered < PREFIX + len {
            return Ok(None);
        }
        self.advance(PREFIX);
        Ok(Some(self.take(len)))
    }

    fn peek(&self, out: &mut [u8]) {
        let mut filled = 0;
        for chunk in &self.chunks {
            let n = chunk.len().min(out.len() - filled);
            out[filled..filled + n].copy_from_slice(&chunk[..n]);
            filled += n;
            if filled == out.len() {
                return;
            }
        }
    }

    fn advance(&mut self, mut n: usize) {
        self.buffered -= n;
        while n > 0 {
            let Some(front) = self.chunks.front_mut() else {
                return;
            };
            if front.len() > n {
                front.advance(n);
                return;
            }
            n -= front.len();
            self.chunks.pop_front();
        }
    }

    /// `n` buffered bytes: a slice of one frame when it holds them all, else one copy.
    fn take(&mut self, n: usize) -> Bytes {
        if let Some(front) = self.chunks.front_mut() {
            if front.len() >= n {
                let out = front.split_to(n);
                if front.is_empty() {
                    self.chunks.pop_front();
                }
                self.buffered -= n;
                return out;
            }
        }
        let mut out = BytesMut::with_capacity(n);
        while out.len() < n {
            let Some(front) = self.chunks.front_mut() else {
                break;
            };
            let k = front.len().min(n - out.len());
            out.extend_from_slice(&front[..k]);
            front.advance(k);
            if front.is_empty() {
                self.chunks.pop_front();
            }
        }
        self.buffered -= out.len();
        out.freeze()
    }
}

#[cfg(test)]
mod tests;

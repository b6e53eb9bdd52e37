//! The do-nothing ext_proc server: the floor that epp's cost is compared against.
//!
//! It follows the same message pattern as an endpoint picker (defer the request headers answer
//! until the body is in, route with the `x-gateway-destination-endpoint` header plus `envoy.lb`
//! metadata, stream the body back, echo the response) but "picks" by plain round robin over a
//! fixed list. Per stream it allocates only the buffered request body; there is no task and no
//! channel: the response stream is the request stream mapped through a small state machine.

mod messages;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Msg;
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use futures::{Stream, StreamExt};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

use crate::server::ServerHandle;
use messages::Route;

/// Upper bound of one streamed body message, as upstream's EPP uses.
pub const MAX_BODY_CHUNK: usize = 62_000;

/// The response stream of one ext_proc call.
pub type ProcessStream = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

/// Round-robin "picker" over a fixed list of `ip:port` endpoints.
#[derive(Debug, Clone)]
pub struct NoopExtProc {
    routes: Arc<[Route]>,
    next: Arc<AtomicUsize>,
}

impl NoopExtProc {
    /// `endpoints` are `ip:port` strings; with none, every request gets an ImmediateResponse 503.
    pub fn new(endpoints: impl IntoIterator<Item = String>) -> Self {
        Self {
            routes: endpoints.into_iter().map(|ep| Route::new(&ep)).collect(),
            next: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn pick(&self) -> Option<&Route> {
        if self.routes.is_empty() {
            return None;
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        self.routes.get(n % self.routes.len())
    }

    /// Serves on `listener` (plaintext HTTP/2, or TLS with `tls`) until `shutdown` completes.
    pub async fn serve(
        self,
        listener: TcpListener,
        tls: Option<Identity>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), tonic::transport::Error> {
        let mut builder = Server::builder();
        if let Some(identity) = tls {
            builder = builder.tls_config(ServerTlsConfig::new().identity(identity))?;
        }
        builder
            .add_service(ExternalProcessorServer::new(self))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
            .await
    }

    /// Runs [`serve`](Self::serve) in the background; stops when the handle is dropped.
    pub fn start(
        self,
        listener: TcpListener,
        tls: Option<Identity>,
    ) -> std::io::Result<ServerHandle> {
        let addr = listener.local_addr()?;
        Ok(ServerHandle::spawn(
            addr,
            move |_tracker, cancel| async move {
                if let Err(err) = self.serve(listener, tls, cancel.cancelled_owned()).await {
                    tracing::error!(%err, "noop ext_proc server failed");
                }
            },
        ))
    }
}

/// A self-signed certificate for `localhost` and `127.0.0.1` (Envoy's TLS context accepts any).
pub fn self_signed_identity() -> Result<Identity, rcgen::Error> {
    let cert =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])?;
    Ok(Identity::from_pem(
        cert.cert.pem(),
        cert.signing_key.serialize_pem(),
    ))
}

#[tonic::async_trait]
impl ExternalProcessor for NoopExtProc {
    type ProcessStream = ProcessStream;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let mut state = StreamState::new(self.clone());
        let responses = request
            .into_inner()
            // An error is how Envoy ends every stream (RST_STREAM after the last message).
            .take_while(|msg| std::future::ready(msg.is_ok()))
            .flat_map(move |msg| {
                let out = msg.map(|m| state.on_message(m)).unwrap_or_default();
                futures::stream::iter(out.into_iter().map(Ok))
            });
        Ok(Response::new(Box::pin(responses)))
    }
}

/// Where one HTTP request is in the exchange.
#[derive(Debug)]
struct StreamState {
    picker: NoopExtProc,
    request_duplex: bool,
    response_duplex: bool,
    routed: bool,
    body: Vec<u8>,
}

impl StreamState {
    fn new(picker: NoopExtProc) -> Self {
        Self {
            picker,
            request_duplex: true,
            response_duplex: true,
            routed: false,
            body: Vec::new(),
        }
    }

    fn on_message(&mut self, msg: ProcessingRequest) -> Vec<ProcessingResponse> {
        if let Some(cfg) = &msg.protocol_config {
            let duplex = BodySendMode::FullDuplexStreamed as i32;
            self.request_duplex = cfg.request_body_mode == duplex;
            self.response_duplex = cfg.response_body_mode == duplex;
        }
        match msg.request {
            Some(Msg::RequestHeaders(h)) if h.end_of_stream => self.route_headers(),
            Some(Msg::RequestHeaders(_)) if self.request_duplex => Vec::new(),
            Some(Msg::RequestHeaders(_)) => vec![messages::continue_request_headers()],
            Some(Msg::RequestBody(b)) => self.on_request_body(b.body, b.end_of_stream),
            Some(Msg::RequestTrailers(_)) => self.on_request_trailers(),
            Some(Msg::ResponseHeaders(_)) => vec![messages::continue_response_headers()],
            Some(Msg::ResponseBody(b)) if self.response_duplex => {
                vec![messages::response_chunk(b.body, b.end_of_stream)]
            }
            Some(Msg::ResponseBody(_)) => vec![messages::continue_response_body()],
            Some(Msg::ResponseTrailers(_)) => vec![messages::response_trailers()],
            None => Vec::new(),
        }
    }

    fn on_request_body(&mut self, chunk: Vec<u8>, end_of_stream: bool) -> Vec<ProcessingResponse> {
        if self.routed {
            return Vec::new(); // a duplicate end-of-stream chunk (large duplex bodies)
        }
        if !self.request_duplex {
            return self.route_buffered();
        }
        if self.body.is_empty() {
            self.body = chunk;
        } else {
            self.body.extend_from_slice(&chunk);
        }
        if !end_of_stream {
            return Vec::new();
        }
        self.route_with_body(true)
    }

    fn on_request_trailers(&mut self) -> Vec<ProcessingResponse> {
        // With trailers, no body chunk carried end-of-stream: route now if that has not happened.
        let mut out = if self.request_duplex && !self.routed {
            self.route_with_body(false)
        } else {
            Vec::new()
        };
        out.push(messages::request_trailers());
        out
    }

    /// Duplex: the routing headers response, then the buffered body in bounded chunks.
    fn route_with_body(&mut self, end_of_stream: bool) -> Vec<ProcessingResponse> {
        self.routed = true;
        let Some(route) = self.picker.pick() else {
            return vec![messages::no_endpoints()];
        };
        let mut out = vec![route.headers_response()];
        messages::push_body_chunks(&mut out, std::mem::take(&mut self.body), end_of_stream);
        out
    }

    /// A request without body: the routing headers response at once.
    fn route_headers(&mut self) -> Vec<ProcessingResponse> {
        self.routed = true;
        match self.picker.pick() {
            Some(route) => vec![route.headers_response()],
            None => vec![messages::no_endpoints()],
        }
    }

    /// BUFFERED: the routing mutation rides on the body response.
    fn route_buffered(&mut self) -> Vec<ProcessingResponse> {
        self.routed = true;
        match self.picker.pick() {
            Some(route) => vec![route.buffered_body_response()],
            None => vec![messages::no_endpoints()],
        }
    }
}

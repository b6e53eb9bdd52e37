//! The receiving side: a gRPC server on `--speculative-peer-port` that takes only mutually
//! authenticated TLS connections and records the placements other replicas stream to it.
//!
//! The TLS handshake happens here, not inside tonic, so that a refused one is counted
//! (`unauthenticated`) and logged (at most once per [`super::LOG_EVERY`]). What reaches the
//! handler comes from a replica holding a certificate of the sharing CA; each message is still
//! decoded and checked by [`wire::decode_placement`] and a malformed one is refused (`rejected`),
//! never applied.

use super::wire::{self, BytesIn, ShareSummary, MAX_MESSAGE, REPLICA_HEADER, SHARE_PATH};
use super::{count, LogLimit, MAX_TTL};
use crate::datastore::Datastore;
use crate::metrics::{Metrics, PeerOutcome};
use crate::prefix::precise::PreciseIndex;
use bytes::Bytes;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::codegen::{http, Body, BoxFuture, Context, Poll, Service, StdError};
use tonic::server::{ClientStreamingService, NamedService};
use tonic::{Request, Response, Status, Streaming};

/// A handshake not finished by then is dropped (and counted as refused).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// The status message with which a replica refuses its own stream.
pub(crate) const OWN: &str = "own stream";

/// What a received placement is applied to, and how it is counted.
pub(crate) struct Receiver {
    pub(crate) datastore: Arc<Datastore>,
    pub(crate) index: Arc<PreciseIndex>,
    pub(crate) metrics: Arc<Metrics>,
    /// This replica's id: a stream that carries it comes from this replica itself.
    pub(crate) own: u64,
    pub(crate) log: LogLimit,
}

/// Serves `listener` until `shutdown`: mutual TLS with `tls`, then the `Share` method.
pub(crate) async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    receiver: Arc<Receiver>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
) {
    let refusing = Arc::clone(&receiver);
    let incoming = crate::handshake::incoming(
        listener,
        TlsAcceptor::from(tls),
        HANDSHAKE_TIMEOUT,
        move |peer, why| refusing.refuse(peer, why),
        &tracker,
        shutdown.clone(),
    );
    let served = tonic::transport::Server::builder()
        .add_service(ShareService(receiver))
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await;
    if let Err(e) = served {
        tracing::error!(error = %e, "the replica-sharing server failed");
    }
}

impl Receiver {
    /// A connection whose handshake failed: no certificate of the sharing CA, or no TLS at all.
    fn refuse(&self, peer: std::net::SocketAddr, error: &dyn std::fmt::Display) {
        count(&self.metrics, PeerOutcome::unauthenticated);
        if let Some(skipped) = self.log.allow() {
            tracing::warn!(%peer, %error, skipped, "refused a replica-sharing connection (mutual TLS)");
        }
    }

    /// One caller's stream: every message applied or refused, until the caller ends it.
    async fn share(
        self: Arc<Self>,
        req: Request<Streaming<Bytes>>,
    ) -> Result<Response<ShareSummary>, Status> {
        let sender = req
            .metadata()
            .get(REPLICA_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|s| u64::from_str_radix(s, 16).ok());
        match sender {
            None => {
                self.malformed(&"no x-epp-replica metadata");
                count(&self.metrics, PeerOutcome::rejected);
                return Err(Status::invalid_argument("x-epp-replica metadata required"));
            }
            Some(id) if id == self.own => {
                count(&self.metrics, PeerOutcome::own);
                return Err(Status::already_exists(OWN));
            }
            Some(_) => {}
        }
        let mut stream = req.into_inner();
        let mut summary = ShareSummary::default();
        loop {
            match stream.message().await {
                Ok(Some(msg)) => {
                    let outcome = self.apply(&msg);
                    count(&self.metrics, outcome);
                    match outcome {
                        PeerOutcome::applied => summary.applied += 1,
                        _ => summary.refused += 1,
                    }
                }
                Ok(None) => return Ok(Response::new(summary)),
                Err(status) => {
                    if refused_frame(&status) {
                        self.malformed(&status.message());
                        count(&self.metrics, PeerOutcome::rejected);
                    }
                    return Err(status);
                }
            }
        }
    }

    /// Records one message's placement if it is well formed and for an endpoint this replica
    /// knows, with its TTL capped at [`MAX_TTL`]; the caller counts the outcome.
    pub(crate) fn apply(&self, msg: &[u8]) -> PeerOutcome {
        match wire::decode_placement(msg) {
            Err(e) => {
                self.malformed(&e);
                PeerOutcome::rejected
            }
            Ok(p) if self.datastore.snapshot().get(&p.endpoint).is_none() => {
                PeerOutcome::unknown_endpoint
            }
            Ok(p) => {
                let ttl = p.ttl.min(MAX_TTL);
                self.index
                    .speculate(p.endpoint, &p.keys, Instant::now(), ttl);
                PeerOutcome::applied
            }
        }
    }

    /// Logs (rate-limited) a message refused as malformed; the caller counts it.
    fn malformed(&self, error: &dyn std::fmt::Display) {
        if let Some(skipped) = self.log.allow() {
            tracing::warn!(%error, skipped, "refused a malformed replica-sharing message");
        }
    }
}

/// Whether a stream error is the caller's bad framing (an oversized or mis-flagged message)
/// rather than the connection going away.
fn refused_frame(status: &Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
    ) || status.message().starts_with("protocol error")
}

/// The `ReplicaSharing` service, routed by hand: one method, `Share`.
#[derive(Clone)]
pub(crate) struct ShareService(pub Arc<Receiver>);

impl NamedService for ShareService {
    const NAME: &'static str = wire::SERVICE;
}

impl<B> Service<http::Request<B>> for ShareService
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != SHARE_PATH {
            let status = Status::unimplemented(format!("no method {}", req.uri().path()));
            return Box::pin(async move { Ok(status.into_http()) });
        }
        let handler = Share(Arc::clone(&self.0));
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(BytesIn::<ShareSummary>::default())
                .max_decoding_message_size(MAX_MESSAGE);
            Ok(grpc.client_streaming(handler, req).await)
        })
    }
}

struct Share(Arc<Receiver>);

impl ClientStreamingService<Bytes> for Share {
    type Response = ShareSummary;
    type Future = BoxFuture<Response<ShareSummary>, Status>;

    fn call(&mut self, req: Request<Streaming<Bytes>>) -> Self::Future {
        Box::pin(Arc::clone(&self.0).share(req))
    }
}

//! The noop ext_proc server driven by a gRPC client playing Envoy, for the message sequences
//! that are awkward to produce through a real Envoy (request trailers, no endpoints).

use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Msg;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    CommonResponse, HttpBody, HttpHeaders, HttpTrailers, ProcessingRequest, ProcessingResponse,
    ProtocolConfiguration,
};
use harness::noop_extproc::NoopExtProc;
use harness::server::ServerHandle;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

/// One ext_proc stream: send messages, read answers.
struct Envoyish {
    tx: mpsc::Sender<ProcessingRequest>,
    rx: Streaming<ProcessingResponse>,
    _server: ServerHandle,
}

impl Envoyish {
    async fn open(endpoints: &[&str], body_mode: BodySendMode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("test setup");
        let noop = NoopExtProc::new(endpoints.iter().map(|e| (*e).to_owned()));
        let server = noop.start(listener, None).expect("test setup");
        let url = format!("http://{}", server.addr());
        let mut client = ExternalProcessorClient::connect(url)
            .await
            .expect("test setup");
        let (tx, requests) = mpsc::channel(16);
        let config = ProtocolConfiguration {
            request_body_mode: body_mode as i32,
            response_body_mode: body_mode as i32,
            ..Default::default()
        };
        let first = ProcessingRequest {
            protocol_config: Some(config),
            ..message(Msg::RequestHeaders(HttpHeaders::default()))
        };
        tx.send(first).await.expect("test setup");
        let rx = client
            .process(ReceiverStream::new(requests))
            .await
            .expect("test setup")
            .into_inner();
        Self {
            tx,
            rx,
            _server: server,
        }
    }

    async fn send(&self, msg: Msg) {
        self.tx.send(message(msg)).await.expect("test setup");
    }

    async fn next(&mut self) -> Response {
        let msg = self
            .rx
            .message()
            .await
            .expect("test setup")
            .expect("an answer");
        msg.response.expect("a response")
    }
}

fn message(msg: Msg) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(msg),
        ..Default::default()
    }
}

fn body(data: &[u8], end_of_stream: bool) -> Msg {
    Msg::RequestBody(HttpBody {
        body: data.to_vec(),
        end_of_stream,
        ..Default::default()
    })
}

fn destination(common: &CommonResponse) -> String {
    let header = common
        .header_mutation
        .as_ref()
        .expect("test setup")
        .set_headers[0]
        .header
        .as_ref()
        .expect("test setup");
    String::from_utf8(header.raw_value.clone()).expect("test setup")
}

fn streamed(common: &CommonResponse) -> (Vec<u8>, bool) {
    match common
        .body_mutation
        .as_ref()
        .and_then(|m| m.mutation.as_ref())
    {
        Some(Mutation::StreamedResponse(s)) => (s.body.clone(), s.end_of_stream),
        other => panic!("expected a streamed body, got {other:?}"),
    }
}

#[tokio::test]
async fn duplex_request_with_trailers_is_routed_when_the_trailers_arrive() {
    let mut envoy = Envoyish::open(&["10.0.0.1:8000"], BodySendMode::FullDuplexStreamed).await;
    envoy.send(body(b"{\"model\":", false)).await;
    envoy.send(body(b"\"m\"}", false)).await;
    envoy
        .send(Msg::RequestTrailers(HttpTrailers::default()))
        .await;
    let Response::RequestHeaders(headers) = envoy.next().await else {
        panic!("headers first")
    };
    assert_eq!(
        destination(headers.response.as_ref().unwrap()),
        "10.0.0.1:8000"
    );
    let Response::RequestBody(chunk) = envoy.next().await else {
        panic!("then the body")
    };
    assert_eq!(
        streamed(chunk.response.as_ref().unwrap()),
        (b"{\"model\":\"m\"}".to_vec(), false)
    );
    assert!(matches!(envoy.next().await, Response::RequestTrailers(_)));
}

#[tokio::test]
async fn duplex_response_chunks_are_echoed_as_they_come() {
    let mut envoy = Envoyish::open(
        &["10.0.0.1:8000", "10.0.0.2:8000"],
        BodySendMode::FullDuplexStreamed,
    )
    .await;
    envoy.send(body(b"{}", true)).await;
    assert!(matches!(envoy.next().await, Response::RequestHeaders(_)));
    assert!(matches!(envoy.next().await, Response::RequestBody(_)));
    envoy
        .send(Msg::ResponseHeaders(HttpHeaders::default()))
        .await;
    assert!(matches!(envoy.next().await, Response::ResponseHeaders(_)));
    for (data, end) in [(&b"data: 1\n\n"[..], false), (&b""[..], true)] {
        envoy
            .send(Msg::ResponseBody(HttpBody {
                body: data.to_vec(),
                end_of_stream: end,
                ..Default::default()
            }))
            .await;
        let Response::ResponseBody(echo) = envoy.next().await else {
            panic!("an echo")
        };
        assert_eq!(
            streamed(echo.response.as_ref().unwrap()),
            (data.to_vec(), end)
        );
    }
}

#[tokio::test]
async fn buffered_mode_continues_headers_and_routes_on_the_body() {
    let mut envoy = Envoyish::open(&["10.0.0.1:8000"], BodySendMode::Buffered).await;
    assert!(matches!(envoy.next().await, Response::RequestHeaders(h) if h.response.is_none()));
    envoy.send(body(b"{}", true)).await;
    let Response::RequestBody(routed) = envoy.next().await else {
        panic!("a body response")
    };
    let common = routed.response.unwrap();
    assert!(common.clear_route_cache);
    assert_eq!(destination(&common), "10.0.0.1:8000");
}

#[tokio::test]
async fn without_endpoints_every_request_gets_503() {
    let mut envoy = Envoyish::open(&[], BodySendMode::FullDuplexStreamed).await;
    envoy.send(body(b"{}", true)).await;
    let Response::ImmediateResponse(reject) = envoy.next().await else {
        panic!("a rejection")
    };
    assert_eq!(reject.status.unwrap().code, 503);
}

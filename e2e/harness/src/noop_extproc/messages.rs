//! The ext_proc messages the noop server sends. Routing answers are built once per endpoint and
//! cloned per request, so the per-request work stays minimal.

use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, ImmediateResponse,
    ProcessingResponse, StreamedBodyResponse, TrailersResponse,
};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, Value};

use super::MAX_BODY_CHUNK;

/// The header Envoy's pool cluster routes on (and its `envoy.lb` metadata key).
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
/// The dynamic metadata namespace Envoy's load balancers read.
pub const LB_NAMESPACE: &str = "envoy.lb";

/// The prebuilt answers that send a request to one endpoint.
#[derive(Debug, Clone)]
pub struct Route {
    headers: ProcessingResponse,
    buffered_body: ProcessingResponse,
}

impl Route {
    pub fn new(endpoint: &str) -> Self {
        let common = CommonResponse {
            header_mutation: Some(destination_mutation(endpoint)),
            clear_route_cache: true,
            ..Default::default()
        };
        let metadata = lb_metadata(endpoint);
        Self {
            headers: ProcessingResponse {
                response: Some(Response::RequestHeaders(HeadersResponse {
                    response: Some(common.clone()),
                })),
                dynamic_metadata: Some(metadata.clone()),
                ..Default::default()
            },
            buffered_body: ProcessingResponse {
                response: Some(Response::RequestBody(BodyResponse {
                    response: Some(common),
                })),
                dynamic_metadata: Some(metadata),
                ..Default::default()
            },
        }
    }

    /// Duplex, or a request without body: answer the request headers with the route.
    pub fn headers_response(&self) -> ProcessingResponse {
        self.headers.clone()
    }

    /// BUFFERED: answer the request body with the route.
    pub fn buffered_body_response(&self) -> ProcessingResponse {
        self.buffered_body.clone()
    }
}

/// `x-gateway-destination-endpoint: <endpoint>`, overwriting anything the client sent.
fn destination_mutation(endpoint: &str) -> HeaderMutation {
    HeaderMutation {
        set_headers: vec![HeaderValueOption {
            header: Some(HeaderValue {
                key: DESTINATION_HEADER.to_owned(),
                raw_value: endpoint.as_bytes().to_vec(),
                ..Default::default()
            }),
            append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
            ..Default::default()
        }],
        remove_headers: Vec::new(),
    }
}

/// `{"envoy.lb": {"x-gateway-destination-endpoint": <endpoint>}}`.
fn lb_metadata(endpoint: &str) -> Struct {
    let mut inner = Struct::default();
    inner.fields.insert(
        DESTINATION_HEADER.to_owned(),
        Value {
            kind: Some(Kind::StringValue(endpoint.to_owned())),
        },
    );
    let mut outer = Struct::default();
    outer.fields.insert(
        LB_NAMESPACE.to_owned(),
        Value {
            kind: Some(Kind::StructValue(inner)),
        },
    );
    outer
}

/// Appends `body` as streamed request-body messages of at most [`MAX_BODY_CHUNK`] bytes, the
/// last one carrying `end_of_stream`. An empty body needs a message only to end the stream.
pub fn push_body_chunks(out: &mut Vec<ProcessingResponse>, body: Vec<u8>, end_of_stream: bool) {
    if body.len() <= MAX_BODY_CHUNK {
        if !body.is_empty() || end_of_stream {
            out.push(streamed(Response::RequestBody, body, end_of_stream));
        }
        return;
    }
    let count = body.len().div_ceil(MAX_BODY_CHUNK);
    for (i, chunk) in body.chunks(MAX_BODY_CHUNK).enumerate() {
        let last = i + 1 == count;
        out.push(streamed(
            Response::RequestBody,
            chunk.to_vec(),
            last && end_of_stream,
        ));
    }
}

/// Duplex response body: echo one chunk unchanged.
pub fn response_chunk(body: Vec<u8>, end_of_stream: bool) -> ProcessingResponse {
    streamed(Response::ResponseBody, body, end_of_stream)
}

fn streamed(
    kind: fn(BodyResponse) -> Response,
    body: Vec<u8>,
    end_of_stream: bool,
) -> ProcessingResponse {
    let mutation = Mutation::StreamedResponse(StreamedBodyResponse {
        body,
        end_of_stream,
        ..Default::default()
    });
    ProcessingResponse {
        response: Some(kind(BodyResponse {
            response: Some(CommonResponse {
                body_mutation: Some(BodyMutation {
                    mutation: Some(mutation),
                }),
                ..Default::default()
            }),
        })),
        ..Default::default()
    }
}

fn reply(response: Response) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(response),
        ..Default::default()
    }
}

/// BUFFERED request headers: continue (the route comes with the body).
pub fn continue_request_headers() -> ProcessingResponse {
    reply(Response::RequestHeaders(HeadersResponse::default()))
}

pub fn continue_response_headers() -> ProcessingResponse {
    reply(Response::ResponseHeaders(HeadersResponse::default()))
}

pub fn continue_response_body() -> ProcessingResponse {
    reply(Response::ResponseBody(BodyResponse::default()))
}

pub fn request_trailers() -> ProcessingResponse {
    reply(Response::RequestTrailers(TrailersResponse::default()))
}

pub fn response_trailers() -> ProcessingResponse {
    reply(Response::ResponseTrailers(TrailersResponse::default()))
}

/// 503 with a JSON body when there is no endpoint to route to.
pub fn no_endpoints() -> ProcessingResponse {
    let content_type = HeaderValueOption {
        header: Some(HeaderValue {
            key: "content-type".to_owned(),
            raw_value: b"application/json".to_vec(),
            ..Default::default()
        }),
        ..Default::default()
    };
    reply(Response::ImmediateResponse(ImmediateResponse {
        status: Some(HttpStatus { code: 503 }),
        headers: Some(HeaderMutation {
            set_headers: vec![content_type],
            remove_headers: Vec::new(),
        }),
        body: br#"{"error":{"message":"no endpoints configured","code":503}}"#.to_vec(),
        details: "noop_no_endpoints".to_owned(),
        ..Default::default()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk_sizes(out: &[ProcessingResponse]) -> Vec<(usize, bool)> {
        out.iter()
            .map(|r| match &r.response {
                Some(Response::RequestBody(BodyResponse {
                    response: Some(common),
                })) => {
                    match common
                        .body_mutation
                        .as_ref()
                        .and_then(|m| m.mutation.as_ref())
                    {
                        Some(Mutation::StreamedResponse(s)) => (s.body.len(), s.end_of_stream),
                        other => panic!("unexpected mutation {other:?}"),
                    }
                }
                other => panic!("unexpected response {other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_large_body_is_split_into_bounded_chunks_ending_the_stream_once() {
        let mut out = Vec::new();
        push_body_chunks(&mut out, vec![b'x'; 2 * MAX_BODY_CHUNK + 5], true);
        assert_eq!(
            chunk_sizes(&out),
            vec![(MAX_BODY_CHUNK, false), (MAX_BODY_CHUNK, false), (5, true)]
        );
    }

    #[test]
    fn an_empty_body_sends_only_the_end_of_stream() {
        let mut out = Vec::new();
        push_body_chunks(&mut out, Vec::new(), true);
        assert_eq!(chunk_sizes(&out), vec![(0, true)]);
        out.clear();
        push_body_chunks(&mut out, Vec::new(), false);
        assert!(out.is_empty());
    }

    #[test]
    fn the_route_sets_header_and_metadata() {
        let response = Route::new("127.0.0.1:8000").headers_response();
        let md = response.dynamic_metadata.unwrap();
        let Some(Kind::StructValue(lb)) = &md.fields[LB_NAMESPACE].kind else {
            panic!("no envoy.lb")
        };
        assert_eq!(
            lb.fields[DESTINATION_HEADER].kind,
            Some(Kind::StringValue("127.0.0.1:8000".to_owned()))
        );
        let Some(Response::RequestHeaders(h)) = response.response else {
            panic!("not headers")
        };
        let common = h.response.unwrap();
        assert!(common.clear_route_cache);
        let header = common.header_mutation.unwrap().set_headers[0]
            .header
            .clone()
            .unwrap();
        assert_eq!(header.raw_value, b"127.0.0.1:8000");
    }
}

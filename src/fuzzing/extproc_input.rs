//! The byte encoding of an ext_proc message sequence for the `extproc_stream` target, and the
//! reading of the destinations epp set in its responses.
//!
//! Input: up to [`MAX_STEPS`] steps, each `op flags payload…`:
//! - `op % 8`: 0 request headers, 1 request body, 2 request trailers, 3 response headers,
//!   4 response body, 5 response trailers, 6 body deadline fires, 7 a message with no request;
//! - `flags`: bit 0 end of stream, bit 1 carries a protocol config whose request/response body
//!   modes are bits 2-4 / 5-7 (mod 5: NONE, STREAMED, BUFFERED, BUFFERED_PARTIAL, FULL_DUPLEX);
//! - headers: a count byte (`% 8`), then per header a name selector byte and a length-prefixed
//!   value; the `:path` value is a selector among the API paths; names include the destination
//!   header a client might try to inject, and `x-gateway-destination-endpoint-subset` values
//!   become the subset hint metadata;
//! - bodies: a little-endian u16 length (`% 4096`) and the bytes.

use crate::extproc::wire;
use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    CommonResponse, HttpBody, HttpHeaders, HttpTrailers, ProcessingRequest, ProcessingResponse,
    ProtocolConfiguration,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};

pub(crate) const MAX_STEPS: usize = 64;

const HEADER_NAMES: [&str; 12] = [
    ":path",
    "x-request-id",
    "x-gateway-model-name-rewrite",
    "test-epp-endpoint-selection",
    "x-gateway-inference-objective",
    "traceparent",
    wire::DESTINATION_HEADER,
    "content-type",
    ":status",
    ":method",
    wire::SUBSET_KEY,
    "x-original-path",
];

const PATHS: [&str; 8] = [
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/v1/conversations",
    "/v1/models",
    "/",
    "/v1/completions?x=/chat/completions",
];

pub(crate) enum Step {
    Message(Box<ProcessingRequest>),
    BodyTimeout,
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        head
    }

    fn u16(&mut self) -> usize {
        usize::from(self.byte().unwrap_or(0)) | usize::from(self.byte().unwrap_or(0)) << 8
    }
}

/// The steps `data` encodes (at most [`MAX_STEPS`]).
pub(crate) fn decode(data: &[u8]) -> Vec<Step> {
    let mut c = Cursor(data);
    let mut steps = Vec::new();
    while steps.len() < MAX_STEPS {
        let Some(op) = c.byte() else { break };
        let flags = c.byte().unwrap_or(0);
        let eos = flags & 1 == 1;
        let mut metadata = None;
        let request = match op % 8 {
            0 => {
                let (map, subset) = headers(&mut c, true);
                metadata = subset;
                Some(Request::RequestHeaders(HttpHeaders {
                    headers: Some(map),
                    end_of_stream: eos,
                    ..Default::default()
                }))
            }
            1 => Some(Request::RequestBody(body(&mut c, eos))),
            2 => Some(Request::RequestTrailers(HttpTrailers::default())),
            3 => Some(Request::ResponseHeaders(HttpHeaders {
                headers: Some(headers(&mut c, false).0),
                end_of_stream: eos,
                ..Default::default()
            })),
            4 => Some(Request::ResponseBody(body(&mut c, eos))),
            5 => Some(Request::ResponseTrailers(HttpTrailers::default())),
            6 => {
                steps.push(Step::BodyTimeout);
                continue;
            }
            _ => None,
        };
        let protocol_config = (flags & 2 == 2).then(|| ProtocolConfiguration {
            request_body_mode: i32::from((flags >> 2) & 7) % 5,
            response_body_mode: i32::from(flags >> 5) % 5,
            ..Default::default()
        });
        steps.push(Step::Message(Box::new(ProcessingRequest {
            request,
            metadata_context: metadata,
            protocol_config,
            ..Default::default()
        })));
    }
    steps
}

fn body(c: &mut Cursor<'_>, end_of_stream: bool) -> HttpBody {
    let len = c.u16() % 4096;
    HttpBody {
        body: c.take(len).to_vec(),
        end_of_stream,
        ..Default::default()
    }
}

/// A header map and, for request headers, the subset hint metadata its subset entries make.
fn headers(c: &mut Cursor<'_>, request: bool) -> (HeaderMap, Option<Metadata>) {
    let mut map = HeaderMap::default();
    let mut subset = None;
    for _ in 0..c.byte().unwrap_or(0) % 8 {
        let name = HEADER_NAMES[usize::from(c.byte().unwrap_or(0)) % HEADER_NAMES.len()];
        let len = usize::from(c.byte().unwrap_or(0) % 64);
        let raw = c.take(len).to_vec();
        let raw = match name {
            ":path" => PATHS[raw.first().map_or(0, |b| usize::from(*b)) % PATHS.len()]
                .as_bytes()
                .to_vec(),
            ":status" if !request => raw.first().map_or(b"200".to_vec(), |b| {
                [b"200".as_slice(), b"400", b"500", b"503", b"x"][usize::from(*b) % 5].to_vec()
            }),
            _ => raw,
        };
        if name == wire::SUBSET_KEY && request {
            subset = Some(subset_metadata(&String::from_utf8_lossy(&raw)));
            continue;
        }
        map.headers.push(HeaderValue {
            key: name.to_owned(),
            raw_value: raw,
            ..Default::default()
        });
    }
    (map, subset)
}

fn subset_metadata(csv: &str) -> Metadata {
    let value = Value {
        kind: Some(Kind::StringValue(csv.to_owned())),
    };
    let inner = Struct {
        fields: [(wire::SUBSET_KEY.to_owned(), value)].into_iter().collect(),
    };
    Metadata {
        filter_metadata: [(wire::SUBSET_NAMESPACE.to_owned(), inner)]
            .into_iter()
            .collect(),
        ..Default::default()
    }
}

/// Every destination a response names: the destination header it sets and the `envoy.lb`
/// metadata it attaches.
pub(crate) fn destinations(r: &ProcessingResponse) -> Vec<String> {
    let common: Option<&CommonResponse> = match &r.response {
        Some(Response::RequestHeaders(h) | Response::ResponseHeaders(h)) => h.response.as_ref(),
        Some(Response::RequestBody(b) | Response::ResponseBody(b)) => b.response.as_ref(),
        _ => None,
    };
    let mut found: Vec<String> = common
        .and_then(|c| c.header_mutation.as_ref())
        .into_iter()
        .flat_map(|m| &m.set_headers)
        .filter_map(|o| o.header.as_ref())
        .filter(|h| h.key.eq_ignore_ascii_case(wire::DESTINATION_HEADER))
        .map(|h| String::from_utf8_lossy(wire::header_value(h)).into_owned())
        .collect();
    if let Some(Response::ImmediateResponse(i)) = &r.response {
        let set = i
            .headers
            .iter()
            .flat_map(|m| &m.set_headers)
            .filter_map(|o| o.header.as_ref());
        found.extend(
            set.filter(|h| h.key.eq_ignore_ascii_case(wire::DESTINATION_HEADER))
                .map(|h| String::from_utf8_lossy(wire::header_value(h)).into_owned()),
        );
    }
    let lb = r
        .dynamic_metadata
        .as_ref()
        .and_then(|m| m.fields.get(wire::LB_NAMESPACE));
    if let Some(Kind::StructValue(s)) = lb.and_then(|v| v.kind.as_ref()) {
        if let Some(Kind::StringValue(v)) = s
            .fields
            .get(wire::DESTINATION_HEADER)
            .and_then(|v| v.kind.as_ref())
        {
            found.push(v.clone());
        }
    }
    found
}

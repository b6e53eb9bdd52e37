//! Builders for the ext_proc messages epp sends, and readers for what Envoy sends.
//! Everything protocol-shaped (header names, metadata namespaces, chunk size) lives here.

use crate::endpoint::EndpointId;
use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::core::v3::{
    HeaderMap, HeaderValue, HeaderValueOption, Metadata,
};
use envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse,
    ProcessingResponse, StreamedBodyResponse, TrailersResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};

pub(crate) const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
pub(crate) const LB_NAMESPACE: &str = "envoy.lb";
pub(crate) const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
pub(crate) const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
pub(crate) const SERVED_KEY: &str = "x-gateway-destination-endpoint-served";
/// `envoy.lb` key of the candidates' scores (upstream `DestinationEndpointScoresKey`).
pub(crate) const SCORES_KEY: &str = "x-gateway-destination-endpoint-scores";
/// Largest body chunk sent back to Envoy (upstream's `BodyByteLimit`; some builds cap at 64 KiB).
pub(crate) const BODY_CHUNK: usize = 62_000;

/// A header value: Envoy 1.40 sends `raw_value`, older builds `value`.
pub(crate) fn header_value(h: &HeaderValue) -> &[u8] {
    if h.raw_value.is_empty() {
        h.value.as_bytes()
    } else {
        &h.raw_value
    }
}

/// The value of header `key` (lower case) in `map`, if it is valid UTF-8.
pub(crate) fn find_header<'m>(map: Option<&'m HeaderMap>, key: &str) -> Option<&'m str> {
    let h = map?.headers.iter().find(|h| h.key == key)?;
    std::str::from_utf8(header_value(h)).ok()
}

pub(crate) fn set_header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_owned(),
            raw_value: value.as_bytes().to_vec(),
            ..Default::default()
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..Default::default()
    }
}

/// `ip:port[,ip:port…]`, IPv6 bracketed.
pub(crate) fn destination_value(endpoints: &[EndpointId]) -> String {
    let list: Vec<String> = endpoints.iter().map(ToString::to_string).collect();
    list.join(",")
}

/// `dynamic_metadata = {"envoy.lb": {"x-gateway-destination-endpoint": value}}`.
pub(crate) fn destination_metadata(value: &str) -> Struct {
    let mut inner = Struct::default();
    inner.fields.insert(
        DESTINATION_HEADER.to_owned(),
        Value {
            kind: Some(Kind::StringValue(value.to_owned())),
        },
    );
    let mut md = Struct::default();
    md.fields.insert(
        LB_NAMESPACE.to_owned(),
        Value {
            kind: Some(Kind::StructValue(inner)),
        },
    );
    md
}

/// Namespace → key → number as dynamic metadata (the lifecycle plugins' response metadata).
pub(crate) fn numbers_metadata(md: &crate::scheduling::lifecycle::Metadata) -> Struct {
    let mut out = Struct::default();
    for (namespace, values) in md {
        let mut inner = Struct::default();
        for (key, n) in values {
            inner.fields.insert(
                key.clone(),
                Value {
                    kind: Some(Kind::NumberValue(*n)),
                },
            );
        }
        out.fields.insert(
            namespace.clone(),
            Value {
                kind: Some(Kind::StructValue(inner)),
            },
        );
    }
    out
}

/// [`destination_metadata`] plus, when there are any, the scheduler's score of every scored
/// candidate as upstream's `--emit-endpoint-scores` sends them: a struct under
/// [`SCORES_KEY`] mapping `ip:port` (IPv6 bracketed) to a number.
pub(crate) fn destination_metadata_with_scores(
    value: &str,
    scores: &[(EndpointId, f64)],
) -> Struct {
    let mut md = destination_metadata(value);
    if scores.is_empty() {
        return md;
    }
    let mut table = Struct::default();
    for (id, score) in scores {
        table.fields.insert(
            id.to_string(),
            Value {
                kind: Some(Kind::NumberValue(*score)),
            },
        );
    }
    if let Some(Value {
        kind: Some(Kind::StructValue(inner)),
    }) = md.fields.get_mut(LB_NAMESPACE)
    {
        inner.fields.insert(
            SCORES_KEY.to_owned(),
            Value {
                kind: Some(Kind::StructValue(table)),
            },
        );
    }
    md
}

/// The routing mutation: destination header (+ any extra headers) and `clear_route_cache`.
pub(crate) fn routing_common(set: Vec<HeaderValueOption>) -> CommonResponse {
    CommonResponse {
        header_mutation: Some(HeaderMutation {
            set_headers: set,
            remove_headers: Vec::new(),
        }),
        clear_route_cache: true,
        ..Default::default()
    }
}

/// Request headers a client could send to steer routing; epp's routing mutation removes them
/// (the destination header itself is overwritten). `x-data-parallel-host-port` is the deprecated
/// rank header of llm-d's sidecar (epp sets it only with `data-parallel-profile-handler`); on a
/// rank-0 port it would move the decode to another rank than the one epp chose.
pub(crate) const FORGEABLE_HEADERS: [&str; 3] = [
    "x-gateway-destination-endpoint-served",
    "x-gateway-destination-endpoint-subset",
    "x-data-parallel-host-port",
];

/// The request routing mutation: [`routing_common`] that also strips the
/// [`FORGEABLE_HEADERS`] epp does not set itself (`data-parallel-profile-handler` sets
/// `x-data-parallel-host-port`).
pub(crate) fn request_routing(set: Vec<HeaderValueOption>) -> CommonResponse {
    let own = |h: &str| {
        set.iter()
            .any(|o| o.header.as_ref().is_some_and(|v| v.key == h))
    };
    let remove: Vec<String> = FORGEABLE_HEADERS
        .iter()
        .filter(|h| !own(h))
        .map(|h| (*h).to_owned())
        .collect();
    let mut common = routing_common(set);
    if let Some(m) = common.header_mutation.as_mut() {
        m.remove_headers = remove;
    }
    common
}

pub(crate) fn request_headers(
    common: Option<CommonResponse>,
    metadata: Option<Struct>,
) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::RequestHeaders(HeadersResponse {
            response: common,
        })),
        dynamic_metadata: metadata,
        ..Default::default()
    }
}

pub(crate) fn request_body(
    common: Option<CommonResponse>,
    metadata: Option<Struct>,
) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::RequestBody(BodyResponse { response: common })),
        dynamic_metadata: metadata,
        ..Default::default()
    }
}

pub(crate) fn response_headers(common: Option<CommonResponse>) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::ResponseHeaders(HeadersResponse {
            response: common,
        })),
        ..Default::default()
    }
}

/// An empty buffered-mode response-body answer (continue unchanged).
pub(crate) fn response_body_continue() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::ResponseBody(BodyResponse { response: None })),
        ..Default::default()
    }
}

pub(crate) fn request_trailers() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::RequestTrailers(TrailersResponse::default())),
        ..Default::default()
    }
}

pub(crate) fn response_trailers() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::ResponseTrailers(TrailersResponse::default())),
        ..Default::default()
    }
}

fn streamed(body: &[u8], end_of_stream: bool) -> Option<CommonResponse> {
    streamed_vec(body.to_vec(), end_of_stream)
}

fn streamed_vec(body: Vec<u8>, end_of_stream: bool) -> Option<CommonResponse> {
    let chunk = StreamedBodyResponse {
        body,
        end_of_stream,
        ..Default::default()
    };
    Some(CommonResponse {
        body_mutation: Some(BodyMutation {
            mutation: Some(Mutation::StreamedResponse(chunk)),
        }),
        ..Default::default()
    })
}

/// [`streamed_body`] of a request chunk epp owns: one that fits a chunk is moved into the
/// answer, not copied (the chunks that pass through after a decision).
pub(crate) fn streamed_request_chunk(
    body: Vec<u8>,
    end_of_stream: bool,
    out: &mut Vec<ProcessingResponse>,
) {
    if body.len() > BODY_CHUNK {
        return streamed_body(&body, end_of_stream, false, out);
    }
    out.push(ProcessingResponse {
        response: Some(Response::RequestBody(BodyResponse {
            response: streamed_vec(body, end_of_stream),
        })),
        ..Default::default()
    });
}

/// A body as duplex `streamed_response` chunks of at most [`BODY_CHUNK`] bytes. With
/// `end_of_stream`, the last chunk carries it; an empty body is one empty chunk.
pub(crate) fn streamed_body(
    body: &[u8],
    end_of_stream: bool,
    response: bool,
    out: &mut Vec<ProcessingResponse>,
) {
    let wrap = |common| {
        let r = if response {
            Response::ResponseBody(BodyResponse { response: common })
        } else {
            Response::RequestBody(BodyResponse { response: common })
        };
        ProcessingResponse {
            response: Some(r),
            ..Default::default()
        }
    };
    if body.is_empty() {
        out.push(wrap(streamed(body, end_of_stream)));
        return;
    }
    let n = body.len().div_ceil(BODY_CHUNK);
    for (i, chunk) in body.chunks(BODY_CHUNK).enumerate() {
        out.push(wrap(streamed(chunk, end_of_stream && i + 1 == n)));
    }
}

/// A buffered-mode body response replacing the whole body.
pub(crate) fn replaced_body(
    body: Vec<u8>,
    mut common: CommonResponse,
    response: bool,
) -> ProcessingResponse {
    common.body_mutation = Some(BodyMutation {
        mutation: Some(Mutation::Body(body)),
    });
    let r = if response {
        Response::ResponseBody(BodyResponse {
            response: Some(common),
        })
    } else {
        Response::RequestBody(BodyResponse {
            response: Some(common),
        })
    };
    ProcessingResponse {
        response: Some(r),
        ..Default::default()
    }
}

/// A string value at `namespace/key` of Envoy's filter metadata.
pub(crate) fn metadata_string<'m>(
    md: Option<&'m Metadata>,
    namespace: &str,
    key: &str,
) -> Option<&'m str> {
    match md?
        .filter_metadata
        .get(namespace)?
        .fields
        .get(key)?
        .kind
        .as_ref()?
    {
        Kind::StringValue(s) => Some(s),
        _ => None,
    }
}

/// The subset hint: a list of strings, or one comma-separated string. `None` when absent.
pub(crate) fn subset_hint(md: Option<&Metadata>) -> Option<Vec<String>> {
    let value = md?
        .filter_metadata
        .get(SUBSET_NAMESPACE)?
        .fields
        .get(SUBSET_KEY)?;
    let items = match value.kind.as_ref()? {
        Kind::ListValue(list) => list
            .values
            .iter()
            .filter_map(|v| match &v.kind {
                Some(Kind::StringValue(s)) => Some(s.clone()),
                _ => None,
            })
            .collect(),
        Kind::StringValue(s) => s
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
        _ => return None,
    };
    Some(items)
}

/// The session-affinity token header, in both directions: requests carry the token a previous
/// response gave, responses carry the primary's (`session-affinity-scorer`'s
/// `encoded_endpoint_header` strategy; the token is the endpoint name, base64).
pub const SESSION_HEADER: &str = "x-session-token";

pub use crate::scheduling::scorer::{decode_token, encode_token};

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf::ListValue;
    use proptest::prelude::*;

    fn md(kind: Kind) -> Metadata {
        let mut inner = Struct::default();
        inner
            .fields
            .insert(SUBSET_KEY.into(), Value { kind: Some(kind) });
        let mut m = Metadata::default();
        m.filter_metadata.insert(SUBSET_NAMESPACE.into(), inner);
        m
    }

    #[test]
    fn subset_hint_accepts_lists_and_comma_strings() {
        let s = |v: &str| Value {
            kind: Some(Kind::StringValue(v.into())),
        };
        let list = md(Kind::ListValue(ListValue {
            values: vec![s("1.1.1.1:80"), s("2.2.2.2:80")],
        }));
        assert_eq!(
            subset_hint(Some(&list)).unwrap(),
            vec!["1.1.1.1:80", "2.2.2.2:80"]
        );
        let csv = md(Kind::StringValue("1.1.1.1:80, 2.2.2.2:80".into()));
        assert_eq!(subset_hint(Some(&csv)).unwrap().len(), 2);
        assert_eq!(
            subset_hint(Some(&md(Kind::ListValue(ListValue::default())))).unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(subset_hint(Some(&Metadata::default())), None);
    }

    #[test]
    fn bodies_are_chunked_with_eos_on_the_last() {
        let mut out = Vec::new();
        streamed_body(&vec![b'x'; BODY_CHUNK * 2 + 1], true, false, &mut out);
        let chunks: Vec<(usize, bool)> = out
            .iter()
            .map(|r| match &r.response {
                Some(Response::RequestBody(BodyResponse { response: Some(c) })) => {
                    match &c.body_mutation.as_ref().unwrap().mutation {
                        Some(Mutation::StreamedResponse(s)) => (s.body.len(), s.end_of_stream),
                        _ => panic!("not streamed"),
                    }
                }
                _ => panic!("not a request body"),
            })
            .collect();
        assert_eq!(
            chunks,
            vec![(BODY_CHUNK, false), (BODY_CHUNK, false), (1, true)]
        );
        let mut out = Vec::new();
        streamed_body(b"", true, true, &mut out);
        assert_eq!(out.len(), 1);
        // An owned request chunk: moved when it fits, chunked like any body when it does not.
        let owned = |n: usize| {
            let mut out = Vec::new();
            streamed_request_chunk(vec![b'y'; n], true, &mut out);
            out.iter()
                .map(|r| match &r.response {
                    Some(Response::RequestBody(BodyResponse { response: Some(c) })) => {
                        match &c.body_mutation.as_ref().unwrap().mutation {
                            Some(Mutation::StreamedResponse(s)) => {
                                assert!(s.body.iter().all(|b| *b == b'y'));
                                (s.body.len(), s.end_of_stream)
                            }
                            _ => panic!("not streamed"),
                        }
                    }
                    _ => panic!("not a request body"),
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(owned(10), vec![(10, true)]);
        assert_eq!(owned(BODY_CHUNK), vec![(BODY_CHUNK, true)]);
        assert_eq!(owned(BODY_CHUNK + 1), vec![(BODY_CHUNK, false), (1, true)]);
        assert_eq!(owned(0), vec![(0, true)]);
    }

    #[test]
    fn the_session_header_is_the_one_the_scorer_configuration_accepts() {
        assert_eq!(SESSION_HEADER, crate::scheduling::scorer::SESSION_HEADER);
    }

    #[test]
    fn tokens_match_go_std_encoding() {
        // Values from Go: base64.StdEncoding.EncodeToString([]byte(s)).
        assert_eq!(encode_token("default/vllm-0"), "ZGVmYXVsdC92bGxtLTA=");
        assert_eq!(encode_token("ab"), "YWI=");
        assert_eq!(encode_token("abc"), "YWJj");
        assert_eq!(
            decode_token("ZGVmYXVsdC92bGxtLTA=").as_deref(),
            Some("default/vllm-0")
        );
        for bad in ["", "YWJ", "Y=Jj", "YW==YWJj", "YWJ*", "Y==="] {
            assert_eq!(decode_token(bad), None, "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn decode_inverts_encode(s in "\\PC{0,40}") {
            prop_assert_eq!(decode_token(&encode_token(&s)), (!s.is_empty()).then(|| s.clone()));
        }

        #[test]
        fn decode_never_panics(s in "\\PC{0,40}") {
            let _ = decode_token(&s);
        }
    }
}

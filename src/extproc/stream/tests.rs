use super::*;
use crate::config;
use crate::datastore::Datastore;
use crate::director::Runtime;
use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{HttpTrailers, ProtocolConfiguration};
use envoy_types::pb::google::protobuf::value::Kind;

mod early;
mod metadata;
mod parsers;
mod render;

fn machine_with_store(
    ports: &[u16],
    duplex: bool,
) -> (StreamMachine, ProtocolConfiguration, Arc<Datastore>) {
    machine_with_config(ports, duplex, config::UPSTREAM_DEFAULT_CONFIG)
}

fn machine_with_config(
    ports: &[u16],
    duplex: bool,
    config: &str,
) -> (StreamMachine, ProtocolConfiguration, Arc<Datastore>) {
    let (services, _, ds) = services(ports, config);
    let (m, pc) = stream_of(&services, duplex);
    (m, pc, ds)
}

/// The services every stream of a test shares: a director over `ports` under `config`; also the
/// prefix indexes and the datastore it reads.
fn services(
    ports: &[u16],
    config: &str,
) -> (
    Arc<Services>,
    Arc<crate::prefix::source::Indexes>,
    Arc<Datastore>,
) {
    let graph = crate::fixtures::graph(config).ports(ports).build();
    let services = graph.services();
    let indexes = Arc::clone(&graph.shared.indexes);
    let ds = graph.datastore;
    (services, indexes, ds)
}

/// One stream over `services`, in duplex or buffered mode.
fn stream_of(services: &Arc<Services>, duplex: bool) -> (StreamMachine, ProtocolConfiguration) {
    let mode = if duplex {
        BodySendMode::FullDuplexStreamed
    } else {
        BodySendMode::Buffered
    } as i32;
    let pc = ProtocolConfiguration {
        request_body_mode: mode,
        response_body_mode: mode,
        ..Default::default()
    };
    let limits = Limits {
        max_body_bytes: 1 << 20,
        body_timeout: Duration::from_secs(5),
        ..Limits::default()
    };
    (StreamMachine::new(Arc::clone(services), limits), pc)
}

fn machine(ports: &[u16], duplex: bool) -> (StreamMachine, ProtocolConfiguration) {
    let (m, pc, _) = machine_with_store(ports, duplex);
    (m, pc)
}

fn headers(path: &str, eos: bool, pc: Option<ProtocolConfiguration>) -> ProcessingRequest {
    let h = |k: &str, v: &str| HeaderValue {
        key: k.into(),
        raw_value: v.as_bytes().to_vec(),
        ..Default::default()
    };
    let map = HeaderMap {
        headers: vec![
            h(":path", path),
            h(":method", "POST"),
            h("x-request-id", "r1"),
        ],
    };
    ProcessingRequest {
        request: Some(Request::RequestHeaders(HttpHeaders {
            headers: Some(map),
            end_of_stream: eos,
            ..Default::default()
        })),
        protocol_config: pc,
        ..Default::default()
    }
}

fn body(bytes: &[u8], eos: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Request::RequestBody(HttpBody {
            body: bytes.to_vec(),
            end_of_stream: eos,
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn run(m: &mut StreamMachine, msgs: Vec<ProcessingRequest>) -> Vec<ProcessingResponse> {
    let mut out = Vec::new();
    for msg in msgs {
        m.handle(msg, &mut out);
    }
    out
}

fn destination(r: &ProcessingResponse) -> (String, String) {
    let common = match &r.response {
        Some(Response::RequestHeaders(h)) => h.response.as_ref(),
        Some(Response::RequestBody(b)) => b.response.as_ref(),
        other => panic!("not a routing response: {other:?}"),
    }
    .unwrap();
    assert!(common.clear_route_cache);
    let set = &common.header_mutation.as_ref().unwrap().set_headers;
    let hdr = set
        .iter()
        .find(|h| h.header.as_ref().unwrap().key == wire::DESTINATION_HEADER)
        .unwrap();
    let hdr = String::from_utf8(hdr.header.as_ref().unwrap().raw_value.clone()).unwrap();
    let md = r.dynamic_metadata.as_ref().unwrap().fields["envoy.lb"]
        .kind
        .clone();
    let Some(Kind::StructValue(s)) = md else {
        panic!()
    };
    let Some(Kind::StringValue(v)) = s.fields[wire::DESTINATION_HEADER].kind.clone() else {
        panic!()
    };
    (hdr, v)
}

fn streamed_bytes(out: &[ProcessingResponse]) -> (Vec<u8>, bool) {
    let mut all = Vec::new();
    let mut eos = false;
    for r in out {
        if let Some(Response::RequestBody(b)) = &r.response {
            if let Some(Mutation::StreamedResponse(s)) = b
                .response
                .as_ref()
                .and_then(|c| c.body_mutation.as_ref())
                .and_then(|m| m.mutation.as_ref())
            {
                all.extend_from_slice(&s.body);
                eos = s.end_of_stream;
            }
        }
    }
    (all, eos)
}

fn immediate_status(out: &[ProcessingResponse]) -> Option<i32> {
    out.iter().find_map(|r| match &r.response {
        Some(Response::ImmediateResponse(i)) => i.status.as_ref().map(|s| s.code),
        _ => None,
    })
}

const CHAT: &[u8] = br#"{"model":"m", "messages":[{"role":"user","content":"hi"}]}"#;

#[test]
fn duplex_defers_headers_then_routes_and_streams_the_body_back() {
    let (mut m, pc) = machine(&[1, 2], true);
    assert!(run(
        &mut m,
        vec![
            headers("/v1/chat/completions", false, Some(pc)),
            body(&CHAT[..10], false)
        ]
    )
    .is_empty());
    let out = run(&mut m, vec![body(&CHAT[10..], false), body(b"", true)]);
    let (hdr, md) = destination(&out[0]);
    assert_eq!(hdr, md);
    assert!(hdr.starts_with("127.0.0.1:"));
    assert_eq!(streamed_bytes(&out), (CHAT.to_vec(), true));
    let late = run(&mut m, vec![body(b"garbage", true)]);
    assert!(
        late.is_empty(),
        "a duplicate end-of-stream chunk is ignored"
    );
}

#[test]
fn buffered_answers_headers_at_once_and_routes_on_the_body() {
    let (mut m, pc) = machine(&[1], false);
    let out = run(
        &mut m,
        vec![headers("/v1/chat/completions", false, Some(pc))],
    );
    assert!(matches!(out[0].response, Some(Response::RequestHeaders(_))));
    let out = run(&mut m, vec![body(CHAT, true)]);
    assert_eq!(destination(&out[0]).0, "127.0.0.1:1");
}

#[test]
fn bodyless_requests_route_immediately() {
    let (mut m, pc) = machine(&[7], true);
    let out = run(&mut m, vec![headers("/v1/models", true, Some(pc))]);
    assert_eq!(destination(&out[0]).0, "127.0.0.1:7");
}

#[test]
fn trailers_end_the_body_and_get_an_answer() {
    let (mut m, pc) = machine(&[1], true);
    let trailers = ProcessingRequest {
        request: Some(Request::RequestTrailers(HttpTrailers::default())),
        ..Default::default()
    };
    let out = run(
        &mut m,
        vec![
            headers("/v1/chat/completions", false, Some(pc)),
            body(CHAT, false),
            trailers,
        ],
    );
    destination(&out[0]);
    assert_eq!(streamed_bytes(&out), (CHAT.to_vec(), false));
    assert!(matches!(
        out.last().unwrap().response,
        Some(Response::RequestTrailers(_))
    ));
}

#[test]
fn errors_become_immediate_responses() {
    let (mut m, pc) = machine(&[1], true);
    let out = run(
        &mut m,
        vec![
            headers("/v1/chat/completions", false, Some(pc)),
            body(b"{not json", true),
        ],
    );
    assert_eq!(immediate_status(&out), Some(400));
    assert!(m.is_done());
    let (mut m, pc) = machine(&[], true);
    let out = run(
        &mut m,
        vec![
            headers("/v1/chat/completions", false, Some(pc)),
            body(CHAT, true),
        ],
    );
    assert_eq!(immediate_status(&out), Some(503));
    let (mut m, pc) = machine(&[1], true);
    let big = vec![b' '; (1 << 20) + 1];
    let out = run(
        &mut m,
        vec![
            headers("/v1/chat/completions", false, Some(pc)),
            body(&big, false),
        ],
    );
    assert_eq!(immediate_status(&out), Some(413));
    let (mut m, pc) = machine(&[1], true);
    let mut out = run(
        &mut m,
        vec![headers("/v1/chat/completions", false, Some(pc))],
    );
    m.on_body_timeout(&mut out);
    assert_eq!(immediate_status(&out), Some(408));
}

#[test]
fn response_phases_pass_through_in_order_and_release_the_endpoint() {
    let (mut m, pc, ds) = machine_with_store(&[1], true);
    run(
        &mut m,
        vec![
            headers("/v1/chat/completions", false, Some(pc)),
            body(CHAT, true),
        ],
    );
    let state = Arc::clone(ds.snapshot().iter().next().unwrap());
    assert_eq!(state.inflight(), 1);
    let h = |k: &str, v: &str| HeaderValue {
        key: k.into(),
        raw_value: v.as_bytes().to_vec(),
        ..Default::default()
    };
    let resp_headers = ProcessingRequest {
        request: Some(Request::ResponseHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![h(":status", "200")],
            }),
            ..Default::default()
        })),
        ..Default::default()
    };
    let resp_body = |b: &[u8], eos| ProcessingRequest {
        request: Some(Request::ResponseBody(HttpBody {
            body: b.to_vec(),
            end_of_stream: eos,
            ..Default::default()
        })),
        ..Default::default()
    };
    let out = run(
        &mut m,
        vec![
            resp_headers,
            resp_body(b"{\"a\":", false),
            resp_body(b"1}", true),
        ],
    );
    assert!(matches!(
        out[0].response,
        Some(Response::ResponseHeaders(_))
    ));
    assert_eq!(out.len(), 3, "each chunk echoed as it came");
    assert!(m.is_done());
    assert_eq!(state.inflight(), 0);
}

#[test]
fn the_served_endpoint_is_read_and_echoed_by_the_conformance_verifier() {
    use envoy_types::pb::envoy::config::core::v3::Metadata;
    use envoy_types::pb::google::protobuf::{Struct, Value};
    let cfg = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n- type: destination-endpoint-served-verifier\n";
    let (mut m, pc, _) = machine_with_config(&[1, 2], true, cfg);
    run(
        &mut m,
        vec![
            headers("/v1/chat/completions", false, Some(pc)),
            body(CHAT, true),
        ],
    );
    let mut lb = Struct::default();
    lb.fields.insert(
        wire::SERVED_KEY.into(),
        Value {
            kind: Some(Kind::StringValue("127.0.0.1:2".into())),
        },
    );
    let mut md = Metadata::default();
    md.filter_metadata.insert(wire::LB_NAMESPACE.into(), lb);
    let h = |k: &str, v: &str| HeaderValue {
        key: k.into(),
        raw_value: v.as_bytes().to_vec(),
        ..Default::default()
    };
    let resp = ProcessingRequest {
        request: Some(Request::ResponseHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![h(":status", "200")],
            }),
            ..Default::default()
        })),
        metadata_context: Some(md),
        ..Default::default()
    };
    let out = run(&mut m, vec![resp]);
    let Some(Response::ResponseHeaders(hr)) = &out[0].response else {
        panic!()
    };
    let set = &hr
        .response
        .as_ref()
        .unwrap()
        .header_mutation
        .as_ref()
        .unwrap()
        .set_headers;
    let header = set[0].header.as_ref().unwrap();
    assert_eq!(
        (header.key.as_str(), header.raw_value.as_slice()),
        (SERVED_VERIFIER_HEADER, &b"127.0.0.1:2"[..])
    );
}

#[test]
fn a_stream_ending_before_its_response_is_an_interruption_only_when_a_response_was_due() {
    let (mut m, pc) = machine(&[1], true);
    run(
        &mut m,
        vec![
            headers("/v1/chat/completions", false, Some(pc)),
            body(CHAT, true),
        ],
    );
    assert!(
        m.interrupted(),
        "duplex response body announced, none arrived"
    );
    let (mut m, mut pc) = machine(&[1], false);
    pc.response_body_mode = BodySendMode::None as i32;
    run(
        &mut m,
        vec![
            headers("/v1/chat/completions", false, Some(pc)),
            body(CHAT, true),
        ],
    );
    assert!(
        !m.interrupted(),
        "request-only processing ends streams after routing"
    );
}

#[test]
fn without_a_response_body_mode_the_exchange_ends_at_the_response_headers() {
    let (mut m, mut pc) = machine(&[1], false);
    pc.response_body_mode = BodySendMode::None as i32;
    run(
        &mut m,
        vec![
            headers("/v1/chat/completions", false, Some(pc)),
            body(CHAT, true),
        ],
    );
    let h = HeaderValue {
        key: ":status".into(),
        raw_value: b"200".to_vec(),
        ..Default::default()
    };
    let resp = ProcessingRequest {
        request: Some(Request::ResponseHeaders(HttpHeaders {
            headers: Some(HeaderMap { headers: vec![h] }),
            ..Default::default()
        })),
        ..Default::default()
    };
    let out = run(&mut m, vec![resp]);
    assert!(matches!(
        out[0].response,
        Some(Response::ResponseHeaders(_))
    ));
    assert!(m.is_done() && !m.interrupted());
}

fn headers_with(
    path: &str,
    extra: &[(&str, &str)],
    pc: ProtocolConfiguration,
) -> ProcessingRequest {
    let h = |k: &str, v: &str| HeaderValue {
        key: k.into(),
        raw_value: v.as_bytes().to_vec(),
        ..Default::default()
    };
    let mut list = vec![
        h(":path", path),
        h(":method", "POST"),
        h("x-request-id", "r1"),
    ];
    list.extend(extra.iter().map(|(k, v)| h(k, v)));
    ProcessingRequest {
        request: Some(Request::RequestHeaders(HttpHeaders {
            headers: Some(HeaderMap { headers: list }),
            ..Default::default()
        })),
        protocol_config: Some(pc),
        ..Default::default()
    }
}

fn set_header<'a>(r: &'a ProcessingResponse, key: &str) -> Option<&'a [u8]> {
    let Some(Response::RequestHeaders(h)) = &r.response else {
        return None;
    };
    let m = h.response.as_ref()?.header_mutation.as_ref()?;
    m.set_headers
        .iter()
        .map(|o| o.header.as_ref().unwrap())
        .find(|h| h.key == key)
        .map(|h| h.raw_value.as_slice())
}

#[test]
fn routing_strips_headers_a_client_could_forge() {
    let (mut m, pc) = machine(&[1], true);
    let out = run(
        &mut m,
        vec![
            headers_with(
                "/v1/chat/completions",
                &[(wire::DESTINATION_HEADER, "10.9.9.9:80")],
                pc,
            ),
            body(CHAT, true),
        ],
    );
    assert_eq!(destination(&out[0]).0, "127.0.0.1:1");
    let Some(Response::RequestHeaders(h)) = &out[0].response else {
        panic!()
    };
    let removed = &h
        .response
        .as_ref()
        .unwrap()
        .header_mutation
        .as_ref()
        .unwrap()
        .remove_headers;
    assert_eq!(removed, &wire::FORGEABLE_HEADERS.map(String::from));
}

#[test]
fn limits_answer_with_their_own_status() {
    let director = machine_with_store(&[1], true).0.services;
    let limited = |l: Limits| StreamMachine::new(Arc::clone(&director), l);
    let pc = machine(&[1], true).1;
    let mut m = limited(Limits {
        max_header_bytes: 100,
        ..Limits::default()
    });
    let out = run(
        &mut m,
        vec![headers_with(
            "/v1/completions",
            &[("x-big", &"v".repeat(100))],
            pc,
        )],
    );
    assert_eq!(immediate_status(&out), Some(431));
    let mut m = limited(Limits {
        max_request_messages: 3,
        ..Limits::default()
    });
    let out = run(
        &mut m,
        vec![
            headers("/v1/completions", false, Some(pc)),
            body(b"{", false),
            body(b" ", false),
            body(b" ", false),
        ],
    );
    assert_eq!(immediate_status(&out), Some(413));
    let mut m = limited(Limits {
        max_chat_messages: 2,
        ..Limits::default()
    });
    let chat = br#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"#;
    let out = run(
        &mut m,
        vec![
            headers("/v1/chat/completions", false, Some(pc)),
            body(chat, false),
        ],
    );
    assert_eq!(
        immediate_status(&out),
        Some(400),
        "refused before the body ends"
    );
}

//! The llm-d-router v0.10 request interface through the stream machine: parsers by path,
//! header-time routing (passthrough, WebSocket), steering-header aliases, drop reasons, 412 and
//! endpoint scores.

use super::*;
use crate::request::{ParserKind, ParserSet};

fn lb_field(r: &ProcessingResponse, key: &str) -> Option<Kind> {
    let md = r
        .dynamic_metadata
        .as_ref()?
        .fields
        .get("envoy.lb")?
        .kind
        .clone();
    let Some(Kind::StructValue(s)) = md else {
        return None;
    };
    s.fields.get(key).and_then(|v| v.kind.clone())
}

fn immediate_header(out: &[ProcessingResponse], key: &str) -> Option<String> {
    out.iter().find_map(|r| match &r.response {
        Some(Response::ImmediateResponse(i)) => i
            .headers
            .as_ref()?
            .set_headers
            .iter()
            .filter_map(|h| h.header.as_ref())
            .find(|h| h.key == key)
            .map(|h| String::from_utf8_lossy(&h.raw_value).into_owned()),
        _ => None,
    })
}

#[test]
fn passthrough_paths_route_at_the_headers_and_stream_the_body_unread() {
    for duplex in [true, false] {
        let (mut m, pc) = machine(&[1], duplex);
        let out = run(&mut m, vec![headers("/v1/rerank", false, Some(pc))]);
        assert_eq!(out.len(), 1, "routed on the headers (duplex {duplex})");
        assert_eq!(destination(&out[0]).0, "127.0.0.1:1");
        let junk = b"not json at all {{{";
        let out = run(&mut m, vec![body(junk, false), body(b"", true)]);
        if duplex {
            assert_eq!(streamed_bytes(&out), (junk.to_vec(), true));
        } else {
            assert_eq!(out.len(), 2);
            assert!(immediate_status(&out).is_none());
        }
    }
}

#[test]
fn websocket_upgrades_route_at_the_headers_whatever_the_parsers() {
    let (mut m, pc) = machine(&[1], true);
    let mut rt = Runtime::build(config::UPSTREAM_DEFAULT_CONFIG, None).unwrap();
    rt.parsers = ParserSet::new([ParserKind::OpenAi]);
    m.services.config.store(rt);
    let out = run(
        &mut m,
        vec![headers_with(
            "/v1/chat/completions",
            &[("upgrade", "websocket")],
            pc,
        )],
    );
    assert_eq!(destination(&out[0]).0, "127.0.0.1:1");
    let frames: Vec<_> = (0..200).map(|i| body(&[i as u8; 10], false)).collect();
    let out = run(&mut m, frames);
    assert_eq!(streamed_bytes(&out).0.len(), 2000, "no limit, no scan");
    let out = run(
        &mut m,
        vec![headers("/v1/realtime?model=m", false, Some(pc))],
    );
    assert!(out.is_empty(), "one request per stream");
    let (mut m, pc) = machine(&[1], true);
    let out = run(
        &mut m,
        vec![headers("/v1/realtime?model=m", false, Some(pc))],
    );
    assert_eq!(destination(&out[0]).0, "127.0.0.1:1");
}

#[test]
fn a_path_no_configured_parser_claims_is_a_400_at_the_headers() {
    let (mut m, pc) = machine(&[1], true);
    let mut rt = Runtime::build(config::UPSTREAM_DEFAULT_CONFIG, None).unwrap();
    rt.parsers = ParserSet::new([ParserKind::OpenAi, ParserKind::SglangHttp]);
    m.services.config.store(rt);
    let out = run(&mut m, vec![headers("/v1/messages", false, Some(pc))]);
    assert_eq!(immediate_status(&out), Some(400));
    let (mut m2, _) = machine(&[1], true);
    m2.services = Arc::clone(&m.services);
    let gen = br#"{"input_ids":[1,2,3],"extra_key":"k"}"#;
    let out = run(
        &mut m2,
        vec![headers("/generate", false, Some(pc)), body(gen, true)],
    );
    assert_eq!(destination(&out[0]).0, "127.0.0.1:1");
    assert_eq!(streamed_bytes(&out), (gen.to_vec(), true));
}

#[test]
fn anthropic_and_token_in_bodies_are_parsed_and_forwarded_unchanged() {
    let cases: &[(&str, &[u8])] = &[
        (
            "/v1/messages",
            br#"{"model":"claude","system":"s","messages":[{"role":"user","content":"hi"}]}"#,
        ),
        (
            "/inference/v1/generate",
            br#"{"model":"m","token_ids":[1,2,3],"sampling_params":{"max_tokens":2}}"#,
        ),
    ];
    for (path, bytes) in cases {
        let (mut m, pc) = machine(&[1], true);
        let out = run(
            &mut m,
            vec![headers(path, false, Some(pc)), body(bytes, true)],
        );
        assert_eq!(destination(&out[0]).0, "127.0.0.1:1", "{path}");
        assert_eq!(streamed_bytes(&out), (bytes.to_vec(), true), "{path}");
    }
    let (mut m, pc) = machine(&[1], true);
    let bad = br#"{"model":"m","token_ids":[]}"#;
    let out = run(
        &mut m,
        vec![
            headers("/inference/v1/generate", false, Some(pc)),
            body(bad, true),
        ],
    );
    assert_eq!(immediate_status(&out), Some(400));
}

#[test]
fn llm_d_header_names_win_over_their_gie_aliases() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("x-gateway-model-name-rewrite", "old")], "old"),
        (&[("x-llm-d-model-name-rewrite", "new")], "new"),
        (
            &[
                ("x-gateway-model-name-rewrite", "old"),
                ("x-llm-d-model-name-rewrite", "new"),
            ],
            "new",
        ),
    ];
    for (extra, want) in cases {
        let (mut m, pc) = machine(&[1], true);
        let out = run(
            &mut m,
            vec![
                headers_with("/v1/chat/completions", extra, pc),
                body(CHAT, true),
            ],
        );
        let (forwarded, _) = streamed_bytes(&out);
        let text = String::from_utf8(forwarded).unwrap();
        assert!(
            text.contains(&format!(r#""model":"{want}""#)),
            "{extra:?}: {text}"
        );
    }
}

#[test]
fn rejections_carry_upstreams_drop_reason() {
    let (mut m, pc) = machine(&[], true);
    let out = run(
        &mut m,
        vec![
            headers("/v1/chat/completions", false, Some(pc)),
            body(CHAT, true),
        ],
    );
    assert_eq!(immediate_status(&out), Some(503));
    assert_eq!(
        immediate_header(&out, status::DROPPED_REASON_HEADER).as_deref(),
        Some("rejected-no-endpoints")
    );
    let (mut m, pc) = machine(&[1], true);
    let out = run(
        &mut m,
        vec![
            headers("/v1/chat/completions", false, Some(pc)),
            body(b"{", true),
        ],
    );
    assert_eq!(immediate_status(&out), Some(400));
    assert_eq!(immediate_header(&out, status::DROPPED_REASON_HEADER), None);
}

#[test]
fn prefer_if_available_is_412_until_the_endpoint_caches_the_prompt() {
    let prompt = "the same long shared prefix ".repeat(40);
    let chat = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": prompt}]})
        .to_string();
    let (m0, pc) = machine(&[1], true);
    let director = Arc::clone(&m0.services);
    let send = |prefer: bool| {
        let mut m = StreamMachine::new(Arc::clone(&director), Limits::default());
        let extra: &[(&str, &str)] = if prefer {
            &[("prefer", "if-available")]
        } else {
            &[]
        };
        run(
            &mut m,
            vec![
                headers_with("/v1/chat/completions", extra, pc),
                body(chat.as_bytes(), true),
            ],
        )
    };
    let out = send(true);
    assert_eq!(immediate_status(&out), Some(412), "nothing cached yet");
    assert_eq!(immediate_header(&out, status::DROPPED_REASON_HEADER), None);
    assert_eq!(immediate_status(&send(false)), None);
    let out = send(true);
    assert_eq!(destination(&out[0]).0, "127.0.0.1:1", "cached now");
}

#[test]
fn endpoint_scores_are_in_the_metadata_only_when_asked() {
    for emit in [false, true] {
        let (mut m, pc) = machine(&[1, 2], true);
        if emit {
            m.emit_endpoint_scores();
        }
        let out = run(
            &mut m,
            vec![
                headers("/v1/chat/completions", false, Some(pc)),
                body(CHAT, true),
            ],
        );
        let scores = lb_field(&out[0], wire::SCORES_KEY);
        if !emit {
            assert!(scores.is_none());
            continue;
        }
        let Some(Kind::StructValue(s)) = scores else {
            panic!("{scores:?}")
        };
        let mut keys: Vec<_> = s.fields.keys().cloned().collect();
        keys.sort();
        assert_eq!(keys, ["127.0.0.1:1", "127.0.0.1:2"]);
        assert!(s
            .fields
            .values()
            .all(|v| matches!(v.kind, Some(Kind::NumberValue(n)) if n.is_finite())));
    }
}

#[test]
fn the_configured_request_handler_parsers_decide() {
    let config = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n- type: max-score-picker\n- name: anthropic\n  type: anthropic-parser\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n  - pluginRef: max-score-picker\nrequestHandler:\n  parsers:\n  - pluginRef: anthropic\n";
    let (mut m, pc, _) = machine_with_config(&[1], true, config);
    assert_eq!(
        m.services.config.load().parsers.kinds().collect::<Vec<_>>(),
        vec![ParserKind::Anthropic]
    );
    let out = run(
        &mut m,
        vec![headers("/v1/chat/completions", false, Some(pc))],
    );
    assert_eq!(immediate_status(&out), Some(400), "no fallback configured");
    let (m, _, _) = machine_with_config(&[1], true, config::UPSTREAM_DEFAULT_CONFIG);
    assert_eq!(m.services.config.load().parsers, ParserSet::default());
}

#[test]
fn passthrough_is_admitted_like_any_request_and_bodyless_requests_are_never_412() {
    let (mut m, pc, ds) = machine_with_store(&[1], true);
    let mut o = crate::datastore::objectives::Objectives::default();
    o.objectives.insert("batch".into(), -1);
    ds.set_objectives(o);
    // No scraped metrics: the pool counts as saturated, so a sheddable request is shed.
    let out = run(
        &mut m,
        vec![headers_with(
            "/v1/rerank",
            &[("x-llm-d-inference-objective", "batch")],
            pc,
        )],
    );
    assert_eq!(immediate_status(&out), Some(429));
    assert_eq!(
        immediate_header(&out, status::DROPPED_REASON_HEADER).as_deref(),
        Some("rejected-saturated")
    );
    let (mut m, pc) = machine(&[1], true);
    let out = run(
        &mut m,
        vec![headers_with(
            "/v1/rerank",
            &[("prefer", "if-available")],
            pc,
        )],
    );
    assert_eq!(
        immediate_status(&out),
        Some(412),
        "a passthrough prompt is never cached"
    );
    let (mut m, _) = machine(&[1], true);
    let mut get = headers("/v1/models", true, Some(pc));
    if let Some(Request::RequestHeaders(h)) = &mut get.request {
        if let Some(map) = h.headers.as_mut() {
            map.headers.push(HeaderValue {
                key: "prefer".into(),
                raw_value: b"if-available".to_vec(),
                ..Default::default()
            });
        }
    }
    let out = run(&mut m, vec![get]);
    assert_eq!(
        destination(&out[0]).0,
        "127.0.0.1:1",
        "upstream never gates GETs"
    );
}

/// Response headers with `status`, and one response body chunk.
fn response_headers(status: &str) -> ProcessingRequest {
    let h = HeaderValue {
        key: ":status".into(),
        raw_value: status.as_bytes().to_vec(),
        ..Default::default()
    };
    ProcessingRequest {
        request: Some(Request::ResponseHeaders(HttpHeaders {
            headers: Some(HeaderMap { headers: vec![h] }),
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn response_chunk(bytes: &[u8]) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Request::ResponseBody(HttpBody {
            body: bytes.to_vec(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

#[test]
fn an_accepted_websocket_session_ends_with_its_stream_not_as_a_reset() {
    let (mut m, pc) = machine(&[1], true);
    run(
        &mut m,
        vec![headers_with(
            "/v1/realtime",
            &[("upgrade", "websocket")],
            pc,
        )],
    );
    let out = run(&mut m, vec![response_headers("101")]);
    assert!(matches!(
        out[0].response,
        Some(Response::ResponseHeaders(_))
    ));
    // Server frames pass through unread and unheld, whatever they contain.
    let frame = b"\x81\x05{\"usage";
    let out = run(&mut m, vec![response_chunk(frame), response_chunk(frame)]);
    let passed: Vec<u8> = out
        .iter()
        .filter_map(|r| match &r.response {
            Some(Response::ResponseBody(b)) => b.response.as_ref()?.body_mutation.as_ref(),
            _ => None,
        })
        .filter_map(|m| match &m.mutation {
            Some(Mutation::StreamedResponse(s)) => Some(s.body.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(passed, [&frame[..], &frame[..]].concat());
    assert!(
        !m.interrupted(),
        "a session has no end of stream to wait for"
    );
    m.closed();
    assert!(m.is_done());
    assert_eq!(m.services.metrics.stream_resets.get(), 0);
}

#[test]
fn a_refused_websocket_upgrade_is_an_ordinary_exchange() {
    let (mut m, pc) = machine(&[1], true);
    run(
        &mut m,
        vec![headers_with(
            "/v1/realtime",
            &[("upgrade", "websocket")],
            pc,
        )],
    );
    run(&mut m, vec![response_headers("503")]);
    assert!(m.interrupted(), "a 503 body was due");
    m.closed();
    assert!(!m.is_done(), "only an accepted session ends on close");
}

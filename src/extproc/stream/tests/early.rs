//! The decision before the body ends (duplex mode), and the wait for flow control.

use super::*;

fn long_completion(model: &str, prompt_bytes: usize) -> Vec<u8> {
    serde_json::json!({"model": model, "prompt": "abcd ".repeat(prompt_bytes / 5), "stream": true})
        .to_string()
        .into_bytes()
}

#[test]
fn early_decision_routes_once_the_prefix_is_in_and_streams_the_rest() {
    let (mut m, pc) = machine(&[1, 2], true);
    let whole = long_completion("m", 100_000);
    let mut out = run(&mut m, vec![headers("/v1/completions", false, Some(pc))]);
    let mut decided_at = None;
    for (i, chunk) in whole.chunks(10_000).enumerate() {
        let before = out.len();
        m.handle(body(chunk, false), &mut out);
        if decided_at.is_none() && out.len() > before {
            decided_at = Some(i);
        }
    }
    m.handle(body(b"", true), &mut out);
    assert_eq!(
        decided_at,
        Some(3),
        "the default prefix scorer reads 32 KiB of prompt"
    );
    destination(&out[0]);
    assert_eq!(
        streamed_bytes(&out),
        (whole, true),
        "every byte passes through, in order"
    );
    assert!(
        m.routed().unwrap().stream,
        "`stream` came after the decision point and is still seen"
    );
}

#[test]
fn early_rewrite_patches_the_model_and_fixes_the_content_length() {
    let (mut m, pc) = machine(&[1], true);
    let whole = long_completion("short", 50_000);
    let len = whole.len().to_string();
    let mut out = run(
        &mut m,
        vec![headers_with(
            "/v1/completions",
            &[
                ("x-gateway-model-name-rewrite", "a-longer-name"),
                ("content-length", &len),
            ],
            pc,
        )],
    );
    for chunk in whole.chunks(40_000) {
        m.handle(body(chunk, false), &mut out);
    }
    m.handle(body(b"", true), &mut out);
    let expected = String::from_utf8(whole.clone())
        .unwrap()
        .replacen("\"short\"", "\"a-longer-name\"", 1)
        .into_bytes();
    assert_eq!(
        set_header(&out[0], "content-length"),
        Some(expected.len().to_string().as_bytes())
    );
    assert_eq!(streamed_bytes(&out), (expected, true));
}

#[test]
fn without_early_decision_or_in_buffered_mode_the_whole_body_decides() {
    let (director, pc) = {
        let (m, pc, _) = machine_with_store(&[1], true);
        (m.services, pc)
    };
    let mut m = StreamMachine::new(
        director,
        Limits {
            early_decision: false,
            ..Limits::default()
        },
    );
    let whole = long_completion("m", 100_000);
    let mut out = run(&mut m, vec![headers("/v1/completions", false, Some(pc))]);
    for chunk in whole.chunks(10_000) {
        m.handle(body(chunk, false), &mut out);
    }
    assert!(out.is_empty());
    m.handle(body(b"", true), &mut out);
    destination(&out[0]);
    let (mut m, pc) = machine(&[1], false);
    let out = run(
        &mut m,
        vec![
            headers("/v1/completions", false, Some(pc)),
            body(&whole[..60_000], false),
        ],
    );
    assert!(out
        .iter()
        .all(|r| set_header(r, wire::DESTINATION_HEADER).is_none()));
}

#[test]
fn flow_control_parks_the_decision_until_admitted_or_refused() {
    let (mut m, pc) = machine(&[1], true);
    m.use_flow_control();
    let out = run(
        &mut m,
        vec![
            headers_with(
                "/v1/chat/completions",
                &[("x-gateway-inference-fairness-id", "tenant-a")],
                pc,
            ),
            body(CHAT, true),
        ],
    );
    assert!(out.is_empty());
    let ticket = m.take_flow_ticket().unwrap();
    assert_eq!(
        (ticket.fairness_id.as_str(), ticket.priority, ticket.bytes),
        ("tenant-a", 0, CHAT.len() as u64)
    );
    assert!(m.take_flow_ticket().is_none(), "one ticket per request");
    let mut out = Vec::new();
    m.on_admission(Ok(()), &mut out);
    destination(&out[0]);
    assert_eq!(streamed_bytes(&out), (CHAT.to_vec(), true));
    let (mut m, pc) = machine(&[1], true);
    m.use_flow_control();
    run(
        &mut m,
        vec![
            headers("/v1/chat/completions", false, Some(pc)),
            body(CHAT, true),
        ],
    );
    assert_eq!(m.take_flow_ticket().unwrap().fairness_id, "default-flow");
    let mut out = Vec::new();
    m.on_admission(
        Err(crate::director::flowcontrol::FlowError::Full {
            limit: "maxRequests",
            value: 1,
        }),
        &mut out,
    );
    assert_eq!(immediate_status(&out), Some(429));
}

#[test]
fn an_early_decision_also_waits_for_flow_control() {
    let (mut m, pc) = machine(&[1], true);
    m.use_flow_control();
    let whole = long_completion("m", 100_000);
    let mut out = run(&mut m, vec![headers("/v1/completions", false, Some(pc))]);
    m.handle(body(&whole[..50_000], false), &mut out);
    assert!(out.is_empty(), "parked, not routed");
    let ticket = m.take_flow_ticket().unwrap();
    assert_eq!(ticket.bytes, 50_000, "no content-length: the bytes so far");
    m.on_admission(Ok(()), &mut out);
    destination(&out[0]);
    m.handle(body(&whole[50_000..], true), &mut out);
    assert_eq!(streamed_bytes(&out), (whole, true));
}

impl StreamMachine {
    /// The decision of a routed stream.
    fn routed(&self) -> Option<&Routed> {
        match &self.state {
            State::Routed(ex) => Some(&ex.routed),
            _ => None,
        }
    }
}

#[test]
fn a_gathering_plugin_holds_the_decision_for_its_window_then_routes_the_group_together() {
    let config = include_str!("../../../../config/examples/llm-d-burst-prefix.yaml");
    let graph = crate::fixtures::graph(config)
        .ports(&[1, 2, 3])
        .experimental()
        .build();
    let services = graph.services();
    let mut destinations = Vec::new();
    let mut streams: Vec<StreamMachine> = Vec::new();
    for _ in 0..3 {
        let (mut m, pc) = stream_of(&services, true);
        let out = run(
            &mut m,
            vec![
                headers("/v1/chat/completions", false, Some(pc)),
                body(CHAT, true),
            ],
        );
        assert!(out.is_empty(), "held: no answer before the window closes");
        assert!(m.awaiting_decision());
        streams.push(m);
    }
    for m in &mut streams {
        let until = m.take_gather().expect("a window to wait for");
        assert!(until <= tokio::time::Instant::now() + Duration::from_millis(100));
        assert!(m.take_gather().is_none(), "joined once");
    }
    // The driver sleeps until the window closes; the first to ask places the window.
    for m in &mut streams {
        let mut out = Vec::new();
        m.on_gathered(&mut out);
        destinations.push(destination(&out[0]).0);
    }
    assert!(
        destinations.iter().all(|d| *d == destinations[0]),
        "{destinations:?}"
    );
}

#[test]
fn with_flow_control_the_window_is_joined_after_admission() {
    let config = include_str!("../../../../config/examples/llm-d-burst-prefix.yaml");
    let graph = crate::fixtures::graph(config)
        .ports(&[1, 2])
        .experimental()
        .build();
    let (mut m, pc) = stream_of(&graph.services(), true);
    m.use_flow_control();
    let out = run(
        &mut m,
        vec![
            headers("/v1/chat/completions", false, Some(pc)),
            body(CHAT, true),
        ],
    );
    assert!(out.is_empty());
    assert!(
        m.take_gather().is_none(),
        "not before its flow-control turn"
    );
    assert!(m.take_flow_ticket().is_some());
    let mut out = Vec::new();
    m.on_admission(Ok(()), &mut out);
    assert!(out.is_empty(), "admitted, still held for the window");
    assert!(m.take_gather().is_some());
    m.on_gathered(&mut out);
    destination(&out[0]);
}

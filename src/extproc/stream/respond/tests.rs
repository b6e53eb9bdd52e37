//! The response tracker: usage read, model names restored, chunks passed through.

use super::*;
use envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;

fn bodies(out: &[ProcessingResponse]) -> Vec<u8> {
    let mut all = Vec::new();
    for r in out {
        let Some(Response::ResponseBody(b)) = &r.response else {
            panic!()
        };
        let Some(Mutation::StreamedResponse(s)) = &b
            .response
            .as_ref()
            .unwrap()
            .body_mutation
            .as_ref()
            .unwrap()
            .mutation
        else {
            panic!()
        };
        all.extend_from_slice(&s.body);
    }
    all
}

#[test]
fn restores_the_model_name_across_chunks_when_not_streaming() {
    let mut t = ResponseTracker::new(
        Some(200),
        Some("application/json"),
        false,
        Some(("m-v2", "m")),
    );
    let mut out = Vec::new();
    t.on_chunk(br#"{"model":"m-"#, false, &mut out);
    assert!(out.is_empty(), "held until the end");
    t.on_chunk(br#"v2","usage":{"prompt_tokens":5,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}"#, true, &mut out);
    assert_eq!(bodies(&out), br#"{"model":"m","usage":{"prompt_tokens":5,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}"#.to_vec());
    let s = t.summary(10);
    assert_eq!(
        (s.prompt_tokens, s.completion_tokens, s.cached_tokens),
        (Some(5), Some(2), Some(4))
    );
}

#[test]
fn reads_usage_from_grpc_messages_split_across_chunks() {
    // Vertex AI: an HttpBody whose data is the JSON.
    let json = br#"{"usage":{"prompt_tokens":6,"completion_tokens":2}}"#;
    let mut vertex = vec![0, 0, 0, 0, 2 + json.len() as u8, 0x12, json.len() as u8];
    vertex.extend_from_slice(json);
    // vLLM: a stream chunk, then the final message {prompt 7, completion 3, cached 4}.
    let vllm = [
        0, 0, 0, 0, 6, 0x0a, 0x04, 0x10, 7, 0x18, 1, 0, 0, 0, 0, 8, 0x12, 0x06, 0x18, 7, 0x20, 3,
        0x28, 4,
    ];
    for (body, want) in [(&vertex[..], (6, 2, None)), (&vllm[..], (7, 3, Some(4)))] {
        let mut t = ResponseTracker::new(Some(200), Some("application/grpc"), true, None);
        let mut out = Vec::new();
        for piece in body.chunks(3) {
            t.on_chunk(piece, false, &mut out);
        }
        t.on_chunk(b"", true, &mut out);
        let s = t.summary(0);
        let got = (s.prompt_tokens, s.completion_tokens, s.cached_tokens);
        assert_eq!(got, (Some(want.0), Some(want.1), want.2));
    }
}

#[test]
fn passes_sse_through_at_once_and_reads_final_usage() {
    let mut t = ResponseTracker::new(Some(200), Some("text/event-stream"), true, None);
    let mut out = Vec::new();
    t.on_chunk(
        b"data: {\"choices\":[{\"text\":\"a\"}]}\n\n",
        false,
        &mut out,
    );
    assert_eq!(out.len(), 1, "forwarded without waiting");
    t.on_chunk(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":3,\"prompt_token_details\":{\"cached_tokens\":8}}}\n\ndata: [DONE]\n\n", true, &mut out);
    let s = t.summary(0);
    assert_eq!(
        (s.prompt_tokens, s.completion_tokens, s.cached_tokens),
        (Some(9), Some(3), Some(8))
    );
    assert_eq!(s.status, Some(200));
    let (h, f, l) = (
        s.headers_at.unwrap(),
        s.first_body_at.unwrap(),
        s.last_body_at.unwrap(),
    );
    assert!(
        h <= f && f <= l,
        "headers, first chunk, last chunk in order"
    );
    assert!(!s.connect_failure);
}

#[test]
fn reads_usage_from_an_sse_line_split_across_chunks() {
    let line = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":4}}\r\n\r\ndata: [DONE]\r\n\r\n";
    for cuts in [(1, 2), (10, 30), (40, 41), (70, line.len() - 3)] {
        let mut t = ResponseTracker::new(Some(200), Some("text/event-stream"), true, None);
        let mut out = Vec::new();
        let first: &[u8] = b"data: {\"choices\":[{\"text\":\"usage\"}]}\n\n";
        t.on_chunk(first, false, &mut out);
        t.on_chunk(&line[..cuts.0], false, &mut out);
        t.on_chunk(&line[cuts.0..cuts.1], false, &mut out);
        t.on_chunk(&line[cuts.1..], true, &mut out);
        let s = t.summary(0);
        assert_eq!(
            (s.prompt_tokens, s.completion_tokens),
            (Some(12), Some(4)),
            "cut at {cuts:?}"
        );
        assert_eq!(
            bodies(&out),
            [first, &line[..]].concat(),
            "every byte forwarded"
        );
    }
}

#[test]
fn recognises_envoys_connect_failure_reply_and_nothing_else() {
    let envoy = b"upstream connect error or disconnect/reset before headers. reset reason: remote connection failure";
    let mut t = ResponseTracker::new(Some(503), Some("text/plain"), false, None);
    t.on_chunk(envoy, true, &mut Vec::new());
    assert!(t.summary(0).connect_failure);
    let mut t = ResponseTracker::new(Some(503), Some("application/json"), false, None);
    t.on_chunk(br#"{"error":"overloaded"}"#, true, &mut Vec::new());
    assert!(
        !t.summary(0).connect_failure,
        "a pod's own 503 is a 5xx, not a connection failure"
    );
    let mut t = ResponseTracker::new(Some(200), Some("text/plain"), false, None);
    t.on_chunk(envoy, true, &mut Vec::new());
    assert!(
        !t.summary(0).connect_failure,
        "a 200 quoting the text is an answer"
    );
}

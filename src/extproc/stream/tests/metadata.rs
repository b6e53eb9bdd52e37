//! The lifecycle plugins' response metadata (`request-attribute-reporter`) rides on the
//! response's last body message, as upstream attaches it, in every body mode.

use super::*;

const REPORTER: &str = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n- type: request-attribute-reporter\n  parameters:\n    attributes:\n    - key: {name: x-gateway-inference-request-cost}\n      expression: usage.prompt_tokens + usage.completion_tokens\n";

fn response_headers(content_type: &str) -> ProcessingRequest {
    let h = |k: &str, v: &str| HeaderValue {
        key: k.into(),
        raw_value: v.as_bytes().to_vec(),
        ..Default::default()
    };
    ProcessingRequest {
        request: Some(Request::ResponseHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![h(":status", "200"), h("content-type", content_type)],
            }),
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn response_body(b: &[u8], eos: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Request::ResponseBody(HttpBody {
            body: b.to_vec(),
            end_of_stream: eos,
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// The metadata of every response message after the headers' answer: the cost, if any.
fn costs(out: &[ProcessingResponse]) -> Vec<Option<f64>> {
    out.iter()
        .skip(1)
        .map(|r| {
            let lb = r
                .dynamic_metadata
                .as_ref()?
                .fields
                .get(wire::LB_NAMESPACE)?;
            let Some(Kind::StructValue(s)) = &lb.kind else {
                return None;
            };
            match s.fields.get("x-gateway-inference-request-cost")?.kind {
                Some(Kind::NumberValue(n)) => Some(n),
                _ => None,
            }
        })
        .collect()
}

fn answer(duplex: bool, content_type: &str, chunks: &[&[u8]]) -> Vec<ProcessingResponse> {
    let (mut m, pc, _) = machine_with_config(&[1], duplex, REPORTER);
    run(
        &mut m,
        vec![
            headers("/v1/chat/completions", false, Some(pc)),
            body(CHAT, true),
        ],
    );
    let mut msgs = vec![response_headers(content_type)];
    for (i, c) in chunks.iter().enumerate() {
        msgs.push(response_body(c, i + 1 == chunks.len()));
    }
    run(&mut m, msgs)
}

#[test]
fn the_cost_rides_on_the_last_body_message_only() {
    let json: [&[u8]; 2] = [
        br#"{"choices":[],"usage":{"prompt_tokens":5,"#,
        br#""completion_tokens":10,"total_tokens":15}}"#,
    ];
    assert_eq!(
        costs(&answer(true, "application/json", &json)),
        [None, Some(15.0)]
    );
    let whole = json.concat();
    assert_eq!(
        costs(&answer(false, "application/json", &[&whole])),
        [Some(15.0)]
    );
    let sse: [&[u8]; 3] = [
        b"data: {\"choices\":[{\"text\":\"a\"}]}\n\n",
        b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\n",
        b"data: [DONE]\n\n",
    ];
    assert_eq!(
        costs(&answer(true, "text/event-stream", &sse)),
        [None, None, Some(9.0)]
    );
}

#[test]
fn no_usage_reports_nothing() {
    // Upstream's counts are 0 without a usage object, and a 0 is not reported.
    let out = answer(true, "application/json", &[br#"{"choices":[]}"#]);
    assert_eq!(costs(&out), [None]);
}

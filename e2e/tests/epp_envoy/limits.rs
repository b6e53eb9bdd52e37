//! Request limits through Envoy: each refusal is an HTTP status with an OpenAI-shaped JSON body
//! naming the limit, and no pod is reached (body size, ext_proc messages per stream, header
//! bytes, JSON nesting, invalid UTF-8, chat `messages` count).

use harness::client::HttpResponse;
use harness::stack::StackOptions;
use http::StatusCode;

use super::early::{long_completion, HeldRequest};
use super::support::{args, completion, post, received_counts, start, MODEL};

fn assert_refused(response: &HttpResponse, status: StatusCode, names: &str) {
    assert_eq!(response.status, status, "{}", response.text());
    let body = response
        .json()
        .unwrap_or_else(|e| panic!("{e}: {}", response.text()));
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("inference error: "), "{message}");
    assert!(message.contains(names), "expected {names:?} in {message:?}");
    assert_eq!(body["error"]["code"], status.as_u16());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_size_message_count_and_header_bytes_have_limits() {
    let flags = [
        "--max-request-body-bytes",
        "50000",
        "--max-request-messages",
        "4",
        "--max-request-header-bytes",
        "4096",
    ];
    let stack = start(StackOptions {
        pods: 1,
        epp_args: args(&flags),
        ..StackOptions::default()
    })
    .await;
    let big = long_completion(100_000);
    let r = post(&stack, "/v1/completions", big, &[]).await;
    assert_refused(
        &r,
        StatusCode::PAYLOAD_TOO_LARGE,
        "request body exceeds 50000 bytes",
    );
    let huge = "h".repeat(10_000);
    let r = post(
        &stack,
        "/v1/completions",
        completion("hi"),
        &[("x-huge", &huge)],
    )
    .await;
    assert_refused(
        &r,
        StatusCode::from_u16(431).unwrap(),
        "request headers exceed 4096 bytes",
    );
    // A body within the size limit that reaches epp in more chunks than allowed.
    let body = long_completion(40_000);
    let held = HeldRequest::open(
        stack.envoy.listener_addr(),
        "/v1/completions",
        &[],
        body.len(),
        &body[..5],
    )
    .await;
    let mut held = held;
    let mut answer = None;
    for p in body[5..].chunks(8_000) {
        held = held.send(p).await;
        answer = held.response(std::time::Duration::from_millis(50)).await;
        if answer.is_some() {
            break;
        }
    }
    let (status, text) = answer.expect("refused before the body ended");
    assert_eq!(status, 413, "{text}");
    assert!(
        text.contains("request exceeds 4 ext_proc messages"),
        "{text}"
    );
    assert_eq!(received_counts(&stack), vec![0]);
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_json_is_a_400_naming_the_problem() {
    let stack = start(StackOptions {
        pods: 1,
        epp_args: args(&["--max-chat-messages", "10"]),
        ..StackOptions::default()
    })
    .await;
    let deep = format!(
        r#"{{"model":"{MODEL}","prompt":"x","extra":{}{}}}"#,
        "[".repeat(5000),
        "]".repeat(5000)
    );
    assert_refused(
        &post(&stack, "/v1/completions", deep, &[]).await,
        StatusCode::BAD_REQUEST,
        "nests JSON deeper than 128 levels",
    );
    let mut invalid = format!(r#"{{"model":"{MODEL}","prompt":"abc"#).into_bytes();
    invalid.extend_from_slice(&[0xff, 0xfe, b'"', b'}']);
    assert_refused(
        &post(&stack, "/v1/completions", invalid, &[]).await,
        StatusCode::BAD_REQUEST,
        "not valid UTF-8",
    );
    let messages: Vec<_> = (0..11)
        .map(|i| serde_json::json!({"role": "user", "content": format!("m{i}")}))
        .collect();
    let chat = serde_json::json!({"model": MODEL, "messages": messages}).to_string();
    assert_refused(
        &post(&stack, "/v1/chat/completions", chat, &[]).await,
        StatusCode::BAD_REQUEST,
        "more than 10 messages",
    );
    let ok: Vec<_> = messages_of(10);
    let chat = serde_json::json!({"model": MODEL, "messages": ok}).to_string();
    assert_eq!(
        post(&stack, "/v1/chat/completions", chat, &[]).await.status,
        StatusCode::OK
    );
    assert_eq!(
        received_counts(&stack),
        vec![1],
        "only the acceptable request reached the pod"
    );
    stack.stop().await;
}

fn messages_of(n: usize) -> Vec<serde_json::Value> {
    (0..n)
        .map(|i| serde_json::json!({"role": "user", "content": format!("m{i}")}))
        .collect()
}

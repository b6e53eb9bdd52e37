//! The early decision through Envoy (issue #8): with a long prompt epp routes once the model and
//! the prompt prefix are in, Envoy opens the upstream request while the client is still
//! sending, and the pod receives the client's bytes exactly (with the model rewritten in
//! place when asked). A body that turns out invalid after the decision reaches the pod, which
//! answers the error; with `--early-decision=false` epp still judges the whole body.
//!
//! The client here is a raw HTTP/1.1 writer so that the test controls when the rest of the
//! body is sent. epp runs upstream's default configuration here: the decision waits for as much
//! prompt text as the prefix index reads (`prefix-cache-scorer`'s 256 blocks, about 32 KiB),
//! where the built-in default's index reads up to 32,768 tokens (256 KiB), more than the part
//! of the body these tests hold back.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use harness::stack::{Stack, StackOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::support::{access_log, long_context, start, traffic, MODEL};
use harness::envoy::repo_root;

/// epp's flags: upstream's default configuration (see the module docs), then `extra`.
fn upstream_default(extra: &[&str]) -> Vec<String> {
    let config = repo_root().join("config/examples/upstream-default.yaml");
    let mut a = vec![format!("--config-file={}", config.display())];
    a.extend(extra.iter().map(|f| (*f).to_owned()));
    a
}

const UPSTREAM_REQUESTS: &str = "cluster.original_destination_cluster.upstream_rq_total";

/// An HTTP/1.1 request whose body the test sends in parts.
pub struct HeldRequest {
    stream: TcpStream,
}

impl HeldRequest {
    /// Sends the request head (with `Content-Length: body_len`) and the first part of the body.
    pub async fn open(
        addr: SocketAddr,
        path: &str,
        headers: &[(&str, &str)],
        body_len: usize,
        first: &[u8],
    ) -> Self {
        let mut head = format!("POST {path} HTTP/1.1\r\nhost: epp\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {body_len}\r\n");
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(first).await.unwrap();
        Self { stream }
    }

    /// Sends another part of the body.
    pub async fn send(mut self, part: &[u8]) -> Self {
        // Envoy may already have answered (a refusal) and closed: the response tells.
        let _ = self.stream.write_all(part).await;
        self
    }

    /// Sends the rest of the body and reads the response: status and body text.
    pub async fn finish(mut self, rest: &[u8]) -> (u16, String) {
        let _ = self.stream.write_all(rest).await;
        self.response(Duration::from_secs(20))
            .await
            .unwrap_or_default()
    }

    /// The response if one arrives within `wait`: status and body text. A refusal may come
    /// while the client is still sending, and Envoy then resets the connection after the
    /// response: what was read counts.
    pub async fn response(&mut self, wait: Duration) -> Option<(u16, String)> {
        let mut raw = Vec::new();
        let mut buf = [0u8; 8192];
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match tokio::time::timeout_at(deadline, self.stream.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => raw.extend_from_slice(&buf[..n]),
                Ok(_) => break,
                Err(_) if raw.is_empty() => return None,
                Err(_) => break,
            }
        }
        let text = String::from_utf8_lossy(&raw).into_owned();
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Some((status, body))
    }
}

/// A completion body with a `prompt_bytes` prompt; the model first, `stream` last.
pub fn long_completion(prompt_bytes: usize) -> Vec<u8> {
    let prompt = super::support::words(7, prompt_bytes / 7);
    format!(
        r#"{{ "model" : "{MODEL}", "prompt": {}, "max_tokens": 3, "stream": false }}"#,
        serde_json::to_string(&prompt).unwrap()
    )
    .into_bytes()
}

async fn upstream_requests(stack: &Stack) -> u64 {
    stack
        .envoy
        .counter(UPSTREAM_REQUESTS)
        .await
        .unwrap()
        .unwrap_or(0)
}

/// Polls until Envoy has opened `n` upstream requests (bounded); whether it did.
pub async fn wait_upstream(stack: &Stack, n: u64, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if upstream_requests(stack).await >= n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_is_reached_before_the_client_has_sent_the_whole_body() {
    let stack = start(StackOptions {
        pods: 2,
        pod_config: long_context(&[]),
        epp_args: upstream_default(&[]),
        ..StackOptions::default()
    })
    .await;
    let body = long_completion(300_000);
    let held = HeldRequest::open(
        stack.envoy.listener_addr(),
        "/v1/completions",
        &[],
        body.len(),
        &body[..120_000],
    )
    .await;
    assert!(
        wait_upstream(&stack, 1, Duration::from_secs(10)).await,
        "Envoy never opened the upstream request while the body was incomplete"
    );
    let (status, text) = held.finish(&body[120_000..]).await;
    assert_eq!(status, 200, "{text}");
    let received: Vec<_> = stack.pods.iter().flat_map(traffic).collect();
    assert_eq!(received.len(), 1);
    assert_eq!(
        received[0].body.as_ref(),
        body.as_slice(),
        "the pod got the client's bytes exactly"
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_early_decision_off_the_gateway_waits_for_the_whole_body() {
    let stack = start(StackOptions {
        pods: 2,
        pod_config: long_context(&[]),
        epp_args: upstream_default(&["--early-decision=false"]),
        ..StackOptions::default()
    })
    .await;
    let body = long_completion(300_000);
    let held = HeldRequest::open(
        stack.envoy.listener_addr(),
        "/v1/completions",
        &[],
        body.len(),
        &body[..120_000],
    )
    .await;
    assert!(
        !wait_upstream(&stack, 1, Duration::from_millis(500)).await,
        "routed before the body ended"
    );
    let (status, text) = held.finish(&body[120_000..]).await;
    assert_eq!(status, 200, "{text}");
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_model_rewrite_is_byte_exact_with_the_right_length() {
    let stack = start(StackOptions {
        pods: 1,
        pod_config: long_context(&["test-model-rewritten"]),
        epp_args: upstream_default(&[]),
        ..StackOptions::default()
    })
    .await;
    let body = long_completion(200_000);
    let headers = [("x-gateway-model-name-rewrite", "test-model-rewritten")];
    let held = HeldRequest::open(
        stack.envoy.listener_addr(),
        "/v1/completions",
        &headers,
        body.len(),
        &body[..80_000],
    )
    .await;
    assert!(wait_upstream(&stack, 1, Duration::from_secs(10)).await);
    let (status, text) = held.finish(&body[80_000..]).await;
    assert_eq!(status, 200, "{text}");
    let expected = String::from_utf8(body).unwrap().replacen(
        &format!("\"{MODEL}\""),
        "\"test-model-rewritten\"",
        1,
    );
    let got = &traffic(&stack.pods[0])[0];
    assert_eq!(got.body.as_ref(), expected.as_bytes());
    if let Some(len) = got.header("content-length") {
        assert_eq!(
            len,
            expected.len().to_string(),
            "content-length follows the rewrite"
        );
    }
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_broken_after_the_decision_is_answered_by_the_pod() {
    let mut body = long_completion(100_000);
    body.truncate(body.len() - 2);
    body.extend_from_slice(b",,, not json");
    let stack = start(StackOptions {
        pods: 1,
        epp_args: upstream_default(&[]),
        ..StackOptions::default()
    })
    .await;
    let held = HeldRequest::open(
        stack.envoy.listener_addr(),
        "/v1/completions",
        &[],
        body.len(),
        &body[..60_000],
    )
    .await;
    // The rest is sent once routed (sent at once, Envoy may read the whole body as one chunk,
    // and a one-chunk body is judged whole by epp).
    assert!(wait_upstream(&stack, 1, Duration::from_secs(10)).await);
    let (status, text) = held.finish(&body[60_000..]).await;
    assert_eq!(status, 400, "{text}");
    assert!(
        !text.contains("inference error"),
        "the model server, not epp, answered: {text}"
    );
    assert_eq!(
        access_log(&stack, 1).await[0].upstream.as_deref(),
        Some(stack.pods[0].endpoint().as_str())
    );
    stack.stop().await;
    let stack = start(StackOptions {
        pods: 1,
        epp_args: upstream_default(&["--early-decision=false"]),
        ..StackOptions::default()
    })
    .await;
    let held = HeldRequest::open(
        stack.envoy.listener_addr(),
        "/v1/completions",
        &[],
        body.len(),
        &body[..60_000],
    )
    .await;
    let (status, text) = held.finish(&body[60_000..]).await;
    assert_eq!(status, 400);
    assert!(text.contains("inference error: BadRequest"), "{text}");
    stack.stop().await;
}

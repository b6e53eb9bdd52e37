//! Sends one streaming OpenAI request and times it: time to first token, the gap between every
//! two tokens, end-to-end latency, and what the final usage chunk reports (prompt, output and
//! cached tokens). The serving pod is read from the `x-inference-pod` response header that
//! inference-sim sets (routers that drop response headers leave it unknown).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;

/// A pooled HTTP/1.1 client (keep-alive connections, reused across requests).
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Builds the shared client; idle connections are kept for reuse.
pub fn client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(4096)
        .build(connector)
}

/// What came back for one request.
#[derive(Debug, Default)]
pub struct Outcome {
    /// HTTP status; 0 when no response arrived.
    pub status: u16,
    pub ttft: Option<Duration>,
    pub e2e: Duration,
    /// Gaps between consecutive token events.
    pub itls: Vec<Duration>,
    pub output_tokens: u64,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    pub pod: Option<String>,
    /// Generated text (kept for chat sessions, which resend it).
    pub text: String,
    pub error: Option<String>,
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Choice {
    text: Option<String>,
    delta: Option<Delta>,
}

#[derive(Deserialize)]
struct Delta {
    content: Option<String>,
}

#[derive(Deserialize)]
struct Usage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    prompt_tokens_details: Option<Details>,
}

#[derive(Deserialize)]
struct Details {
    cached_tokens: Option<u64>,
}

/// Tracks token arrivals while the SSE stream is read.
struct Timer {
    start: Instant,
    last: Option<Instant>,
    keep_text: bool,
}

impl Timer {
    fn on_event(&mut self, data: &[u8], out: &mut Outcome) {
        let Ok(chunk) = serde_json::from_slice::<Chunk>(data) else {
            return;
        };
        if let Some(u) = chunk.usage {
            out.prompt_tokens = u.prompt_tokens;
            out.output_tokens = u.completion_tokens.unwrap_or(out.output_tokens);
            out.cached_tokens = u.prompt_tokens_details.and_then(|d| d.cached_tokens);
        }
        let Some(choice) = chunk.choices.into_iter().next() else {
            return;
        };
        let text = choice
            .text
            .or_else(|| choice.delta.and_then(|d| d.content))
            .unwrap_or_default();
        if text.is_empty() {
            return;
        }
        let now = Instant::now();
        match self.last {
            None => out.ttft = Some(now - self.start),
            Some(prev) => out.itls.push(now - prev),
        }
        self.last = Some(now);
        out.output_tokens += 1;
        if self.keep_text {
            out.text.push_str(&text);
        }
    }
}

/// POSTs `body` to `path` on `target` and reads the SSE stream to its end.
pub async fn send(
    client: &HttpClient,
    target: SocketAddr,
    path: &str,
    body: Bytes,
    keep_text: bool,
) -> Outcome {
    let start = Instant::now();
    let mut out = Outcome::default();
    if let Err(e) = exchange(client, target, path, body, keep_text, start, &mut out).await {
        out.error = Some(e);
    }
    out.e2e = start.elapsed();
    out
}

async fn exchange(
    client: &HttpClient,
    target: SocketAddr,
    path: &str,
    body: Bytes,
    keep_text: bool,
    start: Instant,
    out: &mut Outcome,
) -> Result<(), String> {
    let req = Request::builder()
        .method(Method::POST)
        .uri(format!("http://{target}{path}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let resp = client
        .request(req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    out.status = resp.status().as_u16();
    out.pod = resp
        .headers()
        .get("x-inference-pod")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let ok = resp.status().is_success();
    let mut body = resp.into_body();
    let mut timer = Timer {
        start,
        last: None,
        keep_text,
    };
    let mut buf: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("body: {e}"))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        drain_events(&mut buf, |event| timer.on_event(event, out));
    }
    if !ok {
        return Err(format!(
            "status {}: {}",
            out.status,
            String::from_utf8_lossy(&buf)
                .chars()
                .take(200)
                .collect::<String>()
        ));
    }
    Ok(())
}

/// Calls `f` with the payload of every complete `data:` event in `buf` and removes them.
fn drain_events(buf: &mut Vec<u8>, mut f: impl FnMut(&[u8])) {
    let mut consumed = 0;
    while let Some(end) = find(&buf[consumed..], b"\n\n") {
        let event = &buf[consumed..consumed + end];
        for line in event.split(|&b| b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Some(data) = line.strip_prefix(b"data:") {
                let data = data.strip_prefix(b" ").unwrap_or(data);
                if data != b"[DONE]" {
                    f(data);
                }
            }
        }
        consumed += end + 2;
    }
    buf.drain(..consumed);
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complete_events_are_delivered_and_partial_ones_kept() {
        let mut buf = b"data: {\"a\":1}\n\ndata: [DONE]\n\ndata: {\"b\"".to_vec();
        let mut seen = Vec::new();
        drain_events(&mut buf, |e| {
            seen.push(String::from_utf8_lossy(e).into_owned())
        });
        assert_eq!(seen, vec!["{\"a\":1}"]);
        assert_eq!(buf, b"data: {\"b\"");
    }

    #[test]
    fn token_events_set_ttft_and_gaps_and_usage_sets_cached_tokens() {
        let mut out = Outcome::default();
        let mut t = Timer {
            start: Instant::now(),
            last: None,
            keep_text: true,
        };
        t.on_event(br#"{"choices":[{"text":" a"}]}"#, &mut out);
        t.on_event(br#"{"choices":[{"delta":{"content":" b"}}]}"#, &mut out);
        t.on_event(br#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":8}}}"#, &mut out);
        assert!(out.ttft.is_some());
        assert_eq!(
            (
                out.itls.len(),
                out.output_tokens,
                out.cached_tokens,
                out.prompt_tokens
            ),
            (1, 2, Some(8), Some(9))
        );
        assert_eq!(out.text, " a b");
    }
}

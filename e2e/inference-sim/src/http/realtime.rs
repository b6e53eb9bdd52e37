//! vLLM's Realtime API, `GET /v1/realtime` upgraded to a WebSocket, as far as a router test needs
//! it: the handshake (101 with the RFC 6455 `Sec-WebSocket-Accept`), vLLM's event flow and the
//! close handshake.
//!
//! vLLM (`vllm/entrypoints/speech_to_text/realtime/api_router.py`): the server sends
//! `session.created` on connect; the client may send `session.update` (model), then
//! `input_audio_buffer.append` events (base64 PCM16, 16 kHz mono) and `input_audio_buffer.commit`;
//! the server answers a commit with `transcription.delta` events and `transcription.done` (the
//! text and its usage); a bad event gets an `error` event and the session stays open.
//!
//! Simplified (honestly): the transcript is filler, computed here without the engine (a session
//! is not in `vllm:num_requests_running`); one input token per 80 ms of audio (1,280 samples, a
//! 12.5 Hz audio encoder); every server event also names the pod (`inference_pod`, like the
//! `x-inference-pod` header), so a test sees which pod served the session. A session is counted
//! where every request is: the test hook records the upgrade request.
//!
//! Ownership: hyper hands the connection over after the 101; the handler leaves the session in
//! the connection's [`UpgradeSlot`] and the connection's own task runs it (`pod::serve`), so a
//! stopped pod drops its sessions with its connections, as a crashed vLLM would.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{SinkExt, StreamExt};
use http::{header, HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

use super::{Body, PodState, ReqBody};
use crate::openai::ApiError;

/// The route.
pub const PATH: &str = "/v1/realtime";

/// Largest client message (and frame) a session accepts; a larger one closes the session with
/// status 1009 (message too big).
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;

/// PCM16 bytes per input token: 80 ms of 16 kHz mono audio.
const BYTES_PER_TOKEN: usize = 1_280 * 2;

/// Where a connection's upgraded session waits: the connection puts one in every request's
/// extensions, the handler fills it, and the connection runs it once hyper lets go of the socket.
#[derive(Clone, Default)]
pub struct UpgradeSlot(Arc<Mutex<Option<BoxFuture<'static, ()>>>>);

impl UpgradeSlot {
    /// The session left by the handler, if the connection was upgraded.
    pub fn take(&self) -> Option<BoxFuture<'static, ()>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    fn put(&self, session: BoxFuture<'static, ()>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(session);
    }
}

/// Answers the upgrade request: 101 and a session, or why not. A plain GET is a 404, as on vLLM
/// (a WebSocket route matches no HTTP request).
pub fn accept(
    state: &Arc<PodState>,
    mut req: Request<ReqBody>,
) -> Result<Response<Body>, ApiError> {
    let headers = req.headers();
    if !has_token(headers, header::UPGRADE, "websocket") {
        return Err(ApiError::NoRoute);
    }
    if req.version() != http::Version::HTTP_11 {
        let msg = "a WebSocket upgrade needs HTTP/1.1 (RFC 6455)";
        return Err(ApiError::BadRequest(msg.into()));
    }
    if !has_token(headers, header::CONNECTION, "upgrade") {
        return Err(ApiError::BadRequest(
            "`Connection: upgrade` is required".into(),
        ));
    }
    if headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .map(HeaderValue::as_bytes)
        != Some(b"13")
    {
        return Ok(version_required());
    }
    let key = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .ok_or_else(|| ApiError::BadRequest("`Sec-WebSocket-Key` is required".into()))?;
    let accept_key = derive_accept_key(key.as_bytes());
    let slot = req
        .extensions()
        .get::<UpgradeSlot>()
        .cloned()
        .ok_or(ApiError::Unavailable("this connection cannot be upgraded"))?;
    let upgrade = hyper::upgrade::on(&mut req);
    let session = Session::new(state);
    slot.put(Box::pin(async move {
        match upgrade.await {
            Ok(upgraded) => session.run(TokioIo::new(upgraded)).await,
            Err(e) => tracing::debug!(error = %e, "realtime upgrade failed"),
        }
    }));
    let mut resp = Response::new(Full::new(Bytes::new()).boxed());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(v) = HeaderValue::from_str(&accept_key) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    Ok(resp)
}

/// Whether a comma-separated header lists `token` (case-insensitive).
fn has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|v| {
        v.to_str()
            .is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    })
}

/// RFC 6455 §4.4: an unsupported version is a 426 naming the version served.
fn version_required() -> Response<Body> {
    let mut resp = super::full(
        StatusCode::UPGRADE_REQUIRED,
        "text/plain",
        "Sec-WebSocket-Version 13 is required",
    );
    resp.headers_mut().insert(
        header::SEC_WEBSOCKET_VERSION,
        HeaderValue::from_static("13"),
    );
    resp
}

/// One session's state: the events it answers, apart from the socket.
#[derive(Debug)]
pub struct Session {
    id: String,
    pod: String,
    /// The base model and the LoRA adapters loaded when the session started.
    served: Vec<String>,
    model: String,
    /// Audio bytes appended since the last commit.
    buffered: usize,
    created: u64,
}

impl Session {
    fn new(state: &PodState) -> Self {
        let n = state
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut served = vec![state.cfg.engine.model.clone()];
        let loras = state.loras.lock().unwrap_or_else(|e| e.into_inner());
        served.extend(loras.loaded().iter().map(|l| l.name.clone()));
        Self::with(
            format!("sess-{}-{n}", state.cfg.pod_name),
            &state.cfg.pod_name,
            served,
            state.clock.unix(tokio::time::Instant::now()) as u64,
        )
    }

    /// A session of `pod` serving `served` (the first is the default model).
    pub fn with(id: String, pod: &str, served: Vec<String>, created: u64) -> Self {
        let model = served.first().cloned().unwrap_or_default();
        Self {
            id,
            pod: pod.to_owned(),
            served,
            model,
            buffered: 0,
            created,
        }
    }

    /// The first server event.
    pub fn created(&self) -> Value {
        self.event(
            json!({"type": "session.created", "id": self.id, "created": self.created,
            "model": self.model}),
        )
    }

    /// The server events answering one client text message.
    pub fn on_text(&mut self, text: &str) -> Vec<Value> {
        let event: Value = match serde_json::from_str(text) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => return vec![self.error("event must be a JSON object", "invalid_event")],
            Err(e) => return vec![self.error(&format!("invalid JSON: {e}"), "invalid_json")],
        };
        match event["type"].as_str() {
            Some("session.update") => self.update(&event),
            Some("input_audio_buffer.append") => self.append(&event),
            Some("input_audio_buffer.commit") => self.commit(),
            Some(other) => {
                vec![self.error(&format!("Unknown event type: {other}"), "unknown_event")]
            }
            None => vec![self.error("`type` is required", "invalid_event")],
        }
    }

    fn update(&mut self, event: &Value) -> Vec<Value> {
        let Some(model) = event["model"].as_str() else {
            return Vec::new();
        };
        if !self.served.iter().any(|m| m == model) {
            let msg = format!("The model `{model}` does not exist.");
            return vec![self.error(&msg, "model_not_found")];
        }
        self.model = model.to_owned();
        Vec::new()
    }

    fn append(&mut self, event: &Value) -> Vec<Value> {
        match event["audio"].as_str().map(base64_len) {
            Some(Some(bytes)) => {
                self.buffered += bytes;
                Vec::new()
            }
            Some(None) => vec![self.error("`audio` is not base64", "invalid_audio")],
            None => vec![self.error("`audio` is required", "invalid_audio")],
        }
    }

    fn commit(&mut self) -> Vec<Value> {
        let tokens = self.buffered.div_ceil(BYTES_PER_TOKEN);
        self.buffered = 0;
        let words: Vec<&str> = (0..tokens.min(64)).map(|_| "word").collect();
        let text = words.join(" ");
        let mut out = Vec::new();
        if !text.is_empty() {
            out.push(self.event(json!({"type": "transcription.delta", "delta": text})));
        }
        let usage = json!({"input_tokens": tokens, "output_tokens": words.len(),
            "total_tokens": tokens + words.len()});
        out.push(self.event(json!({"type": "transcription.done", "text": text, "usage": usage})));
        out
    }

    fn error(&self, message: &str, code: &str) -> Value {
        self.event(json!({"type": "error", "error": message, "code": code}))
    }

    fn event(&self, mut v: Value) -> Value {
        v["inference_pod"] = json!(self.pod);
        v
    }

    /// Serves the session on the upgraded connection until the client closes it (the reply
    /// to its Close frame is sent, then the connection is closed: the server closes first).
    async fn run<S>(mut self, io: S)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let config = WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE_BYTES))
            .max_frame_size(Some(MAX_MESSAGE_BYTES));
        let mut ws = WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await;
        if send(&mut ws, self.created()).await.is_err() {
            return;
        }
        while let Some(message) = ws.next().await {
            let replies = match message {
                Ok(Message::Text(text)) => self.on_text(text.as_str()),
                Ok(Message::Binary(_)) => {
                    vec![self.error("binary frames are not supported", "invalid_event")]
                }
                Ok(_) => Vec::new(), // ping (pong is automatic), pong, close (reply is automatic)
                Err(WsError::Capacity(e)) => {
                    tracing::debug!(session = %self.id, error = %e, "realtime message too big");
                    return close_too_big(ws).await;
                }
                Err(e) => {
                    tracing::debug!(session = %self.id, error = %e, "realtime session ended");
                    return;
                }
            };
            for reply in replies {
                if send(&mut ws, reply).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Ends a session whose client sent a message over [`MAX_MESSAGE_BYTES`]: a Close frame with
/// 1009, then the rest of what the client sends is read and dropped (until it goes quiet for
/// 100 ms, closes, or 2 s pass) so that closing the socket does not reset it under the Close
/// frame (a socket closed with unread input sends RST, and the peer may lose what preceded it).
async fn close_too_big<S>(mut ws: WebSocketStream<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncReadExt;
    let frame = CloseFrame {
        code: CloseCode::Size,
        reason: "message too big".into(),
    };
    if ws.close(Some(frame)).await.is_err() {
        return;
    }
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
    let quiet = std::time::Duration::from_millis(100);
    let mut buf = vec![0u8; 64 << 10];
    while tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(quiet, ws.get_mut().read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return,
        }
    }
}

async fn send<S>(ws: &mut WebSocketStream<S>, event: Value) -> Result<(), ()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    ws.send(Message::text(event.to_string()))
        .await
        .map_err(|e| tracing::debug!(error = %e, "realtime send failed"))
}

/// The decoded length of standard base64 (padding optional), or `None` if it is not base64.
fn base64_len(s: &str) -> Option<usize> {
    let body = s.trim_end_matches('=');
    let padding = s.len() - body.len();
    let alphabet = |b: u8| b.is_ascii_alphanumeric() || b == b'+' || b == b'/';
    if padding > 2 || !body.bytes().all(alphabet) || body.len() % 4 == 1 {
        return None;
    }
    if padding > 0 && !s.len().is_multiple_of(4) {
        return None;
    }
    Some(body.len() * 3 / 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> Session {
        Session::with(
            "sess-1".into(),
            "pod-a",
            vec!["base".into(), "lora-x".into()],
            7,
        )
    }

    #[test]
    fn the_first_event_is_session_created_naming_the_pod_and_the_model() {
        let created = session().created();
        assert_eq!(created["type"], "session.created");
        assert_eq!(created["id"], "sess-1");
        assert_eq!(created["model"], "base");
        assert_eq!(created["inference_pod"], "pod-a");
    }

    #[test]
    fn a_commit_transcribes_the_appended_audio_and_empties_the_buffer() {
        let mut s = session();
        let audio = "AAAA".repeat(1_280); // 3,840 bytes: two tokens of 2,560
        let append = json!({"type": "input_audio_buffer.append", "audio": audio}).to_string();
        assert!(s.on_text(&append).is_empty());
        let out = s.on_text(r#"{"type":"input_audio_buffer.commit"}"#);
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(out[0]["type"], "transcription.delta");
        assert_eq!(out[1]["type"], "transcription.done");
        assert_eq!(out[1]["usage"]["input_tokens"], 2);
        assert_eq!(out[1]["text"], "word word");
        assert_eq!(out[1]["inference_pod"], "pod-a");
        let again = s.on_text(r#"{"type":"input_audio_buffer.commit","final":true}"#);
        assert_eq!(again.len(), 1);
        assert_eq!(again[0]["usage"]["input_tokens"], 0);
    }

    #[test]
    fn bad_events_get_error_events_and_the_session_goes_on() {
        let mut s = session();
        let cases = [
            ("not json", "invalid_json"),
            ("[1]", "invalid_event"),
            (r#"{"no":"type"}"#, "invalid_event"),
            (r#"{"type":"response.create"}"#, "unknown_event"),
            (r#"{"type":"input_audio_buffer.append"}"#, "invalid_audio"),
            (
                r#"{"type":"input_audio_buffer.append","audio":"ab$c"}"#,
                "invalid_audio",
            ),
            (
                r#"{"type":"session.update","model":"other"}"#,
                "model_not_found",
            ),
        ];
        for (text, code) in cases {
            let out = s.on_text(text);
            assert_eq!(out.len(), 1, "{text}");
            assert_eq!(
                (out[0]["type"].as_str(), out[0]["code"].as_str()),
                (Some("error"), Some(code)),
                "{text}"
            );
        }
        assert!(s
            .on_text(r#"{"type":"session.update","model":"lora-x"}"#)
            .is_empty());
        assert_eq!(s.model, "lora-x");
    }

    #[test]
    fn base64_lengths_follow_the_padding() {
        assert_eq!(base64_len(""), Some(0));
        assert_eq!(base64_len("QQ=="), Some(1));
        assert_eq!(base64_len("QUI="), Some(2));
        assert_eq!(base64_len("QUJD"), Some(3));
        assert_eq!(base64_len("QUJDRA"), Some(4));
        assert_eq!(base64_len("Q"), None);
        assert_eq!(base64_len("QQ==="), None);
        assert_eq!(base64_len("QUJDRA="), None);
    }

    /// A pod on 127.0.0.1:0 and a TCP connection to it.
    async fn pod() -> (crate::Pod, tokio::net::TcpStream) {
        let cfg = crate::PodConfig {
            pod_name: "pod-ws".into(),
            ..crate::PodConfig::default()
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let faults = crate::FaultSwitch::new(cfg.faults.clone());
        let pod = crate::Pod::start(listener, Arc::new(cfg), faults)
            .await
            .unwrap();
        let tcp = tokio::net::TcpStream::connect(pod.addr()).await.unwrap();
        (pod, tcp)
    }

    async fn next_event<S>(ws: &mut WebSocketStream<S>) -> Value
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let wait = std::time::Duration::from_secs(5);
        let message = tokio::time::timeout(wait, ws.next()).await.unwrap();
        match message {
            Some(Ok(Message::Text(t))) => serde_json::from_str(t.as_str()).unwrap(),
            other => panic!("expected a text event, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_session_upgrades_answers_events_and_closes_with_the_handshake() {
        let (pod, tcp) = pod().await;
        let url = format!("ws://{}/v1/realtime?model=m", pod.addr());
        let (mut ws, resp) = tokio_tungstenite::client_async(url, tcp).await.unwrap();
        assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(resp.headers()["x-inference-pod"], "pod-ws");
        let created = next_event(&mut ws).await;
        assert_eq!(
            (created["type"].as_str(), created["inference_pod"].as_str()),
            (Some("session.created"), Some("pod-ws"))
        );
        let append = json!({"type": "input_audio_buffer.append", "audio": "AAAA".repeat(900)});
        ws.send(Message::text(append.to_string())).await.unwrap();
        ws.send(Message::text(r#"{"type":"input_audio_buffer.commit"}"#))
            .await
            .unwrap();
        assert_eq!(next_event(&mut ws).await["type"], "transcription.delta");
        let done = next_event(&mut ws).await;
        assert_eq!(done["usage"]["input_tokens"], 2, "{done}");
        ws.close(None).await.unwrap();
        // The server answers the Close frame and closes the connection: the stream ends.
        let wait = std::time::Duration::from_secs(5);
        while let Some(m) = tokio::time::timeout(wait, ws.next()).await.unwrap() {
            assert!(matches!(m, Ok(Message::Close(_))), "{m:?}");
        }
        pod.stop().await;
    }

    #[tokio::test]
    async fn a_message_over_the_limit_closes_the_session_with_1009() {
        let (pod, tcp) = pod().await;
        let url = format!("ws://{}/v1/realtime", pod.addr());
        let (mut ws, _) = tokio_tungstenite::client_async(url, tcp).await.unwrap();
        next_event(&mut ws).await;
        ws.send(Message::text("x".repeat(MAX_MESSAGE_BYTES + 1)))
            .await
            .unwrap();
        let wait = std::time::Duration::from_secs(5);
        let reply = tokio::time::timeout(wait, ws.next()).await.unwrap();
        match reply {
            Some(Ok(Message::Close(Some(frame)))) => assert_eq!(u16::from(frame.code), 1009),
            other => panic!("expected a Close frame with 1009, got {other:?}"),
        }
        pod.stop().await;
    }

    #[tokio::test]
    async fn a_plain_get_is_a_404_and_a_wrong_version_a_426() {
        let (pod, tcp) = pod().await;
        let request = http::Request::get(format!("ws://{}/v1/realtime", pod.addr()))
            .header("host", pod.addr().to_string())
            .header("connection", "Upgrade")
            .header("upgrade", "websocket")
            .header("sec-websocket-version", "8")
            .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
            .body(())
            .unwrap();
        match tokio_tungstenite::client_async(request, tcp).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                assert_eq!(resp.status(), StatusCode::UPGRADE_REQUIRED);
                assert_eq!(resp.headers()["sec-websocket-version"], "13");
            }
            other => panic!("expected a 426, got {other:?}"),
        }
        let mut tcp = tokio::net::TcpStream::connect(pod.addr()).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        tcp.write_all(b"GET /v1/realtime HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
        pod.stop().await;
    }

    #[tokio::test]
    async fn an_upgrade_over_http_1_0_is_a_400() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (pod, mut tcp) = pod().await;
        let request = "GET /v1/realtime HTTP/1.0\r\nconnection: upgrade\r\nupgrade: websocket\r\n\
            sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
        tcp.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.0 400"), "{answer}");
        assert!(answer.contains("needs HTTP/1.1"), "{answer}");
        pod.stop().await;
    }

    #[test]
    fn upgrade_and_connection_tokens_are_matched_in_lists_and_any_case() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("WebSocket"));
        assert!(has_token(&h, header::CONNECTION, "upgrade"));
        assert!(has_token(&h, header::UPGRADE, "websocket"));
        assert!(!has_token(&h, header::UPGRADE, "h2c"));
    }
}

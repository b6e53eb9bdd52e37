//! The e2e harness against a real Envoy 1.40: Envoy + the noop ext_proc server (in process) +
//! two recording inference-sim pods, for every shipped config. These fail, not skip, when Envoy is not
//! installed: run `hack/install-envoy.sh`.

use std::time::Duration;

use bytes::Bytes;
use harness::client;
use harness::envoy::{AccessLogEntry, Envoy, EnvoyConfig, Template};
use harness::noop_extproc::{self_signed_identity, NoopExtProc};
use harness::server::ServerHandle;
use harness::sim_pod::{test_pod_config, with_long_context, SimPod};
use http::{Method, StatusCode};
use inference_sim::{PodConfig, Tokenizer, TokenizerKind};
use tokio::net::TcpListener;

const LOG_WAIT: Duration = Duration::from_secs(5);

/// Envoy in front of two pods, routed by the noop ext_proc server (round robin from pod-a).
struct Stack {
    envoy: Envoy,
    pods: Vec<SimPod>,
    _epp: Option<ServerHandle>,
}

impl Stack {
    async fn start(template: Template) -> Self {
        Self::start_with(template, false, |cfg| cfg, |opts| opts).await
    }

    /// `tls`: TLS between Envoy and the ext_proc server; `envoy` and `opts` adjust the Envoy
    /// config and each pod's configuration.
    async fn start_with(
        template: Template,
        tls: bool,
        envoy: impl FnOnce(EnvoyConfig) -> EnvoyConfig,
        opts: impl Fn(PodConfig) -> PodConfig,
    ) -> Self {
        let mut pods = Vec::new();
        for name in ["pod-a", "pod-b"] {
            pods.push(
                SimPod::bind(opts(test_pod_config(name)))
                    .await
                    .expect("start pod"),
            );
        }
        let mut config = EnvoyConfig::new(template.clone()).pool(pods.iter().map(SimPod::addr));
        let epp = if template.uses_ext_proc() {
            let listener = TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind ext_proc");
            let identity = tls.then(|| self_signed_identity().expect("certificate"));
            let noop = NoopExtProc::new(pods.iter().map(SimPod::endpoint));
            let handle = noop.start(listener, identity).expect("start noop ext_proc");
            config = config.epp(handle.addr()).epp_tls(tls);
            Some(handle)
        } else {
            None
        };
        let envoy = envoy(config)
            .start()
            .await
            .unwrap_or_else(|err| panic!("{err}"));
        Self {
            envoy,
            pods,
            _epp: epp,
        }
    }

    async fn post(&self, path: &str, body: &'static str) -> client::HttpResponse {
        client::post_json(self.envoy.listener_addr(), path, body)
            .await
            .expect("request through envoy")
    }

    fn pod(&self, name: &str) -> &SimPod {
        self.pods
            .iter()
            .find(|p| p.name() == name)
            .expect("known pod")
    }

    async fn access_log(&self, count: usize) -> Vec<AccessLogEntry> {
        self.envoy
            .wait_for_access_log(count, LOG_WAIT)
            .await
            .expect("access log")
    }

    /// The access log shows one 200 per pod, in pod order, routed by header and metadata.
    async fn assert_logged_in_turn(&self) {
        let log = self.access_log(self.pods.len()).await;
        for (entry, pod) in log.iter().zip(&self.pods) {
            let endpoint = Some(pod.endpoint());
            assert_eq!(entry.status, 200, "{}", entry.line);
            assert_eq!(entry.upstream, endpoint, "{}", entry.line);
            assert_eq!(entry.header, endpoint, "{}", entry.line);
            assert_eq!(entry.metadata, endpoint, "{}", entry.line);
        }
    }
}

const COMPLETION: &str =
    r#"{"model":"test-model","prompt":"Say hello to the pool","max_tokens":3}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_reaches_the_pod_the_picker_named() {
    let stack = Stack::start(Template::Duplex).await;
    for expected in ["pod-a", "pod-b"] {
        let response = stack.post("/v1/completions", COMPLETION).await;
        assert_eq!(response.status, StatusCode::OK, "{}", response.text());
        assert_eq!(response.header("x-inference-pod"), Some(expected));
        let pod = stack.pod(expected);
        assert_eq!(
            response.header("x-inference-port"),
            Some(pod.addr().port().to_string().as_str())
        );
        let received = pod.requests();
        assert_eq!(received.len(), 1);
        assert_eq!(received[0].body, Bytes::from_static(COMPLETION.as_bytes()));
        assert_eq!(
            received[0].header("x-gateway-destination-endpoint"),
            Some(pod.endpoint().as_str())
        );
        assert_eq!(response.json().unwrap()["usage"]["completion_tokens"], 3);
    }
    stack.assert_logged_in_turn().await;
    let streams = stack
        .envoy
        .counter("http.epp.ext_proc.streams_started")
        .await
        .unwrap();
    assert_eq!(streams, Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_events_arrive_incrementally_through_envoy() {
    let interval = Duration::from_millis(150);
    let stack = Stack::start_with(
        Template::Duplex,
        false,
        |cfg| cfg,
        |mut cfg| {
            cfg.engine.timing.step_overhead = interval;
            cfg
        },
    )
    .await;
    let body = r#"{"model":"test-model","prompt":"stream please","max_tokens":5,"stream":true}"#;
    let request = client::request(Method::POST, "/v1/completions", body).unwrap();
    let response = client::send_streaming(stack.envoy.listener_addr(), request)
        .await
        .unwrap();
    assert_eq!(response.status, StatusCode::OK);
    let content_type = response.headers.get("content-type").unwrap();
    assert!(
        content_type.as_bytes().starts_with(b"text/event-stream"),
        "{content_type:?}"
    );
    let text = String::from_utf8(response.body().to_vec()).unwrap();
    assert_eq!(text.matches("data: ").count(), 6, "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    // Five tokens from engine steps of 150 ms: buffering would deliver everything at once.
    assert_incremental(&response, 3 * interval);
}

/// At least five chunks, the last arriving at least `spread` after the first non-empty one.
fn assert_incremental(response: &client::StreamedResponse, spread: Duration) {
    let times: Vec<Duration> = response.chunks.iter().map(|c| c.at).collect();
    let first = response
        .chunks
        .iter()
        .find(|c| !c.data.is_empty())
        .map(|c| c.at);
    let last = times.last().copied();
    assert!(response.chunks.len() >= 5, "chunks arrived at {times:?}");
    assert!(
        matches!((first, last), (Some(f), Some(l)) if l - f >= spread),
        "chunks arrived at {times:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_without_body_is_routed() {
    let stack = Stack::start(Template::Duplex).await;
    let response = client::get(stack.envoy.listener_addr(), "/v1/models")
        .await
        .unwrap();
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    assert_eq!(response.json().unwrap()["data"][0]["id"], "test-model");
    let received = stack.pod("pod-a").requests();
    assert_eq!(received.len(), 1);
    assert_eq!(
        (received[0].method.clone(), received[0].path.as_str()),
        (Method::GET, "/v1/models")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_body_arrives_byte_for_byte_in_duplex_mode() {
    // 60,000 words are more tokens than the default 8,192-token context holds.
    let stack = Stack::start_with(Template::Duplex, false, |cfg| cfg, with_long_context).await;
    // Several times the 62,000-byte chunk the picker streams back, and not a multiple of it.
    let prompt = "lorem ipsum ".repeat(30_000);
    let body = format!(r#"{{"model":"test-model","prompt":"{prompt}"}}"#);
    let response = client::post_json(stack.envoy.listener_addr(), "/v1/completions", body.clone())
        .await
        .unwrap();
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    let received = stack.pod("pod-a").requests();
    assert_eq!(received[0].body.len(), body.len());
    assert!(
        received[0].body == body.as_bytes(),
        "the body changed on the way"
    );
    let tokens = Tokenizer::new(TokenizerKind::Cl100kBase)
        .encode(&prompt)
        .len();
    assert_eq!(response.json().unwrap()["usage"]["prompt_tokens"], tokens);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_buffered_config_routes_to_the_picked_pod() {
    let stack = Stack::start(Template::Buffered).await;
    for expected in ["pod-a", "pod-b"] {
        let response = stack.post("/v1/chat/completions", CHAT).await;
        assert_eq!(response.status, StatusCode::OK, "{}", response.text());
        assert_eq!(response.header("x-inference-pod"), Some(expected));
        let received = stack.pod(expected).requests();
        assert_eq!(received[0].body, Bytes::from_static(CHAT.as_bytes()));
        // BUFFERED keeps content-length (duplex forwards chunked).
        assert_eq!(
            received[0].header("content-length"),
            Some(CHAT.len().to_string().as_str())
        );
    }
    let log = stack.access_log(2).await;
    assert!(log.iter().all(|e| e.status == 200), "{log:?}");
}

const CHAT: &str = r#"{"model":"test-model","messages":[{"role":"user","content":"hi there"}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_override_host_config_routes_and_reports_the_served_endpoint() {
    let stack = Stack::start(Template::DuplexOverrideHost).await;
    for expected in ["pod-a", "pod-b"] {
        let response = stack.post("/v1/completions", COMPLETION).await;
        assert_eq!(response.status, StatusCode::OK, "{}", response.text());
        assert_eq!(response.header("x-inference-pod"), Some(expected));
    }
    let log = stack.access_log(2).await;
    for (entry, pod) in log.iter().zip(&stack.pods) {
        assert_eq!(
            entry.served.as_deref(),
            Some(pod.endpoint().as_str()),
            "{}",
            entry.line
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_reaches_the_ext_proc_server_over_tls() {
    let stack = Stack::start_with(Template::Duplex, true, |cfg| cfg, |opts| opts).await;
    let response = stack
        .post(
            "/v1/embeddings",
            r#"{"model":"test-model","input":"embed me"}"#,
        )
        .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    assert_eq!(response.header("x-inference-pod"), Some("pod-a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_round_robin_baseline_spreads_requests_without_ext_proc() {
    let stack = Stack::start(Template::RoundRobin).await;
    for _ in 0..4 {
        let response = stack.post("/v1/completions", COMPLETION).await;
        assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    }
    assert_eq!(stack.pod("pod-a").requests().len(), 2);
    assert_eq!(stack.pod("pod-b").requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_least_request_baseline_serves_requests() {
    let stack = Stack::start(Template::LeastRequest).await;
    let response = stack
        .post("/v1/responses", r#"{"model":"test-model","input":"hello"}"#)
        .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    let usage = &response.json().unwrap()["usage"];
    // "hello" in the chat template as the pod's tokenizer counts it.
    let chat = "<|user|>\nhello\n<|assistant|>\n";
    let tokens = Tokenizer::new(TokenizerKind::Cl100kBase).encode(chat).len();
    assert_eq!(usage["input_tokens"], tokens, "{usage}");
    assert!(
        usage["output_tokens"].as_u64().is_some_and(|n| n >= 1),
        "{usage}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_buffer_limit_rejects_larger_buffered_bodies() {
    let limit = |cfg: EnvoyConfig| cfg.listener_buffer_limit(32 * 1024);
    let stack = Stack::start_with(Template::Buffered, false, limit, |opts| opts).await;
    let small = stack.post("/v1/completions", COMPLETION).await;
    assert_eq!(small.status, StatusCode::OK, "{}", small.text());
    let prompt = "x ".repeat(50_000);
    let body = format!(r#"{{"model":"test-model","prompt":"{prompt}"}}"#);
    let addr = stack.envoy.listener_addr();
    let large = client::post_json(addr, "/v1/completions", body)
        .await
        .unwrap();
    assert_eq!(large.status, StatusCode::PAYLOAD_TOO_LARGE);
    let log = stack.access_log(2).await;
    assert_eq!(
        log[1].details, "request_payload_too_large",
        "{}",
        log[1].line
    );
}

//! What every epp-through-Envoy test needs: start a stack, send a request with headers, find
//! the pod that served it, read Envoy's access log, and wait for epp's Prometheus text to show
//! something (epp scrapes and refreshes its gauges on timers, so tests poll for the condition
//! instead of sleeping).

use std::time::{Duration, Instant};

use bytes::Bytes;
use harness::client::{self, HttpResponse};
use harness::envoy::{repo_root, AccessLogEntry, EnvoyConfig, Template};
use harness::sim_pod::{test_pod_config, with_adapters, with_long_context, SimPod};
use harness::stack::{Epp, Stack, StackOptions};
use http::{Method, StatusCode};
use inference_sim::RecordedRequest;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

pub use harness::sim_pod::TEST_MODEL as MODEL;
const LOG_WAIT: Duration = Duration::from_secs(5);
const METRICS_WAIT: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(20);

/// Starts a stack or fails the test with the whole error chain (Envoy's log included).
pub async fn start(opts: StackOptions) -> Stack {
    Stack::start(opts)
        .await
        .unwrap_or_else(|e| panic!("starting the stack: {e:#}"))
}

/// epp with an empty static pool behind `template`'s Envoy; the second value is the scratch
/// directory holding the endpoints file (remove it after `stack.stop()`).
pub async fn empty_pool_stack(tag: &str, template: Template) -> (Stack, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("epp-e2e-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("endpoints.yaml");
    std::fs::write(&file, "[]\n").unwrap();
    let epp = Epp::start(&args(&[
        "--static-endpoints-file",
        file.to_str().unwrap(),
        "--secure-serving",
        "false",
    ]))
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    let envoy = EnvoyConfig::new(template)
        .epp(epp.grpc)
        .start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let stack = Stack {
        pods: Vec::new(),
        epp,
        envoy,
    };
    (stack, dir)
}

/// Owned command-line flags.
pub fn args(flags: &[&str]) -> Vec<String> {
    flags.iter().map(|f| (*f).to_owned()).collect()
}

/// The text of a file in `config/examples/`.
pub fn example_config(name: &str) -> String {
    let path = repo_root().join("config/examples").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// `POST path` through Envoy with extra request headers.
pub async fn post(
    stack: &Stack,
    path: &str,
    body: impl Into<Bytes>,
    headers: &[(&'static str, &str)],
) -> HttpResponse {
    let mut req = client::request(Method::POST, path, body).unwrap();
    for (name, value) in headers {
        req = client::with_header(req, name, value).unwrap();
    }
    client::send(stack.envoy.listener_addr(), req)
        .await
        .unwrap_or_else(|e| panic!("POST {path} through envoy: {e:#}"))
}

/// A completion request for `prompt` (JSON-escaped), with `max_tokens: 3`.
pub fn completion(prompt: &str) -> String {
    serde_json::json!({"model": MODEL, "prompt": prompt, "max_tokens": 3}).to_string()
}

/// The index of the pod that answered, from its `x-inference-pod` header; fails the test if the
/// response is not a 200 from one of the stack's pods.
pub fn served_by(stack: &Stack, response: &HttpResponse) -> usize {
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    stack
        .pod_index(response.header("x-inference-pod"))
        .unwrap_or_else(|| panic!("not served by a pod of the stack: {:?}", response.headers))
}

/// The index of the pod whose answer this is, whatever its status, from its `x-inference-pod`
/// header; fails the test if no pod of the stack answered.
pub fn answered_by(stack: &Stack, response: &HttpResponse) -> usize {
    stack
        .pod_index(response.header("x-inference-pod"))
        .unwrap_or_else(|| panic!("not answered by a pod of the stack: {response:?}"))
}

/// Test pods whose every engine step takes `step` (a prefill or one decode token each), so
/// streamed tokens arrive `step` apart; `adapters` are served besides [`MODEL`] (LoRA).
pub fn slow_steps(step: Duration, adapters: &[&str]) -> inference_sim::PodConfig {
    let mut cfg = with_adapters(test_pod_config("pod"), adapters);
    cfg.engine.timing.step_overhead = step;
    cfg
}

/// Test pods with a 128k context ([`with_long_context`]), `adapters` as in [`slow_steps`].
pub fn long_context(adapters: &[&str]) -> inference_sim::PodConfig {
    with_long_context(with_adapters(test_pod_config("pod"), adapters))
}

/// Waits until Envoy's access log holds `count` entries and returns them.
pub async fn access_log(stack: &Stack, count: usize) -> Vec<AccessLogEntry> {
    stack
        .envoy
        .wait_for_access_log(count, LOG_WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Asserts that an access log entry routed by header and by metadata to `endpoint`, and that
/// Envoy connected to it.
pub fn assert_routed_to(entry: &AccessLogEntry, endpoint: &str) {
    let expected = Some(endpoint.to_owned());
    assert_eq!(entry.status, 200, "{}", entry.line);
    assert_eq!(entry.header, expected, "header: {}", entry.line);
    assert_eq!(entry.metadata, expected, "metadata: {}", entry.line);
    assert_eq!(entry.upstream, expected, "upstream: {}", entry.line);
}

/// What a pod received through Envoy: every recorded request except epp's `/metrics` scrapes
/// (`/metrics?name[]=...`: epp asks for only the series it reads).
pub fn traffic(pod: &SimPod) -> Vec<RecordedRequest> {
    pod.requests()
        .into_iter()
        .filter(|r| r.path.split('?').next() != Some("/metrics"))
        .collect()
}

/// How many requests each pod received through Envoy.
pub fn received_counts(stack: &Stack) -> Vec<usize> {
    stack.pods.iter().map(|p| traffic(p).len()).collect()
}

/// The value of the first sample of `name` whose labels include every `key="value"` in
/// `labels`, from Prometheus text (epp's parser).
pub use harness::prometheus::labelled as sample;

/// Polls epp's `/metrics` until `ready` accepts the text (bounded); returns that text.
pub async fn wait_for_metrics(epp: &Epp, what: &str, ready: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + METRICS_WAIT;
    loop {
        let text = epp.metrics_text().await.unwrap();
        if ready(&text) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "epp metrics never showed {what} within {METRICS_WAIT:?}:\n{text}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until epp's per-pod queue gauge shows `waiting` for the pod at `endpoint` (the pod's
/// metrics were scraped, and the pool gauges refreshed since).
pub async fn wait_for_scraped_queue(epp: &Epp, endpoint: &str, waiting: f64) {
    let labels = [("model_server_pod", endpoint)];
    wait_for_metrics(epp, &format!("queue {waiting} for {endpoint}"), |t| {
        sample(t, "inference_pool_per_pod_queue_size", &labels) == Some(waiting)
    })
    .await;
}

/// `count` words drawn from a fixed vocabulary with a seeded generator: long prompts that are
/// reproducible, and distinct from their first block for different seeds.
pub fn words(seed: u64, count: usize) -> String {
    const VOCABULARY: [&str; 16] = [
        "river", "copper", "lantern", "meadow", "signal", "harbor", "violet", "engine", "orchard",
        "glacier", "quartz", "saddle", "thunder", "willow", "cipher", "falcon",
    ];
    let mut rng = SmallRng::seed_from_u64(seed);
    let picked: Vec<&str> = (0..count)
        .map(|_| VOCABULARY[rng.random_range(0..VOCABULARY.len())])
        .collect();
    picked.join(" ")
}

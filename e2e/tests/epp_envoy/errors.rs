//! Every class of rejection as the client sees it through Envoy (status, OpenAI-shaped JSON body
//! naming the problem, `details` in the access log, no pod reached), and the request metrics epp
//! exposes after traffic.

use harness::client::HttpResponse;
use harness::envoy::Template;
use harness::stack::{Stack, StackOptions};
use http::StatusCode;

use super::support::{
    access_log, args, completion, empty_pool_stack, example_config, post, received_counts, sample,
    served_by, start, wait_for_metrics, MODEL,
};

/// Asserts a rejection: `status`, a JSON body whose `error.type` is upstream's code name and
/// whose message is `inference error: <Code> - …` containing `names`.
fn assert_rejected(response: &HttpResponse, status: StatusCode, code: &str, names: &str) {
    assert_eq!(response.status, status, "{}", response.text());
    assert_eq!(response.header("content-type"), Some("application/json"));
    let body = response
        .json()
        .unwrap_or_else(|e| panic!("{e}: {}", response.text()));
    let error = &body["error"];
    assert_eq!(error["type"], code, "{body}");
    assert_eq!(error["code"], status.as_u16(), "{body}");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(&format!("inference error: {code} - ")),
        "{message}"
    );
    assert!(message.contains(names), "expected {names:?} in {message:?}");
}

/// Asserts the backpressure details of a 429/503 (#7, upstream issue #1082): a `Retry-After`
/// header and `error.reason` saying why, with the same delay in `error.retry_after_seconds`.
/// Also llm-d-router v0.10's `x-llm-d-request-dropped-reason`, with upstream's value.
fn assert_backpressure(response: &HttpResponse, reason: &str, retry_after: u64) {
    let dropped = match reason {
        "no_ready_endpoints" => "rejected-no-endpoints",
        _ => "rejected-saturated",
    };
    assert_eq!(
        response.header("x-llm-d-request-dropped-reason"),
        Some(dropped),
        "{reason}"
    );
    let body = response.json().unwrap();
    assert_eq!(body["error"]["reason"], reason, "{body}");
    assert_eq!(body["error"]["retry_after_seconds"], retry_after, "{body}");
    assert_eq!(
        response.header("retry-after"),
        Some(retry_after.to_string().as_str())
    );
}

/// Asserts that Envoy logged `count` rejections by epp with `code` and connected to no pod.
async fn assert_logged_rejections(stack: &Stack, count: usize, status: u16, code: &str) {
    let log = access_log(stack, count).await;
    assert_eq!(log.len(), count, "{log:#?}");
    for entry in &log {
        assert_eq!(entry.status, status, "{}", entry.line);
        assert_eq!(entry.details, format!("epp_{code}"), "{}", entry.line);
        assert_eq!(entry.upstream, None, "{}", entry.line);
    }
    assert_eq!(
        received_counts(stack).iter().sum::<usize>(),
        0,
        "a rejected request reached a pod"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_a_400_naming_the_problem() {
    let stack = start(StackOptions::default()).await;
    let cases = [
        ("/v1/completions", "this is not json", "not valid JSON"),
        (
            "/v1/completions",
            r#"{"prompt":"no model here"}"#,
            "model not found in request body",
        ),
        (
            "/v1/completions",
            r#"{"model":7,"prompt":"numeric model"}"#,
            "model must be a string",
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"test-model","prompt":"not chat"}"#,
            "`messages`",
        ),
        (
            "/v1/completions",
            r#"{"model":"test-model","messages":[{"role":"user","content":"hi"}]}"#,
            "`prompt`",
        ),
        (
            "/v1/embeddings",
            r#"{"model":"test-model","prompt":"not embeddings"}"#,
            "`input`",
        ),
    ];
    for (path, body, names) in cases {
        let response = post(&stack, path, body, &[]).await;
        assert_rejected(&response, StatusCode::BAD_REQUEST, "BadRequest", names);
        assert_eq!(
            response.header("retry-after"),
            None,
            "a 400 is not backpressure"
        );
        assert_eq!(response.header("x-llm-d-request-dropped-reason"), None);
    }
    assert_logged_rejections(&stack, cases.len(), 400, "BadRequest").await;
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_a_413() {
    let stack = start(StackOptions {
        epp_args: args(&["--max-request-body-bytes", "1024"]),
        ..StackOptions::default()
    })
    .await;
    let small = post(&stack, "/v1/completions", completion("fits"), &[]).await;
    served_by(&stack, &small);
    let large = completion(&"x".repeat(2_000));
    let response = post(&stack, "/v1/completions", large, &[]).await;
    assert_rejected(
        &response,
        StatusCode::PAYLOAD_TOO_LARGE,
        "PayloadTooLarge",
        "1024 bytes",
    );
    let log = access_log(&stack, 2).await;
    assert_eq!(
        (log[1].status, log[1].details.as_str()),
        (413, "epp_PayloadTooLarge"),
        "{}",
        log[1].line
    );
    assert_eq!(received_counts(&stack).iter().sum::<usize>(), 1);
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_pool_is_a_503() {
    let (stack, dir) = empty_pool_stack("empty-pool", Template::Duplex).await;
    let response = post(&stack, "/v1/completions", completion("anyone there?"), &[]).await;
    assert_rejected(
        &response,
        StatusCode::SERVICE_UNAVAILABLE,
        "ServiceUnavailable",
        "no ready endpoints",
    );
    assert_backpressure(&response, "no_ready_endpoints", 5);
    assert_logged_rejections(&stack, 1, 503, "ServiceUnavailable").await;
    stack.stop().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_filter_rejects_with_429_unless_the_header_names_a_pod() {
    let config = example_config("conformance.yaml");
    let stack = start(StackOptions {
        epp_args: args(&["--config-text", &config]),
        ..StackOptions::default()
    })
    .await;
    let response = post(&stack, "/v1/completions", completion("pick nobody"), &[]).await;
    assert_rejected(
        &response,
        StatusCode::TOO_MANY_REQUESTS,
        "ResourceExhausted",
        "failed to find target endpoint",
    );
    assert_backpressure(&response, "pool_saturated", 1);
    assert_logged_rejections(&stack, 1, 429, "ResourceExhausted").await;
    let named = stack.pods[2].endpoint();
    for i in 0..4 {
        let body = completion(&format!("pick pod 2, round {i}"));
        let response = post(
            &stack,
            "/v1/completions",
            body,
            &[("test-epp-endpoint-selection", &named)],
        )
        .await;
        assert_eq!(served_by(&stack, &response), 2);
    }
    assert_eq!(received_counts(&stack), [0, 0, 4]);
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_metrics_count_traffic_errors_latency_and_usage_by_model() {
    let stack = start(StackOptions::default()).await;
    // Four words of prompt (four cl100k tokens) and max_tokens 3: the pod reports 4 prompt and 3
    // completion tokens.
    let response = post(
        &stack,
        "/v1/completions",
        completion("one two three four"),
        &[],
    )
    .await;
    served_by(&stack, &response);
    assert_eq!(response.json().unwrap()["usage"]["prompt_tokens"], 4);
    let rejected = post(&stack, "/v1/completions", "not json", &[]).await;
    assert_eq!(rejected.status, StatusCode::BAD_REQUEST);

    let model = [("model_name", MODEL), ("target_model_name", MODEL)];
    let text = wait_for_metrics(&stack.epp, "the finished request's usage", |t| {
        sample(t, "inference_objective_output_tokens_count", &model).is_some()
            && sample(
                t,
                "inference_objective_running_requests",
                &[("model_name", MODEL)],
            ) == Some(0.0)
    })
    .await;
    let value = |name: &str, labels: &[(&str, &str)]| {
        sample(&text, name, labels).unwrap_or_else(|| panic!("no {name} {labels:?} in\n{text}"))
    };
    assert_eq!(value("inference_objective_request_total", &model), 1.0);
    assert_eq!(
        value(
            "inference_objective_request_error_total",
            &[("error_code", "BadRequest")]
        ),
        1.0
    );
    assert_eq!(
        value("inference_objective_request_duration_seconds_count", &model),
        1.0
    );
    assert!(value("inference_objective_request_duration_seconds_sum", &model) > 0.0);
    assert_eq!(value("inference_objective_input_tokens_count", &model), 1.0);
    assert_eq!(value("inference_objective_input_tokens_sum", &model), 4.0);
    assert_eq!(value("inference_objective_output_tokens_sum", &model), 3.0);
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_server_error_reaches_the_client_unchanged() {
    let stack = start(StackOptions::default()).await;
    let headers = [(inference_sim::RETURN_ERROR_HEADER, "503")];
    let response = post(&stack, "/v1/completions", completion("fail"), &headers).await;
    assert_eq!(response.status, StatusCode::SERVICE_UNAVAILABLE);
    let pod = stack
        .pod_index(response.header("x-inference-pod"))
        .expect("the pod's own answer");
    let body = response.json().unwrap();
    assert_eq!(body["error"]["code"], 503, "{body}");
    assert_eq!(body["error"]["message"], "Injected failure (503)", "{body}");
    assert_eq!(received_counts(&stack)[pod], 1);
    let log = access_log(&stack, 1).await;
    let endpoint = Some(stack.pods[pod].endpoint());
    assert_eq!(
        (log[0].status, log[0].details.as_str()),
        (503, "via_upstream"),
        "{}",
        log[0].line
    );
    assert_eq!(
        (&log[0].upstream, &log[0].header),
        (&endpoint, &endpoint),
        "{}",
        log[0].line
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_after_the_body_was_read_counts_against_the_requested_model() {
    let config = example_config("conformance.yaml");
    let stack = start(StackOptions {
        epp_args: args(&["--config-text", &config]),
        ..StackOptions::default()
    })
    .await;
    let headers = [("x-gateway-model-name-rewrite", "other")];
    let response = post(&stack, "/v1/completions", completion("nobody"), &headers).await;
    assert_eq!(response.status, StatusCode::TOO_MANY_REQUESTS);
    let text = stack.epp.metrics_text().await.unwrap();
    let labels = [
        ("model_name", MODEL),
        ("target_model_name", "other"),
        ("error_code", "ResourceExhausted"),
    ];
    assert_eq!(
        sample(&text, "inference_objective_request_error_total", &labels),
        Some(1.0),
        "{text}"
    );
    stack.stop().await;
}

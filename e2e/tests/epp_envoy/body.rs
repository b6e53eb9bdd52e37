//! What the pod receives and what the client gets back: bodies byte for byte (epp never
//! re-serialises JSON), only the `model` value changed by a rewrite and restored on the way back,
//! large bodies through the duplex stream, SSE without buffering, and the BUFFERED mode.

use std::time::Duration;

use harness::client;
use harness::envoy::Template;
use harness::sim_pod::{test_pod_config, with_adapters};
use harness::stack::{Stack, StackOptions};
use http::{Method, StatusCode};

use super::support::{
    access_log, answered_by, completion, post, sample, served_by, slow_steps, start, traffic,
    wait_for_metrics, words, MODEL,
};

const REWRITE: &str = "x-gateway-model-name-rewrite";

/// A request body a re-serialiser would change: odd key order, spacing and newlines, unicode
/// escapes next to raw UTF-8, numbers like `1.50` and `1e-1`, nested objects, and the model name
/// inside the prompt too. Returns the body with `model` set to `model`.
fn unusual_body(model: &str) -> String {
    format!(
        "{{ \"temperature\" : 1.50,\n  \"prompt\":\"caf\\u00e9 \\ud83d\\ude00 na\u{ef}ve \\\"{MODEL}\\\" \\/ {MODEL}\",\
         \"model\" :  \"{model}\" ,\"top_p\":1e-1,\n\t\"z\":{{\"b\":[1.0, 2.50 ,-0],\"a\":null}},\"max_tokens\":3 }}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_receives_the_client_body_byte_for_byte() {
    let stack = start(StackOptions::default()).await;
    let body = unusual_body(MODEL);
    let response = post(&stack, "/v1/completions", body.clone(), &[]).await;
    let pod = &stack.pods[served_by(&stack, &response)];
    let received = &traffic(pod)[0];
    assert_eq!(std::str::from_utf8(&received.body).unwrap(), body);
    assert_eq!(response.json().unwrap()["model"], MODEL);
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_rewrite_changes_only_the_model_value_and_the_client_sees_its_own_name() {
    let stack = start(StackOptions {
        pod_config: with_adapters(test_pod_config("pod"), &["other"]),
        ..StackOptions::default()
    })
    .await;
    let response = post(
        &stack,
        "/v1/completions",
        unusual_body(MODEL),
        &[(REWRITE, "other")],
    )
    .await;
    let pod = &stack.pods[served_by(&stack, &response)];
    let received = &traffic(pod)[0];
    assert_eq!(
        std::str::from_utf8(&received.body).unwrap(),
        unusual_body("other")
    );
    // The pod answered for "other" (a LoRA adapter it serves); epp restored the name the
    // client asked for.
    let answer = response.json().unwrap();
    assert_eq!(answer["model"], MODEL, "{answer}");
    assert_eq!(answer["usage"]["completion_tokens"], 3, "{answer}");
    assert!(
        !response.text().contains("\"other\""),
        "{}",
        response.text()
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_five_megabyte_body_is_routed_and_arrives_byte_for_byte() {
    // The pod, like vLLM, refuses a prompt over its context length with a 400 after reading it
    // whole: the answer still comes from the pod epp chose.
    let stack = start(StackOptions::default()).await;
    // Not repetitive, so a reordered, dropped or repeated chunk cannot go unnoticed.
    let mut prompt = words(5, 800_000);
    prompt.truncate(5 << 20);
    let prompt = prompt.trim_end().to_owned();
    let body = serde_json::json!({"model": MODEL, "prompt": prompt, "max_tokens": 1}).to_string();
    assert!(body.len() >= 5 << 20);
    let response = post(&stack, "/v1/completions", body.clone(), &[]).await;
    let pod = &stack.pods[answered_by(&stack, &response)];
    let received = &traffic(pod)[0];
    assert_eq!(received.body.len(), body.len());
    assert!(
        received.body == body.as_bytes(),
        "the body changed on the way"
    );
    assert_eq!(response.status, StatusCode::BAD_REQUEST);
    let error = response.json().unwrap();
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("maximum context length is 8192 tokens"),
        "{error}"
    );
    let log = access_log(&stack, 1).await;
    let endpoint = Some(pod.endpoint());
    assert_eq!(log[0].status, 400, "{}", log[0].line);
    assert_eq!(
        (&log[0].header, &log[0].metadata, &log[0].upstream),
        (&endpoint, &endpoint, &endpoint),
        "{}",
        log[0].line
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_events_reach_the_client_as_the_pod_sends_them() {
    let interval = Duration::from_millis(150);
    let stack = start(StackOptions {
        pod_config: slow_steps(interval, &["other"]),
        ..StackOptions::default()
    })
    .await;
    let body = r#"{"model":"test-model","prompt":"stream please","max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}"#;
    let req = client::request(Method::POST, "/v1/completions", body).unwrap();
    let req = client::with_header(req, REWRITE, "other").unwrap();
    let response = client::send_streaming(stack.envoy.listener_addr(), req)
        .await
        .unwrap();
    assert_eq!(response.status, StatusCode::OK);
    let content_type = response.headers.get("content-type").unwrap();
    assert!(
        content_type.as_bytes().starts_with(b"text/event-stream"),
        "{content_type:?}"
    );
    let text = String::from_utf8(response.body().to_vec()).unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    // Five token events and the usage event, each naming the client's model, not the rewrite.
    assert_eq!(
        text.matches("\"model\":\"test-model\"").count(),
        6,
        "{text}"
    );
    assert!(!text.contains("\"other\""), "{text}");
    let arrivals: Vec<Duration> = response
        .chunks
        .iter()
        .filter(|c| !c.data.is_empty())
        .map(|c| c.at)
        .collect();
    assert!(arrivals.len() >= 5, "chunks arrived at {arrivals:?}");
    // The pod's engine steps take 150 ms, one token each: buffering anywhere would deliver them together.
    let spread = arrivals[arrivals.len() - 1] - arrivals[0];
    assert!(spread >= 3 * interval, "chunks arrived at {arrivals:?}");
    let pod = stack.pod_index(
        response
            .headers
            .get("x-inference-pod")
            .and_then(|v| v.to_str().ok()),
    );
    assert!(pod.is_some(), "{:?}", response.headers);
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_mode_routes_and_the_body_arrives_intact_with_a_matching_content_length() {
    let longer = "a-much-longer-model-name";
    let stack = start(StackOptions {
        template: Template::Buffered,
        pod_config: with_adapters(test_pod_config("pod"), &[longer]),
        ..StackOptions::default()
    })
    .await;
    let body = unusual_body(MODEL);
    let response = post(&stack, "/v1/completions", body.clone(), &[]).await;
    let pod = &stack.pods[served_by(&stack, &response)];
    let received = traffic(pod).pop().unwrap();
    assert_eq!(std::str::from_utf8(&received.body).unwrap(), body);
    assert_eq!(
        received.header("content-length"),
        Some(body.len().to_string().as_str())
    );

    // A rewrite to a longer name: the body is replaced and its length must follow.
    let response = post(
        &stack,
        "/v1/completions",
        body.clone(),
        &[(REWRITE, longer)],
    )
    .await;
    let pod = &stack.pods[served_by(&stack, &response)];
    let received = traffic(pod).pop().unwrap();
    let expected = unusual_body(longer);
    assert_eq!(std::str::from_utf8(&received.body).unwrap(), expected);
    assert_eq!(
        received.header("content-length"),
        Some(expected.len().to_string().as_str())
    );
    assert_eq!(response.json().unwrap()["usage"]["completion_tokens"], 3);
    let log = access_log(&stack, 2).await;
    assert!(
        log.iter()
            .all(|e| e.status == 200 && e.header == e.upstream && e.metadata == e.upstream),
        "{log:#?}"
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_answer_for_a_rewritten_model_comes_back_whole_with_the_client_model_name() {
    // 40,000 tokens make a ~200 kB answer whose "model" key comes after the text: Envoy hands it
    // to epp in many chunks, and epp must restore the name wherever the chunks split. The pod
    // has the context and the KV blocks for it, and runs 1,000 times faster than real time.
    let mut pod_config = with_adapters(test_pod_config("pod"), &["other"]);
    pod_config.engine.max_model_len = 48_000;
    pod_config.engine.num_gpu_blocks = 4_096;
    pod_config.engine.time_scale = 1_000.0;
    let stack = start(StackOptions {
        pod_config,
        ..StackOptions::default()
    })
    .await;
    let body = serde_json::json!({"model": MODEL, "prompt": "a long answer", "max_tokens": 40_000});
    let response = post(
        &stack,
        "/v1/completions",
        body.to_string(),
        &[(REWRITE, "other")],
    )
    .await;
    served_by(&stack, &response);
    assert!(response.body.len() > 3 * 62_000, "{}", response.body.len());
    let answer = response.json().unwrap();
    assert_eq!(answer["model"], MODEL);
    let text = answer["choices"][0]["text"].as_str().unwrap();
    assert!(text.len() > 3 * 40_000, "{}", text.len());
    assert_eq!(answer["usage"]["completion_tokens"], 40_000);
    stack.stop().await;
}

/// Starts a 2 s SSE answer and drops the client once epp counts it as running.
async fn abandon_a_stream(stack: &Stack) {
    let body = r#"{"model":"test-model","prompt":"a slow stream","max_tokens":20,"stream":true}"#;
    let req = client::request(Method::POST, "/v1/completions", body).unwrap();
    let running = [("model_name", MODEL)];
    tokio::select! {
        done = client::send_streaming(stack.envoy.listener_addr(), req) => {
            panic!("the stream ended before the client left: {done:?}")
        }
        _ = wait_for_metrics(&stack.epp, "one running request", |t| {
            sample(t, "inference_objective_running_requests", &running) == Some(1.0)
        }) => {}
    }
    // The client's connection is closed here, mid-stream.
}

fn slow_stream_stack() -> StackOptions {
    StackOptions {
        pod_config: slow_steps(Duration::from_millis(100), &[]),
        ..StackOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_stream_releases_its_running_request() {
    let stack = start(slow_stream_stack()).await;
    abandon_a_stream(&stack).await;
    let running = [("model_name", MODEL)];
    wait_for_metrics(&stack.epp, "no running request", |t| {
        sample(t, "inference_objective_running_requests", &running) == Some(0.0)
    })
    .await;
    // Nothing is left half-open: the pool still serves.
    let response = post(&stack, "/v1/completions", completion("after"), &[]).await;
    served_by(&stack, &response);
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_stream_counts_as_a_stream_reset() {
    let stack = start(slow_stream_stack()).await;
    abandon_a_stream(&stack).await;
    wait_for_metrics(&stack.epp, "one stream reset", |t| {
        sample(t, "epp_extproc_stream_resets_total", &[]) == Some(1.0)
    })
    .await;
    stack.stop().await;
}

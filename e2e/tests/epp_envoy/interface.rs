//! llm-d-router v0.10's request interface through Envoy (issue 19): the parser the path selects
//! (Anthropic Messages, vLLM token-in, passthrough), llm-d's steering header names over their
//! GIE aliases, and `Prefer: if-available` (412 until the chosen pod caches the prompt). A
//! passthrough or Realtime request is routed on its headers: Envoy reaches the pod while the
//! client is still sending (llm-d-router #1532).
//! Drop reasons on 429/503 are asserted with the other rejections (`errors.rs`).

use std::time::Duration;

use harness::stack::StackOptions;
use http::StatusCode;
use serde_json::json;

use super::early::{wait_upstream, HeldRequest};
use super::support::{
    access_log, answered_by, args, assert_routed_to, completion, post, served_by, start, traffic,
    words, MODEL,
};
use harness::sim_pod::{test_pod_config, with_adapters};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_messages_stick_to_the_pod_caching_their_system_prompt() {
    let stack = start(StackOptions::default()).await;
    let system = words(7, 2_000);
    let body = |question: &str| {
        json!({"model": MODEL, "max_tokens": 5, "system": system,
               "messages": [{"role": "user", "content": question}]})
        .to_string()
    };
    let mut served = Vec::new();
    for i in 0..4 {
        let sent = body(&format!("question number {i}"));
        let response = post(&stack, "/v1/messages", sent.clone(), &[]).await;
        let pod = served_by(&stack, &response);
        let answer = response.json().unwrap();
        assert_eq!(
            (&answer["type"], &answer["model"]),
            (&json!("message"), &json!(MODEL)),
            "{answer}"
        );
        assert_eq!(answer["usage"]["output_tokens"], 5, "{answer}");
        let received = traffic(&stack.pods[pod]);
        assert_eq!(
            received.last().unwrap().body,
            sent.as_bytes(),
            "byte for byte"
        );
        served.push(pod);
    }
    assert!(
        served.iter().all(|p| *p == served[0]),
        "the shared system prompt is a shared prefix: {served:?}"
    );
    let log = access_log(&stack, 4).await;
    assert_routed_to(&log[3], &stack.pods[served[0]].endpoint());
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_in_generate_requests_route_on_their_token_ids() {
    let stack = start(StackOptions::default()).await;
    let shared: Vec<u32> = (0..2_000u32).map(|i| (i * 7919) % 50_000).collect();
    let mut served = Vec::new();
    for tail in 0..4u32 {
        let mut ids = shared.clone();
        ids.extend([60_000 + tail, 60_100 + tail]);
        let sent = json!({"model": MODEL, "token_ids": ids,
                          "sampling_params": {"max_tokens": 3}})
        .to_string();
        let response = post(&stack, "/inference/v1/generate", sent.clone(), &[]).await;
        let pod = served_by(&stack, &response);
        assert_eq!(
            traffic(&stack.pods[pod]).last().unwrap().body,
            sent.as_bytes()
        );
        let answer = response.json().unwrap();
        let generated = answer["choices"][0]["token_ids"].as_array().map(Vec::len);
        assert_eq!(generated, Some(3), "{answer}");
        served.push(pod);
    }
    assert!(
        served.iter().all(|p| *p == served[0]),
        "the shared token prefix sticks: {served:?}"
    );
    let bad = post(
        &stack,
        "/inference/v1/generate",
        json!({"model": MODEL, "token_ids": []}).to_string(),
        &[],
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.text());
    assert!(bad.text().contains("token_ids"), "{}", bad.text());
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_no_parser_claims_pass_through_unread() {
    // The pods, like vLLM serving a generative model, have none of these routes: each answers
    // 404 after receiving the request unchanged.
    let stack = start(StackOptions::default()).await;
    let cases = [
        ("/v1/rerank", "not json at all {{{"),
        ("/generate", r#"{"input_ids": "whatever the pod accepts"}"#),
        ("/v1/messages/count_tokens", r#"{"messages": "unchecked"}"#),
    ];
    for (i, (path, body)) in cases.iter().enumerate() {
        let response = post(&stack, path, *body, &[]).await;
        let pod = answered_by(&stack, &response);
        assert_eq!(response.status, StatusCode::NOT_FOUND, "{path}");
        let last = traffic(&stack.pods[pod]).pop().unwrap();
        assert_eq!(
            (last.path.as_str(), &last.body[..]),
            (*path, body.as_bytes())
        );
        let log = access_log(&stack, i + 1).await;
        let endpoint = Some(stack.pods[pod].endpoint());
        assert_eq!(log[i].status, 404, "{}", log[i].line);
        assert_eq!(
            (&log[i].header, &log[i].metadata, &log[i].upstream),
            (&endpoint, &endpoint, &endpoint),
            "{}",
            log[i].line
        );
    }
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llm_d_header_names_win_over_their_gie_aliases() {
    let stack = start(StackOptions {
        pod_config: with_adapters(test_pod_config("pod"), &["gie-name", "llmd-name"]),
        ..StackOptions::default()
    })
    .await;
    let chat = json!({"model": MODEL, "max_tokens": 2,
                      "messages": [{"role": "user", "content": "which model am I?"}]})
    .to_string();
    let cases: [(&[(&'static str, &str)], &str); 3] = [
        (&[("x-gateway-model-name-rewrite", "gie-name")], "gie-name"),
        (&[("x-llm-d-model-name-rewrite", "llmd-name")], "llmd-name"),
        (
            &[
                ("x-gateway-model-name-rewrite", "gie-name"),
                ("x-llm-d-model-name-rewrite", "llmd-name"),
            ],
            "llmd-name",
        ),
    ];
    for (headers, want) in cases {
        let response = post(&stack, "/v1/chat/completions", chat.clone(), headers).await;
        let pod = served_by(&stack, &response);
        let received = traffic(&stack.pods[pod]).pop().unwrap();
        let forwarded: serde_json::Value = serde_json::from_slice(&received.body).unwrap();
        assert_eq!(forwarded["model"], want, "{headers:?}");
        assert_eq!(
            response.json().unwrap()["model"],
            MODEL,
            "the client sees its own model name"
        );
    }
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefer_if_available_is_412_until_the_chosen_pod_caches_the_prompt() {
    let stack = start(StackOptions::default()).await;
    let body = json!({"model": MODEL, "max_tokens": 2, "prompt": words(3, 1_500)}).to_string();
    let prefer = [("prefer", "if-available")];
    let refused = post(&stack, "/v1/completions", body.clone(), &prefer).await;
    assert_eq!(
        refused.status,
        StatusCode::PRECONDITION_FAILED,
        "{}",
        refused.text()
    );
    assert_eq!(
        refused.json().unwrap()["error"]["type"],
        "PreconditionFailed"
    );
    assert_eq!(refused.header("x-llm-d-request-dropped-reason"), None);
    let first = post(&stack, "/v1/completions", body.clone(), &[]).await;
    let pod = served_by(&stack, &first);
    let cached = post(&stack, "/v1/completions", body.clone(), &prefer).await;
    assert_eq!(served_by(&stack, &cached), pod, "served where it is cached");
    let log = access_log(&stack, 3).await;
    assert_eq!(
        (
            log[0].status,
            log[0].details.as_str(),
            log[0].upstream.as_deref()
        ),
        (412, "epp_PreconditionFailed", None),
        "{}",
        log[0].line
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn realtime_and_passthrough_requests_reach_the_pod_before_their_body_ends() {
    let stack = start(StackOptions {
        pods: 2,
        ..StackOptions::default()
    })
    .await;
    let body = vec![b'x'; 64 << 10];
    for (i, path) in ["/v1/realtime", "/v1/rerank"].into_iter().enumerate() {
        let held = HeldRequest::open(
            stack.envoy.listener_addr(),
            path,
            &[],
            body.len(),
            &body[..16],
        )
        .await;
        assert!(
            wait_upstream(&stack, i as u64 + 1, Duration::from_secs(10)).await,
            "{path}: Envoy never opened the upstream request while the body was incomplete"
        );
        // vLLM's Realtime API is a WebSocket and a generative model has no rerank route: the
        // pod's 404, once it has the whole body.
        let (status, text) = held.finish(&body[16..]).await;
        assert_eq!(status, 404, "{path}: {text}");
        let received: Vec<_> = stack
            .pods
            .iter()
            .flat_map(traffic)
            .filter(|r| r.path == path)
            .collect();
        assert_eq!(received.len(), 1, "{path}");
        assert_eq!(received[0].body.as_ref(), body.as_slice(), "{path}");
    }
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_scores_reach_envoys_metadata_with_emit_endpoint_scores() {
    for emit in [false, true] {
        let stack = start(StackOptions {
            epp_args: if emit {
                args(&["--emit-endpoint-scores"])
            } else {
                Vec::new()
            },
            ..StackOptions::default()
        })
        .await;
        let response = post(&stack, "/v1/completions", completion("scored"), &[]).await;
        served_by(&stack, &response);
        let log = access_log(&stack, 1).await;
        let scores = log[0]
            .line
            .split(' ')
            .find_map(|w| w.strip_prefix("scores="))
            .unwrap_or_else(|| panic!("no scores field: {}", log[0].line));
        if !emit {
            assert_eq!(scores, "-", "{}", log[0].line);
        } else {
            let table: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(scores).unwrap_or_else(|e| panic!("{e}: {}", log[0].line));
            let mut keys: Vec<_> = table.keys().cloned().collect();
            keys.sort();
            let mut pods: Vec<_> = stack.pods.iter().map(|p| p.endpoint()).collect();
            pods.sort();
            assert_eq!(keys, pods, "every candidate's ip:port");
            assert!(table.values().all(serde_json::Value::is_number), "{scores}");
        }
        stack.stop().await;
    }
}

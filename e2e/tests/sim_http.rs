//! inference-sim over HTTP, in-process: timing shape (prefix cache, queueing),
//! the OpenAI surface, errors, LoRA, faults and pod kill/restart.

use crate::sim_support;

use std::time::Duration;

use harness::client;
use http::{Method, StatusCode};
use serde_json::{json, Value};
use sim_support::{metrics, pod_config, post, sample, start, MODEL};

/// Time to the first SSE chunk of a one-token streamed completion.
async fn ttft(addr: std::net::SocketAddr, prompt: Value) -> (Duration, Value) {
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 1, "stream": true,
        "stream_options": {"include_usage": true}});
    let req =
        client::request(Method::POST, "/v1/completions", body.to_string()).expect("test setup");
    let resp = client::send_streaming(addr, req).await.expect("test setup");
    assert_eq!(resp.status, StatusCode::OK);
    let text = String::from_utf8_lossy(&resp.body()).into_owned();
    let usage_line = text
        .lines()
        .find(|l| l.contains("\"usage\""))
        .expect("usage chunk");
    let usage: Value =
        serde_json::from_str(usage_line.trim_start_matches("data: ")).expect("test setup");
    (resp.chunks[0].at, usage["usage"].clone())
}

#[tokio::test]
async fn ttft_grows_with_uncached_prompt_tokens_and_drops_for_a_cached_prefix() {
    let cluster = start(vec![pod_config("p0")]).await;
    let addr = cluster.addrs()[0];
    let long: Vec<u32> = (1000..3000).collect();
    let (short_t, _) = ttft(addr, json!((1..=48).collect::<Vec<u32>>())).await;
    let (long_t, usage) = ttft(addr, json!(long)).await;
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
    let mut again = long.clone();
    again.extend(5000..5016);
    let (cached_t, usage) = ttft(addr, json!(again)).await;
    // 2000 uncached tokens cost ~400 ms; 2016 tokens with 2000 cached ~8 ms.
    assert!(
        long_t > short_t + Duration::from_millis(250),
        "short {short_t:?} long {long_t:?}"
    );
    assert!(cached_t * 4 < long_t, "cached {cached_t:?} long {long_t:?}");
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 2000);
    let text = metrics(addr).await;
    assert_eq!(sample(&text, "vllm:prefix_cache_hits_total"), Some(2000.0));
    cluster.shutdown().await;
}

#[tokio::test]
async fn requests_beyond_max_num_seqs_queue_and_metrics_show_them_waiting() {
    let mut cfg = pod_config("p0");
    cfg.engine.max_num_seqs = 2;
    let cluster = start(vec![cfg]).await;
    let addr = cluster.addrs()[0];
    let body = |i: u32| json!({"model": MODEL, "prompt": [i, i + 1, i + 2], "max_tokens": 80});
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..4 {
        tasks.spawn(async move { post(addr, "/v1/completions", body(i * 10)).await });
    }
    let mut saw_waiting = false;
    for _ in 0..100 {
        let text = metrics(addr).await;
        let running = sample(&text, "vllm:num_requests_running{");
        let waiting = sample(&text, "vllm:num_requests_waiting{");
        if running == Some(2.0) && waiting == Some(2.0) {
            saw_waiting = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(saw_waiting, "never saw 2 running + 2 waiting");
    while let Some(resp) = tasks.join_next().await {
        assert_eq!(resp.unwrap().status, StatusCode::OK);
    }
    let text = metrics(addr).await;
    // Two requests started at once; two waited a whole 80-token run (~480 ms).
    let quick = sample(
        &text,
        "vllm:request_queue_time_seconds_bucket{engine=\"0\",le=\"0.3\"",
    );
    assert_eq!(quick, Some(2.0));
    assert_eq!(
        sample(&text, "vllm:request_queue_time_seconds_count"),
        Some(4.0)
    );
    let sum = sample(&text, "vllm:request_queue_time_seconds_sum").unwrap();
    assert!(sum > 0.6, "queue time sum {sum}");
    cluster.shutdown().await;
}

#[tokio::test]
async fn responses_name_the_pod_and_stream_vllm_shaped_chunks() {
    let cluster = start(vec![pod_config("pod-a")]).await;
    let addr = cluster.addrs()[0];
    let resp = post(
        addr,
        "/v1/completions",
        json!({"model": MODEL, "prompt": "Hello world", "max_tokens": 3}),
    )
    .await;
    assert_eq!(resp.status, StatusCode::OK);
    assert_eq!(resp.header("x-inference-pod"), Some("pod-a"));
    assert_eq!(
        resp.header("x-inference-port"),
        Some(addr.port().to_string().as_str())
    );
    let body = resp.json().unwrap();
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["model"], MODEL);
    assert_eq!(body["usage"]["completion_tokens"], 3);
    assert_eq!(body["usage"]["prompt_tokens"], 2);
    assert_eq!(body["choices"][0]["finish_reason"], "length");

    let chat = json!({"model": "food-review-1", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2, "stream": true, "stream_options": {"include_usage": true}});
    let req = client::request(Method::POST, "/v1/chat/completions", chat.to_string()).unwrap();
    let resp = client::send_streaming(addr, req).await.unwrap();
    let text = String::from_utf8_lossy(&resp.body()).into_owned();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 4, "{text}");
    assert_eq!(events[3], "data: [DONE]");
    let first: Value = serde_json::from_str(&events[0][6..]).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(first["model"], "food-review-1");
    let last: Value = serde_json::from_str(&events[1][6..]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    let usage: Value = serde_json::from_str(&events[2][6..]).unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 2);
    cluster.shutdown().await;
}

#[tokio::test]
async fn bad_requests_get_openai_errors_with_the_right_status() {
    let cluster = start(vec![pod_config("p0")]).await;
    let addr = cluster.addrs()[0];
    let cases = [
        (
            json!({"model": "nope", "prompt": "x"}),
            StatusCode::NOT_FOUND,
        ),
        (
            json!({"model": MODEL, "prompt": "x", "max_tokens": 5000}),
            StatusCode::BAD_REQUEST,
        ),
        (json!({"model": MODEL}), StatusCode::BAD_REQUEST),
        (
            json!({"model": MODEL, "prompt": ["a", "b"]}),
            StatusCode::BAD_REQUEST,
        ),
    ];
    for (body, status) in cases {
        let resp = post(addr, "/v1/completions", body.clone()).await;
        assert_eq!(resp.status, status, "{body}");
        let err = resp.json().unwrap();
        assert!(
            err["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{err}"
        );
        assert_eq!(err["error"]["code"], status.as_u16());
    }
    let resp = client::post_json(addr, "/v1/completions", "{not json")
        .await
        .unwrap();
    assert_eq!(resp.status, StatusCode::BAD_REQUEST);
    let req = client::request(
        Method::POST,
        "/v1/completions",
        json!({"prompt": "x"}).to_string(),
    )
    .unwrap();
    let req = client::with_header(req, "x-return-error", "429").unwrap();
    assert_eq!(
        client::send(addr, req).await.unwrap().status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let too_long = json!({"model": MODEL, "prompt": "word ".repeat(5000)});
    let resp = post(addr, "/v1/completions", too_long).await;
    assert_eq!(resp.status, StatusCode::BAD_REQUEST);
    assert!(resp.text().contains("maximum context length is 4096"));
    cluster.shutdown().await;
}

#[tokio::test]
async fn render_and_tokenize_agree_with_the_prompt_the_engine_prefills() {
    let cluster = start(vec![pod_config("p0")]).await;
    let addr = cluster.addrs()[0];
    let tok = post(
        addr,
        "/tokenize",
        json!({"model": MODEL, "prompt": "The quick brown fox"}),
    )
    .await
    .json()
    .unwrap();
    let render = post(
        addr,
        "/v1/completions/render",
        json!({"model": MODEL, "prompt": "The quick brown fox"}),
    )
    .await
    .json()
    .unwrap();
    assert_eq!(tok["tokens"], render[0]["token_ids"]);
    let ids = tok["tokens"].clone();
    let detok = post(addr, "/detokenize", json!({"model": MODEL, "tokens": ids}))
        .await
        .json()
        .unwrap();
    assert_eq!(detok["prompt"], "The quick brown fox");
    let messages = json!([{"role": "user", "content": "hi"}]);
    let chat = post(
        addr,
        "/v1/chat/completions/render",
        json!({"model": MODEL, "messages": messages}),
    )
    .await;
    let chat_tok = post(
        addr,
        "/tokenize",
        json!({"model": MODEL, "messages": messages}),
    )
    .await;
    assert_eq!(
        chat.json().unwrap()["token_ids"],
        chat_tok.json().unwrap()["tokens"]
    );
    let by_ids = post(
        addr,
        "/v1/completions",
        json!({"model": MODEL, "prompt": ids, "max_tokens": 1}),
    )
    .await;
    assert_eq!(
        by_ids.json().unwrap()["usage"]["prompt_tokens"],
        tok["count"]
    );
    cluster.shutdown().await;
}

#[tokio::test]
async fn lora_adapters_load_unload_and_appear_in_models_and_lora_info() {
    let cluster = start(vec![pod_config("p0")]).await;
    let addr = cluster.addrs()[0];
    let load = post(
        addr,
        "/v1/load_lora_adapter",
        json!({"lora_name": "sql", "lora_path": "/x"}),
    )
    .await;
    assert_eq!(load.status, StatusCode::OK);
    let again = post(
        addr,
        "/v1/load_lora_adapter",
        json!({"lora_name": "sql", "lora_path": "/x"}),
    )
    .await;
    assert_eq!(again.status, StatusCode::BAD_REQUEST);
    let models = client::get(addr, "/v1/models")
        .await
        .unwrap()
        .json()
        .unwrap();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, vec![MODEL, "food-review-1", "sql"]);
    let resp = post(
        addr,
        "/v1/completions",
        json!({"model": "sql", "prompt": "x", "max_tokens": 2}),
    )
    .await;
    assert_eq!(resp.json().unwrap()["model"], "sql");
    let text = metrics(addr).await;
    assert!(text.contains(r#"vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql",waiting_lora_adapters=""}"#), "{text}");
    assert_eq!(
        post(addr, "/v1/unload_lora_adapter", json!({"lora_name": "sql"}))
            .await
            .status,
        StatusCode::OK
    );
    let gone = post(
        addr,
        "/v1/completions",
        json!({"model": "sql", "prompt": "x"}),
    )
    .await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    cluster.shutdown().await;
}

#[tokio::test]
async fn a_killed_pod_refuses_connections_and_restarts_empty_after_its_startup_delay() {
    let mut cfg = pod_config("p1");
    cfg.startup_delay = Duration::from_millis(1000);
    let cluster = start(vec![pod_config("p0"), cfg]).await;
    let addr = cluster.addrs()[1];
    wait_healthy(addr).await;
    post(
        addr,
        "/v1/completions",
        json!({"model": MODEL, "prompt": (1..100).collect::<Vec<u32>>(), "max_tokens": 1}),
    )
    .await;
    cluster.kill(1).await.unwrap();
    assert!(client::get(addr, "/health").await.is_err());
    assert_eq!(
        client::get(cluster.addrs()[0], "/health")
            .await
            .unwrap()
            .status,
        StatusCode::OK
    );
    cluster.restart(1).await.unwrap();
    let starting = client::get(addr, "/health").await.unwrap();
    assert_eq!(starting.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(!metrics(addr).await.contains("cache_config_info"));
    wait_healthy(addr).await;
    let text = metrics(addr).await;
    assert!(text.contains("vllm:cache_config_info{"));
    assert_eq!(sample(&text, "vllm:prompt_tokens_total"), Some(0.0));
    cluster.shutdown().await;
}

async fn wait_healthy(addr: std::net::SocketAddr) {
    for _ in 0..200 {
        if client::get(addr, "/health")
            .await
            .expect("pod reachable")
            .status
            == StatusCode::OK
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("pod never became healthy");
}

#[tokio::test]
async fn hang_holds_requests_until_cleared_and_stall_freezes_metrics() {
    let cluster = start(vec![pod_config("p0")]).await;
    let addr = cluster.addrs()[0];
    let faults = cluster.faults(0).await.unwrap();
    faults.update(|f| f.stall_metrics = true);
    let frozen = metrics(addr).await;
    faults.update(|f| f.hang = true);
    let mut task = tokio::task::JoinSet::new();
    task.spawn(async move {
        post(
            addr,
            "/v1/completions",
            json!({"model": MODEL, "prompt": "x", "max_tokens": 2}),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        task.try_join_next().is_none(),
        "a hung request was answered"
    );
    faults.update(|f| f.hang = false);
    assert_eq!(
        task.join_next().await.unwrap().unwrap().status,
        StatusCode::OK
    );
    assert_eq!(metrics(addr).await, frozen);
    faults.update(|f| f.stall_metrics = false);
    assert_eq!(
        sample(&metrics(addr).await, "vllm:generation_tokens_total"),
        Some(2.0)
    );
    faults.update(|f| f.unhealthy = true);
    assert_eq!(
        client::get(addr, "/health").await.unwrap().status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    cluster.shutdown().await;
}

#[tokio::test]
async fn reset_prefix_cache_forgets_cached_prefixes() {
    let cluster = start(vec![pod_config("p0")]).await;
    let addr = cluster.addrs()[0];
    let prompt: Vec<u32> = (1..=64).collect();
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 1});
    post(addr, "/v1/completions", body.clone()).await;
    let hit = post(addr, "/v1/completions", body.clone())
        .await
        .json()
        .unwrap();
    assert_eq!(hit["usage"]["prompt_tokens_details"]["cached_tokens"], 48);
    assert_eq!(
        post(addr, "/reset_prefix_cache", json!({})).await.status,
        StatusCode::OK
    );
    let miss = post(addr, "/v1/completions", body).await.json().unwrap();
    assert_eq!(miss["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    cluster.shutdown().await;
}

#[tokio::test]
async fn a_slow_pod_takes_proportionally_longer() {
    let mut slow = pod_config("slow");
    slow.engine.speed = 0.25;
    let cluster = start(vec![pod_config("fast"), slow]).await;
    let prompt: Vec<u32> = (1..=1000).collect();
    let (fast_t, _) = ttft(cluster.addrs()[0], json!(prompt)).await;
    let (slow_t, _) = ttft(cluster.addrs()[1], json!(prompt)).await;
    // ~205 ms vs ~820 ms of simulated work.
    assert!(slow_t * 2 > fast_t * 5, "fast {fast_t:?} slow {slow_t:?}");
    cluster.shutdown().await;
}

#[tokio::test]
async fn the_other_request_apis_run_on_the_engine_and_answer_in_their_own_shape() {
    let cluster = start(vec![pod_config("p0")]).await;
    let addr = cluster.addrs()[0];
    let r = post(
        addr,
        "/v1/responses",
        json!({"model": MODEL, "instructions": "be brief", "input": "hello", "max_output_tokens": 4}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json().expect("json");
    assert_eq!(
        (&v["object"], &v["model"]),
        (&json!("response"), &json!(MODEL))
    );
    assert_eq!(v["output"][0]["content"][0]["type"], "output_text");
    let u = &v["usage"];
    assert_eq!(u["output_tokens"], 4, "{v}");
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["input_tokens"].as_u64().unwrap_or(0) + 4)
    );

    let r = post(
        addr,
        "/v1/messages",
        json!({"model": MODEL, "max_tokens": 3, "system": "s",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]}]}),
    )
    .await;
    let v = r.json().expect("json");
    assert_eq!(
        (&v["type"], &v["stop_reason"]),
        (&json!("message"), &json!("max_tokens")),
        "{v}"
    );
    assert_eq!(v["usage"]["output_tokens"], 3, "{v}");
    let missing = post(
        addr,
        "/v1/messages",
        json!({"model": MODEL, "messages": []}),
    )
    .await;
    assert_eq!(
        missing.status,
        StatusCode::BAD_REQUEST,
        "{}",
        missing.text()
    );

    let r = post(
        addr,
        "/inference/v1/generate",
        json!({"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 2}}),
    )
    .await;
    let v = r.json().expect("json");
    assert_eq!(
        v["choices"][0]["token_ids"].as_array().map(Vec::len),
        Some(2),
        "{v}"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let stream = post(
        addr,
        "/inference/v1/generate",
        json!({"token_ids": [1], "stream": true}),
    )
    .await;
    assert_eq!(stream.status, StatusCode::BAD_REQUEST, "{}", stream.text());

    let r = post(
        addr,
        "/v1/embeddings",
        json!({"model": MODEL, "input": ["a b", "c d e"]}),
    )
    .await;
    let v = r.json().expect("json");
    assert_eq!(v["data"].as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(v["data"][1]["embedding"].as_array().map(Vec::len), Some(16));
    assert_eq!(v["usage"]["prompt_tokens"], 2 + 3, "{v}");
    let unknown = post(
        addr,
        "/v1/embeddings",
        json!({"model": "nope", "input": "x"}),
    )
    .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);

    for path in ["/v1/rerank", "/v1/realtime", "/generate"] {
        let r = post(addr, path, json!({"model": MODEL})).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{path}");
    }
    let m = metrics(addr).await;
    assert_eq!(
        sample(&m, "vllm:generation_tokens_total"),
        Some(4.0 + 3.0 + 2.0),
        "the three generating APIs ran on the engine"
    );
    cluster.shutdown().await;
}

//! vLLM's render endpoints over real HTTP on loopback: the ids are the pod's own (its tokenizer
//! and chat template, checked against the pod's prefix cache), the wire shapes are the ones
//! llm-d-router's `token-producer` decodes (an array for completions, one object for chat), and
//! bad input is a vLLM error body.

use std::net::SocketAddr;
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::tokenizer::{render_chat, ChatTurn, Tokenizer, TokenizerKind};

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// A pod on 127.0.0.1:0 reporting cached tokens, 100× faster than real time.
async fn pod() -> crate::Pod {
    let mut cfg = crate::PodConfig {
        pod_name: "pod-render".into(),
        prompt_tokens_details: true,
        ..crate::PodConfig::default()
    };
    cfg.engine.model = MODEL.into();
    cfg.engine.time_scale = 100.0;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let faults = crate::FaultSwitch::new(cfg.faults.clone());
    crate::Pod::start(listener, Arc::new(cfg), faults)
        .await
        .unwrap()
}

/// One HTTP/1.1 POST (connection closed after it): status and body.
async fn post(addr: SocketAddr, path: &str, body: &str) -> (u16, String) {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut answer = String::new();
    let wait = std::time::Duration::from_secs(10);
    tokio::time::timeout(wait, tcp.read_to_string(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let status = answer[9..12].parse().unwrap();
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap();
    (status, body)
}

async fn post_json(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    let (status, text) = post(addr, path, &body.to_string()).await;
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    (status, value)
}

fn ids(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}: {v}"))
}

/// Prefills `ids` followed by 16 other tokens; the cached tokens the pod reports. After a
/// request whose prompt the pod tokenized to `ids`, every full block of `ids` is a hit: the
/// rendered ids hash to the blocks the pod stored (the ones its KV events announce).
async fn cached_after(addr: SocketAddr, ids: &[u32]) -> u64 {
    let mut prompt = ids.to_vec();
    prompt.extend(70_000..70_016);
    let (status, resp) = post_json(
        addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": prompt, "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, 200, "{resp}");
    resp["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap()
}

fn full_blocks(n: usize) -> u64 {
    (n / 16 * 16) as u64
}

#[tokio::test]
async fn completions_render_answers_one_object_per_prompt_with_the_pods_ids() {
    let pod = pod().await;
    let addr = pod.addr();
    let tok = Tokenizer::new(TokenizerKind::Cl100kBase);
    let text = "You are a careful assistant who answers in one sentence. ".repeat(6);
    let (status, rendered) = post_json(
        addr,
        "/v1/completions/render",
        &json!({"model": MODEL, "prompt": text, "max_tokens": 5}),
    )
    .await;
    assert_eq!(status, 200, "{rendered}");
    let list = rendered.as_array().expect("an array, one entry per prompt");
    assert_eq!(list.len(), 1);
    let got = ids(&list[0]["token_ids"]);
    assert_eq!(got, tok.encode(&text));
    assert!(got.len() > 32, "{}", got.len());
    // The pod prefills the text prompt as exactly these ids.
    let (status, resp) = post_json(
        addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": text, "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(resp["usage"]["prompt_tokens"], got.len());
    assert_eq!(cached_after(addr, &got).await, full_blocks(got.len()));
    // A prompt list renders prompt by prompt; token-id prompts pass through.
    let (status, batch) = post_json(
        addr,
        "/v1/completions/render",
        &json!({"model": MODEL, "prompt": ["The quick brown fox", "jumps"]}),
    )
    .await;
    assert_eq!(status, 200, "{batch}");
    let batch: Vec<Vec<u32>> = batch
        .as_array()
        .unwrap()
        .iter()
        .map(|o| ids(&o["token_ids"]))
        .collect();
    assert_eq!(
        batch,
        [tok.encode("The quick brown fox"), tok.encode("jumps")]
    );
    let (_, by_ids) = post_json(
        addr,
        "/v1/completions/render",
        &json!({"model": MODEL, "prompt": [[5, 6, 7], [8]]}),
    )
    .await;
    assert_eq!(
        by_ids,
        json!([{"token_ids": [5, 6, 7]}, {"token_ids": [8]}])
    );
    pod.stop().await;
}

#[tokio::test]
async fn chat_render_answers_one_object_with_the_templated_ids_the_pod_caches() {
    let pod = pod().await;
    let addr = pod.addr();
    let system = "Answer as a ship's navigator would, briefly and precisely. ".repeat(5);
    let messages = json!([
        {"role": "system", "content": system},
        {"role": "user", "content": [{"type": "text", "text": "Where "}, {"type": "text", "text": "are we?"}]}
    ]);
    let (status, rendered) = post_json(
        addr,
        "/v1/chat/completions/render",
        &json!({"model": MODEL, "messages": messages}),
    )
    .await;
    assert_eq!(status, 200, "{rendered}");
    assert!(rendered.is_object(), "{rendered}");
    let got = ids(&rendered["token_ids"]);
    let turns = [
        ChatTurn {
            role: "system".into(),
            content: system.clone(),
        },
        ChatTurn {
            role: "user".into(),
            content: "Where are we?".into(),
        },
    ];
    let tok = Tokenizer::new(TokenizerKind::Cl100kBase);
    assert_eq!(got, tok.encode(&render_chat(&turns, true)));
    let (status, resp) = post_json(
        addr,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": messages, "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["usage"]["prompt_tokens"], got.len());
    assert!(got.len() > 32, "{}", got.len());
    assert_eq!(cached_after(addr, &got).await, full_blocks(got.len()));
    // add_generation_prompt is honoured as in serving.
    let (_, bare) = post_json(
        addr,
        "/v1/chat/completions/render",
        &json!({"model": MODEL, "messages": messages, "add_generation_prompt": false}),
    )
    .await;
    assert_eq!(
        ids(&bare["token_ids"]),
        tok.encode(&render_chat(&turns, false))
    );
    pod.stop().await;
}

#[tokio::test]
async fn bad_render_requests_get_vllm_error_bodies() {
    let pod = pod().await;
    let addr = pod.addr();
    let cases = [
        ("/v1/completions/render", r#"{"model": "#.to_owned(), 400),
        (
            "/v1/completions/render",
            json!({"model": MODEL}).to_string(),
            400,
        ),
        (
            "/v1/completions/render",
            json!({"model": MODEL, "prompt": ""}).to_string(),
            400,
        ),
        (
            "/v1/completions/render",
            json!({"model": "nope", "prompt": "hi"}).to_string(),
            404,
        ),
        ("/v1/chat/completions/render", r#"[1"#.to_owned(), 400),
        (
            "/v1/chat/completions/render",
            json!({"model": MODEL, "prompt": "hi"}).to_string(),
            400,
        ),
        (
            "/v1/chat/completions/render",
            json!({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}).to_string(),
            404,
        ),
    ];
    for (path, body, want) in cases {
        let (status, text) = post(addr, path, &body).await;
        assert_eq!(status, want, "{path} {body}: {text}");
        let err: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(err["error"]["code"], want, "{text}");
        let kind = if want == 400 {
            "BadRequestError"
        } else {
            "NotFoundError"
        };
        assert_eq!(err["error"]["type"], kind, "{text}");
    }
    pod.stop().await;
}

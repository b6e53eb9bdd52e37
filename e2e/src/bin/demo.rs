//! `demo`: the whole path on 127.0.0.1 — three model servers, epp (TLS, self-signed, as
//! upstream) and a real Envoy in FULL_DUPLEX_STREAMED mode — then a handful of requests, printing
//! where each landed and why. Run through `hack/demo.sh`, which installs Envoy first.

use anyhow::Context;
use bytes::Bytes;
use epp_e2e::client::{self, HttpResponse};
use epp_e2e::stack::{Stack, StackOptions};
use http::Method;
use std::net::SocketAddr;

fn chat(content: &str) -> String {
    serde_json::json!({"model": "test-model", "messages": [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": content}]}).to_string()
}

fn line(what: &str, r: &HttpResponse) {
    let pod = r.header("x-inference-pod").unwrap_or("-");
    let body = r.text();
    let detail = if r.status.is_success() { String::new() } else { format!("  {}", body.trim()) };
    println!("{what:<48} -> {} served by {pod}{detail}", r.status.as_u16());
}

async fn post(addr: SocketAddr, path: &str, body: String) -> anyhow::Result<HttpResponse> {
    Ok(client::post_json(addr, path, Bytes::from(body)).await?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let stack = Stack::start(StackOptions { tls: true, ..Default::default() }).await.context("starting the demo stack")?;
    let gw = stack.envoy.listener_addr();
    println!("model servers: {}", stack.pods.iter().map(|p| format!("{}={}", p.name(), p.endpoint())).collect::<Vec<_>>().join("  "));
    println!("epp: ext_proc {} (TLS, self-signed), health {}, metrics {}", stack.epp.grpc, stack.epp.health, stack.epp.metrics);
    println!("envoy: listener {} (FULL_DUPLEX_STREAMED, ORIGINAL_DST by x-gateway-destination-endpoint)\n", gw);

    println!("1. pod-0 reports a deep queue (40 waiting); fresh questions avoid it:");
    stack.pods[0].set_waiting(Some(40));
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    for i in 0..4 {
        line(&format!("   chat: question {i}"), &post(gw, "/v1/chat/completions", chat(&format!("question {i}"))).await?);
    }
    stack.pods[0].set_waiting(None);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;

    println!("\n2. the same long prompt, five times: prefix affinity keeps it on one pod:");
    let long = "Summarise the following report. ".repeat(120);
    for i in 0..5 {
        line(&format!("   chat: long shared prompt #{i}"), &post(gw, "/v1/chat/completions", chat(&long)).await?);
    }

    println!("\n3. streaming, a GET and bad input:");
    let sse = serde_json::json!({"model": "test-model", "prompt": "stream please", "stream": true}).to_string();
    let streamed = client::send_streaming(gw, client::request(Method::POST, "/v1/completions", Bytes::from(sse))?).await?;
    let pod = streamed.headers.get("x-inference-pod").and_then(|v| v.to_str().ok()).unwrap_or("-");
    let times: Vec<String> = streamed.chunks.iter().map(|c| format!("{}ms", c.at.as_millis())).collect();
    println!("{:<48} -> {} served by {pod}, {} chunks at {}", "   completions, stream=true", streamed.status.as_u16(), streamed.chunks.len(), times.join(" "));
    line("   GET /v1/models", &client::get(gw, "/v1/models").await?);
    line("   body that is not JSON", &post(gw, "/v1/chat/completions", "{not json".into()).await?);
    line("   chat without messages", &post(gw, "/v1/chat/completions", r#"{"model":"test-model"}"#.into()).await?);

    let metrics = stack.epp.metrics_text().await?;
    println!("\nepp metrics (excerpt):");
    for l in metrics.lines().filter(|l| l.starts_with("inference_objective_request_total") || l.starts_with("inference_objective_request_error_total") || l.starts_with("inference_extension_prefix_indexer_hit_ratio_count")) {
        println!("   {l}");
    }
    stack.stop().await;
    Ok(())
}

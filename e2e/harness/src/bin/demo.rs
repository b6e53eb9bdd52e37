//! `demo`: the whole path on 127.0.0.1 — four inference-sim pods (vLLM-like queueing and prefix
//! caching), epp (TLS with its self-signed certificate, as upstream) and a real Envoy in
//! FULL_DUPLEX_STREAMED mode — then a handful of requests, printing where each landed and what
//! the pod had cached. Run through `hack/demo.sh`, which installs Envoy first.

use anyhow::Context;
use bytes::Bytes;
use harness::client::{self, HttpResponse};
use harness::envoy::Template;
use harness::stack::SimStack;
use http::Method;
use inference_sim::EngineConfig;
use std::collections::BTreeMap;
use std::net::SocketAddr;

fn chat(system: &str, user: &str, max_tokens: u32) -> String {
    serde_json::json!({"model": "demo-model", "max_tokens": max_tokens, "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}).to_string()
}

fn line(what: &str, r: &HttpResponse) {
    let pod = r.header("x-inference-pod").unwrap_or("-");
    let usage = r
        .json()
        .ok()
        .map(|j| j["usage"].clone())
        .unwrap_or_default();
    let detail = if usage.is_null() {
        String::new()
    } else if r.status.is_success() {
        format!(
            "prompt {} tokens, {} cached",
            usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]
        )
    } else {
        String::new()
    };
    let detail = if r.status.is_success() {
        detail
    } else {
        r.text().trim().to_owned()
    };
    println!("{what:<40} -> {} {pod:<6} {detail}", r.status.as_u16());
}

async fn post(addr: SocketAddr, path: &str, body: String) -> anyhow::Result<HttpResponse> {
    Ok(client::post_json(addr, path, Bytes::from(body)).await?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let engine = EngineConfig {
        model: "demo-model".into(),
        time_scale: 5.0,
        ..EngineConfig::default()
    };
    let stack = SimStack::start(4, engine, Template::Duplex, &[], true)
        .await
        .context("starting the demo stack")?;
    let gw = stack.envoy.listener_addr();
    let pods: Vec<String> = stack
        .cluster
        .addrs()
        .iter()
        .enumerate()
        .map(|(i, a)| format!("sim-{i}={a}"))
        .collect();
    println!(
        "model servers (inference-sim, Llama-8B/H100 profile, 5x time): {}",
        pods.join("  ")
    );
    println!(
        "epp: ext_proc {} (TLS, self-signed), health {}, metrics {}",
        stack.epp.grpc, stack.epp.health, stack.epp.metrics
    );
    println!("envoy: listener {gw} (FULL_DUPLEX_STREAMED, ORIGINAL_DST by x-gateway-destination-endpoint)\n");

    println!("1. three products, each with a long system prompt, three questions each:");
    for q in 0..3 {
        for product in ["billing", "search", "storage"] {
            let system = format!("You answer questions about the {product} service. ")
                + &"Follow the style guide carefully and cite the docs. ".repeat(60);
            let r = post(
                gw,
                "/v1/chat/completions",
                chat(&system, &format!("question {q}"), 8),
            )
            .await?;
            line(&format!("   {product} question {q}"), &r);
        }
    }

    println!("\n2. a burst of 16 distinct requests at once spreads by load:");
    let burst = (0..16).map(|i| {
        post(
            gw,
            "/v1/chat/completions",
            chat(
                &format!("burst {i} "),
                &"tell me a long story ".repeat(20),
                64,
            ),
        )
    });
    let mut spread: BTreeMap<String, u32> = BTreeMap::new();
    for r in futures::future::join_all(burst).await {
        let r = r?;
        *spread
            .entry(r.header("x-inference-pod").unwrap_or("error").to_owned())
            .or_default() += 1;
    }
    println!("   served: {spread:?}");

    println!("\n3. streaming, a GET and bad input:");
    let sse = serde_json::json!({"model": "demo-model", "prompt": "stream please", "max_tokens": 6, "stream": true}).to_string();
    let streamed = client::send_streaming(
        gw,
        client::request(Method::POST, "/v1/completions", Bytes::from(sse))?,
    )
    .await?;
    let pod = streamed
        .headers
        .get("x-inference-pod")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-");
    let times: Vec<String> = streamed
        .chunks
        .iter()
        .map(|c| format!("{}ms", c.at.as_millis()))
        .collect();
    println!(
        "{:<40} -> {} {pod:<6} {} chunks at {}",
        "   completions, stream=true",
        streamed.status.as_u16(),
        streamed.chunks.len(),
        times.join(" ")
    );
    line("   GET /v1/models", &client::get(gw, "/v1/models").await?);
    line(
        "   body that is not JSON",
        &post(gw, "/v1/chat/completions", "{not json".into()).await?,
    );
    line(
        "   chat without messages",
        &post(
            gw,
            "/v1/chat/completions",
            r#"{"model":"demo-model"}"#.into(),
        )
        .await?,
    );

    let metrics = stack.epp.metrics_text().await?;
    println!("\nepp metrics (excerpt):");
    let wanted = [
        "inference_objective_request_total",
        "inference_objective_request_error_total",
        "inference_extension_prefix_indexer_hit_ratio_sum",
        "inference_extension_prefix_indexer_hit_ratio_count",
    ];
    for l in metrics
        .lines()
        .filter(|l| wanted.iter().any(|w| l.starts_with(w)))
    {
        println!("   {l}");
    }
    stack.stop().await;
    Ok(())
}

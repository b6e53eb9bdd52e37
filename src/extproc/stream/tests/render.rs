//! llm-d's `token-producer` with the `vllm` backend, through the stream: the decision waits for
//! the render call (a real HTTP server on loopback), and the precise index is looked up with the
//! ids it answered, not with epp's own tokenizer.

use super::*;
use crate::extproc::render::testing::server;
use crate::prefix::precise::Stored;
use crate::prefix::source::Indexes;

/// llm-d v0.10's split precise configuration, rendered by `url`, blocks of 4 tokens.
fn config(url: &str) -> String {
    format!(
        "apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: token-producer
  parameters:
    modelName: base/model
    vllm:
      url: {url}
      timeout: 2s
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig:
      blockSize: 4
    speculativeIndexing: false
- type: prefix-cache-scorer
  parameters:
    prefixMatchInfoProducerName: precise-prefix-cache-producer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
"
    )
}

/// The render server's ids: nothing epp's own tokenizer would produce.
fn ids(text: &str) -> Vec<u32> {
    text.bytes().map(|b| 900_000 + u32::from(b)).collect()
}

fn answer(path: &str, body: &serde_json::Value) -> (u16, String) {
    match (path, body["model"].as_str()) {
        ("/v1/completions/render", Some("base/model")) => {
            let p = body["prompt"].as_str().unwrap_or_default();
            (
                200,
                serde_json::json!([{ "token_ids": ids(p) }]).to_string(),
            )
        }
        _ => (400, r#"{"error":"unexpected"}"#.into()),
    }
}

/// Eight endpoints under `config`; a machine per stream over the same services.
fn build(config: &str) -> (Arc<Services>, Arc<Indexes>) {
    let (services, indexes, _) = super::services(&[1, 2, 3, 4, 5, 6, 7, 8], config);
    (services, indexes)
}

fn stream(services: &Arc<Services>, duplex: bool) -> (StreamMachine, ProtocolConfiguration) {
    stream_of(services, duplex)
}

fn completion(prompt: &str) -> Vec<u8> {
    serde_json::json!({"model": "m", "prompt": prompt, "max_tokens": 5})
        .to_string()
        .into_bytes()
}

#[tokio::test]
async fn the_precise_index_is_looked_up_with_the_rendered_ids() {
    let (url, seen) = server(answer, Duration::ZERO).await;
    let (services, indexes) = build(&config(&url));
    for (port, prompt) in [(3u16, "abcdefgh"), (6, "ijklmnop"), (8, "qrstuvwx")] {
        // The pod's KV events: it holds the prompt's two blocks, as the render server's ids.
        let ep = format!("127.0.0.1:{port}").parse().unwrap();
        indexes.precise.writer(ep).store(&Stored {
            model: "m",
            parent: None,
            hashes: &[u64::from(port) * 10, u64::from(port) * 10 + 1],
            tokens: &ids(prompt),
            block_size: 4,
        });
        for duplex in [false, true] {
            let (mut m, pc) = stream(&services, duplex);
            let out = run(
                &mut m,
                vec![
                    headers("/v1/completions", false, Some(pc)),
                    body(&completion(prompt), true),
                ],
            );
            assert!(
                out.iter().all(|r| !matches!(r.response, Some(Response::RequestHeaders(ref h)) if h.response.as_ref().is_some_and(|c| c.header_mutation.is_some()))),
                "no decision before the render call (duplex {duplex}): {out:?}"
            );
            let job = m.take_render_job().expect("a render call");
            assert!(m.take_render_job().is_none(), "one render call per request");
            assert!(m.take_flow_ticket().is_none());
            let mut out = Vec::new();
            m.on_rendered(job.run().await, &mut out);
            assert_eq!(
                destination(&out[0]).0,
                format!("127.0.0.1:{port}"),
                "{prompt}: the pod holding the rendered blocks"
            );
        }
    }
    assert_eq!(seen.lock().unwrap().len(), 6);
    let ok = services
        .metrics
        .renders
        .get_or_create(&crate::metrics::OutcomeLabels {
            outcome: crate::metrics::Outcome::success,
        })
        .get();
    assert_eq!(ok, 6);
}

#[tokio::test]
async fn a_failed_render_still_routes_and_is_counted_and_flow_control_comes_after() {
    let broken = |_: &str, _: &serde_json::Value| (503, "render pool saturated".to_owned());
    let (url, _) = server(broken, Duration::ZERO).await;
    let (services, _) = build(&config(&url));
    let (mut m, pc) = stream(&services, false);
    run(
        &mut m,
        vec![
            headers("/v1/completions", false, Some(pc)),
            body(&completion("hello"), true),
        ],
    );
    let mut out = Vec::new();
    let result = m.take_render_job().unwrap().run().await;
    m.on_rendered(result, &mut out);
    let (dest, _) = destination(&out[0]);
    assert!(dest.starts_with("127.0.0.1:"), "{dest}");
    let failed = services
        .metrics
        .renders
        .get_or_create(&crate::metrics::OutcomeLabels {
            outcome: crate::metrics::Outcome::failure,
        })
        .get();
    assert_eq!(failed, 1);

    // With flow control the ticket is asked for after the render call, and routing after it.
    let (url, _) = server(answer, Duration::ZERO).await;
    let (services, _) = build(&config(&url));
    let (mut m, pc) = stream(&services, false);
    m.use_flow_control();
    run(
        &mut m,
        vec![
            headers("/v1/completions", false, Some(pc)),
            body(&completion("hello"), true),
        ],
    );
    assert!(m.take_flow_ticket().is_none(), "not before the render call");
    let job = m.take_render_job().unwrap();
    let mut out = Vec::new();
    m.on_rendered(job.run().await, &mut out);
    assert!(out.is_empty(), "parked for flow control");
    assert!(m.take_flow_ticket().is_some());
    m.on_admission(Ok(()), &mut out);
    destination(&out[0]);
}

//! Prefill/decode disaggregation end to end: a real Envoy, epp with llm-d's P/D guide
//! configuration (`config/examples/llm-d-pd.yaml`, unchanged), inference-sim pods speaking the
//! vLLM side of the NIXL protocol, and a decode sidecar in front of each decode pod: llm-d's
//! own `pd-sidecar` when `EPP_PD_SIDECAR` names its binary, else the stand-in
//! (`harness::pd_sidecar`). Every test passes with both. The decode endpoints epp knows are the
//! sidecars' addresses, as in llm-d (the pool's target port is the sidecar's).
//!
//! Needs Envoy (`hack/install-envoy.sh`); `EPP_PD_SIDECAR=/path/to/pd-sidecar` for the real
//! sidecar (`hack/install-peers.sh pd-sidecar` builds it; `hack/test.sh` runs these tests with
//! it). No test here needs the stand-in: each passes with the real sidecar.
#![allow(clippy::unwrap_used)]

use crate::pd_support;

use std::time::Duration;

use harness::client;
use harness::pd_sidecar::SidecarConfig;
use harness::stack::pd::PdStack;
use pd_support::*;

/// One decode pod behind a sidecar and, with `prefill`, one prefill pod; epp with llm-d's P/D
/// guide configuration.
async fn start(prefill: usize, sidecar: SidecarConfig) -> PdStack {
    start_recording(prefill, sidecar, false).await
}

async fn start_recording(prefill: usize, sidecar: SidecarConfig, record: bool) -> PdStack {
    start_with(prefill, sidecar, record, "llm-d-pd.yaml", &[]).await
}

/// [`start`] with another example configuration and more epp flags.
async fn start_with(
    prefill: usize,
    sidecar: SidecarConfig,
    record: bool,
    example: &str,
    flags: &[&str],
) -> PdStack {
    let opts = options(prefill, sidecar, record, example, flags);
    let stack = PdStack::start(opts)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    wait_scraped(&stack).await;
    stack
}

fn sidecar() -> SidecarConfig {
    SidecarConfig::new("127.0.0.1:1".parse().unwrap())
}

async fn complete(stack: &PdStack, prompt: &str) -> serde_json::Value {
    complete_with(stack, prompt, &[]).await
}

async fn complete_with(
    stack: &PdStack,
    prompt: &str,
    headers: &[(&'static str, &str)],
) -> serde_json::Value {
    let body = serde_json::json!({"model": MODEL, "prompt": prompt, "max_tokens": 4});
    let mut req = client::request(http::Method::POST, "/v1/completions", body.to_string()).unwrap();
    for (k, v) in headers {
        req = client::with_header(req, k, v).unwrap();
    }
    let r = client::send(stack.envoy.listener_addr(), req)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("x-inference-pod"),
        Some("sim-decode-0"),
        "the decode pod answers"
    );
    r.json().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_prompt_is_prefilled_on_the_prefill_pod_and_a_repeat_stays_on_the_decode_pod() {
    let stack = start(1, sidecar()).await;
    let prompt = long_prompt(1);
    let first = complete(&stack, &prompt).await;
    let prompt_tokens = first["usage"]["prompt_tokens"].as_f64().unwrap();
    assert!(prompt_tokens > 1500.0, "{first}");
    // The prefill pod computed the prompt (one request, one generated token); the decode pod
    // pulled it (one NIXL transfer) and computed only the last prompt token.
    assert_eq!(
        pod_metric(&stack, 1, "vllm:prompt_tokens_total").await,
        prompt_tokens
    );
    assert_eq!(
        pod_metric(&stack, 1, "vllm:generation_tokens_total").await,
        1.0
    );
    assert_eq!(
        pod_metric(&stack, 0, "vllm:nixl_xfer_time_seconds_count").await,
        1.0
    );
    assert_eq!(
        pod_metric(&stack, 0, "vllm:request_prefill_kv_computed_tokens_sum").await,
        1.0
    );
    assert_eq!(
        pod_metric(&stack, 0, "vllm:generation_tokens_total").await,
        4.0
    );
    assert_eq!(stack.sidecars[0].counts().disaggregated, 1);
    let text = wait_for_epp(&stack, "one prefill-decode decision", |t| {
        decisions(t, "prefill-decode") == 1.0
    })
    .await;
    assert_eq!(decisions(&text, "decode-only"), 0.0);
    assert_eq!(
        sample(
            &text,
            "llm_d_inference_scheduler_disagg_decision_total",
            &[("decision_type", "prefill-decode")]
        ),
        Some(1.0)
    );

    // The same prompt again: the decode pod holds all of it but the last partial block, fewer
    // than nonCachedTokens (16) uncached tokens, so the decider keeps it local.
    // A client's own x-prefiller-host-port is removed: epp owns the header (pointed at a
    // closed port it would fail the request in the sidecar).
    let forged = [("x-prefiller-host-port", "127.0.0.1:1")];
    let second = complete_with(&stack, &prompt, &forged).await;
    assert!(
        second["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_f64()
            .unwrap()
            > 1500.0,
        "the decode pod's own cache: {second}"
    );
    assert_eq!(
        pod_metric(&stack, 1, "vllm:prompt_tokens_total").await,
        prompt_tokens,
        "no second prefill"
    );
    assert_eq!(
        pod_metric(&stack, 0, "vllm:nixl_xfer_time_seconds_count").await,
        1.0
    );
    assert_eq!(stack.sidecars[0].counts().decode_only, 1);
    wait_for_epp(&stack, "a decode-only decision", |t| {
        decisions(t, "decode-only") == 1.0
    })
    .await;
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_prefill_pods_the_request_is_served_decode_only() {
    let stack = start(0, sidecar()).await;
    let r = complete(&stack, &long_prompt(2)).await;
    assert!(r["usage"]["prompt_tokens"].as_f64().unwrap() > 1500.0);
    assert_eq!(
        pod_metric(&stack, 0, "vllm:nixl_xfer_time_seconds_count").await,
        0.0
    );
    let s = stack.sidecars[0].counts();
    assert_eq!((s.decode_only, s.disaggregated), (1, 0));
    let text = wait_for_epp(&stack, "a decode-only decision", |t| {
        decisions(t, "decode-only") == 1.0
    })
    .await;
    let skipped = [("reason", "no_prefill_endpoint")];
    assert_eq!(
        sample(&text, "epp_disagg_prefill_skipped_total", &skipped),
        Some(1.0)
    );
    stack.stop().await;
}

/// Sends a completion through Envoy; the status and the body.
async fn send(stack: &PdStack, prompt: &str) -> (u16, String) {
    let body = serde_json::json!({"model": MODEL, "prompt": prompt, "max_tokens": 4});
    let req = client::request(http::Method::POST, "/v1/completions", body.to_string()).unwrap();
    let r = client::send(stack.envoy.listener_addr(), req)
        .await
        .unwrap();
    (r.status.as_u16(), r.text())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_pod_the_sidecar_cannot_reach_is_retried_then_fails_and_epp_stops_choosing_it() {
    // llm-d v0.10's sidecar retries a prefill answered 502/503/504 (a refused connection is a
    // 502) and then returns the prefill's error: it no longer prefills locally (#1206).
    let stack = start(
        1,
        SidecarConfig {
            prefill_max_retries: 4,
            prefill_retry_backoff: Duration::from_millis(150),
            ..sidecar()
        },
    )
    .await;
    let sidecar = &stack.sidecars[0];
    // 1. The prefill pod is down for a moment: within the staleness threshold epp still
    // believes its last scrape and asks for remote prefill; the sidecar's retries find it back.
    stack.cluster.kill(1).await.unwrap();
    let restart = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        stack.cluster.restart(1).await.unwrap();
    };
    let prompt = long_prompt(3);
    let (r, ()) = tokio::join!(complete(&stack, &prompt), restart);
    assert!(r["usage"]["prompt_tokens"].as_f64().unwrap() > 1500.0);
    let c = sidecar.counts();
    assert_eq!((c.disaggregated, c.prefill_failures), (1, 0), "{c:?}");
    assert!(c.prefill_retries >= 1, "{c:?}");
    assert_eq!(
        pod_metric(&stack, 0, "vllm:nixl_xfer_time_seconds_count").await,
        1.0,
        "the decode pod pulled the KV from the restarted prefill pod"
    );
    // 2. Down for good: every retry is refused and the client gets the sidecar's 502.
    stack.cluster.kill(1).await.unwrap();
    let (status, _) = send(&stack, &long_prompt(4)).await;
    assert_eq!(status, 502);
    let after = sidecar.counts();
    assert_eq!(after.prefill_failures, 1, "{after:?}");
    assert_eq!(after.prefill_retries, c.prefill_retries + 4, "{after:?}");
    // epp counts what became of the requests it sent for remote prefill.
    let outcome = |o: &'static str| {
        move |t: &str| {
            sample(
                t,
                "epp_disagg_remote_prefill_responses_total",
                &[("outcome", o)],
            ) == Some(1.0)
        }
    };
    wait_for_epp(&stack, "one remote prefill answered", outcome("success")).await;
    wait_for_epp(&stack, "one remote prefill failed", outcome("error")).await;
    // 3. epp's metrics show the pod gone, and once its metrics are stale no request is sent
    // toward it: decode-only with the reason, and the request completes.
    wait_for_epp(&stack, "the prefill pod stale", |t| {
        sample(t, "epp_stale_endpoints", &[]) == Some(1.0)
            && sample(t, "epp_metrics_scrapes_total", &[("outcome", "failure")])
                .is_some_and(|v| v > 0.0)
    })
    .await;
    complete(&stack, &long_prompt(5)).await;
    let text = wait_for_epp(&stack, "a skipped prefill", |t| {
        decisions(t, "decode-only") == 1.0
    })
    .await;
    let stale = [("reason", "prefill_endpoints_stale")];
    assert_eq!(
        sample(&text, "epp_disagg_prefill_skipped_total", &stale),
        Some(1.0)
    );
    assert_eq!(decisions(&text, "prefill-decode"), 2.0, "the first two");
    let end = sidecar.counts();
    assert_eq!((end.decode_only, end.prefill_failures), (1, 1), "{end:?}");
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sidecar_sends_a_one_token_prefill_leg_and_a_decode_leg_with_its_kv_parameters() {
    let stack = start_recording(1, sidecar(), true).await;
    let body = serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": long_prompt(6)}],
        "max_tokens": 4,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let req =
        client::request(http::Method::POST, "/v1/chat/completions", body.to_string()).unwrap();
    let r = client::send(stack.envoy.listener_addr(), req)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.text();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let usage: serde_json::Value = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|v| v.get("usage").filter(|u| !u.is_null()).cloned())
        .unwrap();
    let prefill = posts(&stack, 1).await;
    let decode = posts(&stack, 0).await;
    assert_eq!((prefill.len(), decode.len()), (1, 1), "one leg each");
    let (ph, p) = &prefill[0];
    let (dh, d) = &decode[0];
    // The prefill leg: one token, not streamed, asking the pod to keep the KV for a remote decode.
    assert_eq!(p["stream"], false);
    assert!(p.get("stream_options").is_none(), "{p}");
    for f in ["max_tokens", "max_completion_tokens", "min_tokens"] {
        assert_eq!(p[f], 1, "{f}");
    }
    let kv = &p["kv_transfer_params"];
    assert_eq!(kv["do_remote_decode"], true);
    assert_eq!(kv["do_remote_prefill"], false);
    for f in [
        "remote_engine_id",
        "remote_block_ids",
        "remote_host",
        "remote_port",
    ] {
        assert!(kv[f].is_null(), "{f}: {kv}");
    }
    // The decode leg: the client's own fields, and what the prefill pod returned.
    assert_eq!(d["stream"], true);
    assert_eq!(d["stream_options"]["include_usage"], true);
    assert_eq!(d["max_tokens"], 4);
    assert!(d.get("min_tokens").is_none(), "{d}");
    let kv = &d["kv_transfer_params"];
    assert_eq!(kv["do_remote_prefill"], true);
    assert_eq!(kv["remote_engine_id"], "engine-sim-prefill-0");
    assert!(
        kv["remote_block_ids"]
            .as_array()
            .is_some_and(|b| !b.is_empty()),
        "{kv}"
    );
    // Neither leg carries epp's header; both carry the sidecar's request id.
    for h in [ph, dh] {
        assert!(h.get("x-prefiller-host-port").is_none(), "{h:?}");
    }
    let ids = |h: &http::HeaderMap| -> Vec<String> {
        h.get_all("x-request-id")
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    };
    // The sidecar adds its own id after Envoy's (it does not replace it): two values.
    assert_eq!(ids(ph).len(), 2, "{ph:?}");
    assert_eq!(ids(ph), ids(dh), "both legs carry the same request ids");
    // The client sees the prefill pod's cached tokens (none: it had nothing cached).
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"], 0,
        "{usage}"
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_prefill_pod_is_skipped_and_the_request_is_prefilled_on_the_decode_pod() {
    let stack = start(1, sidecar()).await;
    // 50 waiting against the detector's queueDepthThreshold of 5: the prefill pod is saturated,
    // the decode pod is not.
    set_queue(&stack, 1, Some(50)).await;
    let r = complete(&stack, &long_prompt(7)).await;
    assert!(r["usage"]["prompt_tokens"].as_f64().unwrap() > 1500.0);
    assert_eq!(
        pod_metric(&stack, 1, "vllm:prompt_tokens_total").await,
        0.0,
        "the prefill pod got nothing"
    );
    assert_eq!(
        pod_metric(&stack, 0, "vllm:nixl_xfer_time_seconds_count").await,
        0.0
    );
    let c = stack.sidecars[0].counts();
    assert_eq!((c.decode_only, c.disaggregated), (1, 0), "{c:?}");
    let text = wait_for_epp(&stack, "a decode-only decision", |t| {
        decisions(t, "decode-only") == 1.0
    })
    .await;
    let saturated = [("reason", "prefill_endpoints_saturated")];
    assert_eq!(
        sample(&text, "epp_disagg_prefill_skipped_total", &saturated),
        Some(1.0)
    );
    // Its queue drained, the prefill pod takes the next long prompt again.
    set_queue(&stack, 1, None).await;
    complete(&stack, &long_prompt(8)).await;
    assert_eq!(stack.sidecars[0].counts().disaggregated, 1);
    assert_eq!(
        pod_metric(&stack, 0, "vllm:nixl_xfer_time_seconds_count").await,
        1.0
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_echoing_its_prefill_token_is_prefilled_on_the_same_prefill_pod() {
    // llm-d's P/D session affinity: one session-affinity-scorer per profile, the prefill one
    // with `profileName: prefill` and the header x-session-token-prefill.
    let flags = ["--allow-experimental-plugins"];
    let example = "llm-d-pd-session-affinity.yaml";
    let stack = start_with(2, sidecar(), false, example, &flags).await;
    let send = |prompt: String, tokens: Vec<(&'static str, String)>| {
        let addr = stack.envoy.listener_addr();
        async move {
            let body = serde_json::json!({"model": MODEL, "prompt": prompt, "max_tokens": 4});
            let mut req =
                client::request(http::Method::POST, "/v1/completions", body.to_string()).unwrap();
            for (k, v) in &tokens {
                req = client::with_header(req, k, v).unwrap();
            }
            let r = client::send(addr, req).await.unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
            r
        }
    };
    let first = send(long_prompt(11), Vec::new()).await;
    let decode_token = first.header("x-session-token").unwrap().to_owned();
    let prefill_token = first.header("x-session-token-prefill").unwrap().to_owned();
    // Which prefill pod (cluster pod 1 or 2) took it: the one whose prompt counter moved.
    let mut pinned = 0;
    for i in [1, 2] {
        if pod_metric(&stack, i, "vllm:prompt_tokens_total").await > 0.0 {
            pinned = i;
        }
    }
    assert_ne!(pinned, 0, "a prefill pod prefilled the first request");
    let other = 3 - pinned;
    // The pinned pod now looks busier (3 waiting, under the saturation threshold of 5): the
    // queue scorer alone would send new prompts to the other one.
    set_queue(&stack, pinned, Some(3)).await;
    let before = pod_metric(&stack, pinned, "vllm:prompt_tokens_total").await;
    for seed in 12..16 {
        let tokens = vec![
            ("x-session-token", decode_token.clone()),
            ("x-session-token-prefill", prefill_token.clone()),
        ];
        let r = send(long_prompt(seed), tokens).await;
        assert_eq!(
            r.header("x-session-token-prefill"),
            Some(prefill_token.as_str())
        );
    }
    assert!(pod_metric(&stack, pinned, "vllm:prompt_tokens_total").await > before);
    assert_eq!(
        pod_metric(&stack, other, "vllm:prompt_tokens_total").await,
        0.0,
        "every turn of the session prefilled on its pod"
    );
    assert_eq!(stack.sidecars[0].counts().disaggregated, 5);
    // Without the token the queue decides: the other pod.
    send(long_prompt(16), Vec::new()).await;
    assert!(pod_metric(&stack, other, "vllm:prompt_tokens_total").await > 0.0);
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs llm-d-router v0.10's EPP: EPP_LLMD_EPP=/path/to/epp cargo test -p epp-e2e --test e2e pd:: -- --ignored"]
async fn llm_d_routers_own_epp_splits_and_keeps_the_same_requests_with_the_guide_config() {
    // The scenario of the first test, with llm-d-router's EPP in epp's place (same config).
    let mut opts = options(1, sidecar(), false, "llm-d-pd.yaml", &[]);
    opts.llmd_epp = Some(harness::llmd_epp::binary_from_env().unwrap());
    let stack = PdStack::start(opts)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    wait_for_epp(&stack, "both pods scraped", |t| {
        t.lines()
            .filter(|l| l.starts_with("inference_pool_per_pod_queue_size{"))
            .count()
            == 2
    })
    .await;
    let prompt = long_prompt(1);
    let first = complete(&stack, &prompt).await;
    let prompt_tokens = first["usage"]["prompt_tokens"].as_f64().unwrap();
    assert_eq!(
        pod_metric(&stack, 1, "vllm:prompt_tokens_total").await,
        prompt_tokens,
        "prefilled on the prefill pod"
    );
    assert_eq!(
        pod_metric(&stack, 0, "vllm:nixl_xfer_time_seconds_count").await,
        1.0
    );
    let decided = |d: &'static str| {
        move |t: &str| {
            sample(
                t,
                "llm_d_epp_disagg_decision_total",
                &[("decision_type", d)],
            ) == Some(1.0)
        }
    };
    wait_for_epp(
        &stack,
        "one prefill-decode decision",
        decided("prefill-decode"),
    )
    .await;
    complete(&stack, &prompt).await;
    assert_eq!(
        pod_metric(&stack, 1, "vllm:prompt_tokens_total").await,
        prompt_tokens,
        "the repeat stays on the decode pod"
    );
    assert_eq!(
        stack.sidecars[0].counts(),
        harness::pd_sidecar::SidecarCounts {
            disaggregated: 1,
            decode_only: 1,
            ..Default::default()
        }
    );
    wait_for_epp(&stack, "one decode-only decision", decided("decode-only")).await;
    stack.stop().await;
}

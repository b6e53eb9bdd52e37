//! Prefill/decode disaggregation with data-parallel ranks, as llm-d deploys it
//! (`VLLM_DATA_PARALLEL_SIZE=2`, v0.10.0 `deploy/components/vllm-{decode,prefill}`): a decode
//! pod whose two ranks each run their own engine and API server (the model server's port + r),
//! the decode sidecar started with `--data-parallel-size=2` serving rank r on its port + r, a
//! prefill pod with two ranks, and epp with llm-d's P/D guide configuration and one endpoint per
//! rank (`<pod>-rank-<r>`, as its Kubernetes discovery makes them from an InferencePool with two
//! targetPorts). The sidecar is llm-d's own `pd-sidecar` when `EPP_PD_SIDECAR` names its
//! binary, else the stand-in, which serves ranks the same way (`harness::pd_sidecar`).
//!
//! Needs Envoy (`hack/install-envoy.sh`); `EPP_PD_SIDECAR=/path/to/pd-sidecar` for the real
//! sidecar (`hack/install-peers.sh pd-sidecar` builds it; `hack/test.sh` runs these tests with
//! it). No test here needs the stand-in: each passes with the real sidecar.
#![allow(clippy::unwrap_used)]

use crate::pd_support;

use harness::client;
use harness::pd_sidecar::{SidecarConfig, DATA_PARALLEL_HEADER};
use harness::stack::pd::{PdOptions, PdStack};
use pd_support::*;

/// Cluster pods: decode ranks 0 and 1, then prefill ranks 0 and 1.
const DECODE: [usize; 2] = [0, 1];
const PREFILL: [usize; 2] = [2, 3];

/// One decode pod and one prefill pod, two ranks each, every rank recording its requests.
async fn start() -> PdStack {
    let stack = PdStack::start(options())
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    wait_scraped(&stack).await;
    stack
}

/// [`start`]'s stack: llm-d's P/D guide configuration with two ranks a pod, every rank
/// recording its requests.
fn options() -> PdOptions {
    let sidecar = SidecarConfig::new("127.0.0.1:1".parse().unwrap());
    PdOptions {
        data_parallel: 2,
        ..pd_support::options(1, sidecar, true, "llm-d-pd.yaml", &[])
    }
}

/// A completion through Envoy; the pod (rank) that answered and the body.
async fn complete(stack: &PdStack, prompt: &str) -> (String, serde_json::Value) {
    complete_with(stack, prompt, &[]).await
}

async fn complete_with(
    stack: &PdStack,
    prompt: &str,
    headers: &[(&'static str, &str)],
) -> (String, serde_json::Value) {
    let body = serde_json::json!({"model": MODEL, "prompt": prompt, "max_tokens": 4});
    let mut req = client::request(http::Method::POST, "/v1/completions", body.to_string()).unwrap();
    for (k, v) in headers {
        req = client::with_header(req, k, v).unwrap();
    }
    let r = client::send(stack.envoy.listener_addr(), req)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let pod = r.header("x-inference-pod").unwrap_or_default().to_owned();
    (pod, r.json().unwrap())
}

/// Makes `busy` look queued (3 waiting: below the saturation threshold of 5, but the queue
/// scorer prefers the other rank) and the other rank of the same pod idle.
async fn prefer(stack: &PdStack, ranks: [usize; 2], wanted: usize) {
    for i in ranks {
        set_queue(stack, i, (i != wanted).then_some(3)).await;
    }
}

/// Checks that decode rank `d` decoded the request prefilled on prefill rank `p` (cluster
/// pods), and that the other ranks computed nothing: the sims' counters and recordings.
async fn assert_served_by(stack: &PdStack, d: usize, p: usize, prompt_tokens: f64) {
    assert_eq!(
        pod_metric(stack, p, "vllm:prompt_tokens_total").await,
        prompt_tokens,
        "the prefill rank computed the prompt"
    );
    let prefill_legs = posts(stack, p).await;
    assert_eq!(prefill_legs.len(), 1, "one prefill leg");
    let leg = &prefill_legs[0].1;
    assert_eq!(leg["max_tokens"], 1);
    assert_eq!(leg["kv_transfer_params"]["do_remote_decode"], true);
    assert_eq!(
        pod_metric(stack, d, "vllm:nixl_xfer_time_seconds_count").await,
        1.0,
        "the decode rank pulled the KV"
    );
    assert_eq!(
        pod_metric(stack, d, "vllm:request_prefill_kv_computed_tokens_sum").await,
        1.0,
        "and computed only the last prompt token"
    );
    let decode_legs = posts(stack, d).await;
    assert_eq!(decode_legs.len(), 1, "one decode leg");
    let names = stack.endpoint_names();
    assert_eq!(
        decode_legs[0].1["kv_transfer_params"]["remote_engine_id"],
        format!("engine-{}", names[p]),
        "the decode leg pulls from the prefill rank epp chose"
    );
    for other in [DECODE[1 - d], PREFILL[1 - (p - PREFILL[0])]] {
        assert!(
            posts(stack, other).await.is_empty(),
            "rank {other} got nothing"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_routed_to_a_decode_rank_is_prefilled_where_epp_says_and_decoded_on_that_ranks_engine(
) {
    let stack = start().await;
    assert_eq!(
        stack.endpoint_names(),
        [
            "sim-decode-0-rank-0",
            "sim-decode-0-rank-1",
            "sim-prefill-0-rank-0",
            "sim-prefill-0-rank-1"
        ]
    );
    let sidecar = &stack.sidecars[0];
    assert_eq!(sidecar.addrs()[1].port(), sidecar.addr().port() + 1);

    // Rank 1 of both pods: the decode sidecar's port + 1, decoded by the engine on the model
    // server's port + 1.
    prefer(&stack, DECODE, DECODE[1]).await;
    prefer(&stack, PREFILL, PREFILL[1]).await;
    let (pod, body) = complete(&stack, &long_prompt(1)).await;
    assert_eq!(pod, "sim-decode-0-rank-1", "{body}");
    let prompt_tokens = body["usage"]["prompt_tokens"].as_f64().unwrap();
    assert!(prompt_tokens > 1500.0, "{body}");
    assert_served_by(&stack, DECODE[1], PREFILL[1], prompt_tokens).await;
    let (r0, r1) = (sidecar.rank_counts(0), sidecar.rank_counts(1));
    assert_eq!(
        (r0.disaggregated, r1.disaggregated),
        (0, 1),
        "{r0:?} {r1:?} ({})",
        stack.sidecar_kind()
    );
    let text = wait_for_epp(&stack, "one prefill-decode decision", |t| {
        decisions(t, "prefill-decode") == 1.0
    })
    .await;
    assert_eq!(decisions(&text, "decode-only"), 0.0);
    assert_eq!(
        sample(
            &text,
            "epp_disagg_remote_prefill_responses_total",
            &[("outcome", "success")]
        ),
        Some(1.0)
    );

    // And the other way round: rank 0 of both, on the pods' own ports. A client's
    // x-data-parallel-host-port naming rank 1 would move the decode there on the sidecar's
    // rank-0 port; epp removes it.
    prefer(&stack, DECODE, DECODE[0]).await;
    prefer(&stack, PREFILL, PREFILL[0]).await;
    let forged = sidecar.addrs()[1].to_string();
    let (pod, body) =
        complete_with(&stack, &long_prompt(2), &[(DATA_PARALLEL_HEADER, &forged)]).await;
    assert_eq!(pod, "sim-decode-0-rank-0", "{body}");
    let prompt_tokens = body["usage"]["prompt_tokens"].as_f64().unwrap();
    assert_served_by_rank_zero(&stack, prompt_tokens).await;
    assert_eq!(sidecar.rank_counts(0).disaggregated, 1);
    assert_eq!(sidecar.rank_counts(1).disaggregated, 1);
    wait_for_epp(&stack, "two prefill-decode decisions", |t| {
        decisions(t, "prefill-decode") == 2.0
    })
    .await;
    stack.stop().await;
}

/// Rank 0 of each pod served the second request (rank 1 kept the first one's counts).
async fn assert_served_by_rank_zero(stack: &PdStack, prompt_tokens: f64) {
    let (d, p) = (DECODE[0], PREFILL[0]);
    assert_eq!(
        pod_metric(stack, p, "vllm:prompt_tokens_total").await,
        prompt_tokens
    );
    assert_eq!(
        pod_metric(stack, d, "vllm:nixl_xfer_time_seconds_count").await,
        1.0
    );
    let legs = posts(stack, d).await;
    assert_eq!(legs.len(), 1);
    assert_eq!(
        legs[0].1["kv_transfer_params"]["remote_engine_id"],
        "engine-sim-prefill-0-rank-0"
    );
    assert_eq!(
        posts(stack, DECODE[1]).await.len(),
        1,
        "rank 1 still has only the first"
    );
    assert_eq!(posts(stack, PREFILL[1]).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deprecated_rank_header_on_the_primary_port_decodes_on_the_named_rank() {
    // What upstream's deprecated data-parallel-profile-handler relied on (epp refuses it:
    // `primaryPort`); the sidecar still honours it, and the stand-in does the same.
    let stack = start().await;
    let sidecar = &stack.sidecars[0];
    let body = serde_json::json!({"model": MODEL, "prompt": "hello", "max_tokens": 2}).to_string();
    let send = |target: String| {
        let body = body.clone();
        let addr = sidecar.addr();
        async move {
            let req = client::request(http::Method::POST, "/v1/completions", body).unwrap();
            let req = client::with_header(req, DATA_PARALLEL_HEADER, &target).unwrap();
            client::send(addr, req).await.unwrap()
        }
    };
    let r = send(sidecar.addrs()[1].to_string()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-inference-pod"), Some("sim-decode-0-rank-1"));
    assert_eq!(posts(&stack, DECODE[0]).await.len(), 0);
    let r = send("127.0.0.1:1".into()).await;
    assert_eq!(r.status, 400, "no rank there: {}", r.text());
    assert_eq!(
        posts(&stack, DECODE[0]).await.len(),
        0,
        "nor sent to rank 0"
    );
    assert_eq!(posts(&stack, DECODE[1]).await.len(), 1);
    stack.stop().await;
}

/// Forces pod `i`'s queue and waits until llm-d's EPP shows it for that rank.
async fn set_llmd_queue(stack: &PdStack, i: usize, waiting: Option<u64>) {
    let control = stack.cluster.control(i).await.unwrap().unwrap();
    control.hook().set_waiting(waiting);
    let name = format!("\"{}\"", stack.endpoint_names()[i]);
    let want = format!(" {}", waiting.unwrap_or(0));
    wait_for_epp(stack, "the rank's queue scraped", |t| {
        t.lines().any(|l| {
            l.starts_with("inference_pool_per_pod_queue_size{")
                && l.contains(&name)
                && l.ends_with(&want)
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs llm-d-router v0.10's EPP: EPP_LLMD_EPP=/path/to/epp cargo test -p epp-e2e --test e2e pd_dp:: -- --ignored"]
async fn llm_d_routers_own_epp_routes_the_ranks_the_same_way() {
    // The first test's rank-1 request with llm-d-router's EPP in epp's place (same config,
    // its file discovery with the same rank endpoints).
    let mut opts = options();
    opts.llmd_epp = Some(harness::llmd_epp::binary_from_env().unwrap());
    let stack = PdStack::start(opts)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    for (i, busy) in [(0, true), (1, false), (2, true), (3, false)] {
        set_llmd_queue(&stack, i, busy.then_some(3)).await;
    }
    let (pod, body) = complete(&stack, &long_prompt(1)).await;
    assert_eq!(pod, "sim-decode-0-rank-1", "{body}");
    let prompt_tokens = body["usage"]["prompt_tokens"].as_f64().unwrap();
    assert_served_by(&stack, DECODE[1], PREFILL[1], prompt_tokens).await;
    assert_eq!(stack.sidecars[0].rank_counts(1).disaggregated, 1);
    stack.stop().await;
}

//! A client cannot choose its own destination (issue #8). While epp answers, its routing
//! mutation overwrites a forged `x-gateway-destination-endpoint` and removes the other routing
//! headers; the request lands where epp chose. When epp is unreachable and the ext_proc filter
//! is fail-open (BUFFERED mode: in duplex mode Envoy fails open only before the first body
//! chunk), Envoy forwards the request unprocessed, and with an ORIGINAL_DST cluster the
//! client's header alone picks the upstream (the bypass the reference describes); a
//! header_mutation filter before ext_proc that removes the header closes it.

use std::net::SocketAddr;

use harness::envoy::{repo_root, EnvoyConfig, Template};
use harness::sim_pod::SimPod;
use harness::stack::{Epp, StackOptions};
use http::StatusCode;

use super::support::{args, completion, post, served_by, start, traffic, wait_for_scraped_queue};

const DESTINATION: &str = "x-gateway-destination-endpoint";

/// The header_mutation filter (flow-style YAML, one list item) that drops a client's header.
const STRIP_FILTER: &str = "- {name: envoy.filters.http.header_mutation, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation, mutations: {request_mutations: [{remove: x-gateway-destination-endpoint}]}}}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_destination_header_is_overwritten() {
    let attacker = SimPod::named("attacker").await.unwrap();
    let stack = start(StackOptions {
        pods: 2,
        ..StackOptions::default()
    })
    .await;
    // epp prefers pod-0: pod-1 reports a long queue.
    stack.pods[1].hook().set_waiting(Some(50));
    wait_for_scraped_queue(&stack.epp, &stack.pods[1].endpoint(), 50.0).await;
    for forged in [stack.pods[1].endpoint(), attacker.endpoint()] {
        for _ in 0..3 {
            let headers = [
                (DESTINATION, forged.as_str()),
                ("x-gateway-destination-endpoint-served", forged.as_str()),
            ];
            let r = post(
                &stack,
                "/v1/completions",
                completion("where do I go"),
                &headers,
            )
            .await;
            assert_eq!(served_by(&stack, &r), 0, "forged {forged}");
        }
    }
    let got = traffic(&stack.pods[0]);
    assert_eq!(got.len(), 6);
    for req in &got {
        assert_eq!(
            req.header(DESTINATION),
            Some(stack.pods[0].endpoint().as_str()),
            "epp's value, not the client's"
        );
        assert_eq!(
            req.header("x-gateway-destination-endpoint-served"),
            None,
            "stripped"
        );
    }
    assert!(traffic(&attacker).is_empty());
    stack.stop().await;
    attacker.shutdown().await;
}

/// Envoy fail-open in front of an epp that is down; `strip` adds the header_mutation filter.
async fn fail_open_envoy(pool: SocketAddr, strip: bool) -> (harness::envoy::Envoy, Epp) {
    let epp = Epp::start(&args(&[
        "--static-endpoints",
        &pool.to_string(),
        "--secure-serving=false",
    ]))
    .await
    .unwrap();
    let template = Template::File(repo_root().join("config/envoy/buffered-fail-open.yaml"));
    let envoy = EnvoyConfig::new(template)
        .epp(epp.grpc)
        .pool([pool])
        .var(
            "CLIENT_HEADER_FILTER",
            if strip { STRIP_FILTER } else { "" },
        )
        .start()
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    (envoy, epp)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_without_stripping_lets_the_client_choose_and_stripping_stops_it() {
    let pod = SimPod::named("pod-0").await.unwrap();
    let attacker = SimPod::named("attacker").await.unwrap();
    for strip in [false, true] {
        let (envoy, epp) = fail_open_envoy(pod.addr(), strip).await;
        epp.stop().await;
        let req = harness::client::request(
            http::Method::POST,
            "/v1/completions",
            completion("fail open"),
        )
        .unwrap();
        let req = harness::client::with_header(req, DESTINATION, &attacker.endpoint()).unwrap();
        let r = harness::client::send(envoy.listener_addr(), req)
            .await
            .unwrap();
        if strip {
            assert_eq!(
                r.status,
                StatusCode::SERVICE_UNAVAILABLE,
                "no destination, no upstream: {}",
                r.text()
            );
            assert!(
                traffic(&attacker).is_empty(),
                "the stripped header chose nothing"
            );
        } else {
            assert_eq!(
                r.header("x-inference-pod"),
                Some("attacker"),
                "the bypass: {}",
                r.text()
            );
            attacker.hook().clear_requests();
        }
        drop(envoy);
    }
    pod.shutdown().await;
    attacker.shutdown().await;
}

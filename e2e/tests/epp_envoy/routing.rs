//! Where requests go: the pod epp names is the pod Envoy connects to, for bodyless requests,
//! over TLS, with override_host fallback lists, and within a gateway's subset hint.

use harness::client;
use harness::envoy::{repo_root, Template};
use harness::stack::StackOptions;
use http::StatusCode;

use super::support::{
    access_log, args, assert_routed_to, completion, example_config, post, received_counts,
    served_by, start, traffic, MODEL,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_epp_names_in_header_and_metadata_is_the_pod_that_serves() {
    let stack = start(StackOptions::default()).await;
    let mut served = Vec::new();
    for i in 0..6 {
        let body = completion(&format!("request number {i} for the routing check"));
        let response = post(&stack, "/v1/completions", body.clone(), &[]).await;
        let pod = &stack.pods[served_by(&stack, &response)];
        let received = traffic(pod);
        let last = received.last().unwrap();
        assert_eq!(
            last.body,
            body.as_bytes(),
            "{} got another body",
            pod.name()
        );
        assert_eq!(
            last.header("x-gateway-destination-endpoint"),
            Some(pod.endpoint().as_str())
        );
        served.push(pod.endpoint());
    }
    let log = access_log(&stack, served.len()).await;
    for (entry, endpoint) in log.iter().zip(&served) {
        assert_routed_to(entry, endpoint);
    }
    assert_eq!(received_counts(&stack).iter().sum::<usize>(), 6);
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bodyless_get_of_the_model_list_is_routed_to_a_pod() {
    let stack = start(StackOptions::default()).await;
    let response = client::get(stack.envoy.listener_addr(), "/v1/models")
        .await
        .unwrap();
    let pod = &stack.pods[served_by(&stack, &response)];
    assert_eq!(response.json().unwrap()["data"][0]["id"], MODEL);
    let received = traffic(pod);
    assert_eq!(received.len(), 1);
    assert_eq!(
        (received[0].method.as_str(), received[0].path.as_str()),
        ("GET", "/v1/models")
    );
    let log = access_log(&stack, 1).await;
    assert_eq!(log[0].method, "GET");
    assert_routed_to(&log[0], &pod.endpoint());
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_reaches_epp_over_tls_with_its_self_signed_certificate() {
    let stack = start(StackOptions {
        tls: true,
        ..StackOptions::default()
    })
    .await;
    let body = r#"{"model":"test-model","messages":[{"role":"user","content":"over tls"}]}"#;
    let response = post(&stack, "/v1/chat/completions", body, &[]).await;
    let pod = &stack.pods[served_by(&stack, &response)];
    assert_eq!(traffic(pod)[0].body, body.as_bytes());
    let log = access_log(&stack, 1).await;
    assert_routed_to(&log[0], &pod.endpoint());
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn override_host_serves_the_first_endpoint_of_the_fallback_list_and_reports_it() {
    let config = example_config("prefix-absolute.yaml"); // max-score-picker, maxNumOfEndpoints: 2
    let opts = StackOptions {
        template: Template::DuplexOverrideHost,
        epp_args: args(&["--config-text", &config]),
        ..StackOptions::default()
    };
    let stack = start(opts).await;
    let mut served = Vec::new();
    for i in 0..4 {
        let response = post(
            &stack,
            "/v1/completions",
            completion(&format!("fallback {i}")),
            &[],
        )
        .await;
        served.push(stack.pods[served_by(&stack, &response)].endpoint());
    }
    let log = access_log(&stack, served.len()).await;
    for (entry, endpoint) in log.iter().zip(&served) {
        let list = entry.header.as_deref().unwrap_or_default();
        let listed: Vec<&str> = list.split(',').collect();
        assert_eq!(listed.len(), 2, "two endpoints expected: {}", entry.line);
        assert_ne!(listed[0], listed[1], "{}", entry.line);
        assert!(
            listed
                .iter()
                .all(|l| stack.pods.iter().any(|p| p.endpoint() == *l)),
            "unknown endpoint listed: {}",
            entry.line
        );
        assert_eq!(entry.metadata.as_deref(), Some(list), "{}", entry.line);
        assert_eq!(
            listed[0], endpoint,
            "not served by the first listed: {}",
            entry.line
        );
        assert_eq!(entry.served.as_deref(), Some(listed[0]), "{}", entry.line);
        assert_eq!(entry.upstream.as_deref(), Some(listed[0]), "{}", entry.line);
    }
    stack.stop().await;
}

/// `config/envoy/duplex-subset.yaml`: Envoy turns the `x-subset` request header into the
/// `envoy.lb.subset_hint` metadata epp reads (a comma-separated string).
fn subset_stack_options() -> StackOptions {
    let template = Template::File(repo_root().join("config/envoy/duplex-subset.yaml"));
    StackOptions {
        template,
        ..StackOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subset_hint_from_envoy_restricts_the_pods_that_serve() {
    let stack = start(subset_stack_options()).await;
    let only_1 = stack.pods[1].endpoint();
    for i in 0..4 {
        let response = post(
            &stack,
            "/v1/completions",
            completion(&format!("one {i}")),
            &[("x-subset", &only_1)],
        )
        .await;
        assert_eq!(served_by(&stack, &response), 1);
    }
    assert_eq!(received_counts(&stack), [0, 4, 0]);
    let forwarded = traffic(&stack.pods[1]);
    assert!(
        forwarded.iter().all(|r| r.header("x-subset").is_none()),
        "Envoy strips the hint header"
    );
    // Two entries, with spaces around them: pod 1 is never chosen.
    let pair = format!(
        "{} , {}",
        stack.pods[0].endpoint(),
        stack.pods[2].endpoint()
    );
    for i in 0..8 {
        let response = post(
            &stack,
            "/v1/completions",
            completion(&format!("two {i}")),
            &[("x-subset", &pair)],
        )
        .await;
        assert_ne!(
            served_by(&stack, &response),
            1,
            "pod 1 is outside the subset {pair}"
        );
    }
    assert_eq!(received_counts(&stack).iter().sum::<usize>(), 12);
    assert_eq!(received_counts(&stack)[1], 4);
    let log = access_log(&stack, 12).await;
    assert!(
        log[..4]
            .iter()
            .all(|e| e.upstream.as_deref() == Some(only_1.as_str())),
        "{log:#?}"
    );
    // Without the header every pod is a candidate again.
    let mut seen = [false; 3];
    for i in 0..30 {
        let response = post(
            &stack,
            "/v1/completions",
            completion(&format!("all {i}")),
            &[],
        )
        .await;
        seen[served_by(&stack, &response)] = true;
    }
    assert_eq!(seen, [true; 3], "without a subset hint all pods serve");
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subset_hint_that_matches_no_pod_or_is_empty_is_a_503() {
    let stack = start(subset_stack_options()).await;
    let cases = [
        ("127.0.0.1:1", "no endpoint matches the subset hint"),
        // A non-empty header whose entries are all blank: an empty list, as epp reads it.
        (",", "the subset hint is empty"),
    ];
    for (subset, message) in cases {
        let response = post(
            &stack,
            "/v1/completions",
            completion("subset"),
            &[("x-subset", subset)],
        )
        .await;
        assert_eq!(
            response.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{subset}: {}",
            response.text()
        );
        let error = &response.json().unwrap()["error"];
        assert_eq!(error["type"], "ServiceUnavailable", "{error}");
        let text = error["message"].as_str().unwrap();
        assert!(
            text.starts_with("inference error: ServiceUnavailable - "),
            "{text}"
        );
        assert!(text.contains(message), "{subset}: {text}");
    }
    assert_eq!(received_counts(&stack), [0, 0, 0]);
    let log = access_log(&stack, 2).await;
    for entry in &log {
        assert_eq!(
            (entry.status, entry.details.as_str()),
            (503, "epp_ServiceUnavailable"),
            "{}",
            entry.line
        );
        assert_eq!(entry.upstream, None, "{}", entry.line);
    }
    stack.stop().await;
}

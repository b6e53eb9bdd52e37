//! llm-d v1.0's configuration API (`apiVersion: llm-d.ai/v1`) through a real Envoy: the shipped
//! v1 document (`config/examples/llm-d-v1.yaml`, the shapes llm-d's guides write, endpoints
//! from llm-d's file-discovery) starts epp and routes to the file's pods; with
//! `requestHandler.propagatePriority` the pod receives the client's body with only a top-level
//! `priority` added. A v1 document holding a field v1 removed fails start-up naming the field
//! and where it moved. With InferenceObjectives (the fake API server), the objective's priority
//! is the one written.

use std::path::PathBuf;

use harness::envoy::{repo_root, EnvoyConfig, Template};
use harness::sim_pod::{test_pod_config, SimPod};
use harness::stack::{Epp, Stack};

use super::support::{args, post, served_by, traffic, MODEL};

/// The shipped v1 example with its endpoints file at `file`.
fn v1_config(file: &std::path::Path) -> String {
    let text = std::fs::read_to_string(repo_root().join("config/examples/llm-d-v1.yaml")).unwrap();
    let out = text.replace("/etc/epp/endpoints.yaml", &file.display().to_string());
    assert_ne!(out, text, "the example's endpoints path moved");
    out
}

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("epp-e2e-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn endpoints_file(pods: &[SimPod]) -> String {
    let mut out = String::from("endpoints:\n");
    for p in pods {
        let a = p.addr();
        out.push_str(&format!(
            "  - name: {}\n    address: \"{}\"\n    port: \"{}\"\n",
            p.name(),
            a.ip(),
            a.port()
        ));
    }
    out
}

/// A body a re-serialiser would change (key order, spacing, escapes, number spellings).
fn unusual_body(tag: &str) -> String {
    format!(
        "{{ \"temperature\" : 1.50,\n  \"prompt\":\"caf\\u00e9 {tag} \\/ na\u{ef}ve\",\
         \"model\" :  \"{MODEL}\" ,\"top_p\":1e-1,\n\t\"z\":{{\"priority\":[1.0, -0]}},\"max_tokens\":3 }}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_llm_d_v1_document_serves_and_propagates_the_priority_into_the_body() {
    let dir = scratch("v1-config");
    let file = dir.join("endpoints.yaml");
    let mut pods = Vec::new();
    for i in 0..2 {
        let mut cfg = test_pod_config("pod");
        cfg.pod_name = format!("pod-{i}");
        cfg.seed = i;
        pods.push(SimPod::bind(cfg).await.unwrap());
    }
    std::fs::write(&file, endpoints_file(&pods)).unwrap();
    let epp = Epp::start(&args(&[
        "--config-text",
        &v1_config(&file),
        "--secure-serving",
        "false",
        "--refresh-metrics-interval",
        "0.05s",
    ]))
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    let envoy = EnvoyConfig::new(Template::Duplex)
        .epp(epp.grpc)
        .pool(pods.iter().map(SimPod::addr))
        .start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let stack = Stack { pods, epp, envoy };

    for i in 0..4 {
        let body = unusual_body(&format!("request {i}"));
        let response = post(&stack, "/v1/completions", body.clone(), &[]).await;
        assert_eq!(response.status.as_u16(), 200, "{}", response.text());
        let pod = &stack.pods[served_by(&stack, &response)];
        let received = traffic(pod).pop().unwrap();
        // No InferenceObjective names the request: the resolved priority is the default, 0.
        let expected = body.replacen("{ ", "{\"priority\":0, ", 1);
        assert_eq!(std::str::from_utf8(&received.body).unwrap(), expected);
        assert_eq!(response.json().unwrap()["model"], MODEL);
    }
    stack.stop().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v1_document_with_a_removed_field_fails_start_up_naming_it_and_where_it_moved() {
    let dir = scratch("v1-removed");
    let file = dir.join("endpoints.yaml");
    std::fs::write(&file, "endpoints: []\n").unwrap();
    let text = format!(
        "{}saturationDetector:\n  pluginRef: utilization-detector\n",
        v1_config(&file)
    );
    let err = match Epp::start(&args(&[
        "--config-text",
        &text,
        "--secure-serving",
        "false",
    ]))
    .await
    {
        Ok(epp) => {
            epp.stop().await;
            panic!("epp started with a removed field");
        }
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("saturationDetector is not a field of llm-d.ai/v1")
            && err.contains("it moved to flowControl.saturationDetector.pluginRef"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The priority an InferenceObjective resolves (Kubernetes mode, the fake API server) is the
/// one written into the body: `critical` 100, `sheddable` -10.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn propagate_priority_writes_the_objectives_priority() {
    use harness::fake_apiserver::FakeApiServer;
    let api = FakeApiServer::bind().await.unwrap();
    let client = api.client(super::flow::NS).unwrap();
    let pod = SimPod::named("pod-0").await.unwrap();
    super::flow::cluster(&client, pod.addr().port()).await;
    let dir = scratch("v1-priority");
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig, super::flow::NS).unwrap();
    let config = "apiVersion: llm-d.ai/v1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins: [{pluginRef: queue-scorer}]\nrequestHandler:\n  propagatePriority: true\n";
    let epp = Epp::start(&args(&[
        "--pool-name",
        "pool",
        "--pool-namespace",
        super::flow::NS,
        "--kubeconfig",
        &kubeconfig.display().to_string(),
        "--secure-serving=false",
        "--config-text",
        config,
    ]))
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    let envoy = EnvoyConfig::new(Template::Duplex)
        .epp(epp.grpc)
        .start()
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let body = unusual_body("objective");
    for (objective, priority) in [("critical", 100), ("sheddable", -10)] {
        let expected = body.replacen("{ ", &format!("{{\"priority\":{priority}, "), 1);
        // The objectives reach epp's datastore through its watch: bounded retries.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let req = harness::client::request(http::Method::POST, "/v1/completions", body.clone())
                .unwrap();
            let req = harness::client::with_header(req, "x-gateway-inference-objective", objective)
                .unwrap();
            let r = harness::client::send(envoy.listener_addr(), req)
                .await
                .unwrap();
            assert_eq!(r.status.as_u16(), 200, "{}", r.text());
            let received = traffic(&pod).pop().unwrap();
            if std::str::from_utf8(&received.body).unwrap() == expected {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{objective}: {:?}",
                String::from_utf8_lossy(&received.body)
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    drop(envoy);
    epp.stop().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

//! llm-d-router's `file-discovery` (endpoints from a file, no Kubernetes): epp started with
//! the llm-d v0.10 configuration the side-by-side bench gives llm-d-router's own EPP
//! (`hack/bench/llmd-default.yaml`), and no endpoint flag, routes through a real Envoy to the
//! pods the file lists; with `watchFile: true` it follows an atomic rewrite of the file and
//! keeps the last good endpoints when an edit breaks the file. A missing file fails start-up
//! with a message naming it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use harness::envoy::{repo_root, EnvoyConfig, Template};
use harness::sim_pod::{test_pod_config, SimPod};
use harness::stack::{Epp, Stack};

use super::support::{args, completion, post, served_by};

/// llm-d's default configuration with its `file-discovery` plugin pointed at `file`.
fn llmd_config(file: &Path, watch: bool) -> String {
    let path = repo_root().join("hack/bench/llmd-default.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let line = format!("    path: {}\n    watchFile: {watch}", file.display());
    let out = text.replace("    path: ${ENDPOINTS_FILE}", &line);
    assert_ne!(out, text, "the template's path line moved");
    out
}

/// llm-d's endpoints file for `pods` (by index into `all`), plus one entry llm-d skips too.
fn endpoints_file(all: &[SimPod], pods: &[usize]) -> String {
    let mut out = String::from("endpoints:\n");
    for &i in pods {
        let addr = all[i].addr();
        out.push_str(&format!(
            "  - name: {}\n    address: \"{}\"\n    port: \"{}\"\n    labels: {{app: vllm}}\n",
            all[i].name(),
            addr.ip(),
            addr.port()
        ));
    }
    out.push_str("  - name: by-host-name\n    address: vllm.local\n    port: \"8000\"\n");
    out
}

/// Writes `text` the way a ConfigMap update or `mv` does: a new file renamed over the old.
fn replace(file: &Path, text: &str) {
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, file).unwrap();
}

/// Which pods served `n` requests.
async fn served(stack: &Stack, n: usize, tag: &str) -> Vec<usize> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let body = completion(&format!("{tag} request {i} about something else entirely"));
        let response = post(stack, "/v1/completions", body, &[]).await;
        out.push(served_by(stack, &response));
    }
    out
}

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("epp-e2e-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llm_ds_file_discovery_config_routes_to_the_files_pods_and_follows_its_rewrites() {
    let dir = scratch("file-discovery");
    let file = dir.join("endpoints.yaml");
    let mut pods = Vec::new();
    for i in 0..3 {
        let mut cfg = test_pod_config("pod");
        cfg.pod_name = format!("pod-{i}");
        cfg.seed = i;
        pods.push(SimPod::bind(cfg).await.unwrap());
    }
    std::fs::write(&file, endpoints_file(&pods, &[0, 1])).unwrap();
    // As llm-d users start it: the pool flags label metrics; no Kubernetes is contacted.
    let epp = Epp::start(&args(&[
        "--config-text",
        &llmd_config(&file, true),
        "--pool-name",
        "bench-pool",
        "--pool-namespace",
        "bench",
        "--secure-serving",
        "false",
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

    let first = served(&stack, 12, "first").await;
    assert!(
        first.iter().all(|&p| p < 2),
        "only the file's pods: {first:?}"
    );

    replace(&file, &endpoints_file(&stack.pods, &[2]));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if served(&stack, 1, "probe").await == [2] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the rewrite was not followed in 10 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = served(&stack, 8, "after").await;
    assert_eq!(after, vec![2; 8], "pods 0 and 1 left the file");

    replace(&file, "endpoints: [\n");
    tokio::time::sleep(Duration::from_millis(2_500)).await; // past two polls (1 s)
    let kept = served(&stack, 6, "kept").await;
    assert_eq!(
        kept,
        vec![2; 6],
        "a broken edit keeps the last good endpoints"
    );
    stack.stop().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_discovery_file_that_is_missing_fails_start_up_naming_it() {
    let dir = scratch("file-discovery-missing");
    let file = dir.join("no-such-endpoints.yaml");
    let err = match Epp::start(&args(&[
        "--config-text",
        &llmd_config(&file, false),
        "--secure-serving",
        "false",
    ]))
    .await
    {
        Ok(epp) => {
            epp.stop().await;
            panic!("epp started without its endpoints file");
        }
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("file-discovery") && err.contains("no-such-endpoints.yaml"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

//! Compatibility, differentially (issue 18): the same requests through Envoy + epp and Envoy +
//! each upstream EPP, on the same pod layout (4 pods, one IP each), comparing HTTP status, the
//! pod that served (`x-inference-pod`) and the error body. Unambiguous scenarios only: well-formed
//! requests, bodyless requests, subset hints, every bad-input class, and a repeated long prompt
//! (prefix affinity: the repeat should land where the first went).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;

use bytes::Bytes;
use http::Method;
use serde::{Deserialize, Serialize};

use super::cluster::{SimCluster, SimOptions};
use super::routers::{self, Bins, Router};
use super::BenchError;
use harness::client;

/// What one request got.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub status: u16,
    /// Index of the pod that answered (from `x-inference-pod`), if any.
    pub pod: Option<String>,
    /// The start of an error body.
    pub body: String,
}

/// One router's answers, case name → outcome.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CompatResult {
    pub router: String,
    pub outcomes: BTreeMap<String, Outcome>,
    pub error: Option<String>,
}

struct Case {
    name: &'static str,
    method: Method,
    path: &'static str,
    header: Option<(&'static str, String)>,
    body: String,
}

fn cases(model: &str, pods: &[SocketAddr]) -> Vec<Case> {
    let long: String = (0..1500).map(|i| format!(" w{}", i % 97)).collect();
    let post = |name, path, body: String| Case {
        name,
        method: Method::POST,
        path,
        header: None,
        body,
    };
    let third = pods.get(2).map(ToString::to_string).unwrap_or_default();
    vec![
        post(
            "chat completion",
            "/v1/chat/completions",
            format!(
                r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}],"max_tokens":1}}"#
            ),
        ),
        post(
            "completion",
            "/v1/completions",
            format!(r#"{{"model":"{model}","prompt":"hi","max_tokens":1}}"#),
        ),
        Case {
            name: "bodyless GET /v1/models",
            method: Method::GET,
            path: "/v1/models",
            header: None,
            body: String::new(),
        },
        Case {
            name: "subset hint: the third pod",
            method: Method::POST,
            path: "/v1/completions",
            header: Some(("x-gateway-destination-endpoint-subset", third)),
            body: format!(r#"{{"model":"{model}","prompt":"hi","max_tokens":1}}"#),
        },
        Case {
            name: "subset hint: no such pod",
            method: Method::POST,
            path: "/v1/completions",
            header: Some((
                "x-gateway-destination-endpoint-subset",
                "127.0.0.250:1".into(),
            )),
            body: format!(r#"{{"model":"{model}","prompt":"hi","max_tokens":1}}"#),
        },
        post(
            "bad: not JSON",
            "/v1/completions",
            "this is not json".into(),
        ),
        post(
            "bad: no model",
            "/v1/completions",
            r#"{"prompt":"hi","max_tokens":1}"#.into(),
        ),
        post(
            "bad: model not a string",
            "/v1/completions",
            r#"{"model":5,"prompt":"hi","max_tokens":1}"#.into(),
        ),
        post(
            "bad: no prompt",
            "/v1/completions",
            format!(r#"{{"model":"{model}","max_tokens":1}}"#),
        ),
        post(
            "bad: chat without messages",
            "/v1/chat/completions",
            format!(r#"{{"model":"{model}","max_tokens":1}}"#),
        ),
        post(
            "prefix: long prompt, first",
            "/v1/completions",
            format!(r#"{{"model":"{model}","prompt":"{long}","max_tokens":1}}"#),
        ),
        post(
            "prefix: same long prompt again",
            "/v1/completions",
            format!(r#"{{"model":"{model}","prompt":"{long} again","max_tokens":1}}"#),
        ),
    ]
}

/// Runs every case through every router (each on fresh pods).
pub async fn run(routers_: &[Router], bins: &Bins, dir: &Path, model: &str) -> Vec<CompatResult> {
    let mut out = Vec::new();
    for r in routers_ {
        let label = r.label();
        eprintln!("[bench] compat: {label}");
        let rdir = dir.join(&label);
        let res = match std::fs::create_dir_all(&rdir) {
            Ok(()) => one(r, bins, &rdir, model).await,
            Err(e) => Err(BenchError::io("creating the compat dir")(e)),
        };
        out.push(res.unwrap_or_else(|e| CompatResult {
            router: label,
            error: Some(e.to_string()),
            ..CompatResult::default()
        }));
    }
    out
}

async fn one(
    router: &Router,
    bins: &Bins,
    dir: &Path,
    model: &str,
) -> Result<CompatResult, BenchError> {
    let sim = SimOptions {
        pods: 4,
        num_gpu_blocks: 1001,
        block_size: 16,
        max_model_len: 16384,
        profile: "llmd-h100-8b".into(),
        time_scale: 10.0,
        lora_adapters: Vec::new(),
        max_loras: 1,
        kv_events: false,
        host_per_pod: true,
        speeds: Vec::new(),
        engine: super::cluster::Engine::InferenceSim,
    };
    let cluster = SimCluster::start(&bins.inference_sim, &sim, dir).await?;
    let running =
        routers::start(router, &cluster.pods, &cluster.kv_ports, bins, dir, model).await?;
    let mut outcomes = BTreeMap::new();
    for c in cases(model, &cluster.pods) {
        let mut req = client::request(c.method.clone(), c.path, Bytes::from(c.body.clone()))
            .map_err(|e| BenchError::Setup(e.to_string()))?;
        if let Some((name, value)) = &c.header {
            req = client::with_header(req, name, value)
                .map_err(|e| BenchError::Setup(e.to_string()))?;
        }
        let o = match client::send(running.target, req).await {
            Ok(r) => Outcome {
                status: r.status.as_u16(),
                pod: r
                    .header("x-inference-pod")
                    .map(|p| p.rsplit('-').next().unwrap_or(p).to_owned()),
                body: if r.status.is_success() {
                    String::new()
                } else {
                    r.text().chars().take(90).collect()
                },
            },
            Err(e) => Outcome {
                status: 0,
                pod: None,
                body: e.to_string(),
            },
        };
        outcomes.insert(c.name.to_owned(), o);
    }
    drop(running);
    drop(cluster);
    Ok(CompatResult {
        router: router.label(),
        outcomes,
        error: None,
    })
}

/// One row per case: each router's `status pod`, and whether it matches epp's.
pub fn table(results: &[CompatResult], ours: &str) -> String {
    let mut out = String::new();
    let names: Vec<&str> = results.iter().map(|r| r.router.as_str()).collect();
    let _ = writeln!(
        out,
        "| case | {} |\n|---|{}",
        names.join(" | "),
        "---|".repeat(names.len())
    );
    let us = results.iter().find(|r| r.router == ours);
    let mut cases: Vec<&String> = results.iter().flat_map(|r| r.outcomes.keys()).collect();
    cases.sort();
    cases.dedup();
    for case in cases {
        let cells: Vec<String> = results
            .iter()
            .map(|r| match r.outcomes.get(case) {
                Some(o) => {
                    let pod = o
                        .pod
                        .as_deref()
                        .map(|p| format!(" pod {p}"))
                        .unwrap_or_default();
                    let same = match us.and_then(|u| u.outcomes.get(case)) {
                        Some(u) if r.router != ours && u.status != o.status => " **≠ status**",
                        _ => "",
                    };
                    let body = if o.body.is_empty() {
                        String::new()
                    } else {
                        format!(" `{}`", o.body.replace('|', "/").replace('`', "'"))
                    };
                    format!("{}{pod}{same}{body}", o.status)
                }
                None => r
                    .error
                    .as_deref()
                    .unwrap_or("–")
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_owned(),
            })
            .collect();
        let _ = writeln!(out, "| {case} | {} |", cells.join(" | "));
    }
    out
}

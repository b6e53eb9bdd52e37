//! Compatibility, differentially (issue 18): the same requests through Envoy + epp and Envoy +
//! each upstream EPP, on the same pod layout (4 pods, one IP each), comparing HTTP status, the
//! pod that served (`x-inference-pod`) and the error body. Unambiguous scenarios only: well-formed
//! requests, bodyless requests, subset hints, every bad-input class, a repeated long prompt
//! (prefix affinity: the repeat should land where the first went), and one pod clearly best by
//! queue or by KV cache (`load` cases: real requests sent straight to the pods set them up).
//!
//! The subset hint travels as a gateway sends it: ext_proc metadata (`envoy.lb.subset_hint` /
//! `x-gateway-destination-endpoint-subset`, a list of `ip:port`), set by a Lua filter in a
//! second Envoy (`hack/bench/envoy-duplex-subset-list.yaml`) in front of the same EPP. A request
//! header of that name is not a hint: no EPP reads it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;

use bytes::Bytes;
use http::Method;
use serde::{Deserialize, Serialize};

use super::cluster::{SimCluster, SimOptions};
use super::routers::{self, Bins, Router, Running};
use super::BenchError;
use harness::client;
use harness::envoy::{repo_root, Envoy, EnvoyConfig, Template};

mod load;

/// What one request got.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub status: u16,
    /// Index of the pod that answered (from `x-inference-pod`), if any.
    pub pod: Option<String>,
    /// The start of an error body.
    pub body: String,
    /// What the case set up (the pods' scraped states for the load cases).
    #[serde(default)]
    pub note: String,
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
    /// The subset hint (comma-separated `ip:port`, `-` for an empty list), sent as metadata.
    subset: Option<String>,
    body: String,
}

/// The request header the subset gateway's Lua filter turns into the metadata list.
const SUBSET_LIST_HEADER: &str = "x-subset-list";

fn cases(model: &str, pods: &[SocketAddr]) -> Vec<Case> {
    let long: String = (0..1500).map(|i| format!(" w{}", i % 97)).collect();
    let post = |name, path, body: String| Case {
        name,
        method: Method::POST,
        path,
        subset: None,
        body,
    };
    let third = pods.get(2).map(ToString::to_string).unwrap_or_default();
    let subset = |name, hint: String| Case {
        subset: Some(hint),
        ..post(
            name,
            "/v1/completions",
            format!(r#"{{"model":"{model}","prompt":"hi","max_tokens":1}}"#),
        )
    };
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
            subset: None,
            body: String::new(),
        },
        subset("subset hint (metadata list): the third pod", third.clone()),
        subset(
            "subset hint (metadata list): the third pod and one unknown",
            format!("127.0.0.250:1,{third}"),
        ),
        subset(
            "subset hint (metadata list): no such pod",
            "127.0.0.250:1".into(),
        ),
        subset("subset hint (metadata list): empty", "-".into()),
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

/// Which cases a compat run sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suite {
    /// The basic cases and the queue and KV load cases ([`load::CASES`]), each EPP as given.
    Default,
    /// The LoRA load case ([`load::LORA`]), each EPP with its LoRA configuration
    /// ([`super::plan::lora_routers`]), on pods serving the case's two adapters.
    Lora,
}

/// Runs `suite`'s cases through every router (each case set on fresh pods).
pub async fn run(
    routers_: &[Router],
    bins: &Bins,
    dir: &Path,
    model: &str,
    suite: Suite,
) -> Vec<CompatResult> {
    let mut out = Vec::new();
    for r in routers_ {
        let label = r.label();
        eprintln!("[bench] compat ({suite:?}): {label}");
        let rdir = dir.join(&label);
        let res = match std::fs::create_dir_all(&rdir) {
            Ok(()) => match suite {
                Suite::Default => one(r, bins, &rdir, model).await,
                Suite::Lora => {
                    let adapters = [load::LORA_OTHER, load::LORA_BEST];
                    let o = load_case(r, bins, &rdir, model, &load::LORA, &adapters).await;
                    o.map(|o| BTreeMap::from([(load::LORA.name.to_owned(), o)]))
                }
            },
            Err(e) => Err(BenchError::io("creating the compat dir")(e)),
        };
        out.push(match res {
            Ok(outcomes) => CompatResult {
                router: label,
                outcomes,
                error: None,
            },
            Err(e) => CompatResult {
                router: label,
                error: Some(e.to_string()),
                ..CompatResult::default()
            },
        });
    }
    out
}

/// The basic cases, then each queue/KV load case, on fresh pods each.
async fn one(
    router: &Router,
    bins: &Bins,
    dir: &Path,
    model: &str,
) -> Result<BTreeMap<String, Outcome>, BenchError> {
    let mut outcomes = BTreeMap::new();
    {
        let (cluster, running) = stack(router, bins, &dir.join("basic"), model, &[]).await?;
        let subset_gateway = subset_gateway(&running).await?;
        for c in cases(model, &cluster.pods) {
            let target = match (&c.subset, &subset_gateway) {
                (None, _) => Some(running.target),
                (Some(_), gw) => gw.as_ref().map(Envoy::listener_addr),
            };
            let o = match target {
                Some(t) => send(t, &c).await,
                None => Outcome {
                    body: "no ext_proc server: no subset hint".into(),
                    ..Outcome::default()
                },
            };
            outcomes.insert(c.name.to_owned(), o);
        }
        drop(subset_gateway);
        drop(running);
        drop(cluster);
    }
    for case in &load::CASES {
        let o = load_case(router, bins, dir, model, case, &[]).await?;
        outcomes.insert(case.name.to_owned(), o);
    }
    Ok(outcomes)
}

/// One load case on fresh pods serving `adapters`, `router` in front of them.
async fn load_case(
    router: &Router,
    bins: &Bins,
    dir: &Path,
    model: &str,
    case: &load::LoadCase,
    adapters: &[&str],
) -> Result<Outcome, BenchError> {
    let (cluster, running) = stack(router, bins, &dir.join(case.slug), model, adapters).await?;
    let o = load::run(case, &cluster.pods, running.target, model).await;
    drop(running);
    drop(cluster);
    Ok(o)
}

/// Fresh pods (4, one IP each, serving `adapters` one at a time) and `router` in front of them.
async fn stack(
    router: &Router,
    bins: &Bins,
    dir: &Path,
    model: &str,
    adapters: &[&str],
) -> Result<(SimCluster, Running), BenchError> {
    std::fs::create_dir_all(dir).map_err(BenchError::io("creating the compat dir"))?;
    let sim = SimOptions {
        pods: 4,
        num_gpu_blocks: 1001,
        block_size: 16,
        max_model_len: 16384,
        profile: "llmd-h100-8b".into(),
        // Real time: the load cases prefill thousands of tokens before their probe.
        time_scale: 1.0,
        lora_adapters: adapters.iter().map(|a| (*a).to_owned()).collect(),
        max_loras: 1,
        kv_events: false,
        host_per_pod: true,
        speeds: Vec::new(),
        engine: super::cluster::Engine::InferenceSim,
        kv_events_sub: None,
    };
    let cluster = SimCluster::start(&bins.inference_sim, &sim, dir).await?;
    let running = routers::start_on(router, &cluster, bins, dir, model).await?;
    Ok((cluster, running))
}

/// A second Envoy in front of `running`'s ext_proc servers that sends the subset hint as
/// metadata (`None` for a router without ext_proc).
async fn subset_gateway(running: &Running) -> Result<Option<Envoy>, BenchError> {
    if running.extproc.is_empty() {
        return Ok(None);
    }
    let template = repo_root().join("hack/bench/envoy-duplex-subset-list.yaml");
    let envoy = EnvoyConfig::new(Template::File(template))
        .epp_replicas(running.extproc.iter().copied())
        .concurrency(1)
        .start()
        .await?;
    Ok(Some(envoy))
}

async fn send(target: SocketAddr, c: &Case) -> Outcome {
    let req = client::request(c.method.clone(), c.path, Bytes::from(c.body.clone())).and_then(
        |r| match &c.subset {
            Some(hint) => client::with_header(r, SUBSET_LIST_HEADER, hint),
            None => Ok(r),
        },
    );
    match req {
        Ok(req) => outcome(client::send(target, req).await),
        Err(e) => Outcome {
            body: e.to_string(),
            ..Outcome::default()
        },
    }
}

/// Status, serving pod and the start of an error body.
fn outcome(r: Result<client::HttpResponse, client::ClientError>) -> Outcome {
    match r {
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
            note: String::new(),
        },
        Err(e) => Outcome {
            body: e.to_string(),
            ..Outcome::default()
        },
    }
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
                    let note = if o.note.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", o.note)
                    };
                    let pod_differs = match us.and_then(|u| u.outcomes.get(case)) {
                        Some(u)
                            if r.router != ours && case.starts_with("load") && u.pod != o.pod =>
                        {
                            " **≠ pod**"
                        }
                        _ => "",
                    };
                    format!("{}{pod}{same}{pod_differs}{body}{note}", o.status)
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

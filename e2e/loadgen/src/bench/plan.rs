//! What each mode runs. The cluster is llm-d's published shape scaled to this machine: 8 pods
//! whose KV cache (16,000 tokens each) is exceeded six times over by the shared prefixes of the
//! workload (48 system prompts × 2,000 tokens = 96,000 tokens, 75% of the cluster's cache;
//! llm-d's 73-capacity run: ≈ 6× one pod, 73%). The pods use inference-sim's `llmd-h100-8b`
//! profile (llm-d-inference-sim's timing, what upstream benchmarks on) at time scale 0.5, so
//! the request rates stay within what the 2-core machine can drive.
//!
//! - `smoke`: 2 pods, a few requests, epp and round robin only (what CI runs, in-process);
//! - `quick`: shared prefix at the target load through every router, no sharing through Envoy
//!   least request and epp-best;
//! - `full`: every router on every workload: shared prefix, no sharing, a shared-prefix load
//!   sweep (latency against offered load), multi-turn chat, the long/short mix, the LoRA mix;
//!   plus the overhead runs and the inference-perf cross-check.

use std::path::PathBuf;

use super::cluster::SimOptions;
use super::compare::Scenario;
use super::routers::Router;
use harness::envoy::repo_root;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Smoke,
    Quick,
    Full,
}

/// Knobs of a plan (flags of the `bench` binary).
#[derive(Clone, Debug)]
pub struct PlanOptions {
    pub mode: Mode,
    /// Offered load of the shared-prefix run (requests/s).
    pub shared_prefix_rate: f64,
    /// Offered load of the no-sharing run (requests/s).
    pub random_rate: f64,
    /// Seconds of load per run.
    pub duration_s: f64,
    /// Seconds at the start of each run left out of the figures (caches warm up).
    pub warmup_s: f64,
    /// Include vllm-router and sglang-router.
    pub peers: bool,
    pub profile: String,
    pub time_scale: f64,
    /// More epp configurations to compare: (name, config file).
    pub extra_epp: Vec<(String, PathBuf)>,
    /// Each epp router runs once per count here (active-active replicas behind Envoy; a count
    /// above 1 adds `-x<count>` to the label). Empty means `[1]`.
    pub epp_replicas: Vec<usize>,
    /// Also run each multi-replica precise router with the replicas sharing their speculative
    /// entries (label suffix `-shared`).
    pub share_speculative: bool,
    /// Include the upstream EPPs (GIE's EPP, llm-d-router; `hack/install-peers.sh`).
    pub upstream: bool,
    /// Seed of every workload (the same seed gives the same requests at the same times).
    pub seed: u64,
}

pub const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

fn config(name: &str) -> PathBuf {
    repo_root().join("hack").join("bench").join(name)
}

/// The routers of a full comparison, in table order, plus `o.extra_epp`.
fn routers_of(o: &PlanOptions) -> Vec<Router> {
    let mut r = routers(o.peers);
    if o.upstream {
        r.extend(upstream_routers());
    }
    // An extra configuration named like a built-in one replaces it.
    r.retain(|b| {
        !o.extra_epp
            .iter()
            .any(|(n, _)| b.label() == format!("epp-{n}"))
    });
    r.extend(
        o.extra_epp
            .iter()
            .map(|(name, config)| epp_router(name, config)),
    );
    with_replicas(r, &o.epp_replicas, o.share_speculative)
}

/// Every epp router once per replica count in `counts` (empty: unchanged); with `share`, each
/// multi-replica precise router a second time with shared speculative entries.
fn with_replicas(routers: Vec<Router>, counts: &[usize], share: bool) -> Vec<Router> {
    if counts.is_empty() {
        return routers;
    }
    let mut out = Vec::new();
    for r in routers {
        match r {
            Router::Epp { name, config, .. } => out.extend(counts.iter().map(|&n| Router::Epp {
                name: name.clone(),
                config: config.clone(),
                replicas: n,
            })),
            Router::EppPrecise { name, config, .. } => {
                for &n in counts {
                    for shared in [false, true].into_iter().filter(|s| !s || (share && n > 1)) {
                        out.push(Router::EppPrecise {
                            name: name.clone(),
                            config: config.clone(),
                            replicas: n,
                            shared,
                        });
                    }
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// An epp router for `config`: with the pods' KV events when the config uses the precise scorer.
/// epp with one of `hack/bench`'s configurations, one replica.
fn epp(name: &str, file: &str) -> Router {
    Router::Epp {
        name: name.into(),
        config: config(file),
        replicas: 1,
    }
}

pub fn epp_router(name: &str, config: &std::path::Path) -> Router {
    let text = std::fs::read_to_string(config).unwrap_or_default();
    let precise = text.contains("precise-prefix-cache-scorer");
    let (name, config) = (name.to_owned(), config.to_path_buf());
    if text.contains("${KV_EVENTS_ENDPOINT}") {
        // llm-d's precise configuration (global socket mode): the pods publish to epp's SUB.
        Router::EppLlmdPrecise { name, config }
    } else if precise {
        Router::EppPrecise {
            name,
            config,
            replicas: 1,
            shared: false,
        }
    } else {
        Router::Epp {
            name,
            config,
            replicas: 1,
        }
    }
}

/// The routers of a full comparison, in table order.
pub fn routers(peers: bool) -> Vec<Router> {
    let mut r = vec![
        Router::EnvoyRoundRobin,
        Router::EnvoyLeastRequest,
        epp("default", "epp-default.yaml"),
        epp("upstream-default", "epp-upstream-default.yaml"),
        epp("best", "epp-best.yaml"),
        Router::EppPrecise {
            name: "precise".into(),
            config: config("epp-precise.yaml"),
            replicas: 1,
            shared: false,
        },
        epp("ttft", "epp-ttft.yaml"),
        epp("characters", "epp-characters.yaml"),
    ];
    if peers {
        r.push(Router::VllmRouter {
            policy: "cache_aware".into(),
        });
        r.push(Router::VllmRouter {
            policy: "power_of_two".into(),
        });
        r.push(Router::SglangRouter {
            policy: "cache_aware".into(),
        });
    }
    r
}

/// The upstream EPPs, each in its built-in default and, for llm-d-router, the llm-d guides'
/// "optimized baseline" (`hack/bench/llmd-optimized-baseline.yaml`, see BENCHMARKS.md).
pub fn upstream_routers() -> Vec<Router> {
    vec![
        Router::GieEpp {
            name: "default".into(),
            config: None,
        },
        Router::LlmdEpp {
            name: "default".into(),
            config: config("llmd-default.yaml"),
        },
        Router::LlmdEpp {
            name: "optimized-baseline".into(),
            config: config("llmd-optimized-baseline.yaml"),
        },
    ]
}

/// llm-d's precise prefix-cache configuration (llm-d-router's perf config, see
/// `hack/bench/llmd-precise.yaml`) run by llm-d-router's EPP and, from the same plugins without
/// file discovery (`hack/bench/epp-llmd-precise.yaml`), by epp; both bind the SUB socket the
/// llm-d-inference-sim pods publish their KV events to.
pub fn llmd_precise_routers() -> Vec<Router> {
    vec![
        Router::LlmdEppPrecise {
            name: "precise".into(),
            config: config("llmd-precise.yaml"),
        },
        Router::EppLlmdPrecise {
            name: "llmd-precise".into(),
            config: config("epp-llmd-precise.yaml"),
        },
    ]
}

/// The routers of the cost run: epp's default (and upstream's, run by epp) and each upstream
/// EPP's default, plus llm-d's optimized baseline.
pub fn cost_routers() -> Vec<Router> {
    let mut r = vec![
        epp("default", "epp-default.yaml"),
        epp("upstream-default", "epp-upstream-default.yaml"),
        epp("characters", "epp-characters.yaml"),
    ];
    r.extend(upstream_routers());
    r
}

/// The compat run's LoRA case: each EPP with the same LoRA-scoring plugins
/// (`hack/bench/{epp,gie,llmd}-lora.yaml`), as no EPP's built-in default scores LoRA.
pub fn lora_routers() -> Vec<Router> {
    vec![
        epp("lora", "epp-lora.yaml"),
        Router::GieEpp {
            name: "lora".into(),
            config: Some(config("gie-lora.yaml")),
        },
        Router::LlmdEpp {
            name: "lora".into(),
            config: config("llmd-lora.yaml"),
        },
    ]
}

pub fn sim(opts: &PlanOptions, pods: usize) -> SimOptions {
    SimOptions {
        pods,
        num_gpu_blocks: 1001,
        block_size: 16,
        max_model_len: 16384,
        profile: opts.profile.clone(),
        time_scale: opts.time_scale,
        lora_adapters: Vec::new(),
        max_loras: 4,
        kv_events: false,
        host_per_pod: false,
        speeds: Vec::new(),
        engine: super::cluster::Engine::InferenceSim,
        kv_events_sub: None,
    }
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// `loadgen` flags of the shared-prefix workload (without the load).
pub fn shared_prefix_args() -> Vec<String> {
    args(&[
        "--workload",
        "shared-prefix",
        "--groups",
        "48",
        "--prompts-per-group",
        "16",
        "--system-len",
        "2000",
        "--question-len",
        "200",
        "--output-len",
        "50",
    ])
}

fn open(rate_stages: String, drain_s: f64, warmup_s: f64) -> Vec<String> {
    let mut v = vec![
        "--rate-stages".into(),
        rate_stages,
        "--drain-secs".into(),
        drain_s.to_string(),
        "--seed".into(),
        "1".into(),
    ];
    v.extend(["--warmup-secs".into(), warmup_s.to_string()]);
    v
}

fn scenario(
    name: &str,
    sim: SimOptions,
    mut workload: Vec<String>,
    load: Vec<String>,
    routers: Vec<Router>,
) -> Scenario {
    workload.extend(load);
    Scenario {
        name: name.into(),
        sim,
        loadgen_args: workload,
        routers,
        model: MODEL.into(),
    }
}

/// The scenarios of a mode.
pub fn scenarios(o: &PlanOptions) -> Vec<Scenario> {
    let mut v = unseeded(o);
    for s in &mut v {
        reseed(&mut s.loadgen_args, o.seed);
    }
    v
}

/// Sets the value of every `--seed` in `args` to `seed`.
fn reseed(args: &mut [String], seed: u64) {
    for i in 1..args.len() {
        if args[i - 1] == "--seed" {
            args[i] = seed.to_string();
        }
    }
}

fn unseeded(o: &PlanOptions) -> Vec<Scenario> {
    let (d, w) = (o.duration_s, o.warmup_s);
    let drain = (d / 2.0).clamp(5.0, if o.mode == Mode::Quick { 8.0 } else { 20.0 });
    if o.mode == Mode::Smoke {
        let routers = vec![Router::EnvoyRoundRobin, epp("default", "epp-default.yaml")];
        let wl = args(&[
            "--workload",
            "shared-prefix",
            "--groups",
            "4",
            "--prompts-per-group",
            "2",
            "--system-len",
            "200",
            "--question-len",
            "20",
            "--output-len",
            "4",
        ]);
        return vec![scenario(
            "smoke",
            sim(o, 2),
            wl,
            open(format!("4:{d}"), 5.0, 0.0),
            routers,
        )];
    }
    let random = args(&[
        "--workload",
        "random",
        "--input-len",
        "1000",
        "--output-len",
        "50",
    ]);
    let mut no_sharing_routers = routers_of(o);
    let mut shared_routers = routers_of(o);
    if o.mode == Mode::Quick {
        no_sharing_routers
            .retain(|r| matches!(r, Router::EnvoyLeastRequest) || r.label() == "epp-best");
        // Under 5 minutes: the precise router runs in full mode (or quick with `--epp
        // precise=hack/bench/epp-precise.yaml`).
        shared_routers.retain(|r| {
            r.label() != "epp-precise" || o.extra_epp.iter().any(|(n, _)| n == "precise")
        });
        // One upstream EPP in quick mode: GIE's default, the one the Go module proxy serves.
        shared_routers.retain(|r| {
            !matches!(r, Router::LlmdEpp { .. } | Router::GieEpp { .. })
                || r.label() == "gie-epp-default"
        });
    }
    let mut v = vec![
        scenario(
            "shared-prefix",
            sim(o, 8),
            shared_prefix_args(),
            open(format!("{}:{d}", o.shared_prefix_rate), drain, w),
            shared_routers,
        ),
        scenario(
            "no-sharing",
            sim(o, 8),
            random,
            open(format!("{}:{d}", o.random_rate), drain, w),
            no_sharing_routers,
        ),
    ];
    if o.mode == Mode::Full {
        let r = o.shared_prefix_rate;
        let st = (d / 2.0).max(10.0);
        let sweep = format!(
            "{}:{st},{}:{st},{}:{st},{}:{st}",
            r * 0.25,
            r * 0.5,
            r * 0.75,
            r
        );
        v.push(scenario(
            "shared-prefix-sweep",
            sim(o, 8),
            shared_prefix_args(),
            open(sweep, drain, 0.0),
            routers_of(o),
        ));
        let chat = args(&[
            "--workload",
            "multi-turn",
            "--sessions",
            "48",
            "--turns",
            "6",
            "--system-len",
            "1000",
            "--question-len",
            "150",
            "--output-len",
            "50",
        ]);
        v.push(scenario(
            "multi-turn",
            sim(o, 8),
            chat.clone(),
            open(format!("{}:{d}", r * 0.6), drain, w),
            routers_of(o),
        ));
        if o.upstream {
            // The same two workloads on llm-d-inference-sim pods (one process per pod, one
            // port each: GIE's EPP, which needs one IP per pod, cannot run there).
            let mut llmd_sim = sim(o, 8);
            llmd_sim.engine = super::cluster::Engine::LlmdSim;
            // Plus llm-d's precise prefix-cache configuration, fed by the pods' KV events, run
            // by llm-d-router's EPP and by epp (`llmd_precise_routers`).
            let on_llmd_sim = || {
                let mut rs = routers_of(o);
                rs.retain(|r| {
                    matches!(
                        r,
                        Router::Epp { .. } | Router::LlmdEpp { .. } | Router::EppLlmdPrecise { .. }
                    ) && !r.label().ends_with("-x3")
                });
                // An extra configuration (`--epp llmd-precise=...`) replaces the built-in one.
                for r in llmd_precise_routers() {
                    if !rs.iter().any(|x| x.label() == r.label()) {
                        rs.push(r);
                    }
                }
                rs
            };
            v.push(scenario(
                "shared-prefix-llmd-sim",
                llmd_sim.clone(),
                shared_prefix_args(),
                open(format!("{}:{d}", o.shared_prefix_rate), drain, w),
                on_llmd_sim(),
            ));
            v.push(scenario(
                "multi-turn-llmd-sim",
                llmd_sim,
                chat,
                open(format!("{}:{d}", r * 0.6), drain, w),
                on_llmd_sim(),
            ));
        }
        let mix = args(&[
            "--workload",
            "mix",
            "--short-len",
            "200",
            "--long-fraction",
            "0.1",
            "--long-min",
            "1500",
            "--long-max",
            "8000",
            "--output-len",
            "50",
        ]);
        v.push(scenario(
            "long-short-mix",
            sim(o, 8),
            mix,
            open(format!("{}:{d}", o.random_rate), drain, w),
            routers_of(o),
        ));
        let mut lora_sim = sim(o, 8);
        lora_sim.lora_adapters = (0..8).map(crate::workload::lora_name).collect();
        let lora = args(&[
            "--workload",
            "lora",
            "--adapters",
            "8",
            "--input-len",
            "1000",
            "--output-len",
            "50",
        ]);
        v.push(scenario(
            "lora-mix",
            lora_sim,
            lora,
            open(format!("{}:{d}", o.random_rate), drain, w),
            routers_of(o),
        ));
        v.extend(super::ttft::scenarios(o, &routers_of(o)));
        v.push(super::trace_replay::scenario(o, &routers_of(o)));
        if o.upstream {
            // llm-d's precise configuration on inference-sim pods too (their PUB sockets
            // connect to the EPP's SUB, their render endpoints tokenize as they do).
            for s in v
                .iter_mut()
                .filter(|s| matches!(s.name.as_str(), "shared-prefix" | "multi-turn"))
            {
                for r in llmd_precise_routers() {
                    if !s.routers.iter().any(|x| x.label() == r.label()) {
                        s.routers.push(r);
                    }
                }
            }
        }
    }
    v
}

/// The cross-check scenario: shared prefix through epp (default profile) at half the target
/// load, evenly spaced arrivals (so both tools offer exactly the same load), no warm-up
/// (inference-perf has none), `secs` seconds.
pub fn crosscheck(o: &PlanOptions, secs: f64) -> Scenario {
    let router = epp("default", "epp-default.yaml");
    let mut load = open(format!("{}:{secs}", o.shared_prefix_rate / 2.0), 30.0, 0.0);
    load.push("--constant".into());
    scenario(
        "crosscheck",
        sim(o, 8),
        shared_prefix_args(),
        load,
        vec![router],
    )
}

#[cfg(test)]
pub(crate) mod tests;

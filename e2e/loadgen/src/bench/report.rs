//! Turns results into what people read: one Markdown table per scenario (with each router's CPU
//! per request), the target ratios of the benchmark issue with pass/miss, and SVG plots (TTFT
//! CDF per router, TTFT p90 against offered load).

use std::fmt::Write as _;
use std::path::Path;

use super::compare::{read_report, RouterResult};
use crate::plot::{self, Series};
use crate::summary::Percentiles;
use crate::Summary;

/// [`crate::MARKDOWN_HEADER`] plus the routers' CPU per request.
const HEADER: &str = "| run | requests | errors | req/s | output tok/s (window / whole run) | TTFT p50 / p90 / p99 (ms) | ITL p50 / p90 (ms) | E2E p50 / p90 (ms) | prefix hit rate | pod spread (CV) | router CPU µs/req |\n|---|---:|---:|---:|---:|---|---|---|---:|---:|---|";

/// One Markdown table per scenario, in run order.
pub fn tables(results: &[RouterResult]) -> String {
    let mut out = String::new();
    let mut scenarios: Vec<&str> = Vec::new();
    for r in results {
        if !scenarios.contains(&r.scenario.as_str()) {
            scenarios.push(&r.scenario);
        }
    }
    for s in scenarios {
        let _ = writeln!(out, "\n### {s}\n\n{HEADER}");
        for r in results.iter().filter(|r| r.scenario == s) {
            match &r.summary {
                Some(sum) => {
                    let cpu: Vec<String> = r
                        .cpu_us_per_request
                        .iter()
                        .filter(|(k, _)| k.as_str() != "pods")
                        .map(|(k, v)| format!("{k} {v:.0}"))
                        .collect();
                    let _ = writeln!(out, "{} {} |", sum.markdown_row(), cpu.join(", "));
                }
                None => {
                    let _ = writeln!(
                        out,
                        "| {} | failed: {} |",
                        r.router,
                        r.error
                            .as_deref()
                            .unwrap_or("?")
                            .lines()
                            .next()
                            .unwrap_or("")
                    );
                }
            }
        }
        stage_table(&mut out, results.iter().filter(|r| r.scenario == s));
    }
    out
}

/// Per-stage TTFT of multi-stage (load sweep) runs: latency against offered load.
fn stage_table<'a>(out: &mut String, results: impl Iterator<Item = &'a RouterResult>) {
    let mut header = false;
    for r in results {
        let Some(sum) = r.summary.as_ref().filter(|s| s.stages.len() > 1) else {
            continue;
        };
        if !header {
            let _ = writeln!(out, "\n| router | offered req/s | sent | ok | TTFT p50 / p90 (ms) | E2E p50 / p90 (ms) |\n|---|---:|---:|---:|---|---|");
            header = true;
        }
        for st in &sum.stages {
            let (t, e) = (&st.ttft_ms, &st.e2e_ms);
            let _ = writeln!(
                out,
                "| {} | {:.2} | {} | {} | {:.0} / {:.0} | {:.0} / {:.0} |",
                r.router, st.offered_rps, st.sent, st.ok, t.p50, t.p90, e.p50, e.p90
            );
        }
    }
}

fn find<'a>(results: &'a [RouterResult], scenario: &str, router: &str) -> Option<&'a Summary> {
    results
        .iter()
        .find(|r| r.scenario == scenario && r.router == router)
        .and_then(|r| r.summary.as_ref())
}

/// A ratio line: `name: value (target) ✓/✗`.
fn target(out: &mut String, name: &str, value: Option<f64>, goal: &str, met: impl Fn(f64) -> bool) {
    let _ = match value {
        Some(v) => writeln!(
            out,
            "| {name} | {v:.3} | {goal} | {} |",
            if met(v) { "met" } else { "**missed**" }
        ),
        None => writeln!(out, "| {name} | – | {goal} | not measured |"),
    };
}

/// The routing targets of the issue as ratios measured in this run.
pub fn targets(results: &[RouterResult], best: &str) -> String {
    let mut out = String::from("| ratio | measured | target | |\n|---|---:|---|---|\n");
    let sp = |r: &str| find(results, "shared-prefix", r);
    let ns = |r: &str| find(results, "no-sharing", r);
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let p90 = |s: Option<&Summary>| s.filter(|s| s.ok > 0).map(|s| s.ttft_ms.p90);
    let tput = |s: Option<&Summary>| s.map(|s| s.whole_run_output_tokens_per_s);
    let e2e = |s: Option<&Summary>| s.filter(|s| s.ok > 0).map(|s| s.e2e_ms.p90);
    target(
        &mut out,
        &format!("shared prefix: TTFT p90 {best} / round robin"),
        ratio(p90(sp(best)), p90(sp("envoy-round-robin"))),
        "≤ 0.1",
        |v| v <= 0.1,
    );
    target(
        &mut out,
        &format!("shared prefix: TTFT p90 {best} / vllm-router cache_aware"),
        ratio(p90(sp(best)), p90(sp("vllm-router-cache_aware"))),
        "≤ 0.5",
        |v| v <= 0.5,
    );
    target(
        &mut out,
        &format!("shared prefix: output tok/s (whole run) {best} / round robin"),
        ratio(tput(sp(best)), tput(sp("envoy-round-robin"))),
        "≥ 2",
        |v| v >= 2.0,
    );
    target(
        &mut out,
        &format!("no sharing: output tok/s (whole run) {best} / least request"),
        ratio(tput(ns(best)), tput(ns("envoy-least-request"))),
        "≥ 0.95",
        |v| v >= 0.95,
    );
    target(
        &mut out,
        &format!("no sharing: E2E p90 {best} / least request"),
        ratio(e2e(ns(best)), e2e(ns("envoy-least-request"))),
        "≤ 1.05",
        |v| v <= 1.05,
    );
    out
}

/// Writes `<scenario>-ttft-cdf.svg` for every scenario and `<scenario>-ttft-p90-vs-load.svg`
/// for scenarios with several stages.
pub fn plots(results: &[RouterResult], dir: &Path) -> Vec<String> {
    let mut written = Vec::new();
    let mut scenarios: Vec<&str> = results.iter().map(|r| r.scenario.as_str()).collect();
    scenarios.dedup();
    for s in scenarios {
        let of: Vec<&RouterResult> = results
            .iter()
            .filter(|r| r.scenario == s && r.summary.is_some())
            .collect();
        let cdfs: Vec<Series> = of
            .iter()
            .filter_map(|r| {
                let rep = read_report(r.report.as_deref()?).ok()?;
                let ttfts = rep
                    .requests
                    .iter()
                    .filter(|q| q.ok())
                    .filter_map(|q| q.ttft_ms)
                    .collect();
                Some(Series {
                    label: r.router.clone(),
                    points: plot::cdf(ttfts),
                })
            })
            .collect();
        let path = dir.join(format!("{s}-ttft-cdf.svg"));
        if plot::ttft_cdf(&path, &format!("TTFT CDF, {s}"), &cdfs).is_ok() {
            written.push(path.display().to_string());
        }
        for (name, pick) in [
            ("p50", (|p: &Percentiles| p.p50) as fn(&Percentiles) -> f64),
            ("p90", |p: &Percentiles| p.p90),
        ] {
            let sweep: Vec<Series> = of
                .iter()
                .filter_map(|r| {
                    let st = &r.summary.as_ref()?.stages;
                    (st.len() > 1).then(|| Series {
                        label: r.router.clone(),
                        points: st
                            .iter()
                            .map(|x| (x.offered_rps, pick(&x.ttft_ms)))
                            .collect(),
                    })
                })
                .collect();
            if sweep.is_empty() {
                continue;
            }
            let path = dir.join(format!("{s}-ttft-{name}-vs-load.svg"));
            if plot::latency_vs_load(
                &path,
                &format!("TTFT {name} against offered load, {s}"),
                &format!("TTFT {name} (ms)"),
                &sweep,
            )
            .is_ok()
            {
                written.push(path.display().to_string());
            }
        }
    }
    written
}

//! What each EPP costs (issue 18, the upstream operations guide's experiment scaled to this
//! machine): 100 simulated pods, each EPP behind the same Envoy, first idle (no traffic: only
//! scraping 100 pods), then small chat, 10K-token and 100K-token prompts (a shared system prompt
//! and a question, as the guide's 95K and 5K) at fixed rates. Per EPP process: CPU-seconds from
//! `/proc/<pid>/stat` while idle (as cores) and per finished request, peak RSS (VmHWM), and the
//! decision latency each EPP reports itself (its `scheduler_e2e_duration_seconds` histogram,
//! bucket counts diffed around each load, quantiles interpolated as Prometheus'
//! `histogram_quantile`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::cluster::{SimCluster, SimOptions};
use super::compare::{read_report, run_loadgen};
use super::procs::{cpu_time, status_kb};
use super::routers::{self, Bins, Router};
use super::BenchError;

/// One load of the cost run.
#[derive(Clone, Debug, Serialize)]
pub struct CostShape {
    pub name: String,
    /// `loadgen` workload flags.
    pub workload: Vec<String>,
    pub rate: f64,
    pub secs: f64,
}

/// Knobs of the cost run.
#[derive(Clone, Debug, Serialize)]
pub struct CostOptions {
    pub pods: usize,
    pub idle_secs: f64,
    pub shapes: Vec<CostShape>,
    pub time_scale: f64,
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// The three request sizes, at `rates` (small, 10K, 100K) for `secs` each.
pub fn shapes(rates: [f64; 3], secs: f64) -> Vec<CostShape> {
    let prefix = |system: &str, question: &str| {
        args(&[
            "--workload",
            "shared-prefix",
            "--groups",
            "4",
            "--prompts-per-group",
            "64",
            "--system-len",
            system,
            "--question-len",
            question,
            "--output-len",
            "10",
        ])
    };
    vec![
        CostShape {
            name: "small-chat".into(),
            workload: args(&[
                "--workload",
                "multi-turn",
                "--sessions",
                "64",
                "--turns",
                "4",
                "--system-len",
                "40",
                "--question-len",
                "20",
                "--output-len",
                "10",
            ]),
            rate: rates[0],
            secs,
        },
        CostShape {
            name: "10k".into(),
            workload: prefix("9500", "500"),
            rate: rates[1],
            secs,
        },
        CostShape {
            name: "100k".into(),
            workload: prefix("95000", "5000"),
            rate: rates[2],
            secs,
        },
    ]
}

/// One shape through one EPP.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ShapeCost {
    pub shape: String,
    pub offered_rps: f64,
    pub ok: usize,
    pub errors: usize,
    /// CPU ms per finished request, per process (the EPP, envoy): everything the process used
    /// while the load ran (its scraping included).
    pub cpu_ms_per_request: BTreeMap<String, f64>,
    /// The same less what the process uses idle over the same wall time (its idle rate ×
    /// the load's duration): the cost of the requests themselves.
    pub cpu_ms_per_request_above_idle: BTreeMap<String, f64>,
    /// Wall time of the load (send + drain), s.
    pub wall_s: f64,
    /// The EPP's own decision latency over this load (ms), if it reports it.
    pub decision_p50_ms: Option<f64>,
    pub decision_p99_ms: Option<f64>,
    pub decisions: u64,
    pub ttft_p50_ms: f64,
}

/// One EPP's costs.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct EppCost {
    pub router: String,
    /// CPU cores used with no traffic, per process.
    pub idle_cores: BTreeMap<String, f64>,
    pub idle_secs: f64,
    pub shapes: Vec<ShapeCost>,
    /// Peak RSS (VmHWM) of the EPP process(es), MiB.
    pub peak_rss_mib: f64,
    /// Simulated pods the EPP scraped.
    pub pods: usize,
    pub error: Option<String>,
}

/// Runs every router through idle + every shape, each on a fresh cluster.
pub async fn run(
    routers_: &[Router],
    opts: &CostOptions,
    bins: &Bins,
    dir: &Path,
    model: &str,
) -> Vec<EppCost> {
    let mut out = Vec::new();
    for r in routers_ {
        let label = r.label();
        eprintln!("[bench] cost: {label}");
        let rdir = dir.join(&label);
        let res = match std::fs::create_dir_all(&rdir) {
            Ok(()) => one(r, opts, bins, &rdir, model).await,
            Err(e) => Err(BenchError::io("creating the cost dir")(e)),
        };
        out.push(res.unwrap_or_else(|e| {
            eprintln!("[bench]   failed: {e}");
            EppCost {
                router: label.clone(),
                error: Some(e.to_string()),
                ..EppCost::default()
            }
        }));
    }
    out
}

fn sim(opts: &CostOptions) -> SimOptions {
    SimOptions {
        pods: opts.pods,
        // 100K-token prompts: 8,000 blocks of 16 = 128K tokens per pod.
        num_gpu_blocks: 8001,
        block_size: 16,
        max_model_len: 131_072,
        profile: "llmd-h100-8b".into(),
        time_scale: opts.time_scale,
        lora_adapters: Vec::new(),
        max_loras: 1,
        kv_events: false,
        // Every EPP sees the same pods: one IP each (GIE's EPP needs it).
        host_per_pod: true,
        speeds: Vec::new(),
        engine: super::cluster::Engine::InferenceSim,
        kv_events_sub: None,
    }
}

async fn one(
    router: &Router,
    opts: &CostOptions,
    bins: &Bins,
    dir: &Path,
    model: &str,
) -> Result<EppCost, BenchError> {
    let cluster = SimCluster::start(&bins.inference_sim, &sim(opts), dir).await?;
    let running = routers::start_on(router, &cluster, bins, dir, model).await?;
    let pids: Vec<(String, u32)> = running.pids();
    // Settle (first scrapes, connection setup), then idle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let t0 = Instant::now();
    let before: Vec<Duration> = pids
        .iter()
        .map(|(_, p)| cpu_time(*p).unwrap_or_default())
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(opts.idle_secs)).await;
    let wall = t0.elapsed().as_secs_f64();
    let idle_cores: BTreeMap<String, f64> = pids
        .iter()
        .zip(&before)
        .map(|((n, p), b)| {
            let used = cpu_time(*p).unwrap_or_default().saturating_sub(*b);
            (n.clone(), used.as_secs_f64() / wall)
        })
        .collect();
    let mut shapes = Vec::new();
    for shape in &opts.shapes {
        let sdir = dir.join(&shape.name);
        std::fs::create_dir_all(&sdir).map_err(BenchError::io("creating a shape dir"))?;
        let hist_before = scrape_hist(running.metrics).await;
        let before: Vec<Duration> = pids
            .iter()
            .map(|(_, p)| cpu_time(*p).unwrap_or_default())
            .collect();
        let report_path = sdir.join("report.json");
        let mut a = shape.workload.clone();
        a.extend([
            "--rate-stages".into(),
            format!("{}:{}", shape.rate, shape.secs),
            "--constant".into(),
            "--drain-secs".into(),
            "20".into(),
            "--seed".into(),
            "1".into(),
            "--target".into(),
            running.target.to_string(),
            "--label".into(),
            format!("{}-{}", router.label(), shape.name),
            "--model".into(),
            model.to_owned(),
            "--out".into(),
            report_path.display().to_string(),
        ]);
        let started = Instant::now();
        run_loadgen(&bins.loadgen, a, &sdir).await?;
        let wall_s = started.elapsed().as_secs_f64();
        let report = read_report(&report_path)?;
        let n = report.summary.ok.max(1) as f64;
        let used: Vec<(String, f64)> = pids
            .iter()
            .zip(&before)
            .map(|((name, pid), b)| {
                let used = cpu_time(*pid).unwrap_or_default().saturating_sub(*b);
                (name.clone(), used.as_secs_f64())
            })
            .collect();
        let cpu_ms_per_request = used
            .iter()
            .map(|(name, u)| (name.clone(), u * 1e3 / n))
            .collect();
        let cpu_ms_per_request_above_idle = used
            .iter()
            .map(|(name, u)| {
                let idle = idle_cores.get(name).copied().unwrap_or(0.0) * wall_s;
                (name.clone(), (u - idle).max(0.0) * 1e3 / n)
            })
            .collect();
        let hist = scrape_hist(running.metrics).await.minus(&hist_before);
        shapes.push(ShapeCost {
            shape: shape.name.clone(),
            offered_rps: shape.rate,
            ok: report.summary.ok,
            errors: report.summary.requests - report.summary.ok,
            cpu_ms_per_request,
            cpu_ms_per_request_above_idle,
            wall_s,
            decision_p50_ms: hist.quantile(0.5).map(|s| s * 1e3),
            decision_p99_ms: hist.quantile(0.99).map(|s| s * 1e3),
            decisions: hist.count(),
            ttft_p50_ms: report.summary.ttft_ms.p50,
        });
    }
    // What the EPP exposes, for the metric-name diff (BENCHMARKS.md).
    if let Some(addr) = running.metrics {
        if let Ok(r) = harness::client::get(addr, "/metrics").await {
            let _ = std::fs::write(dir.join("metrics.txt"), r.text());
        }
    }
    let peak_rss_mib = running
        .procs
        .iter()
        .map(|p| status_kb(p.pid(), "VmHWM:") as f64 / 1024.0)
        .sum();
    drop(running);
    drop(cluster);
    Ok(EppCost {
        router: router.label(),
        idle_cores,
        idle_secs: wall,
        shapes,
        peak_rss_mib,
        pods: opts.pods,
        error: None,
    })
}

/// A cumulative histogram: upper bound → count (summed over label sets).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Hist(pub BTreeMap<u64, (f64, f64)>);

/// The histogram every EPP here reports its scheduling time in (GIE's name; epp and
/// llm-d-router emit it too).
pub const DECISION_HISTOGRAM: &str = "inference_extension_scheduler_e2e_duration_seconds";

impl Hist {
    /// Parses `<name>_bucket{...,le="x"} count` lines of Prometheus text.
    pub fn parse(text: &str, name: &str) -> Self {
        let prefix = format!("{name}_bucket");
        let mut h = BTreeMap::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix(&prefix) else {
                continue;
            };
            let Some(le_at) = rest.find("le=\"") else {
                continue;
            };
            let le_text = &rest[le_at + 4..];
            let Some(end) = le_text.find('"') else {
                continue;
            };
            let le: f64 = match &le_text[..end] {
                "+Inf" => f64::INFINITY,
                v => match v.parse() {
                    Ok(x) => x,
                    Err(_) => continue,
                },
            };
            let Some(count) = rest
                .rsplit(' ')
                .next()
                .and_then(|c| c.trim().parse::<f64>().ok())
            else {
                continue;
            };
            // Key by the bound's bits so buckets sort numerically (all bounds are positive).
            h.entry(le.to_bits()).or_insert((le, 0.0)).1 += count;
        }
        Self(h)
    }

    pub fn minus(&self, before: &Self) -> Self {
        Self(
            self.0
                .iter()
                .map(|(k, (le, c))| (*k, (*le, c - before.0.get(k).map_or(0.0, |b| b.1))))
                .collect(),
        )
    }

    pub fn count(&self) -> u64 {
        self.0
            .values()
            .map(|(_, c)| *c)
            .fold(0.0, f64::max)
            .max(0.0) as u64
    }

    /// `histogram_quantile`: linear interpolation inside the bucket holding rank q·count.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.0.values().map(|(_, c)| *c).fold(0.0, f64::max);
        if total <= 0.0 {
            return None;
        }
        let rank = q * total;
        let (mut lo, mut below) = (0.0, 0.0);
        for (le, c) in self.0.values() {
            if *c >= rank {
                if le.is_infinite() {
                    return Some(lo);
                }
                let inside = c - below;
                let frac = if inside > 0.0 {
                    (rank - below) / inside
                } else {
                    1.0
                };
                return Some(lo + (le - lo) * frac);
            }
            lo = *le;
            below = *c;
        }
        Some(lo)
    }
}

async fn scrape_hist(metrics: Option<SocketAddr>) -> Hist {
    let Some(addr) = metrics else {
        return Hist::default();
    };
    match harness::client::get(addr, "/metrics").await {
        Ok(r) if r.status.is_success() => Hist::parse(&r.text(), DECISION_HISTOGRAM),
        _ => Hist::default(),
    }
}

fn epp_name(c: &EppCost) -> Option<&str> {
    c.idle_cores
        .keys()
        .find(|k| k.as_str() != "envoy")
        .map(String::as_str)
}

/// The cost tables and the ratios against every upstream EPP measured in the same run.
pub fn table(costs: &[EppCost], ours: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| EPP | idle CPU, EPP (cores) | idle CPU, Envoy | peak RSS, EPP (MiB) | shape | offered req/s | ok / errors | EPP CPU ms/req (total / above idle) | Envoy CPU ms/req | decision p50 / p99 (ms, EPP's histogram) | decisions | TTFT p50 (ms) |\n|---|---:|---:|---:|---|---:|---|---:|---:|---|---:|---:|"
    );
    for c in costs {
        if let Some(e) = &c.error {
            let _ = writeln!(
                out,
                "| {} | failed: {} |",
                c.router,
                e.lines().next().unwrap_or("")
            );
            continue;
        }
        let epp = epp_name(c).unwrap_or("?");
        let idle = c.idle_cores.get(epp).copied().unwrap_or(0.0);
        let envoy_idle = c.idle_cores.get("envoy").copied().unwrap_or(0.0);
        for (i, s) in c.shapes.iter().enumerate() {
            let lead = if i == 0 {
                format!(
                    "| {} | {idle:.4} | {envoy_idle:.4} | {:.0} |",
                    c.router, c.peak_rss_mib
                )
            } else {
                "| | | | |".to_owned()
            };
            let dec = match (s.decision_p50_ms, s.decision_p99_ms) {
                (Some(a), Some(b)) => format!("{a:.3} / {b:.3}"),
                _ => "–".into(),
            };
            let _ = writeln!(
                out,
                "{lead} {} | {} | {} / {} | {:.2} / {:.2} | {:.2} | {dec} | {} | {:.0} |",
                s.shape,
                s.offered_rps,
                s.ok,
                s.errors,
                s.cpu_ms_per_request.get(epp).copied().unwrap_or(0.0),
                s.cpu_ms_per_request_above_idle
                    .get(epp)
                    .copied()
                    .unwrap_or(0.0),
                s.cpu_ms_per_request.get("envoy").copied().unwrap_or(0.0),
                s.decisions,
                s.ttft_p50_ms,
            );
        }
    }
    out.push_str(&ratios(costs, ours));
    out
}

/// epp / each upstream EPP: CPU per request per shape, idle CPU, peak RSS.
pub fn ratios(costs: &[EppCost], ours: &str) -> String {
    let mut out = String::new();
    let Some(us) = costs.iter().find(|c| c.router == ours && c.error.is_none()) else {
        return format!("\n{ours} was not measured: no ratios.\n");
    };
    let _ = writeln!(
        out,
        "\n| ratio ({ours} / upstream) | measured | target | |\n|---|---:|---|---|"
    );
    let line = |out: &mut String, name: String, v: Option<f64>, goal: f64, le: bool| {
        let _ = match v.filter(|v| v.is_finite()) {
            Some(v) => writeln!(
                out,
                "| {name} | {v:.3} | {} {goal} | {} |",
                if le { "≤" } else { "≥" },
                if (le && v <= goal) || (!le && v >= goal) {
                    "met"
                } else {
                    "**missed**"
                }
            ),
            None => writeln!(out, "| {name} | – | | not measured |"),
        };
    };
    for them in costs
        .iter()
        .filter(|c| c.router != ours && c.error.is_none() && !c.router.starts_with("epp"))
    {
        let (a, b) = (epp_name(us).unwrap_or(""), epp_name(them).unwrap_or(""));
        for s in &us.shapes {
            let other = them.shapes.iter().find(|t| t.shape == s.shape);
            for (what, pick) in [
                (
                    "total",
                    (|x: &ShapeCost| &x.cpu_ms_per_request)
                        as fn(&ShapeCost) -> &BTreeMap<String, f64>,
                ),
                ("above idle", |x: &ShapeCost| {
                    &x.cpu_ms_per_request_above_idle
                }),
            ] {
                // Above idle, a process that used less than its idle rate (CPU-starved
                // scraping under load) has no per-request figure: no ratio either.
                let v = other.and_then(|o| {
                    let d = pick(o).get(b).copied()?;
                    let n = pick(s).get(a).copied()?;
                    (d > 0.0 && n > 0.0).then(|| n / d)
                });
                line(
                    &mut out,
                    format!("CPU per request ({what}), {}, / {}", s.shape, them.router),
                    v,
                    0.1,
                    true,
                );
            }
        }
        let idle = match (us.idle_cores.get(a), them.idle_cores.get(b)) {
            (Some(x), Some(y)) if *y > 0.0 => Some(x / y),
            _ => None,
        };
        line(
            &mut out,
            format!("idle CPU ({} pods), / {}", us.pods, them.router),
            idle,
            0.1,
            true,
        );
        let rss = (them.peak_rss_mib > 0.0).then(|| us.peak_rss_mib / them.peak_rss_mib);
        line(
            &mut out,
            format!("peak RSS, / {}", them.router),
            rss,
            0.25,
            true,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# TYPE inference_extension_scheduler_e2e_duration_seconds histogram
inference_extension_scheduler_e2e_duration_seconds_bucket{le="0.0001"} 10
inference_extension_scheduler_e2e_duration_seconds_bucket{le="0.0002"} 30
inference_extension_scheduler_e2e_duration_seconds_bucket{le="0.0005"} 40
inference_extension_scheduler_e2e_duration_seconds_bucket{le="+Inf"} 40
inference_extension_scheduler_e2e_duration_seconds_sum 0.006
inference_extension_scheduler_e2e_duration_seconds_count 40
"#;

    #[test]
    fn quantiles_interpolate_inside_the_bucket_as_prometheus_does() {
        let h = Hist::parse(TEXT, DECISION_HISTOGRAM);
        assert_eq!(h.count(), 40);
        // Rank 20 of 40 lies halfway through the (0.1 ms, 0.2 ms] bucket (10 → 30).
        let p50 = h.quantile(0.5).unwrap();
        assert!((p50 - 0.00015).abs() < 1e-9, "{p50}");
        // Rank 39.6 in (0.2, 0.5] (30 → 40): 0.2 + 0.3 × 0.96.
        let p99 = h.quantile(0.99).unwrap();
        assert!((p99 - 0.000488).abs() < 1e-9, "{p99}");
        let before = Hist::parse(
            &TEXT.replace("} 40", "} 20").replace("} 30", "} 20"),
            DECISION_HISTOGRAM,
        );
        let d = h.minus(&before);
        assert_eq!(d.count(), 20);
        assert!(Hist::default().quantile(0.5).is_none());
    }

    #[test]
    fn the_three_shapes_scale_the_guides_prompt() {
        let s = shapes([20.0, 5.0, 1.0], 10.0);
        assert_eq!(s.len(), 3);
        let joined = s[2].workload.join(" ");
        assert!(
            joined.contains("--system-len 95000 --question-len 5000"),
            "{joined}"
        );
    }
}

//! The numbers of one run: latency percentiles, throughput, errors, prefix-cache hit rate (from
//! the servers' counters), the oracle hit rate, per-pod load spread and per-stage figures for
//! latency-against-load plots; and the Markdown table rows they print as.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::pods::PodCounters;
use super::run::RequestRecord;
use super::workload::Workload;

/// Nearest-rank percentiles and the mean of one quantity (ms).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub mean: f64,
    pub count: usize,
}

impl Percentiles {
    pub fn of(mut v: Vec<f64>) -> Self {
        if v.is_empty() {
            return Self::default();
        }
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Self {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            mean: v.iter().sum::<f64>() / v.len() as f64,
            count: v.len(),
        }
    }
}

/// One open-loop stage.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StageSummary {
    pub stage: usize,
    pub offered_rps: f64,
    pub sent: usize,
    pub ok: usize,
    pub ttft_ms: Percentiles,
    pub e2e_ms: Percentiles,
}

/// Everything reported about one run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub label: String,
    pub requests: usize,
    pub ok: usize,
    pub error_rate: f64,
    /// From the start to the last completion, seconds.
    pub duration_s: f64,
    pub throughput_rps: f64,
    pub output_tokens_per_s: f64,
    /// Output tokens of every finished request, warm-up included, over the whole run (start to
    /// last completion): what the cluster delivered, even when an overloaded router finishes
    /// only its warm-up backlog after the warm-up.
    #[serde(default)]
    pub whole_run_output_tokens_per_s: f64,
    /// Over the finished requests and, as lower bounds, those cut off at the end of the run
    /// (their time so far), so an overloaded router's backlog shows in the tail.
    pub ttft_ms: Percentiles,
    pub itl_ms: Percentiles,
    pub e2e_ms: Percentiles,
    /// Requests still waiting for a first token when the run ended.
    pub cut_off: usize,
    /// Requests sent during the warm-up, left out of every figure.
    pub warmup_requests: usize,
    /// Cached / prompt tokens as the responses' usage reported them.
    pub usage_cached_ratio: Option<f64>,
    /// Prefix-cache hits / queries (tokens) from the pods' counters (whole run, warm-up included).
    pub prefix_hit_rate: Option<f64>,
    /// Hit rate if every request went to a pod already holding its prefix (unbounded caches).
    pub oracle_hit_rate: Option<f64>,
    /// Requests finished per pod (pod counters, else the `x-inference-pod` header).
    pub per_pod_requests: BTreeMap<String, f64>,
    /// Coefficient of variation of `per_pod_requests` (0 = perfectly even).
    pub pod_spread_cv: f64,
    pub stages: Vec<StageSummary>,
    /// Status code (0 = none) → count, for the failed requests.
    pub errors_by_status: BTreeMap<u16, usize>,
}

/// Inputs to [`summarize`] besides the records.
pub struct Context<'a> {
    pub label: &'a str,
    pub workload: &'a Workload,
    /// Offered rate of each stage (empty for closed loop).
    pub stage_rates: &'a [f64],
    pub pod_delta: &'a BTreeMap<String, PodCounters>,
    pub block_size: usize,
    /// Requests sent before this many seconds are warm-up: left out of the figures.
    pub warmup_s: f64,
}

pub fn summarize(all: &[RequestRecord], ctx: &Context<'_>) -> Summary {
    let records: Vec<RequestRecord> = all
        .iter()
        .filter(|r| r.sent_s >= ctx.warmup_s)
        .cloned()
        .collect();
    let records = &records[..];
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok()).collect();
    let end = records
        .iter()
        .map(|r| r.sent_s + r.e2e_ms / 1e3)
        .fold(0.0, f64::max);
    let duration_s = (end - ctx.warmup_s).max(1e-9);
    let ttfts = ok
        .iter()
        .filter_map(|r| r.ttft_ms)
        .chain(records.iter().filter(|r| r.cut_off()).map(|r| r.e2e_ms))
        .collect();
    let out_tokens: u64 = ok.iter().map(|r| r.output_tokens).sum();
    let prompt: u64 = ok.iter().filter_map(|r| r.prompt_tokens).sum();
    let cached: u64 = ok.iter().filter_map(|r| r.cached_tokens).sum();
    let (q, h) = ctx.pod_delta.values().fold((0.0, 0.0), |(q, h), c| {
        (q + c.prefix_queries, h + c.prefix_hits)
    });
    let per_pod = per_pod_requests(&ok, ctx.pod_delta);
    let mut errors_by_status = BTreeMap::new();
    for r in records.iter().filter(|r| !r.ok()) {
        *errors_by_status.entry(r.status).or_insert(0) += 1;
    }
    Summary {
        label: ctx.label.to_owned(),
        requests: records.len(),
        ok: ok.len(),
        error_rate: if records.is_empty() {
            0.0
        } else {
            1.0 - ok.len() as f64 / records.len() as f64
        },
        duration_s,
        throughput_rps: ok.len() as f64 / duration_s,
        output_tokens_per_s: out_tokens as f64 / duration_s,
        whole_run_output_tokens_per_s: whole_run_throughput(all),
        ttft_ms: Percentiles::of(ttfts),
        cut_off: records.iter().filter(|r| r.cut_off()).count(),
        warmup_requests: all.len() - records.len(),
        itl_ms: Percentiles::of(ok.iter().flat_map(|r| r.itls_ms.iter().copied()).collect()),
        e2e_ms: Percentiles::of(ok.iter().map(|r| r.e2e_ms).collect()),
        usage_cached_ratio: (prompt > 0).then(|| cached as f64 / prompt as f64),
        prefix_hit_rate: (q > 0.0).then(|| h / q),
        oracle_hit_rate: oracle_hit_rate(
            &all.iter().filter(|r| r.ok()).collect::<Vec<_>>(),
            ctx.workload,
            ctx.block_size,
        ),
        pod_spread_cv: cv(per_pod.values().copied()),
        per_pod_requests: per_pod,
        stages: stages(all, ctx.stage_rates),
        errors_by_status,
    }
}

fn whole_run_throughput(all: &[RequestRecord]) -> f64 {
    let end = all
        .iter()
        .map(|r| r.sent_s + r.e2e_ms / 1e3)
        .fold(0.0, f64::max);
    let tokens: u64 = all.iter().filter(|r| r.ok()).map(|r| r.output_tokens).sum();
    if end > 0.0 {
        tokens as f64 / end
    } else {
        0.0
    }
}

fn per_pod_requests(
    ok: &[&RequestRecord],
    delta: &BTreeMap<String, PodCounters>,
) -> BTreeMap<String, f64> {
    if delta.values().any(|c| c.requests > 0.0) {
        return delta.iter().map(|(p, c)| (p.clone(), c.requests)).collect();
    }
    let mut m = BTreeMap::new();
    for r in ok {
        *m.entry(r.pod.clone().unwrap_or_else(|| "unknown".into()))
            .or_insert(0.0) += 1.0;
    }
    m
}

fn cv(values: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = values.collect();
    if v.is_empty() {
        return 0.0;
    }
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    if mean == 0.0 {
        return 0.0;
    }
    (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64).sqrt() / mean
}

/// Shared prefix: a group's first request misses, later ones hit the whole blocks of the system
/// prompt. Multi-turn: a turn hits the whole blocks of the previous turn's prompt.
fn oracle_hit_rate(ok: &[&RequestRecord], workload: &Workload, block: usize) -> Option<f64> {
    let block = block.max(1) as u64;
    let mut seen: BTreeMap<usize, u64> = BTreeMap::new();
    let (mut hits, mut total) = (0u64, 0u64);
    let mut ordered: Vec<&&RequestRecord> = ok.iter().collect();
    ordered.sort_by(|a, b| a.sent_s.total_cmp(&b.sent_s));
    for r in ordered {
        let p = r.prompt_tokens?;
        total += p;
        let Some(g) = r.group else { continue };
        let reusable = match workload {
            Workload::SharedPrefix { system_len, .. } => *system_len as u64,
            Workload::MultiTurn { .. } => seen.get(&g).copied().unwrap_or(0),
            _ => 0,
        };
        if seen.contains_key(&g) {
            hits += (reusable.min(p) / block) * block;
        }
        seen.insert(g, p);
    }
    (total > 0).then(|| hits as f64 / total as f64)
}

fn stages(records: &[RequestRecord], rates: &[f64]) -> Vec<StageSummary> {
    rates
        .iter()
        .enumerate()
        .map(|(i, &rate)| {
            let of: Vec<&RequestRecord> = records.iter().filter(|r| r.stage == i).collect();
            let ok: Vec<&&RequestRecord> = of.iter().filter(|r| r.ok()).collect();
            StageSummary {
                stage: i,
                offered_rps: rate,
                sent: of.len(),
                ok: ok.len(),
                ttft_ms: Percentiles::of(ok.iter().filter_map(|r| r.ttft_ms).collect()),
                e2e_ms: Percentiles::of(ok.iter().map(|r| r.e2e_ms).collect()),
            }
        })
        .collect()
}

/// The header of [`Summary::markdown_row`].
pub const MARKDOWN_HEADER: &str = "| run | requests | errors | req/s | output tok/s (window / whole run) | TTFT p50 / p90 / p99 (ms) | ITL p50 / p90 (ms) | E2E p50 / p90 (ms) | prefix hit rate | pod spread (CV) |\n|---|---:|---:|---:|---:|---|---|---|---:|---:|";

impl Summary {
    pub fn markdown_row(&self) -> String {
        let pct = |v: Option<f64>| v.map_or("–".to_owned(), |x| format!("{:.1}%", x * 100.0));
        format!(
            "| {} | {} | {:.1}% | {:.2} | {:.0} / {:.0} | {:.0} / {:.0} / {:.0} | {:.1} / {:.1} | {:.0} / {:.0} | {} | {:.2} |",
            self.label, self.requests, self.error_rate * 100.0, self.throughput_rps, self.output_tokens_per_s, self.whole_run_output_tokens_per_s,
            self.ttft_ms.p50, self.ttft_ms.p90, self.ttft_ms.p99, self.itl_ms.p50, self.itl_ms.p90,
            self.e2e_ms.p50, self.e2e_ms.p90, pct(self.prefix_hit_rate), self.pod_spread_cv
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: usize, group: usize, sent_s: f64, ttft: f64) -> RequestRecord {
        RequestRecord {
            id,
            group: Some(group),
            sent_s,
            ttft_ms: Some(ttft),
            e2e_ms: 100.0,
            status: 200,
            prompt_tokens: Some(100),
            output_tokens: 10,
            cached_tokens: Some(50),
            pod: Some(format!("p{}", id % 2)),
            ..RequestRecord::default()
        }
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let p = Percentiles::of((1..=100).map(f64::from).collect());
        assert_eq!((p.p50, p.p90, p.p99, p.count), (50.0, 90.0, 99.0, 100));
        assert_eq!(Percentiles::of(vec![]).count, 0);
    }

    #[test]
    fn summary_counts_errors_throughput_and_the_oracle() {
        let mut records: Vec<RequestRecord> = (0..4)
            .map(|i| rec(i, i % 2, i as f64, 10.0 * i as f64))
            .collect();
        records.push(RequestRecord {
            id: 4,
            status: 503,
            error: Some("x".into()),
            ..RequestRecord::default()
        });
        let w = Workload::SharedPrefix {
            groups: 2,
            prompts_per_group: 1,
            system_len: 80,
            question_len: 20,
            output_len: 10,
        };
        let ctx = Context {
            label: "t",
            workload: &w,
            stage_rates: &[1.0],
            pod_delta: &BTreeMap::new(),
            block_size: 16,
            warmup_s: 0.0,
        };
        let s = summarize(&records, &ctx);
        assert_eq!(
            (s.requests, s.ok, s.errors_by_status.get(&503)),
            (5, 4, Some(&1))
        );
        assert!((s.error_rate - 0.2).abs() < 1e-9);
        assert!((s.duration_s - 3.1).abs() < 1e-9);
        // two of four requests reuse 80 of their 100 tokens
        assert_eq!(s.oracle_hit_rate, Some(160.0 / 400.0));
        assert_eq!(s.usage_cached_ratio, Some(0.5));
        assert_eq!(s.pod_spread_cv, 0.0);
        assert!(s.markdown_row().starts_with("| t | 5 | 20.0% |"));
    }
}

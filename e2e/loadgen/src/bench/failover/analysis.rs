//! A failover round's records turned into figures, and rounds into a table with their spread.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use super::{FailoverOptions, Fault, Injected};
use crate::run::RequestRecord;

/// Requests sent in the first second are left out of the steady window (cold caches).
const WARM_UP: f64 = 1.0;

/// One round's figures.
#[derive(Clone, Debug)]
pub struct Round {
    pub fault: Fault,
    pub rate: f64,
    pub sent: usize,
    pub failed: usize,
    /// The first distinct errors (status and message), for the report.
    pub errors: Vec<String>,
    /// Streams Envoy had open on the killed replica just before SIGKILL.
    pub victim_in_flight: Option<u64>,
    /// Streams the first replica (the signalled one) had served when the fault began.
    pub victim_streams: Option<u64>,
    /// Seconds from SIGTERM (`apiserver-gone`: the API server's SIGKILL) until Envoy's health
    /// check had taken the (first) replica out of rotation.
    pub out_of_rotation_secs: Option<f64>,
    /// Streams Envoy routed in panic mode (every replica, too few healthy) by the fault's end.
    pub panic_routed: Option<u64>,
    /// How long the fault took (SIGTERM: until the replica exited; rolling: all of them).
    pub fault_secs: f64,
    /// Prefix-cache hit rate (cached / prompt tokens) of the requests sent in the steady window
    /// and of those sent during the fault (from its start to `settle` after its end).
    pub hit_steady: Option<f64>,
    pub hit_during: Option<f64>,
    /// Median and 99th percentile end-to-end latency of the successful requests, ms.
    pub p50_ms: f64,
    pub p99_ms: f64,
}

impl Round {
    pub fn of(
        fault: Fault,
        opts: &FailoverOptions,
        records: &[RequestRecord],
        injected: &Injected,
    ) -> Self {
        let at = injected.at.as_secs_f64();
        let until = (injected.done + opts.settle).as_secs_f64();
        let failed: Vec<&RequestRecord> = records.iter().filter(|r| !r.ok()).collect();
        let mut errors: Vec<String> = Vec::new();
        for r in &failed {
            let e = format!("{} {}", r.status, r.error.as_deref().unwrap_or(""));
            if errors.len() < 5 && !errors.contains(&e) {
                errors.push(e);
            }
        }
        let mut e2e: Vec<f64> = records
            .iter()
            .filter(|r| r.ok())
            .map(|r| r.e2e_ms)
            .collect();
        e2e.sort_by(f64::total_cmp);
        Self {
            fault,
            rate: opts.rate,
            sent: records.len(),
            failed: failed.len(),
            errors,
            victim_in_flight: injected.victim_in_flight,
            victim_streams: injected.victim_streams,
            out_of_rotation_secs: injected.out_of_rotation.map(|d| d.as_secs_f64()),
            panic_routed: injected.panic_routed,
            fault_secs: (injected.done - injected.at).as_secs_f64(),
            hit_steady: hit_rate(records, WARM_UP, at),
            hit_during: hit_rate(records, at, until),
            p50_ms: percentile(&e2e, 0.5),
            p99_ms: percentile(&e2e, 0.99),
        }
    }

    /// `hit_during / hit_steady`, when both are known and the steady rate is not zero.
    pub fn hit_ratio(&self) -> Option<f64> {
        match (self.hit_steady, self.hit_during) {
            (Some(s), Some(d)) if s > 0.0 => Some(d / s),
            _ => None,
        }
    }
}

/// Cached over prompt tokens of the successful requests sent in `[from, to)` seconds.
fn hit_rate(records: &[RequestRecord], from: f64, to: f64) -> Option<f64> {
    let (mut cached, mut prompt) = (0u64, 0u64);
    for r in records
        .iter()
        .filter(|r| r.ok() && r.sent_s >= from && r.sent_s < to)
    {
        cached += r.cached_tokens?;
        prompt += r.prompt_tokens?;
    }
    (prompt > 0).then(|| cached as f64 / prompt as f64)
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// `mean (min–max)` of `values`, with `digits` decimals; `–` without values.
fn spread(values: &[f64], digits: usize) -> String {
    if values.is_empty() {
        return "–".to_owned();
    }
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{mean:.digits$} ({min:.digits$}–{max:.digits$})")
}

/// A Markdown table: one row per fault and rate, each figure as `mean (min–max)` over rounds.
pub fn table(rounds: &[Round]) -> String {
    let mut groups: BTreeMap<(Fault, u64), Vec<&Round>> = BTreeMap::new();
    for r in rounds {
        groups
            .entry((r.fault, r.rate.to_bits()))
            .or_default()
            .push(r);
    }
    let mut out = String::from(
        "| fault | rate (req/s) | rounds | requests / round | failed / round | in flight on the killed replica | fault lasted (s) | prefix hit steady | prefix hit during | during / steady | p50 / p99 e2e (ms) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for ((fault, _), rs) in &groups {
        let col = |f: &dyn Fn(&Round) -> Option<f64>, digits| {
            spread(&rs.iter().filter_map(|r| f(r)).collect::<Vec<_>>(), digits)
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} |",
            fault.name(),
            rs[0].rate,
            rs.len(),
            col(&|r| Some(r.sent as f64), 0),
            col(&|r| Some(r.failed as f64), 1),
            col(&|r| r.victim_in_flight.map(|v| v as f64), 1),
            col(&|r| Some(r.fault_secs), 1),
            col(&|r| r.hit_steady, 3),
            col(&|r| r.hit_during, 3),
            col(&Round::hit_ratio, 3),
            col(&|r| Some(r.p50_ms), 0),
            col(&|r| Some(r.p99_ms), 0),
        );
    }
    out
}

/// How long a round's load must run for `fault` to end and settle inside it.
pub fn needed(fault: Fault, opts: &FailoverOptions) -> Duration {
    let per_replica = opts.drain_timeout + Duration::from_secs(3);
    let fault_takes = match fault {
        Fault::Steady | Fault::Sigkill => Duration::ZERO,
        Fault::Sigterm => per_replica,
        Fault::RollingRestart => per_replica * opts.replicas as u32,
        // The restart (about 2 s; more on a busy machine) and the watches' resumption.
        Fault::ApiServerGone => opts.apiserver_down + Duration::from_secs(15),
    };
    opts.fault_at + fault_takes + opts.settle
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(sent_s: f64, status: u16, prompt: u64, cached: u64) -> RequestRecord {
        RequestRecord {
            sent_s,
            status,
            prompt_tokens: Some(prompt),
            cached_tokens: Some(cached),
            e2e_ms: 100.0,
            ..RequestRecord::default()
        }
    }

    #[test]
    fn hit_rate_counts_only_successes_sent_in_the_window() {
        let records = [
            record(0.5, 200, 100, 0),
            record(1.5, 200, 100, 80),
            record(2.5, 200, 100, 40),
            record(2.6, 500, 100, 100),
        ];
        assert_eq!(hit_rate(&records, 1.0, 2.0), Some(0.8));
        assert_eq!(hit_rate(&records, 2.0, 3.0), Some(0.4));
        assert_eq!(hit_rate(&records, 3.0, 4.0), None);
    }

    #[test]
    fn spread_shows_mean_min_and_max() {
        assert_eq!(spread(&[1.0, 2.0, 6.0], 1), "3.0 (1.0–6.0)");
        assert_eq!(spread(&[], 1), "–");
    }
}

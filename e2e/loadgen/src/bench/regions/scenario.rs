//! The bed's scenarios: an open-loop load in phases of different rates (one region saturated
//! and recovering), and a steady load during which one region is lost.

use std::time::Duration;

use tokio::time::Instant;

use super::Bed;
use crate::run::{self, RequestRecord, RunConfig};
use crate::schedule::{Load, Stage};
use crate::summary::Percentiles;
use crate::workload::Workload;

/// What is sent: the workload, the model it names, the seed of its prompts and arrivals.
#[derive(Clone, Debug)]
pub struct Traffic {
    pub workload: Workload,
    pub model: String,
    pub seed: u64,
}

/// One phase of the load: `rate` requests per second (Poisson) for `duration`.
#[derive(Clone, Debug)]
pub struct Phase {
    pub name: String,
    pub rate: f64,
    pub duration: Duration,
}

/// What the requests sent in one phase saw.
#[derive(Clone, Debug)]
pub struct PhaseStats {
    pub name: String,
    pub rate: f64,
    pub sent: usize,
    pub failed: usize,
    /// TTFT of the successful requests, ms.
    pub ttft: Percentiles,
    /// Share of the successful requests served outside the first region (the hub's own).
    pub cross_region: f64,
}

/// The run's settings for `load` over `bed`, bounded by `duration` plus 30 s of drain.
fn config(bed: &Bed, load: Load, duration: Duration, traffic: &Traffic) -> RunConfig {
    RunConfig {
        target: bed.hub.listener(),
        workload: traffic.workload.clone(),
        load,
        max_requests: 100_000,
        max_duration: duration,
        drain: Duration::from_secs(30),
        seed: traffic.seed,
        model: traffic.model.clone(),
    }
}

/// Runs `phases` back to back and returns each one's figures.
pub async fn phases(bed: &Bed, phases: &[Phase], traffic: &Traffic) -> Vec<PhaseStats> {
    let stages = phases
        .iter()
        .map(|p| Stage {
            rate: p.rate,
            duration: p.duration,
        })
        .collect();
    let total = phases.iter().map(|p| p.duration).sum();
    let load = Load::Open {
        stages,
        poisson: true,
    };
    let records = run::run(config(bed, load, total, traffic)).await;
    phases
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mine: Vec<&RequestRecord> = records.iter().filter(|r| r.stage == i).collect();
            stats(bed, &p.name, p.rate, &mine)
        })
        .collect()
}

/// The figures of `records`.
fn stats(bed: &Bed, name: &str, rate: f64, records: &[&RequestRecord]) -> PhaseStats {
    let ok: Vec<&&RequestRecord> = records.iter().filter(|r| r.ok()).collect();
    let ttft = Percentiles::of(ok.iter().filter_map(|r| r.ttft_ms).collect());
    let regions: Vec<usize> = ok
        .iter()
        .filter_map(|r| bed.region_of(r.pod.as_deref()?))
        .collect();
    let away = regions.iter().filter(|&&i| i != 0).count();
    PhaseStats {
        name: name.to_owned(),
        rate,
        sent: records.len(),
        failed: records.len() - ok.len(),
        ttft,
        cross_region: match regions.len() {
            0 => 0.0,
            n => away as f64 / n as f64,
        },
    }
}

/// What losing a region under load cost.
#[derive(Clone, Debug)]
pub struct LossResult {
    pub sent: usize,
    /// Failed requests sent before the cut: the ones in flight in the lost region.
    pub failed_in_flight: usize,
    /// Requests sent before the cut that had not ended at it and were not served by another
    /// region: at most these may fail.
    pub in_flight_there: usize,
    /// Failed requests sent after the cut: routed to a region the hub should have left.
    pub failed_after: usize,
    /// When the cut happened, seconds into the load.
    pub cut_at_s: f64,
    /// The requests sent after the cut.
    pub after: PhaseStats,
}

/// A steady load at `rate` for `duration`; region `victim` is cut `cut_at` into it.
pub async fn lose(
    bed: &Bed,
    victim: usize,
    rate: f64,
    duration: Duration,
    cut_at: Duration,
    traffic: &Traffic,
) -> LossResult {
    let load = Load::Open {
        stages: vec![Stage { rate, duration }],
        poisson: true,
    };
    let start = Instant::now();
    let cut = async {
        tokio::time::sleep_until(start + cut_at).await;
        bed.regions[victim].cut();
        start.elapsed().as_secs_f64()
    };
    let (records, cut_at_s) = tokio::join!(run::run(config(bed, load, duration, traffic)), cut);
    let before = |r: &&RequestRecord| r.sent_s < cut_at_s;
    let failed = |r: &&RequestRecord| !r.ok();
    let after: Vec<&RequestRecord> = records.iter().filter(|r| !before(r)).collect();
    let there = |r: &&RequestRecord| {
        let ends_after = r.sent_s + r.e2e_ms / 1000.0 >= cut_at_s;
        let elsewhere = r
            .pod
            .as_deref()
            .and_then(|p| bed.region_of(p))
            .is_some_and(|i| i != victim);
        ends_after && !elsewhere
    };
    LossResult {
        sent: records.len(),
        failed_in_flight: records.iter().filter(before).filter(failed).count(),
        in_flight_there: records.iter().filter(before).filter(there).count(),
        failed_after: after.iter().filter(|r| !r.ok()).count(),
        cut_at_s,
        after: stats(bed, "after the cut", rate, &after),
    }
}

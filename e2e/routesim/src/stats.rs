//! The figures of one run (as the real-time bench computes them: warm-up left out, requests cut
//! off at the end counted in the TTFT tail with their time so far) and their 95% intervals over
//! seeds.

use crate::bounds::Bound;
use crate::Record;
use loadgen::summary::Percentiles;
use serde::Serialize;

/// One run's figures (milliseconds, tokens/s, fractions).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RunFigures {
    pub ttft_ms: Percentiles,
    pub e2e_ms: Percentiles,
    /// Output tokens per second over the measured window.
    pub throughput: f64,
    /// Cached / prompt tokens as the engines' usage reported them.
    pub hit_rate: f64,
    pub requests: usize,
    pub failed: usize,
    pub cut_off: usize,
    /// The own-prefill floor of the same requests ([`crate::bounds`]).
    pub floor_ttft_ms: Percentiles,
    /// Cached / prompt tokens with an unbounded cache, and with the oracle placement.
    pub ideal_hit_rate: f64,
    pub oracle_hit_rate: Option<f64>,
}

impl RunFigures {
    /// Figures of the requests sent at or after `warmup` seconds.
    pub fn of(records: &[Record], warmup: f64) -> Self {
        let measured: Vec<&Record> = records.iter().filter(|r| r.sent >= warmup).collect();
        let ok: Vec<&&Record> = measured.iter().filter(|r| r.ok()).collect();
        let ttft = ok
            .iter()
            .filter_map(|r| r.ttft)
            .chain(measured.iter().filter(|r| r.cut_off).map(|r| r.e2e))
            .map(|s| s * 1e3)
            .collect();
        let e2e = ok.iter().map(|r| r.e2e * 1e3).collect();
        let end = ok.iter().map(|r| r.sent + r.e2e).fold(warmup, f64::max);
        let tokens: usize = ok.iter().map(|r| r.output_tokens).sum();
        let prompt: usize = ok.iter().map(|r| r.prompt_tokens).sum();
        let cached: usize = ok.iter().map(|r| r.cached_tokens).sum();
        let bounds: Vec<Bound> = measured.iter().filter_map(|r| r.bound).collect();
        let asked = bounds.iter().map(|b| b.prompt_tokens).sum::<usize>().max(1) as f64;
        let oracle: Option<usize> = bounds.iter().map(|b| b.oracle_cached).sum();
        Self {
            ttft_ms: Percentiles::of(ttft),
            e2e_ms: Percentiles::of(e2e),
            throughput: tokens as f64 / (end - warmup).max(1e-9),
            hit_rate: cached as f64 / prompt.max(1) as f64,
            requests: measured.len(),
            failed: measured.iter().filter(|r| !r.ok() && !r.cut_off).count(),
            cut_off: measured.iter().filter(|r| r.cut_off).count(),
            floor_ttft_ms: Percentiles::of(bounds.iter().map(|b| b.floor_ttft * 1e3).collect()),
            ideal_hit_rate: bounds.iter().map(|b| b.ideal_cached).sum::<usize>() as f64 / asked,
            oracle_hit_rate: oracle.map(|o| o as f64 / asked),
        }
    }
}

/// A mean over seeds and its 95% confidence interval (Student's t).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Interval {
    pub mean: f64,
    pub lo: f64,
    pub hi: f64,
    pub n: usize,
}

impl Interval {
    pub fn of(values: &[f64]) -> Self {
        let n = values.len();
        if n == 0 {
            return Self::default();
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        if n == 1 {
            return Self {
                mean,
                lo: mean,
                hi: mean,
                n,
            };
        }
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        let half = t975(n - 1) * (var / n as f64).sqrt();
        Self {
            mean,
            lo: mean - half,
            hi: mean + half,
            n,
        }
    }
}

/// The mean ratio `a / b` over paired runs (the same seed under two routers) with its 95%
/// interval: the seed's own luck (its arrivals, its prompts) cancels in the ratio, so the
/// interval is far narrower than the two routers' own intervals side by side. `None` unless
/// both have the same number of runs, all positive.
pub fn paired_ratio(a: &[f64], b: &[f64]) -> Option<Interval> {
    if a.is_empty() || a.len() != b.len() || b.iter().any(|v| *v <= 0.0) {
        return None;
    }
    let ratios: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
    Some(Interval::of(&ratios))
}

/// The 97.5% quantile of Student's t with `df` degrees of freedom.
fn t975(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::INFINITY,
        d if d <= 30 => TABLE[d - 1],
        d if d <= 60 => 2.000 + 0.042 * (60 - d) as f64 / 30.0,
        _ => 1.96,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interval_of_constant_values_has_no_width_and_widens_with_spread() {
        let flat = Interval::of(&[2.0; 5]);
        assert_eq!((flat.lo, flat.mean, flat.hi), (2.0, 2.0, 2.0));
        let spread = Interval::of(&[1.0, 2.0, 3.0]);
        // mean 2, sd 1, n 3: half width = 4.303 / sqrt(3).
        assert!((spread.hi - 2.0 - 4.303 / 3f64.sqrt()).abs() < 1e-9);
    }

    #[test]
    fn a_paired_ratio_cancels_what_the_seeds_share() {
        // Two routers whose p90s swing alike from seed to seed: side by side their intervals
        // are wide and overlap; seed by seed one is 2% slower, every time.
        let best = [400.0, 900.0, 600.0, 1200.0, 750.0];
        let other: Vec<f64> = best.iter().map(|v| v * 1.02).collect();
        let (a, b) = (Interval::of(&other), Interval::of(&best));
        assert!(
            a.hi > b.lo * 1.05,
            "the unpaired rule cannot tell them apart"
        );
        let r = paired_ratio(&other, &best).unwrap();
        assert!((r.mean - 1.02).abs() < 1e-9 && r.hi - r.lo < 1e-9);
        assert_eq!(paired_ratio(&other[..2], &best), None);
        assert_eq!(paired_ratio(&[1.0], &[0.0]), None);
    }

    #[test]
    fn cut_off_requests_count_in_the_ttft_tail_and_warm_up_is_left_out() {
        let ok = |id, sent, ttft| Record {
            id,
            sent,
            ttft: Some(ttft),
            e2e: ttft + 1.0,
            prompt_tokens: 100,
            cached_tokens: 50,
            output_tokens: 10,
            ..Record::default()
        };
        let cut = Record {
            id: 9,
            sent: 5.0,
            e2e: 30.0,
            error: Some("cut off".into()),
            cut_off: true,
            ..Record::default()
        };
        let f = RunFigures::of(&[ok(0, 0.5, 9.0), ok(1, 2.0, 0.1), cut], 1.0);
        assert_eq!(f.requests, 2);
        assert_eq!(f.ttft_ms.p99, 30_000.0);
        assert_eq!(f.ttft_ms.p50, 100.0);
        assert!((f.hit_rate - 0.5).abs() < 1e-9);
    }
}

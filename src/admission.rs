//! Admission without flow control, as upstream's `LegacyAdmissionController`: a request whose
//! priority is below zero is rejected (429) when the pool is saturated; every other request is
//! admitted and queues on the model servers.
//!
//! Saturation follows upstream's `utilization-detector`: per endpoint
//! `max(waiting / queueDepthThreshold, kvUsage / kvCacheUtilThreshold)`, with stale or missing
//! metrics counting as 1.0; the pool's saturation is the average over the candidates (1.0 when
//! there are none) and it is saturated at ≥ 1.0. Pure: the caller passes the clock.
//!
//! The thresholds are the detector plugin's `parameters` in the EndpointPickerConfig
//! ([`Thresholds::from_params`], decoded by `crate::config`), with upstream's names, defaults
//! and checks.

pub(crate) mod concurrency;
mod params;
pub(crate) mod probabilistic;
pub use params::UtilizationParams;

use crate::endpoint::EndpointMetrics;
use std::time::{Duration, Instant};

/// Upstream's defaults: queue 5, KV 0.8, headroom 0.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Thresholds {
    /// `queueDepthThreshold`.
    pub(crate) queue_depth: f64,
    /// `kvCacheUtilThreshold`, in (0, 1].
    pub(crate) kv_cache_util: f64,
    /// `metricsStalenessThreshold`: metrics older than this count as saturated. Unset, epp uses
    /// `--metrics-staleness-threshold` (one staleness for the scheduler, the gauges and
    /// admission) where upstream's detector uses 200 ms.
    pub(crate) staleness: Option<Duration>,
    /// `headroom`: upstream applies it only when the detector also runs as a filter, which
    /// epp does not; accepted and checked so upstream configurations load unchanged.
    pub(crate) headroom: f64,
    /// The `concurrency-detector`, when `saturationDetector.pluginRef` names one: saturation is
    /// then epp's own in-flight load ([`concurrency::Concurrency::saturation`]).
    pub(crate) concurrency: Option<concurrency::Concurrency>,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            queue_depth: 5.0,
            kv_cache_util: 0.8,
            staleness: None,
            headroom: 0.0,
            concurrency: None,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("the pool is saturated (saturation {saturation:.2}) and the request's priority {priority} is sheddable")]
pub struct Shed {
    /// The request's priority (`datastore::objectives::Priority`): below zero is sheddable.
    pub(crate) priority: i32,
    pub(crate) saturation: f64,
}

/// One endpoint's saturation; `staleness` applies when the thresholds set none.
pub(crate) fn endpoint_saturation(
    metrics: Option<&EndpointMetrics>,
    now: Instant,
    t: &Thresholds,
    staleness: Duration,
) -> f64 {
    match metrics {
        Some(m) if m.age(now) <= t.staleness.unwrap_or(staleness) => {
            (m.waiting / t.queue_depth).max(m.kv_usage / t.kv_cache_util)
        }
        _ => 1.0,
    }
}

/// The pool's saturation over `endpoints`.
pub(crate) fn saturation<'a>(
    endpoints: impl ExactSizeIterator<Item = Option<&'a EndpointMetrics>>,
    now: Instant,
    t: &Thresholds,
    staleness: Duration,
) -> f64 {
    let n = endpoints.len();
    if n == 0 {
        return 1.0;
    }
    endpoints
        .map(|m| endpoint_saturation(m, now, t, staleness))
        .sum::<f64>()
        / n as f64
}

/// Admits or sheds a request; `saturation` is evaluated only for sheddable requests.
pub(crate) fn admit(priority: i32, saturation: impl FnOnce() -> f64) -> Result<(), Shed> {
    if priority >= 0 {
        return Ok(());
    }
    let s = saturation();
    if s >= 1.0 {
        return Err(Shed {
            priority,
            saturation: s,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(waiting: f64, kv: f64, age_ms: u64, now: Instant) -> EndpointMetrics {
        crate::fixtures::metrics()
            .waiting(waiting)
            .kv_usage(kv)
            .updated(now - Duration::from_millis(age_ms))
            .build()
    }

    #[test]
    fn saturation_averages_queue_and_kv_ratios_and_stale_counts_as_full() {
        let now = Instant::now();
        let t = Thresholds {
            staleness: Some(Duration::from_millis(200)),
            ..Thresholds::default()
        };
        let idle = m(0.0, 0.0, 0, now);
        let queued = m(10.0, 0.0, 0, now);
        let kv = m(0.0, 0.4, 0, now);
        let stale = m(0.0, 0.0, 10_000, now);
        assert_eq!(
            saturation(
                [Some(&idle), Some(&queued)].into_iter(),
                now,
                &t,
                Duration::ZERO
            ),
            1.0
        );
        assert_eq!(
            saturation([Some(&kv)].into_iter(), now, &t, Duration::ZERO),
            0.5
        );
        assert_eq!(
            saturation([Some(&stale), None].into_iter(), now, &t, Duration::ZERO),
            1.0
        );
        assert_eq!(saturation(std::iter::empty(), now, &t, Duration::ZERO), 1.0);
    }

    #[test]
    fn only_negative_priorities_are_shed_and_only_when_saturated() {
        assert!(admit(0, || 5.0).is_ok());
        assert!(admit(10, || 5.0).is_ok());
        assert!(admit(-1, || 0.99).is_ok());
        assert_eq!(
            admit(-1, || 1.0),
            Err(Shed {
                priority: -1,
                saturation: 1.0
            })
        );
    }
}

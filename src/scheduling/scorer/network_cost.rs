//! `network-cost-scorer` (epp, hub): a hub's clusters priced in one unit, milliseconds until
//! the client sees the first token: the cluster's estimated time to first token plus the round
//! trip to it. It scores `cheapest / cost`, so with `max-score-picker` (and no other scorer)
//! traffic stays in the nearest cluster while that is cheaper, spills to a farther one when the
//! near one's queue costs more than the extra round trip, and comes back when the queue drains.
//! Sessions stay where their cache is with `multicluster-session-affinity-filter` in front.
//!
//! # The estimate
//! ```text
//! ttft = (idleTtftMs · (1 − matched) + queuedRequestMs · queue) / (1 − min(kv, 0.95))
//! cost = rtt + ttft
//! ```
//! - `queue` and `kv` are what the cluster's spoke EPP publishes (its pool's average waiting
//!   queue per pod and average KV-cache utilization, `multicluster-metrics-extractor`). A
//!   request queued behind `queue` others waits about `queue` batch-slot releases, each about
//!   `queuedRequestMs` (a decode's share of a slot); that is the term that grows under
//!   saturation, where the spoke's queue is the only signal a hub has.
//! - To `queue` the hub adds the requests it sent the cluster since that reading (a spoke's
//!   gauges are one publication and one scrape old: 50–330 ms). Without them every request
//!   between two readings went to the cluster that was cheapest at the last one, and the near
//!   queue overshot before anything spilled (`region-bench`, saturated). Each counts as one
//!   queued request on the pool's per-pod average: exact for a one-pod cluster, an over-count
//!   for larger ones, which the next reading corrects.
//! - `1 / (1 − kv)` is M/M/1's stretch of the response time at utilization `kv`: a pool whose
//!   cache is filling is busy before its queue shows it (capped at 0.95: ×20).
//! - `matched` is the share of the prompt's blocks this cluster is believed to hold
//!   (`multicluster-approx-prefix-cache-producer`'s match, 0 without one): a cached prefix
//!   is not prefilled again, so a session's home is cheaper by what its prefill would cost.
//! - `rtt` is the round trip the hub measures itself: each scrape of the spoke's metrics is
//!   timed, and the hub keeps the smallest of the last eight (a minimum filter, as TCP's and
//!   BBR's RTT estimators do: connection set-up and a slow answer inflate a sample, never
//!   shrink it). A cluster scraped without a timing (none yet) falls back to its `rttLabel`
//!   label from the clusters file (milliseconds), else 0.
//!
//! A cluster whose spoke published neither gauge scores 0 (unscored, as the multicluster
//! scorers leave it).

use crate::plugin::Invalid;
use crate::scheduling::{Candidate, SchedulingRequest};

/// The scorer's parameters.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct NetworkCostScorer {
    /// Time to first token of an uncached prompt at an idle pool, ms.
    pub(crate) idle_ttft_ms: f64,
    /// Time to first token each request waiting in a pod's queue adds, ms.
    pub(crate) queued_request_ms: f64,
    /// The cluster label holding a static round trip (ms), read when none was measured.
    pub(crate) rtt_label: String,
}

impl Default for NetworkCostScorer {
    fn default() -> Self {
        Self {
            idle_ttft_ms: 50.0,
            queued_request_ms: 100.0,
            rtt_label: "rttMs".into(),
        }
    }
}

/// The KV utilization past which the stretch stops growing (×20).
const KV_CAP: f64 = 0.95;

impl NetworkCostScorer {
    pub(crate) fn validate(self) -> Result<Self, Vec<Invalid>> {
        let mut bad = Vec::new();
        let non_negative = |v: f64| v.is_finite() && v >= 0.0;
        if !non_negative(self.idle_ttft_ms) {
            bad.push(Invalid::new("idleTtftMs", "idleTtftMs must be >= 0"));
        }
        if !non_negative(self.queued_request_ms) {
            bad.push(Invalid::new(
                "queuedRequestMs",
                "queuedRequestMs must be >= 0",
            ));
        }
        if self.rtt_label.is_empty() {
            bad.push(Invalid::new("rttLabel", "rttLabel must not be empty"));
        }
        match bad.is_empty() {
            true => Ok(self),
            false => Err(bad),
        }
    }

    /// The candidate's round trip, ms: measured, else its label, else 0.
    fn rtt_ms(&self, c: &Candidate) -> f64 {
        let measured = c.metrics.as_ref().and_then(|m| m.pool?.rtt_ms);
        measured
            .or_else(|| c.labels.get(&self.rtt_label)?.trim().parse().ok())
            .filter(|v: &f64| v.is_finite() && *v >= 0.0)
            .unwrap_or(0.0)
    }

    /// The cluster's estimated time to first token, ms; `None` when its spoke published
    /// neither gauge.
    fn ttft_ms(&self, req: &SchedulingRequest<'_>, c: &Candidate) -> Option<f64> {
        let pool = c.metrics.as_ref()?.pool?;
        if pool.queue.is_none() && pool.kv_usage.is_none() {
            return None;
        }
        let matched = match req.prefix_total_blocks {
            0 => 0.0,
            total => (c.prefix_blocks.min(total) as f64) / total as f64,
        };
        // A cluster's scraped `waiting` is 0: `c.waiting` is what this hub sent it since.
        let queue = pool.queue.unwrap_or(0.0).max(0.0) + c.waiting.max(0.0);
        let kv = pool.kv_usage.unwrap_or(0.0).clamp(0.0, KV_CAP);
        let work = self.idle_ttft_ms * (1.0 - matched) + self.queued_request_ms * queue;
        Some(work / (1.0 - kv))
    }

    /// A cluster's cost, ms: its round trip plus its estimated TTFT.
    fn cost_ms(&self, req: &SchedulingRequest<'_>, c: &Candidate) -> Option<f64> {
        Some(self.rtt_ms(c) + self.ttft_ms(req, c)?)
    }

    pub(crate) fn score(&self, req: &SchedulingRequest<'_>, pool: &[&Candidate], out: &mut [f64]) {
        for (o, c) in out.iter_mut().zip(pool) {
            *o = self.cost_ms(req, c).unwrap_or(f64::NAN);
        }
        let cheapest = out
            .iter()
            .copied()
            .filter(|v| !v.is_nan())
            .fold(f64::INFINITY, f64::min);
        for o in out.iter_mut() {
            *o = match *o {
                v if v.is_nan() => 0.0,
                v if v <= 0.0 => 1.0,
                v => cheapest.max(0.0) / v,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::cand;
    use std::sync::Arc;

    /// A cluster on `port` whose spoke publishes `queue` and `kv`, `rtt` ms away (measured).
    fn cluster(port: u16, queue: f64, kv: f64, rtt: Option<f64>) -> Candidate {
        let metrics = crate::fixtures::metrics()
            .pool(Some(kv), Some(queue))
            .pool_rtt(rtt)
            .arc();
        Candidate {
            metrics: Some(metrics),
            ..cand(port, 0.0, 0.0, 0)
        }
    }

    fn scores(req: &SchedulingRequest<'_>, cands: &[Candidate]) -> Vec<f64> {
        let mut out = vec![9.0; cands.len()];
        NetworkCostScorer::default().score(req, &cands.iter().collect::<Vec<_>>(), &mut out);
        out
    }

    fn pick(cands: &[Candidate]) -> usize {
        let s = scores(&SchedulingRequest::default(), cands);
        (0..s.len())
            .max_by(|a, b| s[*a].total_cmp(&s[*b]))
            .expect("a candidate")
    }

    #[test]
    fn the_near_cluster_wins_while_its_queue_costs_less_than_the_extra_round_trip() {
        // 40 ms vs 280 ms: the far one is 240 ms farther; each queued request costs 100 ms.
        let far = || cluster(2, 0.0, 0.1, Some(280.0));
        assert_eq!(pick(&[cluster(1, 0.0, 0.1, Some(40.0)), far()]), 0);
        assert_eq!(pick(&[cluster(1, 2.0, 0.1, Some(40.0)), far()]), 0, "stay");
        assert_eq!(pick(&[cluster(1, 3.0, 0.1, Some(40.0)), far()]), 1, "spill");
        assert_eq!(
            pick(&[cluster(1, 0.5, 0.1, Some(40.0)), far()]),
            0,
            "return"
        );
    }

    #[test]
    fn requests_sent_since_the_last_reading_count_as_queued_until_the_next() {
        let far = || cluster(2, 0.0, 0.1, Some(280.0));
        let near = |sent: f64| Candidate {
            waiting: sent,
            ..cluster(1, 0.0, 0.1, Some(40.0))
        };
        // The same reading (an empty queue): the near cluster wins until the hub's own
        // requests since then cost more than the extra 240 ms round trip.
        assert_eq!(pick(&[near(0.0), far()]), 0);
        assert_eq!(pick(&[near(2.0), far()]), 0, "stay");
        assert_eq!(
            pick(&[near(3.0), far()]),
            1,
            "spill before the next reading"
        );
    }

    #[test]
    fn the_cheapest_scores_one_and_the_others_by_the_ratio_of_costs() {
        let s = scores(
            &SchedulingRequest::default(),
            &[
                cluster(1, 0.0, 0.0, Some(50.0)),
                cluster(2, 0.0, 0.0, Some(150.0)),
                cluster(3, 1.0, 0.5, Some(0.0)),
            ],
        );
        // Costs: 100, 200 and (50 + 100) / 0.5 = 300 ms.
        assert_eq!(s, vec![1.0, 0.5, 100.0 / 300.0]);
    }

    #[test]
    fn a_filling_cache_stretches_the_estimate_and_is_capped() {
        let s = NetworkCostScorer::default();
        let req = SchedulingRequest::default();
        let ttft = |kv| s.ttft_ms(&req, &cluster(1, 0.0, kv, None)).unwrap();
        assert_eq!(ttft(0.0), 50.0);
        assert_eq!(ttft(0.5), 100.0);
        assert!((ttft(1.0) - 1000.0).abs() < 1e-9, "{}", ttft(1.0));
    }

    #[test]
    fn a_held_prefix_is_not_priced_again() {
        // Both idle at the same distance; cluster 1 holds the whole prompt.
        let mut home = cluster(1, 0.0, 0.0, Some(40.0));
        home.prefix_blocks = 8;
        let req = SchedulingRequest {
            prefix_total_blocks: 8,
            block_size: 16,
            ..Default::default()
        };
        let s = scores(&req, &[home.clone(), cluster(2, 0.0, 0.0, Some(40.0))]);
        assert_eq!(s, vec![1.0, 40.0 / 90.0]);
        // A queued request at home costs more than the whole prefill elsewhere.
        home.metrics = cluster(1, 1.0, 0.0, Some(40.0)).metrics;
        let s = scores(&req, &[home, cluster(2, 0.0, 0.0, Some(40.0))]);
        assert_eq!(s, vec![90.0 / 140.0, 1.0]);
    }

    #[test]
    fn the_label_is_read_only_without_a_measurement_and_silence_scores_zero() {
        let labelled = |rtt| Candidate {
            labels: Arc::new([("rttMs".to_owned(), "200".to_owned())].into()),
            ..cluster(1, 0.0, 0.0, rtt)
        };
        let s = NetworkCostScorer::default();
        let req = SchedulingRequest::default();
        assert_eq!(s.cost_ms(&req, &labelled(None)), Some(250.0));
        assert_eq!(s.cost_ms(&req, &labelled(Some(10.0))), Some(60.0));
        let silent = cand(9, 0.0, 0.0, 0);
        let out = scores(&req, &[cluster(1, 0.0, 0.0, Some(10.0)), silent]);
        assert_eq!(out, vec![1.0, 0.0]);
    }

    #[test]
    fn bad_parameters_are_refused_by_name() {
        let bad = NetworkCostScorer {
            idle_ttft_ms: -1.0,
            queued_request_ms: f64::NAN,
            rtt_label: String::new(),
        };
        let names: Vec<_> = bad
            .validate()
            .unwrap_err()
            .iter()
            .map(|i| i.parameter)
            .collect();
        assert_eq!(names, ["idleTtftMs", "queuedRequestMs", "rttLabel"]);
    }
}

//! `prefix-cache-affinity-filter` (llm-d): keep only the endpoints that hold most of the
//! prompt ("sticky"), unless that costs too much time-to-first-token.
//!
//! A candidate is sticky when `prefix_blocks / prefix_total_blocks ≥ affinityThreshold`. No
//! sticky candidate, a threshold ≤ 0, one candidate or an exploration draw
//! (`explorationProbability`) keep everyone. With `maxTTFTPenaltyMs > 0` and non-sticky
//! candidates present, each candidate's TTFT is estimated as its in-flight tokens (uncached
//! prompt tokens epp sent there with no first token yet) over `peakPrefillThroughput`, and
//! when the best sticky TTFT exceeds the best non-sticky one by more than `maxTTFTPenaltyMs`
//! the filter keeps everyone (the load gate). Otherwise only the sticky candidates remain.

use crate::metrics::affinity::{record_affinity, AffinityOutcome};
use crate::plugin::Invalid;
use crate::scheduling::{Candidate, SchedulingRequest};
use rand::Rng;

const PREFILL_THROUGHPUT: &str = "prefillThroughput";
const LATENCY_PREDICTOR: &str = "latencyPredictor";

#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct PrefixCacheAffinityFilter {
    pub(crate) affinity_threshold: f64,
    pub(crate) exploration_probability: f64,
    #[serde(rename = "maxTTFTPenaltyMs")]
    pub(crate) max_ttft_penalty_ms: f64,
    /// `prefillThroughput`, or `latencyPredictor` (upstream's predictor sidecars: refused,
    /// epp has none).
    #[serde(rename = "ttftSource")]
    pub(crate) ttft_source: String,
    /// Tokens per second one endpoint prefills.
    pub(crate) peak_prefill_throughput: f64,
    /// Producer names: epp has one of each, so any name is accepted.
    pub(crate) prefix_match_info_producer_name: String,
    pub(crate) latency_prediction_info_producer_name: String,
    pub(crate) in_flight_load_producer_name: String,
    /// The instance's name (the `plugin_name` label of its decisions counter), set by the
    /// configuration decoder.
    #[serde(skip)]
    pub(crate) plugin_name: String,
}

impl Default for PrefixCacheAffinityFilter {
    fn default() -> Self {
        Self {
            affinity_threshold: 0.80,
            exploration_probability: 0.0,
            max_ttft_penalty_ms: 18_000.0,
            ttft_source: PREFILL_THROUGHPUT.into(),
            peak_prefill_throughput: 15_928.0,
            prefix_match_info_producer_name: String::new(),
            latency_prediction_info_producer_name: String::new(),
            in_flight_load_producer_name: String::new(),
            plugin_name: String::new(),
        }
    }
}

impl PrefixCacheAffinityFilter {
    /// Upstream's checks and messages (Go's `%f`: six decimals).
    pub(crate) fn validate(self) -> Result<Self, Invalid> {
        let fail =
            |p: &'static str, m: String| Err(Invalid::new(p, format!("invalid config: {m}")));
        if self.affinity_threshold > 1.0 {
            return fail(
                "affinityThreshold",
                format!(
                    "affinityThreshold must be <= 1.0, got {:.6}",
                    self.affinity_threshold
                ),
            );
        }
        if !(0.0..=1.0).contains(&self.exploration_probability) {
            return fail(
                "explorationProbability",
                format!(
                    "explorationProbability must be in [0, 1], got {:.6}",
                    self.exploration_probability
                ),
            );
        }
        if self.max_ttft_penalty_ms < 0.0 {
            return fail(
                "maxTTFTPenaltyMs",
                format!(
                    "maxTTFTPenaltyMs must be >= 0, got {:.6}",
                    self.max_ttft_penalty_ms
                ),
            );
        }
        if self.peak_prefill_throughput < 0.0 {
            return fail(
                "peakPrefillThroughput",
                format!(
                    "peakPrefillThroughput must be >= 0, got {:.6}",
                    self.peak_prefill_throughput
                ),
            );
        }
        if self.ttft_source != PREFILL_THROUGHPUT && self.ttft_source != LATENCY_PREDICTOR {
            return fail(
                "ttftSource",
                format!(
                    "ttftSource must be {LATENCY_PREDICTOR:?} or {PREFILL_THROUGHPUT:?}, got {:?}",
                    self.ttft_source
                ),
            );
        }
        if self.ttft_source == LATENCY_PREDICTOR {
            return fail(
                "ttftSource",
                "ttftSource \"latencyPredictor\" needs upstream's latency-predictor sidecars, which epp does not implement; use \"prefillThroughput\"".into(),
            );
        }
        if self.max_ttft_penalty_ms > 0.0 && self.peak_prefill_throughput == 0.0 {
            return fail(
                "peakPrefillThroughput",
                "peakPrefillThroughput must be > 0 when ttftSource is prefillThroughput".into(),
            );
        }
        Ok(self)
    }

    /// The kept candidates, the decision counted
    /// (`llm_d_epp_prefix_cache_affinity_filter_decisions_total`).
    pub(crate) fn filter<'c>(
        &self,
        req: &SchedulingRequest<'_>,
        pool: Vec<&'c Candidate>,
        rng: &mut impl Rng,
    ) -> Vec<&'c Candidate> {
        let (kept, outcome) = self.decide(req, pool, rng);
        record_affinity(&self.plugin_name, outcome);
        kept
    }

    fn decide<'c>(
        &self,
        req: &SchedulingRequest<'_>,
        pool: Vec<&'c Candidate>,
        rng: &mut impl Rng,
    ) -> (Vec<&'c Candidate>, AffinityOutcome) {
        if pool.len() <= 1 || self.affinity_threshold <= 0.0 {
            return (pool, AffinityOutcome::not_applicable);
        }
        if rng.random::<f64>() < self.exploration_probability {
            return (pool, AffinityOutcome::exploration);
        }
        let (sticky, other): (Vec<&Candidate>, Vec<&Candidate>) = pool
            .iter()
            .partition(|c| score(req, c) >= self.affinity_threshold);
        if sticky.is_empty() {
            return (pool, AffinityOutcome::no_match);
        }
        if self.max_ttft_penalty_ms > 0.0 && !other.is_empty() {
            let penalty = self.best_ttft_ms(&sticky) - self.best_ttft_ms(&other);
            if penalty > self.max_ttft_penalty_ms {
                return (pool, AffinityOutcome::load_override);
            }
        }
        (sticky, AffinityOutcome::sticky)
    }

    fn best_ttft_ms(&self, pool: &[&Candidate]) -> f64 {
        pool.iter()
            .map(|c| c.prefill.pending_tokens / self.peak_prefill_throughput * 1000.0)
            .fold(f64::MAX, f64::min)
    }
}

/// The prefix match ratio (0 without a prompt).
fn score(req: &SchedulingRequest<'_>, c: &Candidate) -> f64 {
    if req.prefix_total_blocks == 0 {
        return 0.0;
    }
    c.prefix_blocks as f64 / req.prefix_total_blocks as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::plugin::params;
    use crate::scheduling::testing::cand;
    use rand::{rngs::SmallRng, SeedableRng};

    fn req() -> SchedulingRequest<'static> {
        SchedulingRequest {
            prefix_total_blocks: 10,
            block_size: 16,
            prompt_tokens: 160,
            ..Default::default()
        }
    }

    /// (prefix blocks, in-flight tokens) per candidate.
    fn kept(f: &PrefixCacheAffinityFilter, cands: &[(usize, f64)]) -> Vec<u16> {
        let cands: Vec<Candidate> = cands
            .iter()
            .enumerate()
            .map(|(i, (blocks, pending))| {
                let mut c = cand(i as u16 + 1, 0.0, 0.0, *blocks);
                c.prefill.pending_tokens = *pending;
                c
            })
            .collect();
        let mut rng = SmallRng::seed_from_u64(1);
        f.filter(&req(), cands.iter().collect(), &mut rng)
            .iter()
            .map(|c| c.id.0.port())
            .collect()
    }

    #[test]
    fn keeps_sticky_endpoints_unless_the_ttft_gate_breaks() {
        let d = PrefixCacheAffinityFilter::default();
        let always_stick = PrefixCacheAffinityFilter {
            max_ttft_penalty_ms: 0.0,
            ..Default::default()
        };
        let off = PrefixCacheAffinityFilter {
            affinity_threshold: 0.0,
            ..Default::default()
        };
        type Case<'a> = (&'a PrefixCacheAffinityFilter, &'a [(usize, f64)], &'a [u16]);
        let table: [Case; 6] = [
            // 8/10 ≥ 0.8 is sticky, 7/10 is not.
            (&d, &[(8, 0.0), (7, 0.0), (0, 0.0)], &[1]),
            (&d, &[(7, 0.0), (0, 0.0)], &[1, 2]),
            // 15928 tokens/s: 300k tokens ahead ≈ 18.8 s > 18 s penalty → everyone.
            (&d, &[(10, 300_000.0), (0, 0.0)], &[1, 2]),
            (&d, &[(10, 200_000.0), (0, 0.0)], &[1]),
            (&always_stick, &[(10, 1e9), (0, 0.0)], &[1]),
            (&off, &[(10, 0.0), (0, 0.0)], &[1, 2]),
        ];
        for (f, cands, want) in table {
            assert_eq!(kept(f, cands), want, "{cands:?}");
        }
    }

    /// Each decision is counted under the instance's name and upstream's outcome names.
    #[test]
    fn decisions_are_counted_by_outcome() {
        use crate::metrics::affinity::{AffinityLabels, AFFINITY_FILTER_DECISIONS};
        let name = "affinity-counter-test";
        let named = |f: PrefixCacheAffinityFilter| PrefixCacheAffinityFilter {
            plugin_name: name.to_owned(),
            ..f
        };
        let d = named(PrefixCacheAffinityFilter::default());
        let explore = named(PrefixCacheAffinityFilter {
            exploration_probability: 1.0,
            ..Default::default()
        });
        kept(&d, &[(8, 0.0), (0, 0.0)]);
        kept(&d, &[(8, 0.0), (0, 0.0)]);
        kept(&d, &[(7, 0.0), (0, 0.0)]);
        kept(&d, &[(10, 300_000.0), (0, 0.0)]);
        kept(&d, &[(10, 0.0)]);
        kept(&explore, &[(10, 0.0), (0, 0.0)]);
        let count = |outcome| {
            let labels = AffinityLabels {
                plugin_name: name.to_owned(),
                outcome,
            };
            AFFINITY_FILTER_DECISIONS.get_or_create(&labels).get()
        };
        use AffinityOutcome as O;
        assert_eq!(count(O::sticky), 2);
        assert_eq!(count(O::no_match), 1);
        assert_eq!(count(O::load_override), 1);
        assert_eq!(count(O::not_applicable), 1);
        assert_eq!(count(O::exploration), 1);
        let mut registry = prometheus_client::registry::Registry::default();
        let _m = crate::metrics::Metrics::register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let line = "llm_d_epp_prefix_cache_affinity_filter_decisions_total{plugin_name=\"affinity-counter-test\",outcome=\"sticky\"} 2";
        assert!(text.contains(line), "{text}");
    }

    #[test]
    fn exploration_keeps_everyone_at_its_rate() {
        let f = PrefixCacheAffinityFilter {
            exploration_probability: 0.25,
            ..Default::default()
        };
        let cands = [cand(1, 0.0, 0.0, 10), cand(2, 0.0, 0.0, 0)];
        let mut rng = SmallRng::seed_from_u64(9);
        let all = (0..4000)
            .filter(|_| f.filter(&req(), cands.iter().collect(), &mut rng).len() == 2)
            .count();
        assert!((800..1200).contains(&all), "{all}");
    }

    #[test]
    fn parameters_are_checked_with_upstream_messages() {
        let bad = [
            (
                "affinityThreshold: 1.5",
                "affinityThreshold must be <= 1.0, got 1.500000",
            ),
            (
                "explorationProbability: -0.1",
                "explorationProbability must be in [0, 1], got -0.100000",
            ),
            (
                "maxTTFTPenaltyMs: -1",
                "maxTTFTPenaltyMs must be >= 0, got -1.000000",
            ),
            (
                "peakPrefillThroughput: 0",
                "peakPrefillThroughput must be > 0 when ttftSource is prefillThroughput",
            ),
            ("ttftSource: latencyPredictor", "latency-predictor"),
            (
                "ttftSource: fast",
                "ttftSource must be \"latencyPredictor\" or \"prefillThroughput\", got \"fast\"",
            ),
        ];
        for (yaml, want) in bad {
            let v: serde_norway::Value = serde_norway::from_str(yaml).unwrap();
            let err = params::<PrefixCacheAffinityFilter>(&v)
                .unwrap()
                .validate()
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{yaml}: {err}");
        }
        let v: serde_norway::Value =
            serde_norway::from_str("{peakPrefillThroughput: 0, maxTTFTPenaltyMs: 0}").unwrap();
        assert!(params::<PrefixCacheAffinityFilter>(&v)
            .unwrap()
            .validate()
            .is_ok());
        let v: serde_norway::Value = serde_norway::from_str("threshold: 0.5").unwrap();
        assert!(params::<PrefixCacheAffinityFilter>(&v).is_err());
    }
}

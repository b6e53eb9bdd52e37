//! `cost-based-pd-decider` (epp): disaggregate a request's prefill when that is cheaper, in
//! seconds, than prefilling on the decode pod, instead of when the uncached suffix passes a
//! fixed token count.
//!
//! # Why not a threshold
//! `prefix-based-pd-decider` sends every request with ≥ `nonCachedTokens` uncached tokens to a
//! prefill pod. That ignores what the remote path costs: the prefill pod must compute the
//! *whole* prompt unless it holds the prefix too, the KV must cross the network, and a prefill
//! queue may be longer than the decode pod's. With a long cached prefix and a 20-token suffix
//! (code completion, multi-turn chat) the threshold ships a prompt the decode pod would finish
//! in milliseconds to a pod that recomputes all of it.
//!
//! # The comparison
//! For the decode pick `D` and each prefill candidate `P` (after the prefill profile's filters),
//! with each pod's TTFT rates (learned by epp from its responses, as the
//! `estimated-ttft-scorer`; a pod never observed takes `D`'s learned rates, else the seed):
//! ```text
//! queue(X)   = per_token·ahead_tokens(X) + per_waiting·waiting(X)        work ahead on X
//! local      = base(D) + queue(D) + per_token(D)·uncached(D) + per_running(D)·running(D)
//!            + interferenceWeight · running(D) · per_token(D) · uncached(D)
//! remote(P)  = max(base(P) + queue(P) + per_token(P)·uncached(P) + handoff + transfer,
//!                  queue(D)) + base(D) + per_running(D)·running(D)
//! transfer   = uncached(D) · kvBytesPerToken / (kvTransferGBps · 10⁹)
//! ```
//! and disaggregates when `min_P remote(P) + minGainMs < local`. The interference term is the
//! reason P/D exists: a local prefill of `t` seconds stalls each of the `running(D)` sequences
//! decoding there by about `t` (their inter-token latency spikes); a remote prefill does not.
//! On idle pods the local path always wins (the remote path adds a hop and a transfer), so the
//! decider disaggregates long uncached prompts when the decode pod is busy decoding, and keeps
//! short suffixes local whatever their absolute length.
//!
//! Cost: O(prefill candidates) per request, no allocation.

use crate::plugin::Invalid;
use crate::scheduling::scorer::{EstimatedTtftScorer, TtftInputs, TtftRates};
use crate::scheduling::{Candidate, SchedulingRequest};

#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct CostBasedPdDecider {
    /// KV-cache bytes per prompt token, all layers, K and V (2 · layers · KV heads · head dim ·
    /// bytes per value; 131,072 for a Llama-3-8B in bf16).
    pub(crate) kv_bytes_per_token: f64,
    /// Prefill → decode KV transfer bandwidth, GB/s (10⁹ bytes).
    pub(crate) kv_transfer_g_bps: f64,
    /// Fixed cost of the remote path: the sidecar's prefill request and the KV handshake, ms.
    pub(crate) handoff_latency_ms: f64,
    /// Weight of the stall a local prefill imposes on each sequence decoding on the decode pod.
    /// 0.25 by default: in the P/D benchmark it matched the best fixed threshold's TTFT on every
    /// workload and beat it on long prompts (p50 0.63-0.64x), with E2E level; 0.5 kept the 200-
    /// token prompts of the mixed workload remote (TTFT p50 1.3-1.5x the best threshold's), 0.1
    /// raised long-prompt E2E p90 (BENCHMARKS.md, #21, "The interference weight, swept").
    pub(crate) interference_weight: f64,
    /// Disaggregate only when the remote path is estimated at least this much cheaper, ms.
    pub(crate) min_gain_ms: f64,
    /// Seed rates for pods epp has not observed (the `estimated-ttft-scorer`'s parameters).
    pub(crate) peak_prefill_throughput: f64,
    pub(crate) base_latency_ms: f64,
    pub(crate) decode_cost_ms: f64,
    pub(crate) queued_request_cost_ms: f64,
    /// Use each pod's learned rates (false: the seed for every pod).
    pub(crate) learn: bool,
}

impl Default for CostBasedPdDecider {
    fn default() -> Self {
        let seed = EstimatedTtftScorer::default();
        Self {
            kv_bytes_per_token: 131_072.0,
            kv_transfer_g_bps: 25.0,
            handoff_latency_ms: 5.0,
            interference_weight: 0.25,
            min_gain_ms: 0.0,
            peak_prefill_throughput: seed.peak_prefill_throughput,
            base_latency_ms: seed.base_latency_ms,
            decode_cost_ms: seed.decode_cost_ms,
            queued_request_cost_ms: seed.queued_request_cost_ms,
            learn: true,
        }
    }
}

/// One path's estimate, seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct PathCosts {
    pub(crate) local: f64,
    /// The cheapest prefill candidate's remote path (`None`: no candidate).
    pub(crate) remote: Option<f64>,
}

impl CostBasedPdDecider {
    pub(crate) fn validate(self) -> Result<Self, Invalid> {
        let fields = [
            ("kvBytesPerToken", self.kv_bytes_per_token, false),
            ("kvTransferGBps", self.kv_transfer_g_bps, false),
            ("handoffLatencyMs", self.handoff_latency_ms, true),
            ("interferenceWeight", self.interference_weight, true),
            ("minGainMs", self.min_gain_ms, true),
            ("peakPrefillThroughput", self.peak_prefill_throughput, false),
            ("baseLatencyMs", self.base_latency_ms, true),
            ("decodeCostMs", self.decode_cost_ms, true),
            ("queuedRequestCostMs", self.queued_request_cost_ms, true),
        ];
        for (name, v, zero_ok) in fields {
            if !v.is_finite() || v < 0.0 || (v == 0.0 && !zero_ok) {
                let want = if zero_ok { ">= 0" } else { "> 0" };
                return Err(Invalid::new(
                    name,
                    format!("{name} must be a finite number {want}, got {v}"),
                ));
            }
        }
        Ok(self)
    }

    fn ttft(&self) -> EstimatedTtftScorer {
        EstimatedTtftScorer {
            peak_prefill_throughput: self.peak_prefill_throughput,
            base_latency_ms: self.base_latency_ms,
            decode_cost_ms: self.decode_cost_ms,
            queued_request_cost_ms: self.queued_request_cost_ms,
            eviction_cost_weight: 0.0,
            congestion_cost_weight: 0.0,
            in_flight_delay_weight: 0.0,
            learn: self.learn,
        }
    }

    /// `c`'s rates: learned, else `fallback` (the decode pod's, same hardware presumed), else
    /// the seed.
    fn rates(&self, c: &Candidate, fallback: Option<TtftRates>) -> TtftRates {
        let learned = c.prefill.learned.filter(|_| self.learn);
        learned.or(fallback).unwrap_or_else(|| self.ttft().seed())
    }

    /// The estimates of both paths for `req` with decode pick `d` and prefill candidates `pool`.
    pub(crate) fn costs(
        &self,
        req: &SchedulingRequest<'_>,
        d: &Candidate,
        pool: &[&Candidate],
    ) -> PathCosts {
        let ttft = self.ttft();
        let rd = self.rates(d, None);
        let id = ttft.inputs(req, d);
        let queue = |r: &TtftRates, i: &TtftInputs| {
            r.per_token * i.ahead_tokens + r.per_waiting * i.waiting
        };
        let prefill_d = rd.per_token * id.own_tokens;
        let decode_step = rd.base + rd.per_running * id.running;
        let local = decode_step
            + queue(&rd, &id)
            + prefill_d
            + self.interference_weight * id.running * prefill_d;
        let learned_d = d.prefill.learned.filter(|_| self.learn);
        let transfer = id.own_tokens * self.kv_bytes_per_token / (self.kv_transfer_g_bps * 1e9);
        let handoff = self.handoff_latency_ms / 1e3;
        let remote = pool
            .iter()
            .filter(|p| p.id != d.id)
            .map(|p| {
                let rp = self.rates(p, learned_d);
                let ip = ttft.inputs(req, p);
                let prefill = rp.base + queue(&rp, &ip) + rp.per_token * ip.own_tokens;
                (prefill + handoff + transfer).max(queue(&rd, &id)) + decode_step
            })
            .filter(|c| c.is_finite())
            .min_by(f64::total_cmp);
        PathCosts { local, remote }
    }

    /// Whether the remote path is cheaper by at least `minGainMs`.
    pub(crate) fn disaggregate(
        &self,
        req: &SchedulingRequest<'_>,
        d: &Candidate,
        pool: &[&Candidate],
    ) -> bool {
        let c = self.costs(req, d, pool);
        c.remote
            .is_some_and(|r| r + self.min_gain_ms / 1e3 < c.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::cand;

    fn req(prompt: usize) -> SchedulingRequest<'static> {
        SchedulingRequest {
            prompt_tokens: prompt,
            block_size: 16,
            ..Default::default()
        }
    }

    fn decider() -> CostBasedPdDecider {
        CostBasedPdDecider::default().validate().unwrap()
    }

    fn running(port: u16, n: f64, blocks: usize) -> Candidate {
        let mut c = cand(port, 0.0, 0.0, blocks);
        c.running = n;
        c
    }

    #[test]
    fn idle_pods_keep_the_prefill_local() {
        let d = decider();
        let (dec, pre) = (running(1, 0.0, 0), running(2, 0.0, 0));
        for prompt in [16, 1_000, 30_000] {
            assert!(!d.disaggregate(&req(prompt), &dec, &[&pre]), "{prompt}");
        }
    }

    #[test]
    fn a_long_uncached_prompt_leaves_a_busy_decode_pod() {
        let d = decider();
        let dec = running(1, 32.0, 0);
        let pre = running(2, 0.0, 0);
        assert!(d.disaggregate(&req(8_000), &dec, &[&pre]));
        let c = d.costs(&req(8_000), &dec, &[&pre]);
        assert!(c.remote.unwrap() < c.local, "{c:?}");
    }

    #[test]
    fn a_short_suffix_after_a_long_cached_prefix_stays_local() {
        // 8,000-token prompt, the decode pod holds 7,984 tokens (499 blocks): a 16-token
        // suffix. The threshold decider at 16 disaggregates it; the prefill pod would have to
        // recompute all 8,000 tokens.
        let d = decider();
        let dec = running(1, 32.0, 499);
        let pre = running(2, 0.0, 0);
        assert!(!d.disaggregate(&req(8_000), &dec, &[&pre]));
        let threshold = super::super::decider::PrefixBasedPdDecider {
            non_cached_tokens: 16,
            prompt_tokens: 0,
        };
        assert!(threshold.disaggregate(&req(8_000), Some(&dec)));
    }

    #[test]
    fn a_queued_prefill_pool_keeps_the_prefill_local() {
        let d = decider();
        let dec = running(1, 32.0, 0);
        let mut pre = running(2, 0.0, 0);
        pre.prefill.pending_tokens = 400_000.0; // 25 s of prefill ahead at the seed rate
        assert!(!d.disaggregate(&req(8_000), &dec, &[&pre]));
        let idle = running(3, 0.0, 0);
        assert!(
            d.disaggregate(&req(8_000), &dec, &[&pre, &idle]),
            "the idle one is chosen"
        );
    }

    #[test]
    fn no_prefill_candidate_or_only_the_decode_pod_never_disaggregates() {
        let d = decider();
        let dec = running(1, 64.0, 0);
        assert!(!d.disaggregate(&req(8_000), &dec, &[]));
        assert!(!d.disaggregate(&req(8_000), &dec, &[&dec]));
    }

    #[test]
    fn slow_links_make_the_transfer_count() {
        let dec = running(1, 4.0, 0);
        let pre = running(2, 0.0, 0);
        let fast = decider();
        let slow = CostBasedPdDecider {
            kv_transfer_g_bps: 0.1,
            ..decider()
        };
        assert!(fast.disaggregate(&req(8_000), &dec, &[&pre]));
        assert!(!slow.disaggregate(&req(8_000), &dec, &[&pre]));
    }

    #[test]
    fn parameters_are_checked() {
        for yaml in [
            "{kvTransferGBps: 0}",
            "{interferenceWeight: -1}",
            "{kvBytesPerToken: .nan}",
        ] {
            let v: serde_norway::Value = serde_norway::from_str(yaml).unwrap();
            let p: CostBasedPdDecider = serde_norway::from_value(v).unwrap();
            assert!(p.validate().is_err(), "{yaml}");
        }
        let v: serde_norway::Value = serde_norway::from_str("{transferBandwidth: 1}").unwrap();
        assert!(serde_norway::from_value::<CostBasedPdDecider>(v).is_err());
    }
}

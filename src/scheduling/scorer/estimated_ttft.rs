//! `estimated-ttft-scorer` (epp): compare candidates in one unit, time. For each candidate it
//! estimates when this request's first token would arrive there and scores `best / estimate`,
//! so with `max-score-picker` (and no other scorer) the pick is the earliest first token.
//!
//! # The estimate
//! ```text
//! own     = prompt tokens − prefix the pod holds (approximate or precise index)
//! ahead   = uncached tokens epp sent there with no first token yet
//!         + (waiting requests epp did not send) × the pod's mean request size
//! ttft    = base + per_token · (ahead + own) + per_running · running + per_waiting · waiting
//! cost    = ttft + per_token · own · (evictionCostWeight · evicted
//!                                     + congestionCostWeight · queued
//!                                     + inFlightDelayWeight · (running + waiting))
//! evicted = max(kv_usage, share of own past the room the prefix index knows is left)
//! ```
//! The coefficients are the pod's own, learned online from what epp observed of its responses
//! (`datastore::ttft`: prompt size, cached tokens from `usage`, measured TTFT); a pod never
//! observed gets the seed built from this plugin's parameters (`peakPrefillThroughput`, llm-d's
//! name and default). The last term prices the other prefixes a full cache must evict to hold
//! `own` new tokens: they will be recomputed later, by someone. The congestion term prices what
//! `own` costs the others when the pool is busy: each second of prefill delays the requests that
//! queue behind it before the queue drains, about as many as are queued now (M/M/1's mean number
//! in system). `queued` is the pool's mean queue (waiting requests, scraped plus dispatched
//! since), not the destination's: the balancer spreads a delay over the pool, and a pod whose
//! queue is momentarily empty in a saturated pool is queued again by the next arrivals (priced
//! by its own queue, the term drove sessions off their homes to such pods: BENCHMARKS.md, #20).
//! Below capacity the mean is near 0 and the estimate alone decides. The term is off by default
//! (`congestionCostWeight: 0`): over capacity it did not keep sessions home in the agentic
//! benchmark (what moves them there is the prefix index forgetting them, see below), and at 80%
//! load it cost hit rate.
//!
//! The in-flight term prices what this request's prefill does to the sequences already on the
//! pod: a decoding sequence's next step waits for the prefill (chunked prefill lengthens the
//! steps it rides in by exactly its compute), and a waiting one starts that much later. So the
//! cost of a candidate is the total delay the choice causes, this request's and theirs. It is
//! what keeps a long prompt off a pod with many decodes (the long/short mix: TTFT alone sent it
//! to the pod with the least prefill ahead and stalled up to 40 decodes there, ITL p90 60–97 ms
//! against 32 ms for least request) and a popular prefix off a busy second pod (recomputing
//! 2,000 tokens where 10 sequences run costs them 10 × the recomputation). On by default
//! (`inFlightDelayWeight: 1`, every held-up sequence counted once).
//!
//! Past the approximate index's match cap (`maxPrefixTokensToMatch`) nothing is hashed, so
//! the pod holding every hashed block is credited with the part past the cap it was last
//! sent after the same blocks, up to this prompt's own length
//! ([`crate::prefix::Lookup::held_past_cap`]): a conversation growing past the cap stays a
//! hit at home rather than a prompt two thirds cold everywhere.
//!
//! # Home and spill (hysteresis)
//! The pod holding the longest prefix of a request is its home: there `own` is only the new
//! tokens, so both extra terms are small. Leaving home costs the recomputation now, in this
//! request's TTFT, plus its congestion and eviction price at the destination; a session (or a
//! popular prefix) therefore moves only when its home's queue costs more than all three. Where
//! it moves, the prefix index records it, so that pod becomes a second home and the next
//! requests of the same prefix choose between two homes at the price of their new tokens only.
//! A home lasts as long as the prefix index remembers it: with `autoTune` the approximate index
//! holds as many blocks per pod as the pod's cache, so over capacity it forgets sessions and
//! their next turns are placed as strangers (BENCHMARKS.md, #20, "homes").
//!
//! # Bounded load falls out of the unit
//! A request goes to the pod holding its prefix until that pod's queue costs more than
//! recomputing the prefix elsewhere: for a 16-token match behind 20 queued requests, the
//! idle pod wins; for an 8,000-token conversation behind one queued request, its home wins.
//! No weight trades a prefix ratio against a min-max queue score.
//!
//! # Relation to llm-d's plugins
//! - `token-load-scorer` scores `1 − in-flight tokens / threshold`: the `ahead` term alone, in
//!   tokens, without the request's own prefill or the pod's speed.
//! - `prefix-cache-affinity-filter` keeps the pods above a prefix-score threshold unless their
//!   TTFT, estimated as `in-flight tokens / peakPrefillThroughput`, exceeds the best other pod's
//!   by `maxTTFTPenaltyMs`: the same comparison, as a yes/no gate with one fleet-wide rate.
//! - `latency-scorer` scores headroom against the SLO from a trained predictor sidecar; here the
//!   predictor is this linear model, learned per pod in-process.
//!
//! # SLO
//! With `x-llm-d-slo-ttft-ms` (or `x-slo-ttft-ms`) on a sheddable request (priority < 0), the
//! scheduler rejects it (429) when no candidate's estimate meets the SLO and none is idle or
//! cold, as upstream's `latency-slo-admitter` does with its predictions. Other requests are
//! never rejected for their SLO; they go to the earliest first token.
//!
//! Cost: a few multiplications per candidate; no allocation beyond the score vector.

use crate::plugin::Invalid;
use crate::scheduling::{Candidate, SchedulingRequest};

/// Seconds per part of a request's wait on one endpoint (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TtftRates {
    pub base: f64,
    pub per_token: f64,
    pub per_running: f64,
    pub per_waiting: f64,
    /// Mean uncached prompt tokens per request at this endpoint (0: unknown).
    pub mean_tokens: f64,
}

/// What the estimate needs of an endpoint besides its metrics, filled by the director.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PrefillLoad {
    /// Uncached prompt tokens epp dispatched here that have no first token yet.
    pub pending_tokens: f64,
    /// How many requests those are.
    pub pending_requests: f64,
    /// The endpoint's learned rates; `None` until epp has observed it.
    pub learned: Option<TtftRates>,
    /// Requests waiting at the pod as the estimate counts them: the last scrape's plus those
    /// epp dispatched since that have no first token yet. `Candidate::waiting` also counts
    /// requests dispatched since the scrape that have already finished (right for the
    /// queue-scorer's upstream behaviour); priced here, each finished request of a session
    /// looked like a whole prompt queued at its home until the next scrape, and sequential
    /// turns left home. `None`: `Candidate::waiting`.
    pub queued: Option<f64>,
    /// Prompt tokens past the prefix index's match cap the pod is taken to hold
    /// ([`crate::prefix::Lookup::held_past_cap`]), server tokens.
    pub held_past_cap: f64,
    /// Tokens the pod's cache has room for before a prefix the index recorded there is
    /// evicted ([`crate::prefix::Lookup::free_tokens`]); `None`: nothing recorded there.
    pub cache_free_tokens: Option<f64>,
}

/// The terms of one candidate's estimate, as the director records them for learning.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TtftInputs {
    pub(crate) ahead_tokens: f64,
    pub(crate) own_tokens: f64,
    pub(crate) running: f64,
    pub waiting: f64,
}

#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct EstimatedTtftScorer {
    /// Seed prefill throughput of a pod, tokens/s (llm-d's `peakPrefillThroughput`).
    pub(crate) peak_prefill_throughput: f64,
    /// Seed fixed part of a TTFT (an engine step, the network), ms.
    pub(crate) base_latency_ms: f64,
    /// Seed cost of each sequence the pod is decoding, ms.
    pub(crate) decode_cost_ms: f64,
    /// Seed cost of each request waiting in the pod's queue beyond its tokens, ms.
    pub(crate) queued_request_cost_ms: f64,
    /// Weight of the recomputation a full cache's evictions cause (0 = this request only).
    pub(crate) eviction_cost_weight: f64,
    /// Weight of the delay this request's own prefill imposes on the requests queued behind it
    /// (0 = this request only; 1 = one queued request delayed per request queued now). Off by
    /// default: at 1 it kept no more sessions home over capacity and cost 9–12 points of hit
    /// rate at 80% load in the agentic benchmark (BENCHMARKS.md, #20).
    pub(crate) congestion_cost_weight: f64,
    /// Weight of the delay this request's own prefill imposes on the sequences already on the
    /// pod (running and waiting): each is held up for the whole prefill, its decode steps or its
    /// start (1 = every one counted in full; 0 = this request's TTFT only). Without it a long
    /// prompt went to the pod with the least prefill ahead however many sequences it stalled
    /// there, and a prefix spilled onto a busy pod (BENCHMARKS.md, #20, "settling the default").
    pub(crate) in_flight_delay_weight: f64,
    /// Use each pod's learned rates (false: the seed for every pod).
    pub(crate) learn: bool,
}

impl Default for EstimatedTtftScorer {
    fn default() -> Self {
        Self {
            peak_prefill_throughput: 15_928.0,
            base_latency_ms: 30.0,
            decode_cost_ms: 1.0,
            queued_request_cost_ms: 100.0,
            eviction_cost_weight: 0.25,
            congestion_cost_weight: 0.0,
            in_flight_delay_weight: 1.0,
            learn: true,
        }
    }
}

impl EstimatedTtftScorer {
    pub(crate) fn validate(self) -> Result<Self, Invalid> {
        let fields = [
            ("peakPrefillThroughput", self.peak_prefill_throughput, false),
            ("baseLatencyMs", self.base_latency_ms, true),
            ("decodeCostMs", self.decode_cost_ms, true),
            ("queuedRequestCostMs", self.queued_request_cost_ms, true),
            ("evictionCostWeight", self.eviction_cost_weight, true),
            ("congestionCostWeight", self.congestion_cost_weight, true),
            ("inFlightDelayWeight", self.in_flight_delay_weight, true),
        ];
        for (name, v, zero_ok) in fields {
            if !v.is_finite() || v < 0.0 || (v == 0.0 && !zero_ok) {
                return Err(Invalid::new(
                    name,
                    format!(
                        "{name} must be a finite number > 0 (≥ 0 unless it is a rate), got {v}"
                    ),
                ));
            }
        }
        Ok(self)
    }

    /// The rates of a pod never observed.
    pub(crate) fn seed(&self) -> TtftRates {
        TtftRates {
            base: self.base_latency_ms / 1e3,
            per_token: 1.0 / self.peak_prefill_throughput.max(1e-9),
            per_running: self.decode_cost_ms / 1e3,
            per_waiting: self.queued_request_cost_ms / 1e3,
            mean_tokens: 0.0,
        }
    }

    fn rates(&self, c: &Candidate) -> TtftRates {
        self.rates_with(c, Typical::SEED)
    }

    /// `c`'s learned rates; a pod not observed yet gets the seed scaled by `typical`, the pool's
    /// least slowness relative to the seed (the seed itself may be far off, so it is not used).
    fn rates_with(&self, c: &Candidate, typical: Typical) -> TtftRates {
        match c.prefill.learned {
            Some(l) if self.learn => l,
            _ => {
                let s = self.seed();
                TtftRates {
                    base: s.base * typical.step,
                    per_token: s.per_token * typical.token,
                    per_running: s.per_running * typical.step,
                    per_waiting: s.per_waiting * typical.step,
                    mean_tokens: 0.0,
                }
            }
        }
    }

    /// The learned pods' least slowness relative to the seed, per step and per token (1 when
    /// none has learned): a pod not observed yet is taken to be as fast as the fastest observed
    /// one. Not the median: with the median, the one or two pods observed first that learned a
    /// fast rate (one sample can: a request that waited behind a long prefill teaches a small
    /// per-token rate) looked faster than every pod not observed yet, and took every cold
    /// prompt, evicting what they held (BENCHMARKS.md, "Prompts past the match cap"). As fast
    /// as the best, an unobserved pod ties with it on time, and what else it costs decides; one
    /// response teaches it its own rates. Skipped when every candidate has learned.
    fn typical(&self, pool: &[&Candidate]) -> Typical {
        if !self.learn || pool.iter().all(|c| c.prefill.learned.is_some()) {
            return Typical::SEED;
        }
        let seed = self.seed();
        let least = |ratio: &dyn Fn(&TtftRates) -> f64| {
            pool.iter()
                .filter_map(|c| c.prefill.learned)
                .map(|l| ratio(&l))
                .filter(|v| v.is_finite() && *v > 0.0)
                .min_by(f64::total_cmp)
                .unwrap_or(1.0)
        };
        Typical {
            step: least(&|l| l.base / seed.base),
            token: least(&|l| l.per_token / seed.per_token),
        }
    }

    /// The terms of `c`'s estimate for `req`.
    pub(crate) fn inputs(&self, req: &SchedulingRequest<'_>, c: &Candidate) -> TtftInputs {
        let prompt = req.prompt_tokens as f64;
        let hashed = (c.prefix_blocks * req.block_size) as f64;
        let held = (hashed + c.prefill.held_past_cap.max(0.0)).min(prompt);
        let own = prompt - held;
        // A queued request epp did not send: the pod's mean, else as large as this whole prompt.
        let mean = Some(self.rates(c).mean_tokens)
            .filter(|m| *m > 0.0)
            .unwrap_or(prompt.max(1.0));
        let external = (waiting(c) - c.prefill.pending_requests).max(0.0);
        TtftInputs {
            ahead_tokens: c.prefill.pending_tokens.max(0.0) + external * mean,
            own_tokens: own,
            running: c.running.max(0.0),
            waiting: waiting(c),
        }
    }

    fn estimate_with(&self, req: &SchedulingRequest<'_>, c: &Candidate, typical: Typical) -> f64 {
        let r = self.rates_with(c, typical);
        let i = self.inputs(req, c);
        r.base
            + r.per_token * (i.ahead_tokens + i.own_tokens)
            + r.per_running * i.running
            + r.per_waiting * i.waiting
    }

    /// The estimate plus what the request's own prefill costs others there: the prefixes a full
    /// cache evicts to hold the new tokens, and the delay of the `queued` requests (the pool's
    /// mean queue) that wait behind it.
    fn cost(&self, req: &SchedulingRequest<'_>, c: &Candidate, pool: &Pool) -> f64 {
        let (typical, queued) = (pool.typical, pool.queued);
        let own = self.inputs(req, c).own_tokens;
        let prefill = self.rates_with(c, typical).per_token * own;
        let evicted = c
            .kv_usage
            .clamp(0.0, 1.0)
            .max(recorded_share(c, own) - pool.recorded_floor);
        let others = self.eviction_cost_weight * evicted
            + self.congestion_cost_weight * queued
            + self.in_flight_delay_weight * in_flight(c);
        let cost = self.estimate_with(req, c, typical) + prefill * others;
        if cost.is_finite() {
            cost.max(1e-6)
        } else {
            f64::MAX
        }
    }

    pub(crate) fn score(&self, req: &SchedulingRequest<'_>, pool: &[&Candidate], out: &mut [f64]) {
        let facts = Pool {
            typical: self.typical(pool),
            queued: mean_queue(pool),
            recorded_floor: if pool.iter().any(|c| c.prefill.cache_free_tokens.is_none()) {
                0.0
            } else {
                pool.iter()
                    .map(|c| recorded_share(c, self.inputs(req, c).own_tokens))
                    .fold(1.0, f64::min)
            },
        };
        for (o, c) in out.iter_mut().zip(pool) {
            *o = self.cost(req, c, &facts);
        }
        let best = out.iter().copied().fold(f64::INFINITY, f64::min);
        for o in out.iter_mut() {
            *o = best / *o;
        }
    }

    /// upstream's `latency-slo-admitter`: a sheddable request with a TTFT SLO is rejected when
    /// no candidate meets it and none is idle (nothing running or queued) or cold (KV < 2%).
    pub(crate) fn rejects(&self, req: &SchedulingRequest<'_>, pool: &[&Candidate]) -> bool {
        let Some(slo) = req.slo_ttft_s.filter(|_| req.sheddable) else {
            return false;
        };
        let typical = self.typical(pool);
        !pool.iter().any(|c| {
            self.estimate_with(req, c, typical) <= slo
                || (c.running <= 0.0 && waiting(c) <= 0.0)
                || c.kv_usage < 0.02
        })
    }
}

/// A pool's typical slowness relative to the seed: what a pod not observed yet is priced at.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Typical {
    step: f64,
    token: f64,
}

impl Typical {
    const SEED: Self = Self {
        step: 1.0,
        token: 1.0,
    };
}

/// What the whole pool shares in one request's costs.
struct Pool {
    typical: Typical,
    /// The pool's mean queue ([`mean_queue`]).
    queued: f64,
    /// The least [`recorded_share`] of any candidate: evicting is priced only past it.
    recorded_floor: f64,
}

/// The share of `own` new tokens past the room the prefix index knows is left on `c` after the
/// prefixes it recorded there: what they would evict (0 where nothing is recorded).
///
/// The eviction price takes the larger of the KV blocks in use (what a model server reports:
/// running sequences only) and this share beyond the pool's least. A model server's usage
/// misses a cache full of finished requests' prefixes: an idle pod holding a 100,000-token
/// prefix reports nearly 0, and looked free to the next group's cold prompt, which evicted it
/// (BENCHMARKS.md, "Prompts past the match cap"). Only past the pool's least, because where
/// every pod must evict as much, evicting decides nothing between them, and priced in full it
/// held every cache-bound pool's requests harder to busy homes (shared prefix on 16K-token
/// caches: throughput 12.0 against 14.0 req/s).
fn recorded_share(c: &Candidate, own: f64) -> f64 {
    match c.prefill.cache_free_tokens {
        Some(free) if own > 0.0 => ((own - free.max(0.0)) / own).clamp(0.0, 1.0),
        _ => 0.0,
    }
}

/// The sequences on `c` that this request's prefill holds up: those decoding and those waiting.
fn in_flight(c: &Candidate) -> f64 {
    c.running.max(0.0) + waiting(c)
}

/// The requests waiting at `c` ([`PrefillLoad::queued`]).
fn waiting(c: &Candidate) -> f64 {
    c.prefill.queued.unwrap_or(c.waiting).max(0.0)
}

/// The mean of the candidates' waiting requests (0 for an empty pool).
fn mean_queue(pool: &[&Candidate]) -> f64 {
    if pool.is_empty() {
        return 0.0;
    }
    pool.iter().map(|c| waiting(c)).sum::<f64>() / pool.len() as f64
}

#[cfg(test)]
mod tests;

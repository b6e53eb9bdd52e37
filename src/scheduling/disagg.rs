//! Disaggregated serving: llm-d's `disagg-profile-handler` (and the deprecated
//! `pd-profile-handler`) over several scheduling profiles.
//!
//! # What a request goes through
//! In `decode-first` order (the default): the decode profile picks the destination; then, if
//! an encode decider approves, the encode profile picks the encoders; then, if a prefill
//! decider approves, the prefill profile picks the prefill pod. In `prefill-first` order the
//! prefill profile runs first whenever it exists (no decider), then encode, then decode. The
//! decode pod is always the destination; its sidecar learns the others from request headers:
//! `x-prefiller-host-port` (`ip:port`) and `x-encoder-hosts-ports` (`ip:port,ip:port`). epp
//! owns these headers when a disaggregating handler is configured: a value the client sent is
//! removed (it would let a client point the sidecar anywhere).
//!
//! # Faults
//! A stage whose profile finds no endpoint (no prefill pods in the pool, every one filtered
//! out) does not fail the request: it is served decode-only, as upstream, and epp logs the
//! reason once until the stage works again. epp adds two rules: when every prefill candidate's
//! metrics are stale (epp cannot scrape it, so the sidecar most likely cannot reach it either),
//! prefill is skipped the same way; and a saturated prefill pod (the saturation detector's own
//! ratio ≥ 1, [`SchedulingRequest::saturated`]) is never chosen, so a pool saturated in prefill
//! but not in decode serves decode-only instead of queueing behind the prefill pods. All count
//! in `epp_disagg_prefill_skipped_total{reason}`. The reverse (decode saturated, prefill not)
//! is the destination's saturation: admission and flow control measure it over the endpoints
//! the decode profile keeps ([`Scheduler::keeps_labels`]).
//!
//! Cost: one profile run per stage that runs (at most three), each O(candidates × scorers).

pub(crate) mod cost;
mod decider;
pub(crate) mod p2p;
mod params;
pub(crate) mod session;

use super::{Candidate, Decision, ScheduleError, Scheduler, SchedulingRequest};
use crate::endpoint::EndpointId;
use crate::plugin::PluginKind;
use rand::Rng;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub(crate) use decider::{has_multimodal, Decider, PrefixBasedPdDecider};
pub(crate) use params::HandlerParams;

/// The prefill pod's `ip:port`, for the decode pod's sidecar.
pub(crate) const PREFILLER_HEADER: &str = "x-prefiller-host-port";
/// The encode pods' `ip:port` list, comma-separated.
pub(crate) const ENCODERS_HEADER: &str = "x-encoder-hosts-ports";
/// A peer to pull the cached prefix from (`p2p-source-producer`).
pub(crate) const KV_SOURCE_HEADER: &str = "x-kv-cache-source-host-port";

/// Execution order of the stages (upstream's `StageOrder`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StageOrder {
    DecodeFirst,
    PrefillFirst,
}

/// Which stages served a request (upstream's `decision_type` label values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum DisaggDecision {
    DecodeOnly,
    PrefillDecode,
    EncodeDecode,
    EncodePrefillDecode,
}

impl DisaggDecision {
    fn new(encode: bool, prefill: bool) -> Self {
        match (encode, prefill) {
            (true, true) => Self::EncodePrefillDecode,
            (true, false) => Self::EncodeDecode,
            (false, true) => Self::PrefillDecode,
            (false, false) => Self::DecodeOnly,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::DecodeOnly => "decode-only",
            Self::PrefillDecode => "prefill-decode",
            Self::EncodeDecode => "encode-decode",
            Self::EncodePrefillDecode => "encode-prefill-decode",
        }
    }
}

/// Why a prefill stage that should have run did not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum SkipReason {
    /// The prefill profile found no endpoint (none in the pool, or all filtered out).
    NoPrefillEndpoint,
    /// Every prefill candidate's metrics are stale: epp cannot reach them.
    PrefillEndpointsStale,
    /// Every fresh prefill candidate is saturated (the saturation detector's own ratio ≥ 1).
    PrefillEndpointsSaturated,
}

impl SkipReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::NoPrefillEndpoint => "no_prefill_endpoint",
            Self::PrefillEndpointsStale => "prefill_endpoints_stale",
            Self::PrefillEndpointsSaturated => "prefill_endpoints_saturated",
        }
    }
}

/// What the handler did with one request, for metrics and the sidecar headers.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct DisaggOutcome {
    /// The handler's instance name and type (metric labels).
    pub(crate) handler: Arc<str>,
    pub(crate) kind: PluginKind,
    pub(crate) decision: DisaggDecision,
    /// The prefill decider's verdict, when it was asked (`pd_decision_total`).
    pub(crate) prefill_approved: Option<bool>,
    pub(crate) prefill: Option<EndpointId>,
    pub(crate) encode: Vec<EndpointId>,
    pub(crate) skipped: Option<SkipReason>,
}

impl DisaggOutcome {
    /// The sidecar headers: each set to its value, or removed (`None`).
    pub(crate) fn headers(&self) -> Vec<(&'static str, Option<String>)> {
        let encoders = (!self.encode.is_empty()).then(|| {
            let all: Vec<String> = self.encode.iter().map(ToString::to_string).collect();
            all.join(",")
        });
        vec![
            (PREFILLER_HEADER, self.prefill.map(|p| p.to_string())),
            (ENCODERS_HEADER, encoders),
        ]
    }
}

/// An optional stage: its profile and the decider that gates it.
#[derive(Clone, Debug)]
pub(crate) struct Stage {
    /// The profile's name (`profileName` of the session-affinity plugins refers to it).
    pub(crate) name: String,
    pub(crate) profile: Scheduler,
    pub(crate) decider: Option<Decider>,
}

/// The disaggregating handler built from configuration.
#[derive(Clone, Debug)]
pub(crate) struct Disagg {
    pub(crate) name: Arc<str>,
    /// The decode profile's name.
    pub(crate) decode: String,
    pub(crate) kind: PluginKind,
    pub(crate) order: StageOrder,
    pub(crate) prefill: Option<Stage>,
    pub(crate) encode: Option<Stage>,
    /// A skipped prefill was logged and has not worked since (log once per outage).
    warned: Arc<AtomicBool>,
}

impl Disagg {
    pub(crate) fn new(name: &str, decode: &str, kind: PluginKind, order: StageOrder) -> Self {
        Self {
            name: name.into(),
            decode: decode.to_owned(),
            kind,
            order,
            prefill: None,
            encode: None,
            warned: Arc::default(),
        }
    }

    /// Whether a decider reads the prompt's length.
    pub(crate) fn reads_prompt_length(&self) -> bool {
        [&self.prefill, &self.encode]
            .into_iter()
            .flatten()
            .any(|s| s.decider.as_ref().is_some_and(Decider::reads_prompt_length))
    }

    /// Whether a decider reads multimodal content.
    pub(crate) fn reads_multimodal(&self) -> bool {
        [&self.prefill, &self.encode]
            .into_iter()
            .flatten()
            .any(|s| matches!(s.decider, Some(Decider::AlwaysMultimodal)))
    }

    /// The stages' profiles, for what the scheduler must know of all of them (labels).
    pub(crate) fn profiles(&self) -> impl Iterator<Item = &Scheduler> {
        [&self.prefill, &self.encode]
            .into_iter()
            .flatten()
            .map(|s| &s.profile)
    }

    /// Runs the stages for one request; `decode` is the decode profile.
    pub(crate) fn schedule(
        &self,
        decode: &Scheduler,
        req: &SchedulingRequest<'_>,
        candidates: &[Candidate],
        rng: &mut impl Rng,
    ) -> Result<Decision, ScheduleError> {
        let mut out = DisaggOutcome {
            handler: self.name.clone(),
            kind: self.kind,
            decision: DisaggDecision::DecodeOnly,
            prefill_approved: None,
            prefill: None,
            encode: Vec::new(),
            skipped: None,
        };
        let mut decision = match self.order {
            StageOrder::DecodeFirst => {
                let d = decode.schedule_profile(req, candidates, rng)?;
                let pick = candidates
                    .iter()
                    .find(|c| Some(&c.id) == d.endpoints.first());
                self.run_encode(req, pick, candidates, rng, &mut out);
                if let Some(stage) = &self.prefill {
                    // The prefill stage sees the decode pick as its peer (topology affinity).
                    let req = &SchedulingRequest { peer: pick, ..*req };
                    let pool = stage.profile.filter_pool(req, candidates, rng);
                    let approved = stage
                        .decider
                        .as_ref()
                        .is_some_and(|dec| dec.disaggregate(req, pick, &pool));
                    out.prefill_approved = stage.decider.as_ref().map(|_| approved);
                    if approved {
                        self.run_prefill(stage, req, pool, rng, &mut out);
                    }
                }
                d
            }
            StageOrder::PrefillFirst => {
                if let Some(stage) = &self.prefill {
                    let pool = stage.profile.filter_pool(req, candidates, rng);
                    self.run_prefill(stage, req, pool, rng, &mut out);
                }
                self.run_encode(req, None, candidates, rng, &mut out);
                // The decode stage sees the prefill pick as its peer (topology affinity).
                let peer = out
                    .prefill
                    .and_then(|p| candidates.iter().find(|c| c.id == p));
                decode.schedule_profile(&SchedulingRequest { peer, ..*req }, candidates, rng)?
            }
        };
        out.decision = DisaggDecision::new(!out.encode.is_empty(), out.prefill.is_some());
        decision.disagg = Some(out);
        Ok(decision)
    }

    fn run_encode(
        &self,
        req: &SchedulingRequest<'_>,
        pick: Option<&Candidate>,
        candidates: &[Candidate],
        rng: &mut impl Rng,
        out: &mut DisaggOutcome,
    ) {
        let Some(stage) = &self.encode else { return };
        let approved = stage
            .decider
            .as_ref()
            .is_some_and(|d| d.disaggregate(req, pick, &[]));
        if approved {
            if let Ok(d) = stage.profile.schedule_profile(req, candidates, rng) {
                out.encode = d.endpoints;
            }
        }
    }

    /// Picks the prefill pod from `pool` (the prefill profile's filtered candidates) less the
    /// saturated ones; a pool that is empty, wholly stale or wholly saturated skips the stage,
    /// logged once per outage.
    fn run_prefill(
        &self,
        stage: &Stage,
        req: &SchedulingRequest<'_>,
        pool: Vec<&Candidate>,
        rng: &mut impl Rng,
        out: &mut DisaggOutcome,
    ) {
        let (pool, skip) = usable_prefill(req, pool);
        let picked = match skip {
            None => stage.profile.finish(req, pool, rng).ok(),
            Some(_) => None,
        };
        match picked.and_then(|d| d.endpoints.first().copied()) {
            Some(p) => {
                out.prefill = Some(p);
                self.warned.store(false, Ordering::Relaxed);
            }
            None => {
                let reason = skip.unwrap_or(SkipReason::NoPrefillEndpoint);
                out.skipped = Some(reason);
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        handler = %self.name,
                        reason = reason.as_str(),
                        "prefill stage skipped: serving decode-only until a prefill endpoint is available"
                    );
                }
            }
        }
    }
}

/// The prefill candidates a prefill may go to: the fresh ones that are not saturated (a stale
/// one counts as saturated, as in the detector). `Some` reason when there is none.
fn usable_prefill<'c>(
    req: &SchedulingRequest<'_>,
    pool: Vec<&'c Candidate>,
) -> (Vec<&'c Candidate>, Option<SkipReason>) {
    if pool.is_empty() {
        return (pool, Some(SkipReason::NoPrefillEndpoint));
    }
    if !pool.iter().any(|c| c.fresh) {
        return (pool, Some(SkipReason::PrefillEndpointsStale));
    }
    let open: Vec<&Candidate> = pool
        .into_iter()
        .filter(|c| c.fresh && !req.saturated.contains(&c.id))
        .collect();
    let skip = open
        .is_empty()
        .then_some(SkipReason::PrefillEndpointsSaturated);
    (open, skip)
}

#[cfg(test)]
mod tests;

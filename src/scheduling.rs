//! The scheduler: filters → weighted scorers → picker, pure and synchronous.
//!
//! # Algorithm
//! 1. Filters run in order; an empty result is [`ScheduleError::AllFiltered`] (HTTP 429).
//! 2. Staleness gate: of the survivors, endpoints whose metrics are stale (or never scraped) are
//!    dropped when at least one is fresh, so a pod that stopped reporting is a last resort and
//!    never a silent favourite (an idle-looking stale pod would otherwise win every comparison).
//!    Then slow start thins warming endpoints, and with an `estimated-ttft-scorer` a sheddable
//!    request whose TTFT SLO no survivor can meet is [`ScheduleError::SloUnattainable`] (429).
//! 3. Each scorer yields a score per endpoint, clamped to [0, 1] (NaN → 0) and multiplied by its
//!    weight; the weighted scores are summed (not divided by the total weight, as upstream; the
//!    ranking is the same).
//! 4. The picker chooses `maxNumOfEndpoints` endpoints in rank order.
//!
//! Cost: O(endpoints × scorers) plus a sort; no allocation proportional to the prompt. Nothing
//! here mutates shared state or knows about tokio: randomness comes in as an `Rng`, the prefix
//! match lengths come in on each [`Candidate`], and the director records the decision afterwards.

pub(crate) mod data_parallel;
pub(crate) mod disagg;
pub(crate) mod filter;
pub(crate) mod gather;
pub(crate) mod header_profile;
mod index;
pub(crate) mod inflight_load;
pub(crate) mod lifecycle;
pub(crate) mod picker;
pub(crate) mod producer;
mod profile;
pub mod scorer;
pub(crate) mod topology;

use crate::endpoint::{EndpointId, EndpointMetrics};
use filter::Filter;
use picker::Picker;
use rand::Rng;
use scorer::{PrefixParams, Scorer};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

pub(crate) use profile::{assemble, BuildError, Plugin, Profile};

/// One endpoint as the scheduler sees it for one request: a value snapshot.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub id: EndpointId,
    pub weight: u32,
    pub metrics: Option<Arc<EndpointMetrics>>,
    /// Queue depth: last scrape plus what epp dispatched since.
    pub waiting: f64,
    /// Running requests: last scrape, or epp's own in-flight count if that is larger.
    pub running: f64,
    /// Requests epp routed here that have not finished (llm-d's `InFlightLoad.Requests`).
    pub inflight: f64,
    /// The endpoint's labels (pod labels), for the label filters and `context-length-aware`;
    /// empty unless the configuration reads them ([`Scheduler::reads_labels`]).
    pub labels: Arc<BTreeMap<String, String>>,
    pub kv_usage: f64,
    /// Whether the metrics are younger than the staleness threshold.
    pub fresh: bool,
    /// Consecutive leading prompt blocks this endpoint is believed to hold.
    pub prefix_blocks: usize,
    /// Observed latency (peak-EWMA TTFT / TPOT), for the latency scorer; `None` if unknown.
    pub latency: Option<scorer::LatencyEstimate>,
    /// Slow-start share in (0, 1]: a cold or just-restored endpoint takes part in a request's
    /// selection with probability `ramp / max ramp` (1 = full share).
    pub ramp: f64,
    /// Prefill work epp sent here and the endpoint's learned TTFT rates, for the
    /// `estimated-ttft-scorer`.
    pub prefill: scorer::PrefillLoad,
}

/// What the scheduler needs to know about the request.
#[derive(Clone, Copy, Debug)]
pub struct SchedulingRequest<'a> {
    /// The model after rewrites; also the LoRA adapter name when it is one.
    pub target_model: &'a str,
    /// Full prompt blocks considered by the prefix index.
    pub prefix_total_blocks: usize,
    pub block_size: usize,
    /// The `test-epp-endpoint-selection` header, for the conformance filter.
    pub test_endpoint_selection: Option<&'a str>,
    /// The `x-session-token` header as the client sent it (opaque; hashed by the
    /// consistent-hash picker).
    pub session_token: Option<&'a str>,
    /// The endpoint the session token names, resolved by the director against the snapshot
    /// (`None` when there is no token, it does not decode, or that endpoint is gone).
    pub session_endpoint: Option<EndpointId>,
    /// Key for hash-based affinity: a hash of the session token when present, else the first
    /// prompt block hash (`None` when neither exists, e.g. a prompt shorter than one block).
    pub affinity_key: Option<u64>,
    /// Prompt tokens, as far as the prefix lookup tokenized them; without a lookup, estimated
    /// at four bytes a token (llm-d's `estimate` token producer).
    pub prompt_tokens: usize,
    /// The request's TTFT SLO (`x-llm-d-slo-ttft-ms`), seconds.
    pub slo_ttft_s: Option<f64>,
    /// Priority below 0: the request may be rejected to protect the others.
    pub sheddable: bool,
    /// The body carries image, audio or video content (`always-disagg-multimodal-decider`);
    /// filled only when such a decider is configured.
    pub multimodal: bool,
    /// The body's multimodal items (`mm-embeddings-cache-*`); filled only when a scorer reads
    /// them.
    pub multimodal_items: &'a [crate::request::multimodal::Item],
    /// Endpoints the saturation detector counts as saturated (their own ratio ≥ 1), filled by
    /// the director only when a disaggregating handler has a prefill stage: a prefill is never
    /// sent to one of them ([`disagg`]).
    pub saturated: &'a [EndpointId],
    /// The request headers the configured plugins read ([`lifecycle::Lifecycle::headers`]).
    pub headers: &'a lifecycle::Headers,
    /// Endpoint names (a session token names a pod) resolved against the request's snapshot.
    pub names: &'a dyn lifecycle::EndpointNames,
    /// When the decision is taken (the clock the director was given).
    pub now: Instant,
    /// Where the gathering plugins' windows placed this request ([`gather`]), one per
    /// instance that placed it; read by the scorer bound to that instance.
    pub gathered: &'a [gather::Placement],
    /// The endpoint an earlier stage of this request picked (upstream's `peer-endpoint`): the
    /// decode pick while a decode-first handler's prefill stage runs, the prefill pick while
    /// the decode stage runs after it; `None` otherwise. The topology plugins compare with it.
    pub peer: Option<&'a Candidate>,
}

impl Default for SchedulingRequest<'_> {
    fn default() -> Self {
        Self {
            target_model: "",
            prefix_total_blocks: 0,
            block_size: 0,
            test_endpoint_selection: None,
            session_token: None,
            session_endpoint: None,
            affinity_key: None,
            prompt_tokens: 0,
            slo_ttft_s: None,
            sheddable: false,
            multimodal: false,
            multimodal_items: &[],
            saturated: &[],
            headers: &lifecycle::NO_HEADERS,
            names: &lifecycle::Addresses,
            now: Instant::now(),
            gathered: &[],
            peer: None,
        }
    }
}

impl SchedulingRequest<'_> {
    /// This request's prompt tokens `c` does not hold (llm-d's `UncachedRequestTokens`):
    /// `(total − matched) · blockSize + (prompt − total · blockSize)`, which is the prompt less
    /// the matched blocks since the prefix index hashes full blocks only.
    pub fn uncached_tokens(&self, c: &Candidate) -> f64 {
        let prompt = self.prompt_tokens as f64;
        prompt - ((c.prefix_blocks * self.block_size) as f64).min(prompt)
    }
}

/// The chosen endpoints in rank order (first is primary), with every candidate's total score.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub endpoints: Vec<EndpointId>,
    pub(crate) scores: Vec<(EndpointId, f64)>,
    /// What a disaggregating profile handler did (`None` with a single profile).
    pub(crate) disagg: Option<disagg::DisaggOutcome>,
    /// Request headers for the destination's sidecar: set to the value, or removed (`None`).
    pub(crate) headers: Vec<(&'static str, Option<String>)>,
    /// The port the request is sent to on the picked endpoints' address, when a profile
    /// handler says (`data-parallel-profile-handler`); `None`: the endpoints' own.
    pub port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("no candidate endpoints")]
    NoCandidates,
    #[error("failed to find target endpoint: every candidate was filtered out")]
    AllFiltered,
    /// A sheddable request's TTFT SLO no candidate can meet (upstream's `latency-slo-admitter`).
    #[error("no endpoint can meet the request's TTFT SLO")]
    SloUnattainable,
    /// `header-profile-handler` found no profile to run (the reason: [`header_profile`]).
    #[error("failed to run any scheduler profile: {0}")]
    NoProfile(String),
}

/// One scheduling profile, built from configuration.
#[derive(Clone, Debug)]
pub struct Scheduler {
    filters: Vec<Filter>,
    scorers: Vec<(Scorer, f64)>,
    picker: Picker,
    prefix: Option<PrefixParams>,
    /// `precise-prefix-cache-producer` when no scorer scores its matches: its consumers (the
    /// prefix-cache affinity filter, the no-hit LRU, the deciders) still read the precise index.
    precise: Option<Box<scorer::PrecisePrefixParams>>,
    /// The disaggregating profile handler, whose decode profile is this one.
    disagg: Option<Box<disagg::Disagg>>,
    /// `p2p-source-producer`: names a peer to pull the cached prefix from.
    p2p: Option<disagg::p2p::P2pSourceProducer>,
    /// `header-profile-handler` with several profiles: each request runs the one its header
    /// names, and this profile (the default one) only answers the configuration's questions.
    by_header: Option<Box<header_profile::HeaderProfiles>>,
    /// `data-parallel-profile-handler`: the pick sent to the primary port.
    data_parallel: Option<data_parallel::DataParallel>,
    /// The plugins taking part in the request lifecycle, once per configured instance
    /// (filled when the scheduler is assembled: [`Scheduler::attach_hooks`]).
    hooks: Vec<Arc<dyn lifecycle::Lifecycle>>,
    /// The request headers they read.
    headers: Vec<Arc<str>>,
}

impl Scheduler {
    /// Runs one scheduling cycle: this profile, or every stage of the disaggregating handler.
    pub fn schedule(
        &self,
        req: &SchedulingRequest<'_>,
        candidates: &[Candidate],
        rng: &mut impl Rng,
    ) -> Result<Decision, ScheduleError> {
        if let Some(dp) = &self.data_parallel {
            dp.admits()?;
        }
        let mut d = match (&self.disagg, &self.by_header) {
            (Some(d), _) => d.schedule(self, req, candidates, rng)?,
            (None, Some(h)) => h.schedule(req, candidates, rng)?,
            (None, None) => self.schedule_profile(req, candidates, rng)?,
        };
        d.headers = d.disagg.as_ref().map(|o| o.headers()).unwrap_or_default();
        let computing = d.disagg.as_ref().and_then(|o| o.prefill);
        if let (Some(p), Some(c)) = (&self.p2p, computing.or(d.endpoints.first().copied())) {
            d.headers.push(p.header(req, candidates, c, rng));
        }
        if let Some(dp) = &self.data_parallel {
            dp.redirect(&mut d);
        }
        Ok(d)
    }

    /// Runs this profile alone.
    fn schedule_profile(
        &self,
        req: &SchedulingRequest<'_>,
        candidates: &[Candidate],
        rng: &mut impl Rng,
    ) -> Result<Decision, ScheduleError> {
        if candidates.is_empty() {
            return Err(ScheduleError::NoCandidates);
        }
        let pool = self.filter_pool(req, candidates, rng);
        if pool.is_empty() {
            return Err(ScheduleError::AllFiltered);
        }
        self.finish(req, pool, rng)
    }

    /// The candidates this profile's filters keep (empty when one drains the pool).
    fn filter_pool<'c>(
        &self,
        req: &SchedulingRequest<'_>,
        candidates: &'c [Candidate],
        rng: &mut impl Rng,
    ) -> Vec<&'c Candidate> {
        let mut pool: Vec<&Candidate> = candidates.iter().collect();
        for f in &self.filters {
            pool = f.filter(req, pool, rng);
            if pool.is_empty() {
                break;
            }
        }
        pool
    }

    /// Staleness gate, slow start, SLO check, scores and the pick, over a filtered pool.
    fn finish(
        &self,
        req: &SchedulingRequest<'_>,
        mut pool: Vec<&Candidate>,
        rng: &mut impl Rng,
    ) -> Result<Decision, ScheduleError> {
        if pool.iter().any(|c| c.fresh) {
            pool.retain(|c| c.fresh);
        }
        slow_start(&mut pool, rng);
        if self.estimated_ttft().is_some_and(|s| s.rejects(req, &pool)) {
            return Err(ScheduleError::SloUnattainable);
        }
        let totals = self.score(req, &pool, rng);
        let scored: Vec<(&Candidate, f64)> = pool.into_iter().zip(totals).collect();
        let endpoints = self.picker.pick(req, &scored, rng);
        let scores = scored.iter().map(|(c, s)| (c.id, *s)).collect();
        Ok(Decision {
            endpoints,
            scores,
            disagg: None,
            headers: Vec::new(),
            port: None,
        })
    }

    /// The disaggregating handler, when one is configured.
    pub(crate) fn disagg(&self) -> Option<&disagg::Disagg> {
        self.disagg.as_deref()
    }

    /// The other profiles a request may run: the disaggregating handler's stages, or the
    /// profiles `header-profile-handler` chooses from.
    fn stages(&self) -> impl Iterator<Item = &Scheduler> {
        let disagg = self.disagg.iter().flat_map(|d| d.profiles());
        disagg.chain(self.by_header.iter().flat_map(|h| h.schedulers()))
    }

    fn score(
        &self,
        req: &SchedulingRequest<'_>,
        pool: &[&Candidate],
        rng: &mut impl Rng,
    ) -> Vec<f64> {
        let mut totals = vec![0.0; pool.len()];
        let mut buf = vec![0.0; pool.len()];
        for (scorer, weight) in &self.scorers {
            scorer.score(req, pool, &mut buf, rng);
            for (t, s) in totals.iter_mut().zip(&buf) {
                let s = if s.is_nan() { 0.0 } else { s.clamp(0.0, 1.0) };
                *t += s * weight;
            }
        }
        totals
    }

    /// Prefix-hashing parameters, when a prefix scorer (or the approximate prefix producer) is
    /// configured; without one the director skips tokenization entirely.
    pub(crate) fn prefix_params(&self) -> Option<&PrefixParams> {
        self.prefix.as_ref()
    }

    /// Parameters of the precise prefix scorer, when one is configured: the director then fills
    /// the candidates' prefix matches from the KV-event index instead of the approximate one.
    pub fn precise_params(&self) -> Option<&scorer::PrecisePrefixParams> {
        let by_header = self.by_header.iter().flat_map(|h| h.schedulers());
        std::iter::once(self)
            .chain(by_header)
            .flat_map(|p| p.scorers.iter())
            .find_map(|(s, _)| s.precise_params())
            .or(self.precise.as_deref())
    }

    /// What a request faced on candidate `c` at dispatch (its own prefill, the work ahead),
    /// as the configured TTFT model counts it (upstream's defaults without one).
    pub(crate) fn ttft_inputs(
        &self,
        req: &SchedulingRequest<'_>,
        c: &Candidate,
    ) -> scorer::TtftInputs {
        match self.estimated_ttft() {
            Some(s) => s.inputs(req, c),
            None => scorer::EstimatedTtftScorer::default().inputs(req, c),
        }
    }

    /// The TTFT rates learning starts from: the configured TTFT model's seed, or the defaults.
    pub(crate) fn ttft_seed(&self) -> scorer::TtftRates {
        match self.estimated_ttft() {
            Some(s) => s.seed(),
            None => scorer::EstimatedTtftScorer::default().seed(),
        }
    }

    /// Whether a scorer prices the room left in each pod's cache (eviction): the director
    /// then asks the prefix index for it.
    pub(crate) fn prices_cache_room(&self) -> bool {
        self.estimated_ttft().is_some()
    }

    /// Whether a scorer reads the body's multimodal items.
    pub(crate) fn reads_multimodal_items(&self) -> bool {
        self.scorers.iter().any(|(s, _)| s.reads_multimodal_items())
            || self.stages().any(Scheduler::reads_multimodal_items)
    }

    /// Whether a decider reads whether the body carries multimodal content.
    pub(crate) fn reads_multimodal(&self) -> bool {
        self.disagg().is_some_and(|d| d.reads_multimodal())
    }

    /// The `estimated-ttft-scorer`, when one is configured (its seed rates prime learning).
    pub(crate) fn estimated_ttft(&self) -> Option<&scorer::EstimatedTtftScorer> {
        self.scorers.iter().find_map(|(s, _)| match s {
            scorer::Scorer::EstimatedTtft(s) => Some(s),
            _ => None,
        })
    }

    /// The session-affinity plugins' parameters (scorer and filter), in configuration order.
    #[cfg(test)]
    fn session_params(&self) -> impl Iterator<Item = &scorer::SessionAffinityParams> {
        let scorers = self.scorers.iter().filter_map(|(s, _)| match s {
            scorer::Scorer::SessionAffinity(s) => Some(&s.params),
            _ => None,
        });
        let filters = self.filters.iter().filter_map(|f| match f {
            Filter::SessionAffinity(f) => Some(&f.params),
            _ => None,
        });
        scorers.chain(filters)
    }

    /// [`Self::session_params`], writable (the builder resolves `profileName`).
    fn session_params_mut(&mut self) -> impl Iterator<Item = &mut scorer::SessionAffinityParams> {
        let scorers = self.scorers.iter_mut().filter_map(|(s, _)| match s {
            scorer::Scorer::SessionAffinity(s) => Some(&mut s.params),
            _ => None,
        });
        let filters = self.filters.iter_mut().filter_map(|f| match f {
            Filter::SessionAffinity(f) => Some(&mut f.params),
            _ => None,
        });
        scorers.chain(filters)
    }

    /// The session-affinity instances pinning the primary (decode) pick.
    #[cfg(test)]
    fn primary_session_params(&self) -> impl Iterator<Item = &scorer::SessionAffinityParams> {
        self.session_params()
            .filter(|p| p.pins == scorer::Pin::Primary)
    }

    /// Whether a session-affinity plugin with the `encoded_endpoint_header` strategy is
    /// configured: responses then carry the token.
    #[cfg(test)]
    pub(crate) fn session_affinity(&self) -> bool {
        self.primary_session_params()
            .any(|p| p.session_id().is_none())
    }

    /// The `session_id` strategy's configuration, when a session-affinity plugin uses it.
    #[cfg(test)]
    pub(crate) fn session_id(&self) -> Option<&scorer::SessionIdConfig> {
        self.primary_session_params().find_map(|p| p.session_id())
    }

    /// Whether a `no-hit-lru-scorer` is configured.
    fn has_no_hit_lru(&self) -> bool {
        self.scorers
            .iter()
            .any(|(s, _)| matches!(s, scorer::Scorer::NoHitLru(_)))
    }

    /// The request headers the lifecycle plugins read: the adapter captures these.
    pub(crate) fn request_headers(&self) -> &[Arc<str>] {
        &self.headers
    }

    /// Runs `pre_request` of every lifecycle plugin, then collects the headers the response
    /// carries for this decision (one per name, the first plugin's).
    pub(crate) fn pre_request(&self, placed: &lifecycle::Placed<'_>) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for hook in &self.hooks {
            hook.pre_request(placed);
            hook.response_headers(placed, &mut out);
        }
        if out.len() > 1 {
            let mut seen = std::collections::HashSet::new();
            out.retain(|(name, _)| seen.insert(name.clone()));
        }
        out
    }

    /// Whether a lifecycle plugin holds requests to place them jointly ([`gather`]).
    pub(crate) fn gathers(&self) -> bool {
        self.hooks.iter().any(|h| h.gathers())
    }

    /// Joins the request to every gathering plugin's window: the seats it holds (a plugin
    /// that cannot seat it is logged and skipped: the request goes on without its affinity).
    pub(crate) fn gather(&self, g: &gather::Gathering<'_>) -> Vec<gather::Seat> {
        let mut seats = Vec::new();
        for hook in self.hooks.iter().filter(|h| h.gathers()) {
            match hook.gather(g) {
                Ok(Some(seat)) => seats.push(seat),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "a gathering plugin did not seat the request; it goes on without that plugin's affinity")
                }
            }
        }
        seats
    }

    /// Runs `first_token` of every lifecycle plugin.
    pub(crate) fn first_token(&self, first: &lifecycle::FirstToken) {
        for hook in &self.hooks {
            hook.first_token(first);
        }
    }

    /// Whether a lifecycle plugin screens the candidates before the profiles run.
    pub(crate) fn screens(&self) -> bool {
        self.hooks.iter().any(|h| h.screens())
    }

    /// Runs every screening plugin over the candidates, in configuration order (upstream's
    /// `runScreeners`); an empty result means no endpoint may serve the request.
    pub(crate) fn screen(
        &self,
        screening: &lifecycle::Screening<'_>,
        candidates: &mut Vec<Candidate>,
    ) {
        for hook in self.hooks.iter().filter(|h| h.screens()) {
            if candidates.is_empty() {
                return;
            }
            hook.screen(screening, candidates);
        }
    }

    /// The dynamic metadata every lifecycle plugin adds at the response's end.
    pub(crate) fn response_metadata(&self, usage: &lifecycle::Usage) -> lifecycle::Metadata {
        let mut out = lifecycle::Metadata::new();
        for hook in &self.hooks {
            hook.response_metadata(usage, &mut out);
        }
        out
    }

    /// Runs `response_complete` of every lifecycle plugin.
    pub(crate) fn response_complete(&self, done: &lifecycle::Completed<'_>) {
        for hook in &self.hooks {
            hook.response_complete(done);
        }
    }

    /// What the lifecycle plugins hold, for `/debug/snapshot`.
    pub(crate) fn plugin_state(&self) -> Vec<serde_json::Value> {
        self.hooks.iter().filter_map(|h| h.snapshot()).collect()
    }

    /// Collects the lifecycle plugins of every profile (the disaggregating handler's stages
    /// too), once per instance, and the headers they read. Called once the profiles are
    /// assembled and pinned.
    fn attach_hooks(&mut self, producers: Vec<Arc<dyn lifecycle::Lifecycle>>) {
        let mut hooks = producers;
        for profile in std::iter::once(&*self).chain(self.stages()) {
            let filters = profile.filters.iter().filter_map(Filter::lifecycle);
            let scorers = profile.scorers.iter().filter_map(|(s, _)| s.lifecycle());
            for hook in filters.chain(scorers) {
                if hooks.iter().all(|h| h.instance() != hook.instance()) {
                    hooks.push(hook);
                }
            }
        }
        let mut headers: Vec<Arc<str>> = Vec::new();
        let handler = self.by_header.iter().map(|h| h.params.header_name.as_str());
        for h in hooks.iter().flat_map(|h| h.headers()).chain(handler) {
            if !headers.iter().any(|k| &**k == h) {
                headers.push(Arc::from(h));
            }
        }
        self.hooks = hooks;
        self.headers = headers;
    }

    /// Whether a plugin reads the prompt's length (`token-load-scorer`, `context-length-aware`):
    /// the decision then waits for the whole body, whose length upstream counts.
    pub(crate) fn reads_prompt_length(&self) -> bool {
        self.scorers.iter().any(|(s, _)| {
            matches!(
                s,
                scorer::Scorer::TokenLoad(_) | scorer::Scorer::ContextLength(_)
            )
        }) || self
            .disagg
            .as_ref()
            .is_some_and(|d| d.reads_prompt_length())
            || self
                .by_header
                .iter()
                .flat_map(|h| h.schedulers())
                .any(Scheduler::reads_prompt_length)
    }

    /// Whether a filter or scorer reads the endpoints' labels (the director then copies them
    /// onto the candidates).
    pub(crate) fn reads_labels(&self) -> bool {
        self.filters.iter().any(Filter::reads_labels)
            || self.scorers.iter().any(|(s, _)| s.reads_labels())
            || self.screens()
            || self.stages().any(Scheduler::reads_labels)
    }

    /// Whether an endpoint with `labels` passes this profile's label filters (`decode-filter`
    /// and the other role filters, `by-label`, `label-selector-filter`). With a disaggregating
    /// handler this profile is the decode profile, and these are the endpoints a request can be
    /// routed to: the ones whose saturation admission and flow control weigh.
    pub(crate) fn keeps_labels(&self, labels: &BTreeMap<String, String>) -> bool {
        self.filters
            .iter()
            .all(|f| f.keeps_labels(labels).unwrap_or(true))
    }

    /// Whether a request can be routed to an endpoint with `labels`: with a disaggregating
    /// handler, those its decode profile's label filters keep (a prefill or encode pod is never
    /// the destination); with one profile, every endpoint (upstream).
    pub(crate) fn is_destination(&self, labels: &BTreeMap<String, String>) -> bool {
        self.disagg.is_none() || self.keeps_labels(labels)
    }

    /// Whether a stage reads which endpoints are saturated ([`SchedulingRequest::saturated`]):
    /// a prefill stage never sends a prefill to one.
    pub(crate) fn reads_saturated(&self) -> bool {
        self.disagg().is_some_and(|d| d.prefill.is_some())
    }

    /// Number of endpoints the picker returns (`maxNumOfEndpoints`).
    #[cfg(test)]
    pub(crate) fn max_endpoints(&self) -> usize {
        self.picker.max_endpoints()
    }
}

/// Slow start: each warming candidate stays in this request's pool with probability
/// `ramp / max ramp`, so its expected share is its ramp whatever the picker; if that would
/// leave no one, the pool is left as it was.
fn slow_start(pool: &mut Vec<&Candidate>, rng: &mut impl Rng) {
    let top = pool.iter().map(|c| c.ramp).fold(0.0, f64::max);
    if top <= 0.0 || pool.iter().all(|c| c.ramp >= top) {
        return;
    }
    let kept: Vec<&Candidate> = pool
        .iter()
        .copied()
        .filter(|c| c.ramp >= top || rng.random::<f64>() * top < c.ramp)
        .collect();
    if !kept.is_empty() {
        *pool = kept;
    }
}

/// The scheduler of a parsed document, as `crate::config` decodes it: the tests' way in
/// (production code builds it through `crate::config`, which calls [`assemble`]).
#[cfg(test)]
pub(crate) fn build_with(
    cfg: &crate::config::EndpointPickerConfig,
    load: crate::config::LoadOptions,
) -> Result<Scheduler, Vec<crate::config::Problem>> {
    crate::config::scheduler(cfg, load)
}

/// [`build_with`] with the default load options.
#[cfg(test)]
pub(crate) fn build(
    cfg: &crate::config::EndpointPickerConfig,
) -> Result<Scheduler, Vec<crate::config::Problem>> {
    build_with(cfg, crate::config::LoadOptions::default())
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A fresh candidate on port `port` with the given queue, KV usage and prefix match.
    pub(crate) fn cand(port: u16, waiting: f64, kv: f64, prefix_blocks: usize) -> Candidate {
        Candidate {
            id: format!("10.0.0.1:{port}").parse().unwrap(),
            weight: 1,
            metrics: None,
            waiting,
            running: 0.0,
            inflight: 0.0,
            labels: Arc::default(),
            kv_usage: kv,
            fresh: true,
            prefix_blocks,
            latency: None,
            ramp: 1.0,
            prefill: scorer::PrefillLoad::default(),
        }
    }

    /// A candidate on `port` with the given labels.
    pub(crate) fn labelled(port: u16, labels: &[(&str, &str)]) -> Candidate {
        Candidate {
            labels: Arc::new(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..cand(port, 0.0, 0.0, 0)
        }
    }

    /// A fresh scrape with the given queue, running count and KV usage.
    pub(crate) fn metrics(waiting: f64, running: f64, kv_usage: f64) -> Arc<EndpointMetrics> {
        crate::fixtures::metrics()
            .waiting(waiting)
            .running(running)
            .kv_usage(kv_usage)
            .arc()
    }
}

#[cfg(test)]
mod tests;

//! The routing steps of [`Director::route`]: candidates and admission (`candidates.rs`), the
//! prefix lookup, scheduling, and recording the decision (`record.rs`: prefix index, no-hit
//! LRU, session binding, in-flight lease).

use super::candidates::screen;
use super::exchange::{Body, DirectorError, Incoming, Routed};
use super::{prompt_cap, Director, Runtime};
use crate::datastore::objectives::Priority;
use crate::datastore::{EndpointState, PrefillGuard};
use crate::endpoint::EndpointId;
use crate::metrics::{ModelLabels, RequestLabels};
use crate::prefix::source::{Lookup, Pod, Pods, PrefixSource, Query, Source};
use crate::request::{self, LlmRequest, Prompt};
use crate::scheduling::gather::{Placement, Seat};
use crate::scheduling::lifecycle::{EndpointNames, Placed};
use crate::scheduling::{self, Candidate, ScheduleError, Scheduler, SchedulingRequest};
use rand::Rng;
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

/// A parsed request's part of the decision.
struct Prompted<'a> {
    request: &'a LlmRequest,
    bytes: &'a [u8],
    /// The model the request goes to (rewrites, InferenceModel splits): borrowed from the
    /// request unless something rewrote it, so an unrewritten request copies no model name.
    target: Cow<'a, str>,
    priority: Priority,
}

pub(super) fn route(
    d: &Director,
    inc: &Incoming<'_>,
    rng: &mut impl Rng,
) -> Result<Routed, DirectorError> {
    let now = d.clock.now();
    let runtime = d.config.load();
    let prompted = d.prompted(inc, rng);
    let snapshot = d.datastore.snapshot();
    let states = d.candidate_states(&snapshot, inc.subset, now)?;
    let parsed = prompted.as_ref().map(|p| p.priority);
    d.admission(&runtime, (inc, parsed, now), &states, rng)?;
    let source = d.source(&runtime);
    let mut candidates = d.candidates(&states, runtime.scheduler.reads_labels(), now);
    screen(&runtime, inc, &snapshot, &mut candidates, rng)?;
    let p = prompted.as_ref();
    let lookup = d.look_up(&runtime, source.as_ref(), p, &mut candidates);
    let saturated = super::disagg::saturated(&runtime, &states, d.opts.staleness, now);
    let names = Names(&states);
    let items = multimodal_items(&runtime, p);
    let gathered: Vec<Placement> = inc.seats.iter().filter_map(Seat::placement).collect();
    let facts = Facts {
        inc,
        prompted: p,
        lookup: lookup.as_ref(),
        prompt_cap: prompt_cap(&runtime, source.as_ref()),
        token_scale: d.indexes.approximate.scale.get(),
        multimodal: p.is_some_and(|p| runtime.scheduler.reads_multimodal() && multimodal(p)),
        multimodal_items: &items,
        gathered: &gathered,
    };
    let step = Step {
        scheduler: &runtime.scheduler,
        sreq: facts.scheduling_request(&states, &names, &saturated, now),
        candidates: &candidates,
        started: inc.started.unwrap_or(now),
    };
    let labels = d.model_labels(p);
    let decision = d.decide(&step, &labels, p.is_some(), rng)?;
    let primary = snapshot
        .get(&decision.endpoints[0])
        .ok_or(DirectorError::UnknownEndpoint(decision.endpoints[0]))?;
    let gated = !matches!(inc.body, Body::None) && inc.if_available;
    if gated && !holds_prefix(lookup.as_ref(), primary.id()) {
        return Err(DirectorError::NotCached);
    }
    let prefill = decision.disagg.as_ref().and_then(|o| o.prefill);
    let prefill = prefill.and_then(|p| snapshot.get(&p));
    if let (Some(l), Some(source)) = (&lookup, &source) {
        d.record_prefix((source, l, now), &candidates, primary, prefill);
    }
    let decided = step.commit(decision, (primary, prefill), lookup.as_ref(), p.is_some());
    let for_body = p.filter(|_| runtime.propagate_priority);
    let priority = for_body.map(|p| (p.bytes, p.priority));
    let mut routed = d.answer(prompted, primary, decided, labels, inc);
    write_priority(&mut routed, priority);
    Ok(routed)
}

/// `requestHandler.propagatePriority`: the resolved priority into the forwarded body's
/// top-level `priority` (spliced into the body as the model rewrite left it).
fn write_priority(routed: &mut Routed, original: Option<(&[u8], Priority)>) {
    let Some((bytes, priority)) = original else {
        return;
    };
    let body = routed.body.as_deref().unwrap_or(bytes);
    if let Some(b) = request::priority::with_priority(body, priority) {
        routed.body = Some(b);
    }
}

/// The next request's number ([`Placed::id`]): the lifecycle's points of one request carry it.
static NEXT_REQUEST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// One request as the scheduler takes it: what the decision and its records read.
struct Step<'a> {
    scheduler: &'a Scheduler,
    sreq: SchedulingRequest<'a>,
    candidates: &'a [Candidate],
    /// When the request was read (the scheduler's latency counts from it).
    started: Instant,
}

impl Step<'_> {
    /// The decision taken: the lifecycle's `pre_request` (plugins record, and add the
    /// response's headers), the prefill counted where it runs, and what the primary faced.
    fn commit(
        &self,
        decision: scheduling::Decision,
        (primary, prefill): (&Arc<EndpointState>, Option<&Arc<EndpointState>>),
        lookup: Option<&Lookup>,
        parsed: bool,
    ) -> Decided {
        let id = NEXT_REQUEST.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let placed = Placed {
            id,
            request: &self.sreq,
            candidates: self.candidates,
            decision: &decision,
            primary: primary.id(),
            prefill: prefill.map(|p| p.id()),
            now: self.sreq.now,
        };
        let client_headers = self.scheduler.pre_request(&placed);
        let own = |id: EndpointId| self.candidates.iter().find(|c| c.id == id);
        // With remote prefill the prefill pod does the prompt's work, and the decode pod's
        // TTFT (prefill elsewhere + transfer) must not teach it its own prefill rate.
        let remote = prefill
            .map(|p| own(p.id()).map(|c| p.start_prefill(self.sreq.uncached_tokens(c) as u64)));
        let dispatched = own(primary.id())
            .filter(|_| parsed)
            .map(|c| self.scheduler.ttft_inputs(&self.sreq, c));
        let mut decided = Decided::new(decision, client_headers, dispatched, lookup, self.started);
        decided.remote = remote;
        decided.id = id;
        decided
    }
}

/// What the scheduling request is made of.
struct Facts<'a> {
    inc: &'a Incoming<'a>,
    prompted: Option<&'a Prompted<'a>>,
    lookup: Option<&'a Lookup>,
    /// Bytes of prompt text parsing kept.
    prompt_cap: usize,
    /// Pseudo-tokens per server token ([`crate::prefix::index::TokenScale`]).
    token_scale: f64,
    /// The body carries multimodal content and a decider reads it.
    multimodal: bool,
    /// The body's multimodal items, when a scorer reads them.
    multimodal_items: &'a [request::multimodal::Item],
    /// Where the gathering plugins' windows placed the request.
    gathered: &'a [Placement],
}

impl<'a> Facts<'a> {
    /// The scheduler's view of the request: without a parsed body there is no model, prompt,
    /// SLO, or shedding.
    fn scheduling_request(
        &self,
        states: &[&Arc<EndpointState>],
        names: &'a Names<'a>,
        saturated: &'a [EndpointId],
        now: Instant,
    ) -> SchedulingRequest<'a> {
        let (inc, p, lookup) = (self.inc, self.prompted, self.lookup);
        SchedulingRequest {
            target_model: p.map_or("", |p| &*p.target),
            prefix_total_blocks: lookup.map_or(0, |l| l.hashes.len()),
            block_size: lookup.map_or(16, |l| l.block_size),
            test_endpoint_selection: inc.test_endpoint_selection,
            session_token: inc.session_token,
            session_endpoint: session_endpoint(states, inc.session_endpoint),
            affinity_key: affinity_key(
                inc.session_token,
                lookup.and_then(|l| l.hashes.first().copied()),
            ),
            prompt_tokens: p.map_or(0, |p| {
                prompt_tokens(
                    lookup,
                    p.request,
                    p.bytes,
                    self.prompt_cap,
                    self.token_scale,
                )
            }),
            slo_ttft_s: p
                .and(inc.slo_ttft_ms)
                .filter(|v| *v > 0.0)
                .map(|ms| ms / 1e3),
            sheddable: p.is_some_and(|p| p.priority < 0),
            multimodal: self.multimodal,
            multimodal_items: self.multimodal_items,
            saturated,
            headers: inc.headers,
            names,
            now,
            gathered: self.gathered,
            // Set by a disaggregating handler for its later stage.
            peer: None,
        }
    }
}

/// The endpoint names of one request's snapshot, for the plugins that read or write a
/// session token.
#[derive(Debug)]
pub(super) struct Names<'a>(pub(super) &'a [&'a Arc<EndpointState>]);

impl EndpointNames for Names<'_> {
    fn named(&self, name: &str) -> Option<EndpointId> {
        session_endpoint(self.0, Some(name))
    }
    fn name_of(&self, id: EndpointId) -> Option<String> {
        let state = self.0.iter().find(|s| s.id() == id)?;
        Some(state.endpoint.name.clone())
    }
}

/// Whether the body carries image, audio or video content.
fn multimodal(p: &Prompted<'_>) -> bool {
    scheduling::disagg::has_multimodal(p.bytes)
}

/// The body's multimodal items, when a scorer reads them (parsed only when the byte search
/// finds multimodal content).
fn multimodal_items(runtime: &Runtime, p: Option<&Prompted<'_>>) -> Vec<request::multimodal::Item> {
    match p {
        Some(p) if runtime.scheduler.reads_multimodal_items() && multimodal(p) => {
            request::multimodal::items(p.bytes)
        }
        _ => Vec::new(),
    }
}

/// The scheduler's answer and what the lifecycle added, before the lease is taken.
struct Decided {
    destinations: Vec<EndpointId>,
    scores: Vec<(EndpointId, f64)>,
    /// Headers the lifecycle plugins add to the response (session tokens).
    client_headers: Vec<(String, String)>,
    remote_prefill: Option<Arc<str>>,
    dispatched: Option<scheduling::scorer::TtftInputs>,
    started: Instant,
    /// Request headers for the decode pod's sidecar (P/D).
    headers: Vec<(&'static str, Option<String>)>,
    /// The whole prompt in pseudo-tokens, to learn their ratio to the server's tokens.
    pseudo_prompt_tokens: Option<u32>,
    /// With a remote prefill, the prefill counted against the prefill pod (`None` inside
    /// when that pod was not a candidate); `None` without one.
    remote: Option<Option<PrefillGuard>>,
    /// The request's number ([`Placed::id`]).
    id: u64,
}

impl Decided {
    fn new(
        decision: scheduling::Decision,
        client_headers: Vec<(String, String)>,
        dispatched: Option<scheduling::scorer::TtftInputs>,
        lookup: Option<&Lookup>,
        started: Instant,
    ) -> Self {
        let remote_prefill = decision
            .disagg
            .as_ref()
            .filter(|o| o.prefill.is_some())
            .map(|o| Arc::clone(&o.handler));
        // `data-parallel-profile-handler`: each pick's address on the primary port.
        let destinations = match decision.port {
            Some(port) => decision
                .endpoints
                .iter()
                .map(|e| EndpointId(std::net::SocketAddr::new(e.0.ip(), port)))
                .collect(),
            None => decision.endpoints,
        };
        Self {
            destinations,
            scores: decision.scores,
            client_headers,
            remote_prefill,
            dispatched,
            started,
            headers: decision.headers,
            pseudo_prompt_tokens: lookup
                .filter(|l| l.pseudo_tokens && l.prompt_tokens < l.token_cap)
                .and_then(|l| u32::try_from(l.prompt_tokens).ok()),
            remote: None,
            id: 0,
        }
    }
}

/// The prompt's blocks and who holds them, as the configuration's index says.
fn lookup(
    runtime: &Runtime,
    source: &Source<'_>,
    p: &Prompted<'_>,
    candidates: &[Candidate],
    now: Instant,
) -> Option<Lookup> {
    let query = Query {
        request: p.request,
        body: p.bytes,
        model: &p.target,
        tokenizer: runtime.tokenizer.as_ref(),
        pods: &CandidatePods(candidates),
    };
    source.lookup(&query, now)
}

/// The candidates as the prefix index walks them, without collecting them.
struct CandidatePods<'a>(&'a [Candidate]);

impl Pods for CandidatePods<'_> {
    fn count(&self) -> usize {
        self.0.len()
    }
    fn pod(&self, i: usize) -> Pod {
        pod(&self.0[i])
    }
}

/// What a prefix index weighs of a candidate: its scraped load and cache geometry, from the
/// metrics the candidate already holds (no endpoint state is loaded again).
pub(super) fn pod(c: &Candidate) -> Pod {
    let m = c.metrics.as_deref();
    Pod {
        id: c.id,
        load: m.map_or(0.0, |m| m.waiting + m.running),
        cache: m.and_then(|m| m.cache),
    }
}

/// [`pod`] of an endpoint that is not a candidate.
pub(super) fn pod_of(s: &EndpointState) -> Pod {
    let m = s.metrics();
    Pod {
        id: s.id(),
        load: m.as_ref().map_or(0.0, |m| m.waiting + m.running),
        cache: m.and_then(|m| m.cache),
    }
}

impl Director {
    /// A parsed request's target model and priority (the objectives decide both).
    fn prompted<'a>(&self, inc: &Incoming<'a>, rng: &mut impl Rng) -> Option<Prompted<'a>> {
        let Body::Parsed { request, bytes } = inc.body else {
            return None;
        };
        let objectives = self.datastore.objectives();
        let rewritten = request
            .api
            .rewrites_model()
            .then(|| objectives.rewrite_or_header(&request.model, inc.model_rewrite, rng))
            .flatten();
        let target = match rewritten {
            Some(t) if t != request.model => Cow::Owned(t),
            _ => Cow::Borrowed(request.model.as_str()),
        };
        let priority = objectives.priority(inc.objective, &request.model);
        Some(Prompted {
            request,
            bytes,
            target,
            priority,
        })
    }

    /// The decision as the adapter gets it: the in-flight lease taken, the body rewritten
    /// when the target model differs.
    fn answer(
        &self,
        prompted: Option<Prompted<'_>>,
        primary: &Arc<EndpointState>,
        mut decided: Decided,
        labels: ModelLabels,
        inc: &Incoming<'_>,
    ) -> Routed {
        let prefill = match decided.remote.take() {
            Some(guard) => {
                decided.dispatched = None;
                guard
            }
            None => decided
                .dispatched
                .map(|d| primary.start_prefill(d.own_tokens as u64)),
        };
        let (model, rewritten_model, stream, body) = match prompted {
            Some(p) => {
                let req = p.request;
                let rewritten = match p.target {
                    Cow::Owned(t) => Some(t),
                    Cow::Borrowed(_) => None,
                };
                let body = rewritten
                    .as_deref()
                    .map(|t| request::rewrite_model(p.bytes, &req.model_span, t));
                let request = RequestLabels {
                    model_name: labels.model_name.clone(),
                    target_model_name: labels.target_model_name.clone(),
                    priority: p.priority.to_string(),
                };
                self.metrics.request_total.get_or_create(&request).inc();
                (req.model.clone(), rewritten, req.stream, body)
            }
            None => (String::new(), None, false, None),
        };
        let lease = self.lease(primary, &labels.model_name);
        Routed {
            destinations: decided.destinations,
            body,
            model,
            rewritten_model,
            stream,
            started: decided.started,
            lease,
            client_headers: decided.client_headers,
            captured: inc.headers.clone(),
            fairness_id: inc.fairness_id.filter(|f| !f.is_empty()).map(str::to_owned),
            remote_prefill: decided.remote_prefill,
            scores: decided.scores,
            prefill,
            dispatched: decided.dispatched,
            headers: decided.headers,
            labels,
            pseudo_prompt_tokens: decided.pseudo_prompt_tokens,
            id: decided.id,
            first_seen: false,
        }
    }

    /// Runs the scheduler and counts the attempt (and a disaggregating handler's decision,
    /// under the target model's capped label value).
    fn decide(
        &self,
        step: &Step<'_>,
        labels: &ModelLabels,
        traced: bool,
        rng: &mut impl Rng,
    ) -> Result<scheduling::Decision, DirectorError> {
        let (sreq, started) = (&step.sreq, step.started);
        let span = traced.then(|| crate::telemetry::child("schedule"));
        let result = step.scheduler.schedule(sreq, step.candidates, rng);
        if let Ok(d) = &result {
            crate::telemetry::annotate_decision(&d.endpoints, &d.scores);
        }
        self.metrics.scheduler_e2e.observe(
            self.clock
                .now()
                .saturating_duration_since(started)
                .as_secs_f64(),
        );
        self.record_attempt(&result, &labels.target_model_name);
        let decision = decided(result)?;
        drop(span);
        if let Some(o) = &decision.disagg {
            // A client chooses the model name: its label value is the capped one.
            let target = match sreq.target_model {
                "" => self.metrics.model("unknown"),
                _ => labels.target_model_name.clone(),
            };
            super::disagg::record(&self.metrics.disagg, o, target);
        }
        Ok(decision)
    }

    /// The prompt's blocks and who holds them, filled into the candidates (matched blocks,
    /// what a pod holds past the match cap, and, when the scheduler prices it, the room left in
    /// each pod's cache).
    fn look_up(
        &self,
        runtime: &Runtime,
        source: Option<&Source<'_>>,
        prompted: Option<&Prompted<'_>>,
        candidates: &mut [Candidate],
    ) -> Option<Lookup> {
        let (p, source) = prompted.zip(source)?;
        let l = {
            let _span = crate::telemetry::child("tokenize");
            lookup(runtime, source, p, candidates, self.clock.now())?
        };
        let room = match runtime.scheduler.prices_cache_room() {
            true => source.room(&CandidatePods(candidates), l.block_size),
            false => Vec::new(),
        };
        // Server tokens: the index counts pseudo-tokens with `tokenizer: characters`.
        let per = match l.pseudo_tokens {
            true => self.indexes.approximate.scale.get(),
            false => 1.0,
        };
        for (i, c) in candidates.iter_mut().enumerate() {
            c.prefix_blocks = l.scored(c.id);
            c.prefill.held_past_cap = l.held_past_cap(c.id) as f64 / per;
            c.prefill.cache_free_tokens = room.get(i).copied().flatten().map(|t| t as f64 / per);
        }
        Some(l)
    }

    /// The model-name label values of a request, each looked up once: the requested model and
    /// the target (the same value unless a rewrite changed it); empty without a parsed body.
    fn model_labels(&self, prompted: Option<&Prompted<'_>>) -> ModelLabels {
        let (model, rewritten) = match prompted {
            Some(p) => match &p.target {
                Cow::Owned(t) => (p.request.model.as_str(), Some(t.as_str())),
                Cow::Borrowed(_) => (p.request.model.as_str(), None),
            },
            None => ("", None),
        };
        let model_name = self.metrics.model(model);
        let target_model_name = match rewritten {
            Some(t) => self.metrics.model(t),
            None => model_name.clone(),
        };
        ModelLabels {
            model_name,
            target_model_name,
        }
    }
}

/// The request's prompt tokens: as the prefix lookup tokenized them (pseudo-tokens converted
/// at the learned `scale`), else (and past the lookup's match cap) estimated at four bytes a
/// token (llm-d's default `estimate` token producer) from the prompt text, or from the whole
/// body when parsing kept only the first `cap` bytes of the prompt.
fn prompt_tokens(
    lookup: Option<&Lookup>,
    req: &LlmRequest,
    body: &[u8],
    cap: usize,
    scale: f64,
) -> usize {
    let counted = |l: &Lookup| match l.pseudo_tokens {
        true => (l.prompt_tokens as f64 / scale).round() as usize,
        false => l.prompt_tokens,
    };
    let estimate = || match &req.prompt {
        Prompt::Tokens(t) => t.len(),
        Prompt::Text(t) if t.len() < cap => crate::request::estimated_tokens(t.len()),
        Prompt::Text(_) => crate::request::estimated_tokens(body.len()),
    };
    match lookup {
        Some(l) if l.prompt_tokens < l.token_cap => counted(l),
        Some(l) => counted(l).max(estimate()),
        None => estimate(),
    }
}

/// Whether the prefix lookup found any of the prompt's blocks held by `id` (upstream's
/// conditional-decode gate: a match of at least one block; no prefix scorer, no match).
fn holds_prefix(lookup: Option<&Lookup>, id: EndpointId) -> bool {
    lookup.is_some_and(|l| l.held(id) > 0)
}

/// The candidate named by a session token (the adapter decoded the endpoint name from it).
fn session_endpoint(states: &[&Arc<EndpointState>], name: Option<&str>) -> Option<EndpointId> {
    let name = name?;
    states
        .iter()
        .find(|s| s.endpoint.name == name)
        .map(|s| s.id())
}

/// The consistent-hash key: the session token's hash, else the first prompt block hash.
fn affinity_key(token: Option<&str>, first_block: Option<u64>) -> Option<u64> {
    match token.filter(|t| !t.is_empty()) {
        Some(t) => Some(xxhash_rust::xxh64::xxh64(t.as_bytes(), 0)),
        None => first_block,
    }
}

/// A decision with a destination, or why there is none.
fn decided(
    result: Result<scheduling::Decision, ScheduleError>,
) -> Result<scheduling::Decision, DirectorError> {
    match result {
        Ok(d) if !d.endpoints.is_empty() => Ok(d),
        Ok(_) => Err(DirectorError::Schedule(ScheduleError::AllFiltered)),
        Err(e) => Err(DirectorError::Schedule(e)),
    }
}

//! The routing steps of [`Director::route`]: candidates and admission (`candidates.rs`), the
//! prefix lookup, scheduling, and recording the decision (`record.rs`: prefix index, no-hit
//! LRU, session binding, in-flight lease).

use super::exchange::{Body, DirectorError, Incoming, Routed};
use super::{prompt_cap, Director, Runtime};
use crate::datastore::objectives::Priority;
use crate::datastore::{EndpointState, PrefillGuard};
use crate::endpoint::EndpointId;
use crate::metrics::{ModelLabels, RequestLabels};
use crate::prefix::source::{Lookup, Pod, Pods, PrefixSource, Query, Source};
use crate::request::{self, LlmRequest, Prompt};
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
    let started = inc.started.unwrap_or_else(Instant::now);
    let runtime = d.config.load();
    let prompted = d.prompted(inc, rng);
    let snapshot = d.datastore.snapshot();
    let states = d.candidate_states(&snapshot, inc.subset)?;
    let priority = match (&prompted, inc.body) {
        (Some(p), _) => Some(p.priority),
        (None, Body::Unread) => Some(d.priority(inc.objective, "")),
        (None, _) => None,
    };
    if let Some(priority) = priority {
        let destinations = super::disagg::destinations(&runtime.scheduler, &states);
        d.admit(&runtime.thresholds, priority, &destinations)?;
        for admitter in &runtime.admitters {
            let endpoints = states
                .iter()
                .map(|s| s.metrics().map(|m| (m.waiting, m.kv_usage)));
            if let Some(why) = admitter.refuses(priority, endpoints, rng.random()) {
                return Err(DirectorError::NotAdmitted(why));
            }
        }
    }
    let source = d.source(&runtime);
    let mut candidates = d.candidates(&states, runtime.scheduler.reads_labels());
    let lookup = prompted
        .as_ref()
        .zip(source.as_ref())
        .and_then(|(p, source)| {
            let _span = crate::telemetry::child("tokenize");
            lookup(&runtime, source, p, &candidates)
        });
    let token_scale = d.indexes.approximate.scale.get();
    if let Some(l) = &lookup {
        // Only the estimated-TTFT scorer prices the room left in each pod's cache.
        let room = match &source {
            Some(s) if runtime.scheduler.estimated_ttft().is_some() => {
                s.room(&CandidatePods(&candidates), l.block_size)
            }
            _ => Vec::new(),
        };
        // Server tokens: the index counts pseudo-tokens with `tokenizer: characters`.
        let per = if l.pseudo_tokens { token_scale } else { 1.0 };
        for (i, c) in candidates.iter_mut().enumerate() {
            c.prefix_blocks = l.scored(c.id);
            c.prefill.held_past_cap = l.held_past_cap(c.id) as f64 / per;
            c.prefill.cache_free_tokens = room.get(i).copied().flatten().map(|t| t as f64 / per);
        }
    }
    let lru = d.lru_snapshot(&runtime.scheduler);
    let facts = Facts {
        inc,
        prompted: prompted.as_ref(),
        lookup: lookup.as_ref(),
        states: &states,
        prompt_cap: prompt_cap(&runtime, source.as_ref()),
        token_scale,
    };
    let bound = d.session_bound(&runtime.scheduler, inc.session_id);
    let prefill_bound = d.prefill_session_bound(&runtime.scheduler, inc.prefill_session_id);
    let saturated = super::disagg::saturated(&runtime, &states, d.opts.staleness);
    let mut sreq = facts.scheduling_request(&lru, bound);
    sreq.prefill_session_endpoint = sreq.prefill_session_endpoint.or(prefill_bound);
    sreq.saturated = &saturated;
    sreq.multimodal = prompted.as_ref().is_some_and(|p| {
        runtime
            .scheduler
            .disagg()
            .is_some_and(|d| d.reads_multimodal())
            && scheduling::disagg::has_multimodal(p.bytes)
    });
    let span = prompted
        .as_ref()
        .map(|_| crate::telemetry::child("schedule"));
    let labels = d.model_labels(prompted.as_ref());
    let result = d.schedule(&runtime.scheduler, &sreq, &candidates, rng, started);
    d.record_attempt(&result, &labels.target_model_name);
    let scheduling::Decision {
        endpoints: destinations,
        scores,
        disagg,
        headers,
    } = decided(result)?;
    drop(span);
    let prefill_pod = disagg.as_ref().and_then(|o| o.prefill);
    if let Some(o) = &disagg {
        let target = prompted.as_ref().map_or("", |p| &*p.target);
        super::disagg::record(&d.metrics.disagg, o, target);
    }
    let primary = snapshot
        .get(&destinations[0])
        .ok_or(DirectorError::UnknownEndpoint(destinations[0]))?;
    let gated = !matches!(inc.body, Body::None) && inc.if_available;
    if gated && !holds_prefix(lookup.as_ref(), destinations[0]) {
        return Err(DirectorError::NotCached);
    }
    // With remote prefill the prefill pod computed the prompt too (upstream records both).
    let prefill_state = prefill_pod.and_then(|p| snapshot.get(&p));
    if let (Some(l), Some(source)) = (&lookup, &source) {
        let primary_pod = candidates.iter().find(|c| c.id == primary.id()).map(pod);
        d.record_prefix(source, l, primary_pod.unwrap_or_else(|| pod_of(primary)));
        if let Some(p) = prefill_state {
            let prefill_pod = candidates.iter().find(|c| c.id == p.id()).map(pod);
            source.record(l, &prefill_pod.unwrap_or_else(|| pod_of(p)), Instant::now());
        }
    }
    d.record_no_hit(&runtime.scheduler, &candidates, primary.id());
    let session = (inc.session_id, bound);
    d.record_session(&runtime.scheduler, session, &candidates, primary.id());
    if let Some(p) = prefill_pod {
        let session = (inc.prefill_session_id, prefill_bound);
        d.record_prefill_session(&runtime.scheduler, session, &candidates, p);
    }
    let decided = Decided {
        destinations,
        scores,
        session_endpoint: (runtime.scheduler.session_affinity())
            .then(|| primary.endpoint.name.clone()),
        prefill_session: runtime
            .scheduler
            .prefill_session_header()
            .zip(prefill_state)
            .map(|(h, p)| (h.to_owned(), p.endpoint.name.clone())),
        remote_prefill: disagg
            .as_ref()
            .filter(|o| o.prefill.is_some())
            .map(|o| Arc::clone(&o.handler)),
        dispatched: prompted
            .as_ref()
            .and_then(|_| dispatched(&runtime.scheduler, &sreq, &candidates, primary.id())),
        started,
        headers,
        pseudo_prompt_tokens: lookup
            .as_ref()
            .filter(|l| l.pseudo_tokens && l.prompt_tokens < l.token_cap)
            .and_then(|l| u32::try_from(l.prompt_tokens).ok()),
    };
    // With remote prefill the prefill pod does the prompt's work, and the decode pod's TTFT
    // (prefill elsewhere + transfer) must not teach it its own prefill rate.
    let remote = prefill_state.map(|p| {
        let own = candidates.iter().find(|c| c.id == p.id());
        own.map(|c| p.start_prefill(sreq.uncached_tokens(c) as u64))
    });
    let for_body = (prompted.as_ref())
        .filter(|_| runtime.propagate_priority)
        .map(|p| (p.bytes, p.priority));
    let mut routed = d.answer(prompted, primary, decided, labels, remote);
    write_priority(&mut routed, for_body);
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

/// What the scheduling request is made of.
struct Facts<'a> {
    inc: &'a Incoming<'a>,
    prompted: Option<&'a Prompted<'a>>,
    lookup: Option<&'a Lookup>,
    states: &'a [&'a Arc<EndpointState>],
    /// Bytes of prompt text parsing kept.
    prompt_cap: usize,
    /// Pseudo-tokens per server token ([`crate::prefix::index::TokenScale`]).
    token_scale: f64,
}

impl<'a> Facts<'a> {
    /// The scheduler's view of the request: without a parsed body there is no model, prompt,
    /// SLO, or shedding.
    fn scheduling_request(
        &self,
        lru: &'a [EndpointId],
        bound: Option<EndpointId>,
    ) -> SchedulingRequest<'a> {
        let (inc, p, lookup) = (self.inc, self.prompted, self.lookup);
        SchedulingRequest {
            target_model: p.map_or("", |p| &*p.target),
            prefix_total_blocks: lookup.map_or(0, |l| l.hashes.len()),
            block_size: lookup.map_or(16, |l| l.block_size),
            test_endpoint_selection: inc.test_endpoint_selection,
            session_token: inc.session_token,
            session_endpoint: session_endpoint(self.states, inc.session_endpoint),
            prefill_session_endpoint: session_endpoint(self.states, inc.prefill_session_endpoint),
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
            lru,
            session_bound: bound,
            // Set by the caller, which knows whether a decider reads it.
            multimodal: false,
            saturated: &[],
        }
    }
}

/// What the primary faced at dispatch, for its prefill count and TTFT learning.
fn dispatched(
    scheduler: &Scheduler,
    sreq: &SchedulingRequest<'_>,
    candidates: &[Candidate],
    primary: EndpointId,
) -> Option<scheduling::scorer::TtftInputs> {
    let c = candidates.iter().find(|c| c.id == primary)?;
    Some(match scheduler.estimated_ttft() {
        Some(s) => s.inputs(sreq, c),
        None => scheduling::scorer::EstimatedTtftScorer::default().inputs(sreq, c),
    })
}

/// The scheduler's answer, before the lease is taken.
struct Decided {
    destinations: Vec<EndpointId>,
    scores: Vec<(EndpointId, f64)>,
    session_endpoint: Option<String>,
    prefill_session: Option<(String, String)>,
    remote_prefill: Option<Arc<str>>,
    dispatched: Option<scheduling::scorer::TtftInputs>,
    started: Instant,
    /// Request headers for the decode pod's sidecar (P/D).
    headers: Vec<(&'static str, Option<String>)>,
    /// The whole prompt in pseudo-tokens, to learn their ratio to the server's tokens.
    pseudo_prompt_tokens: Option<u32>,
}

/// The prompt's blocks and who holds them, as the configuration's index says.
fn lookup(
    runtime: &Runtime,
    source: &Source<'_>,
    p: &Prompted<'_>,
    candidates: &[Candidate],
) -> Option<Lookup> {
    let query = Query {
        request: p.request,
        body: p.bytes,
        model: &p.target,
        tokenizer: runtime.tokenizer.as_ref(),
        pods: &CandidatePods(candidates),
    };
    source.lookup(&query, Instant::now())
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
fn pod(c: &Candidate) -> Pod {
    let m = c.metrics.as_deref();
    Pod {
        id: c.id,
        load: m.map_or(0.0, |m| m.waiting + m.running),
        cache: m.and_then(|m| m.cache),
    }
}

/// [`pod`] of an endpoint that is not a candidate.
fn pod_of(s: &EndpointState) -> Pod {
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
        remote_prefill: Option<Option<PrefillGuard>>,
    ) -> Routed {
        let prefill = match remote_prefill {
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
            session_endpoint: decided.session_endpoint,
            prefill_session: decided.prefill_session,
            remote_prefill: decided.remote_prefill,
            scores: decided.scores,
            prefill,
            dispatched: decided.dispatched,
            headers: decided.headers,
            labels,
            pseudo_prompt_tokens: decided.pseudo_prompt_tokens,
        }
    }

    fn schedule(
        &self,
        scheduler: &Scheduler,
        sreq: &SchedulingRequest<'_>,
        candidates: &[Candidate],
        rng: &mut impl Rng,
        started: Instant,
    ) -> Result<scheduling::Decision, ScheduleError> {
        let result = scheduler.schedule(sreq, candidates, rng);
        if let Ok(d) = &result {
            crate::telemetry::annotate_decision(&d.endpoints, &d.scores);
        }
        self.metrics
            .scheduler_e2e
            .observe(started.elapsed().as_secs_f64());
        result
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

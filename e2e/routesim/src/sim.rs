//! The discrete-event loop: arrivals, engine steps and metric scrapes in virtual time. epp's
//! director decides each request on the virtual clock (the real director, scheduler and prefix
//! index; its metrics as the last scrape left them), the engines run the steps, and the loop
//! jumps from one event to the next without sleeping.

use crate::bounds::{Bound, Bounds};
use crate::pod::{At, InFlight, Pod, Progress};
use crate::traffic::{Encoder, Traffic, Wire};
use crate::Record;
use epp::clock::VirtualClock;
use epp::director::{Body, Director, End, Incoming, ResponseSummary, Routed};
use epp::endpoint::{Endpoint, EndpointId};
use epp::request::ApiKind;
use inference_sim::engine::Usage;
use inference_sim::EngineConfig;
use loadgen::workload::Body as Asked;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Who places the requests.
#[derive(Clone, Debug)]
pub enum Router {
    /// epp with this EndpointPickerConfig (any configuration epp loads).
    Epp { name: String, config: String },
    /// Each pod in turn (Envoy's round robin), the floor every router must beat.
    RoundRobin,
}

impl Router {
    pub fn name(&self) -> &str {
        match self {
            Router::Epp { name, .. } => name,
            Router::RoundRobin => "round-robin",
        }
    }
}

/// The simulated cluster and how epp sees it.
#[derive(Clone, Debug)]
pub struct Cluster {
    pub pods: usize,
    /// Relative speed per pod (missing entries are 1.0): heterogeneous GPUs.
    pub speeds: Vec<f64>,
    /// The engine of every pod (blocks, batch limits, timing profile).
    pub engine: EngineConfig,
    /// epp's `--refresh-metrics-interval`.
    pub scrape_interval: Duration,
    /// epp's `--metrics-staleness-threshold`.
    pub staleness: Duration,
    /// inference-sim's `--time-scale`: steps take `1 / time_scale` of their simulated time
    /// (the real-time bench runs its pods at 0.5, twice as slow, so that 2 cores keep up);
    /// every figure is then in the bench's (wall) units.
    pub time_scale: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A metrics scrape of every pod (epp's pollers share one tick schedule).
    Scrape,
    /// A pod's step ends.
    StepEnd(usize),
    /// A planned request is due.
    Arrive(usize),
}

/// A chat session: its history and the turns waiting for the one in flight (the bench's
/// client sends a session's turns one after another).
#[derive(Default)]
struct Session {
    busy: bool,
    pending: VecDeque<usize>,
    history: Vec<(String, String)>,
}

/// One simulation run.
pub struct Sim {
    clock: Arc<VirtualClock>,
    base: Instant,
    director: Option<Arc<Director>>,
    next_pod: usize,
    pods: Vec<Pod>,
    by_id: HashMap<EndpointId, usize>,
    queue: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    traffic: Traffic,
    sessions: Vec<Session>,
    records: Vec<Record>,
    encoder: Encoder,
    rng: SmallRng,
    cluster: Cluster,
    end: Duration,
    bounds: Bounds,
    bound_of: Vec<Option<Bound>>,
}

impl Sim {
    /// A run of `traffic` through `router` on `cluster`, seeded by `seed`; requests still
    /// unanswered `drain` after the last arrival are cut off.
    pub fn new(
        cluster: &Cluster,
        router: &Router,
        traffic: Traffic,
        seed: u64,
        drain: Duration,
    ) -> anyhow::Result<Self> {
        let clock = Arc::new(VirtualClock::default());
        let base = epp::clock::Clock::now(clock.as_ref());
        let encoder = Encoder::default();
        let pods = start_pods(cluster, &encoder, seed);
        let last = traffic.requests.last().map_or(0.0, |r| r.at);
        let mut sim = Self {
            clock,
            base,
            director: None,
            next_pod: 0,
            pods,
            by_id: HashMap::new(),
            queue: BinaryHeap::new(),
            seq: 0,
            sessions: (0..traffic.systems.len())
                .map(|_| Session::default())
                .collect(),
            records: Vec::new(),
            encoder,
            rng: SmallRng::seed_from_u64(seed ^ 0xd1ec_7042),
            cluster: cluster.clone(),
            end: Duration::from_secs_f64(last) + drain,
            bounds: Bounds::new(&cluster.engine, cluster.pods, fastest(cluster)),
            bound_of: vec![None; traffic.requests.len()],
            traffic,
        };
        if let Router::Epp { config, .. } = router {
            sim.director = Some(sim.epp(config)?);
            sim.push(Duration::ZERO, Event::Scrape);
        }
        for i in 0..sim.traffic.requests.len() {
            let at = Duration::from_secs_f64(sim.traffic.requests[i].at);
            sim.push(at, Event::Arrive(i));
        }
        Ok(sim)
    }

    /// epp's director over the pods, on this run's virtual clock.
    fn epp(&mut self, config: &str) -> anyhow::Result<Arc<Director>> {
        let ids: Vec<EndpointId> = (0..self.pods.len()).map(pod_address).collect();
        let graph = epp::fixtures::graph(config)
            .endpoints(ids.iter().copied().map(Endpoint::from_id).collect())
            .staleness(self.cluster.staleness)
            .clock(self.clock.clone())
            // As epp with --allow-experimental-plugins: Alpha types (v0.11's learned scorers)
            // are what the simulator is for trying.
            .experimental()
            .try_build()?;
        let set = graph.datastore.snapshot();
        for (i, id) in ids.iter().enumerate() {
            self.by_id.insert(*id, i);
            self.pods[i].state = set.get(id).cloned();
        }
        Ok(graph.director)
    }

    fn push(&mut self, at: Duration, e: Event) {
        self.seq += 1;
        let nanos = u64::try_from(at.as_nanos()).unwrap_or(u64::MAX);
        self.queue.push(Reverse((nanos, self.seq, e)));
    }

    fn at(&self, offset: Duration) -> At {
        At {
            offset,
            instant: tokio::time::Instant::from_std(self.base + offset),
        }
    }

    /// Runs every event up to the end; returns one record per planned request.
    pub fn run(mut self) -> Vec<Record> {
        while let Some(Reverse((nanos, _, event))) = self.queue.pop() {
            let now = Duration::from_nanos(nanos);
            if now > self.end {
                break;
            }
            let behind = now.saturating_sub(self.clock.elapsed());
            self.clock.advance(behind);
            match event {
                Event::Scrape => self.scrape(now),
                Event::StepEnd(p) => self.step_end(p, now),
                Event::Arrive(r) => self.arrive(r, now),
            }
        }
        self.cut_off();
        self.records.sort_by_key(|r| r.id);
        self.records
    }

    fn scrape(&mut self, now: Duration) {
        let at = self.base + now;
        for pod in &self.pods {
            if let Some(state) = &pod.state {
                state.store_metrics(pod.scrape(at));
            }
        }
        let next = now + self.cluster.scrape_interval;
        self.push(next, Event::Scrape);
    }

    /// A planned request is due: a chat turn waits for its session's turn in flight.
    fn arrive(&mut self, r: usize, now: Duration) {
        if let Asked::ChatTurn { session, .. } = self.traffic.requests[r].spec.body {
            if let Some(s) = self.sessions.get_mut(session) {
                if s.busy {
                    s.pending.push_back(r);
                    return;
                }
                s.busy = true;
            }
        }
        self.send(r, now);
    }

    fn wire(&mut self, r: usize) -> Wire {
        let spec = &self.traffic.requests[r].spec;
        match &spec.body {
            Asked::Prompt(p) => self.encoder.completion(spec, p),
            Asked::ChatTurn { session, .. } => {
                let system = self
                    .traffic
                    .systems
                    .get(*session)
                    .map_or("", String::as_str);
                let s = &mut self.sessions[*session];
                if s.history.len() >= self.traffic.turns {
                    s.history.clear();
                }
                self.encoder.chat(spec, system, &s.history)
            }
        }
    }

    /// Sends request `r` at `now`: epp decides (or round robin), the pod queues it.
    fn send(&mut self, r: usize, now: Duration) {
        let wire = self.wire(r);
        self.bound_of[r] = Some(self.bounds.observe(&wire.tokens));
        let routed = match self.decide(&wire) {
            Ok(routed) => routed,
            Err(e) => return self.refused(r, now, e),
        };
        let p = match &routed {
            Some(routed) => routed
                .destinations
                .first()
                .and_then(|id| self.by_id.get(id))
                .copied()
                .unwrap_or(0),
            None => {
                self.next_pod = (self.next_pod + 1) % self.pods.len();
                self.next_pod
            }
        };
        let max_tokens = self.traffic.requests[r].spec.max_tokens;
        let at = self.at(now);
        let pod = &mut self.pods[p];
        pod.submit(r, wire.tokens, max_tokens, at);
        if let Some(f) = pod.inflight.last_mut() {
            f.routed = routed;
            f.keep_output = wire.chat;
        }
        if !pod.busy {
            self.step(p, now);
        }
    }

    /// epp's decision on the bytes a gateway would hand it; `None` when no epp routes.
    fn decide(&mut self, wire: &Wire) -> Result<Option<Routed>, String> {
        let Some(d) = &self.director else {
            return Ok(None);
        };
        let api = if wire.chat {
            ApiKind::ChatCompletions
        } else {
            ApiKind::Completions
        };
        let request = epp::request::parse(api, &wire.body, d.prompt_cap())
            .map_err(|e| format!("parse: {e}"))?;
        let inc = Incoming {
            body: Body::Parsed {
                request: &request,
                bytes: &wire.body,
            },
            ..Incoming::default()
        };
        d.route(&inc, &mut self.rng)
            .map(Some)
            .map_err(|e| e.to_string())
    }

    fn refused(&mut self, r: usize, now: Duration, error: String) {
        self.record(Record::failed(r, now, error));
        self.session_done(r, now);
    }

    /// Starts pod `p`'s next step at `now`, if it has work.
    fn step(&mut self, p: usize, now: Duration) {
        let at = self.at(now);
        if let Some(d) = self.pods[p].start_step(at) {
            self.push(now + d, Event::StepEnd(p));
        }
    }

    fn step_end(&mut self, p: usize, now: Duration) {
        let at = self.at(now);
        self.pods[p].end_step(at);
        let director = self.director.clone();
        let mut i = 0;
        while i < self.pods[p].inflight.len() {
            match self.pods[p].inflight[i].poll(now, director.as_deref()) {
                Progress::Running => i += 1,
                Progress::Done(usage) => {
                    let f = self.pods[p].inflight.swap_remove(i);
                    self.finished(p, f, usage, now);
                }
                Progress::Failed => {
                    let f = self.pods[p].inflight.swap_remove(i);
                    self.failed(p, f, now);
                }
            }
        }
        self.step(p, now);
    }

    fn finished(&mut self, p: usize, f: InFlight, usage: Usage, now: Duration) {
        if let (Some(d), Some(routed)) = (&self.director, &f.routed) {
            d.finish(routed, End::Response(self.summary(&f, &usage, now)));
        }
        if f.keep_output {
            self.remember_turn(f.request, &f.output);
        }
        self.record(Record::done(&f, p, &usage, now));
        self.session_done(f.request, now);
    }

    fn failed(&mut self, p: usize, f: InFlight, now: Duration) {
        if let (Some(d), Some(routed)) = (&self.director, &f.routed) {
            d.finish(routed, End::Abandoned);
        }
        let mut rec = Record::failed(f.request, f.sent, "engine aborted".into());
        rec.pod = Some(p);
        rec.e2e = now.saturating_sub(f.sent).as_secs_f64();
        self.record(rec);
        self.session_done(f.request, now);
    }

    /// What the response phase hands epp's director when a response ends.
    fn summary(&self, f: &InFlight, usage: &Usage, now: Duration) -> ResponseSummary {
        let first = f.first_token.map(|t| self.base + t);
        ResponseSummary {
            request_bytes: 0,
            response_bytes: usage.completion_tokens * 8,
            prompt_tokens: Some(usage.prompt_tokens as u64),
            completion_tokens: Some(usage.completion_tokens as u64),
            total_tokens: Some((usage.prompt_tokens + usage.completion_tokens) as u64),
            cached_tokens: Some(usage.cached_tokens as u64),
            status: Some(200),
            connect_failure: false,
            headers_at: first,
            first_body_at: first,
            last_body_at: Some(self.base + now),
        }
    }

    fn remember_turn(&mut self, r: usize, output: &[u32]) {
        let answer = self.encoder.text(output);
        if let Asked::ChatTurn { session, question } = &self.traffic.requests[r].spec.body {
            if let Some(s) = self.sessions.get_mut(*session) {
                s.history.push((question.clone(), answer));
            }
        }
    }

    /// A chat turn ended: the session's next waiting turn goes now.
    fn session_done(&mut self, r: usize, now: Duration) {
        let Asked::ChatTurn { session, .. } = self.traffic.requests[r].spec.body else {
            return;
        };
        let Some(s) = self.sessions.get_mut(session) else {
            return;
        };
        match s.pending.pop_front() {
            Some(next) => self.send(next, now),
            None => s.busy = false,
        }
    }

    /// Requests unanswered at the end: cut off, their time so far counted (as the bench does).
    fn cut_off(&mut self) {
        let end = self.end;
        let mut cut = Vec::new();
        for (p, pod) in self.pods.iter_mut().enumerate() {
            cut.extend(pod.inflight.drain(..).map(|f| Record::cut(&f, p, end)));
        }
        for s in &mut self.sessions {
            for r in s.pending.drain(..) {
                let at = Duration::from_secs_f64(self.traffic.requests[r].at);
                let mut rec = Record::failed(r, at, "cut off".into());
                rec.cut_off = true;
                cut.push(rec);
            }
        }
        for rec in cut {
            self.record(rec);
        }
    }

    fn record(&mut self, mut rec: Record) {
        rec.bound = self.bound_of.get(rec.id).copied().flatten();
        self.records.push(rec);
    }

    /// Virtual time the run covered.
    pub fn end(&self) -> Duration {
        self.end
    }
}

/// Pod `i`'s address: loopback-style, never dialled.
fn pod_address(i: usize) -> EndpointId {
    let addr = format!("10.{}.{}.{}:8000", i / 62_500, (i / 250) % 250, i % 250 + 1);
    addr.parse()
        .unwrap_or_else(|_| unreachable!("a valid address: {addr}"))
}

/// The fastest pod's relative speed, time scale included.
fn fastest(cluster: &Cluster) -> f64 {
    (0..cluster.pods)
        .map(|i| cluster.speeds.get(i).copied().unwrap_or(1.0))
        .fold(0.0, f64::max)
        * cluster.time_scale
}

fn start_pods(cluster: &Cluster, encoder: &Encoder, seed: u64) -> Vec<Pod> {
    (0..cluster.pods)
        .map(|i| {
            let mut cfg = cluster.engine.clone();
            cfg.speed = cluster.speeds.get(i).copied().unwrap_or(1.0);
            cfg.time_scale = cluster.time_scale;
            let rng = SmallRng::seed_from_u64(seed.wrapping_mul(1_000_003) + i as u64);
            Pod::new(cfg, rng, encoder.vocabulary())
        })
        .collect()
}

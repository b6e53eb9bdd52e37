//! The run loop: sends the generated requests at the planned times (open loop) or keeps a fixed
//! number in flight (closed loop), bounded by a request count and a duration, and turns every
//! outcome into a [`RequestRecord`]. Requests still running `drain` after the end are cut off
//! and recorded as errors, so a run always ends.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::schedule::{arrivals, Load};
use super::stream::{self, HttpClient, Outcome};
use super::workload::{Body, Generator, RequestSpec, Workload};

/// The error of a request still running when the run ended.
pub const CUT_OFF: &str = "cut off at the end of the run";

/// Everything a run needs.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The router's (or a pod's) HTTP listener.
    pub target: SocketAddr,
    pub workload: Workload,
    pub load: Load,
    pub max_requests: usize,
    pub max_duration: Duration,
    /// How long requests may still run after the last one was sent.
    pub drain: Duration,
    pub seed: u64,
    /// The served base model name.
    pub model: String,
}

/// One request as measured (times in milliseconds, offsets in seconds from the run's start).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RequestRecord {
    pub id: usize,
    pub stage: usize,
    pub group: Option<usize>,
    pub adapter: Option<String>,
    pub sent_s: f64,
    pub ttft_ms: Option<f64>,
    pub e2e_ms: f64,
    pub itl_mean_ms: Option<f64>,
    pub itl_max_ms: Option<f64>,
    /// HTTP status, 0 if none arrived.
    pub status: u16,
    pub prompt_tokens: Option<u64>,
    pub output_tokens: u64,
    pub cached_tokens: Option<u64>,
    pub pod: Option<String>,
    pub error: Option<String>,
    /// Every inter-token gap (ms); kept in memory for percentiles, not written.
    #[serde(skip)]
    pub itls_ms: Vec<f64>,
}

impl RequestRecord {
    pub fn ok(&self) -> bool {
        self.error.is_none() && (200..300).contains(&self.status)
    }

    /// Still waiting for its first token when the run ended.
    pub fn cut_off(&self) -> bool {
        self.error.as_deref() == Some(CUT_OFF)
    }

    fn from_outcome(id: usize, stage: usize, spec: &RequestSpec, sent_s: f64, o: Outcome) -> Self {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let itls_ms: Vec<f64> = o.itls.iter().copied().map(ms).collect();
        let mean =
            (!itls_ms.is_empty()).then(|| itls_ms.iter().sum::<f64>() / itls_ms.len() as f64);
        Self {
            id,
            stage,
            group: spec.group,
            adapter: spec.adapter.clone(),
            sent_s,
            ttft_ms: o.ttft.map(ms),
            e2e_ms: ms(o.e2e),
            itl_mean_ms: mean,
            itl_max_ms: itls_ms.iter().copied().reduce(f64::max),
            status: o.status,
            prompt_tokens: o.prompt_tokens,
            output_tokens: o.output_tokens,
            cached_tokens: o.cached_tokens,
            pod: o.pod,
            error: o.error,
            itls_ms,
        }
    }
}

/// Shared by the request tasks of one run.
struct Ctx {
    client: HttpClient,
    cfg: RunConfig,
    start: Instant,
    /// Chat histories, one per session: (question, answer) pairs; held while a turn runs.
    sessions: Vec<tokio::sync::Mutex<Vec<(String, String)>>>,
    systems: Vec<String>,
}

impl Ctx {
    fn new(cfg: RunConfig, generator: &Generator) -> Self {
        let (sessions, turns_systems) = match &cfg.workload {
            Workload::MultiTurn { sessions, .. } => {
                let systems = (0..*sessions)
                    .map(|s| generator.system_prompt(s).to_owned())
                    .collect();
                (
                    (0..*sessions)
                        .map(|_| tokio::sync::Mutex::new(Vec::new()))
                        .collect(),
                    systems,
                )
            }
            _ => (Vec::new(), Vec::new()),
        };
        Self {
            client: stream::client(),
            cfg,
            start: Instant::now(),
            sessions,
            systems: turns_systems,
        }
    }

    /// Sends one request (waiting for its chat session to be free first) and records it.
    async fn execute(&self, id: usize, stage: usize, spec: RequestSpec) -> RequestRecord {
        let model = spec
            .adapter
            .clone()
            .unwrap_or_else(|| self.cfg.model.clone());
        let mut common = json!({"model": model, "max_tokens": spec.max_tokens, "stream": true,
            "stream_options": {"include_usage": true}, "ignore_eos": true});
        let hard_end = self.start + self.cfg.max_duration + self.cfg.drain;
        match &spec.body {
            Body::Prompt(p) => {
                common["prompt"] = Value::String(p.clone());
                let sent_s = self.start.elapsed().as_secs_f64();
                let o = self
                    .bounded(hard_end, "/v1/completions", &common, false)
                    .await;
                RequestRecord::from_outcome(id, stage, &spec, sent_s, o)
            }
            Body::ChatTurn { session, question } => {
                let mut history = self.sessions[*session].lock().await;
                let turns = match &self.cfg.workload {
                    Workload::MultiTurn { turns, .. } => *turns,
                    _ => usize::MAX,
                };
                if history.len() >= turns {
                    history.clear();
                }
                common["messages"] = messages(&self.systems[*session], &history, question);
                let sent_s = self.start.elapsed().as_secs_f64();
                let o = self
                    .bounded(hard_end, "/v1/chat/completions", &common, true)
                    .await;
                history.push((question.clone(), o.text.clone()));
                RequestRecord::from_outcome(id, stage, &spec, sent_s, o)
            }
        }
    }

    async fn bounded(
        &self,
        hard_end: Instant,
        path: &str,
        body: &Value,
        keep_text: bool,
    ) -> Outcome {
        let bytes = Bytes::from(body.to_string());
        let started = Instant::now();
        match tokio::time::timeout_at(
            hard_end,
            stream::send(&self.client, self.cfg.target, path, bytes, keep_text),
        )
        .await
        {
            Ok(o) => o,
            Err(_) => Outcome {
                e2e: started.elapsed(),
                error: Some(CUT_OFF.into()),
                ..Outcome::default()
            },
        }
    }
}

fn messages(system: &str, history: &[(String, String)], question: &str) -> Value {
    let mut m = vec![json!({"role": "system", "content": system})];
    for (q, a) in history {
        m.push(json!({"role": "user", "content": q}));
        m.push(json!({"role": "assistant", "content": a}));
    }
    m.push(json!({"role": "user", "content": question}));
    Value::Array(m)
}

/// Runs the load and returns one record per request sent, in id order.
pub async fn run(cfg: RunConfig) -> Vec<RequestRecord> {
    let mut generator = Generator::new(cfg.workload.clone(), cfg.seed);
    let ctx = Arc::new(Ctx::new(cfg.clone(), &generator));
    let mut tasks: JoinSet<RequestRecord> = JoinSet::new();
    match &cfg.load {
        Load::Open { stages, poisson } => {
            let planned = match generator.trace_times() {
                Some(times) => times
                    .into_iter()
                    .take(cfg.max_requests)
                    .map(|t| super::schedule::Arrival {
                        at: Duration::from_secs_f64(t),
                        stage: 0,
                    })
                    .collect(),
                None => arrivals(stages, *poisson, cfg.max_requests, cfg.seed),
            };
            for (id, a) in planned.into_iter().enumerate() {
                if a.at >= cfg.max_duration {
                    break;
                }
                let spec = generator.next_request();
                tokio::time::sleep_until(ctx.start + a.at).await;
                let ctx = ctx.clone();
                tasks.spawn(async move { ctx.execute(id, a.stage, spec).await });
            }
        }
        Load::Closed { concurrency } => {
            let generator = Arc::new(Mutex::new(generator));
            let next = Arc::new(AtomicUsize::new(0));
            let mut workers = JoinSet::new();
            for _ in 0..*concurrency {
                workers.spawn(closed_worker(ctx.clone(), generator.clone(), next.clone()));
            }
            let mut records = Vec::new();
            while let Some(done) = workers.join_next().await {
                records.extend(done.unwrap_or_default());
            }
            records.sort_by_key(|r| r.id);
            return records;
        }
    }
    let mut records = Vec::new();
    while let Some(done) = tasks.join_next().await {
        if let Ok(r) = done {
            records.push(r);
        }
    }
    records.sort_by_key(|r| r.id);
    records
}

async fn closed_worker(
    ctx: Arc<Ctx>,
    generator: Arc<Mutex<Generator>>,
    next: Arc<AtomicUsize>,
) -> Vec<RequestRecord> {
    let mut out = Vec::new();
    loop {
        let id = next.fetch_add(1, Ordering::Relaxed);
        if id >= ctx.cfg.max_requests || ctx.start.elapsed() >= ctx.cfg.max_duration {
            return out;
        }
        let spec = generator
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .next_request();
        out.push(ctx.execute(id, 0, spec).await);
    }
}

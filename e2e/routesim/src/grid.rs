//! The grid: workloads × loads × routers × seeds, each cell's figures with 95% intervals over
//! the seeds and the two bounds ([`crate::bounds`]). Load is a share of the cluster's
//! **no-cache capacity**: the request rate at which the pods would be busy all the time if
//! nothing were cached (every prompt token prefilled, every output token decoded alone); a
//! cache-aware router has headroom there, a cache-blind one saturates at 100%.

use crate::sim::{Cluster, Router, Sim};
use crate::stats::{Interval, RunFigures};
use crate::traffic::Traffic;
use loadgen::trace::{self, Replay};
use loadgen::workload::Workload;
use serde::Serialize;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A workload of the grid and its mean request size (tokens), for its capacity.
#[derive(Clone, Debug)]
pub struct Shape {
    pub name: String,
    pub workload: Workload,
    pub prompt_tokens: f64,
    pub output_tokens: f64,
    /// For a trace: the rate its own timestamps offer (requests/s); load scales its clock.
    pub trace_rate: Option<f64>,
}

/// What the grid runs.
#[derive(Clone, Debug)]
pub struct Plan {
    pub shapes: Vec<Shape>,
    /// Shares of the no-cache capacity.
    pub loads: Vec<f64>,
    pub routers: Vec<Router>,
    pub seeds: u64,
    pub cluster: Cluster,
    /// Seconds of arrivals per run, of which `warmup` are left out.
    pub secs: f64,
    pub warmup: f64,
    pub drain: f64,
    pub max_requests: usize,
    /// The routers the verdict judges, each against the best of the others.
    pub judged: Vec<String>,
}

/// One cell's figures over the seeds.
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    pub workload: String,
    pub load: f64,
    pub rate: f64,
    pub router: String,
    pub ttft_p50: Interval,
    pub ttft_p90: Interval,
    pub ttft_p99: Interval,
    pub e2e_p90: Interval,
    pub throughput: Interval,
    pub hit_rate: Interval,
    pub failed: Interval,
    /// The bounds, over the same seeds (they do not depend on the router).
    pub floor_p90: Interval,
    pub ideal_hit: Interval,
    pub oracle_hit: Interval,
    /// Virtual seconds simulated per wall second, over the cell's runs.
    pub speed: f64,
    /// Each seed's TTFT p90, in seed order: every router runs the same seeds (the same
    /// arrivals and prompts), so two routers compare seed by seed ([`crate::stats::paired_ratio`]).
    pub ttft_p90_runs: Vec<f64>,
}

impl Shape {
    /// Rate (requests/s) at which `cluster` is fully busy with nothing cached.
    pub fn capacity(&self, cluster: &Cluster) -> f64 {
        let t = &cluster.engine.timing;
        // The step overhead is shared by a batch: at capacity it is small beside the rest.
        let per_request = t.prefill_per_token.as_secs_f64() * self.prompt_tokens
            + t.decode_per_seq.as_secs_f64() * self.output_tokens;
        let speed: f64 = (0..cluster.pods)
            .map(|i| cluster.speeds.get(i).copied().unwrap_or(1.0))
            .sum::<f64>()
            * cluster.time_scale;
        speed / per_request.max(1e-9)
    }
}

/// Runs every cell; `progress` hears of each finished one.
pub fn run(plan: &Plan, mut progress: impl FnMut(&Cell)) -> anyhow::Result<Vec<Cell>> {
    let mut cells = Vec::new();
    for shape in &plan.shapes {
        for &load in &plan.loads {
            for router in &plan.routers {
                let cell = run_cell(plan, shape, load, router)?;
                progress(&cell);
                cells.push(cell);
            }
        }
    }
    Ok(cells)
}

/// One cell: every seed of `router` on `shape` at `load`, one seed per core at a time.
pub fn run_cell(plan: &Plan, shape: &Shape, load: f64, router: &Router) -> anyhow::Result<Cell> {
    let rate = load * shape.capacity(&plan.cluster);
    let started = Instant::now();
    let runs = on_workers(plan.seeds as usize, |i| {
        one_run(plan, shape, rate, router, i as u64 + 1)
    })?;
    let wall = started.elapsed().as_secs_f64().max(1e-9);
    let virtual_secs: f64 = runs.iter().map(|r| r.1).sum();
    let figures: Vec<RunFigures> = runs.into_iter().map(|r| r.0).collect();
    let over = |f: fn(&RunFigures) -> f64| Interval::of(&figures.iter().map(f).collect::<Vec<_>>());
    Ok(Cell {
        workload: shape.name.clone(),
        load,
        rate,
        router: router.name().to_owned(),
        ttft_p50: over(|f| f.ttft_ms.p50),
        ttft_p90: over(|f| f.ttft_ms.p90),
        ttft_p99: over(|f| f.ttft_ms.p99),
        e2e_p90: over(|f| f.e2e_ms.p90),
        throughput: over(|f| f.throughput),
        hit_rate: over(|f| f.hit_rate),
        failed: over(|f| f.failed as f64),
        floor_p90: over(|f| f.floor_ttft_ms.p90),
        ideal_hit: over(|f| f.ideal_hit_rate),
        oracle_hit: over(|f| f.oracle_hit_rate.unwrap_or(f64::NAN)),
        speed: virtual_secs / wall,
        ttft_p90_runs: figures.iter().map(|f| f.ttft_ms.p90).collect(),
    })
}

/// `job(0..n)` on as many threads as the machine has cores, results in order.
fn on_workers<T: Send>(
    n: usize,
    job: impl Fn(usize) -> anyhow::Result<T> + Sync,
) -> anyhow::Result<Vec<T>> {
    let workers = std::thread::available_parallelism()
        .map_or(1, |c| c.get())
        .min(n.max(1));
    let next = AtomicUsize::new(0);
    let done = Mutex::new(Vec::with_capacity(n));
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let r = job(i);
                done.lock().unwrap_or_else(|e| e.into_inner()).push((i, r));
            });
        }
    });
    let mut done = done.into_inner().unwrap_or_else(|e| e.into_inner());
    if done.len() < n {
        anyhow::bail!("a run panicked");
    }
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

fn one_run(
    plan: &Plan,
    shape: &Shape,
    rate: f64,
    router: &Router,
    seed: u64,
) -> anyhow::Result<(RunFigures, f64)> {
    let workload = at_rate(shape, rate, seed)?;
    let traffic = Traffic::plan(&workload, rate, plan.secs, plan.max_requests, seed);
    let drain = Duration::from_secs_f64(plan.drain);
    let sim = Sim::new(&plan.cluster, router, traffic, seed, drain)?;
    let virtual_secs = sim.end().as_secs_f64();
    let records = sim.run();
    Ok((RunFigures::of(&records, plan.warmup), virtual_secs))
}

/// The workload of one seed: a trace is the seed's own file (in the directory the shape
/// names), its clock scaled so that it offers `rate`.
fn at_rate(shape: &Shape, rate: f64, seed: u64) -> anyhow::Result<Workload> {
    Ok(match (&shape.workload, shape.trace_rate) {
        (Workload::Trace { path, replay }, Some(own)) => Workload::Trace {
            path: agentic_file(Path::new(path), seed)?,
            replay: Replay {
                time_scale: own / rate.max(1e-9),
                ..replay.clone()
            },
        },
        (w, _) => w.clone(),
    })
}

/// The real-time bench's workloads (`loadgen::bench::plan`), sized as there, plus agentic
/// sessions written as traces (one per seed) into `dir`.
pub fn standard_shapes(dir: &Path) -> Vec<Shape> {
    let shared = Workload::SharedPrefix {
        groups: 48,
        prompts_per_group: 16,
        system_len: 2000,
        question_len: 200,
        output_len: 50,
    };
    let chat = Workload::MultiTurn {
        sessions: 48,
        turns: 6,
        system_len: 1000,
        question_len: 150,
        output_len: 50,
    };
    let mix = Workload::LongShortMix {
        short_len: 200,
        long_fraction: 0.1,
        long_min: 1500,
        long_max: 8000,
        output_len: 50,
    };
    let random = Workload::Random {
        input_len: 1000,
        output_len: 50,
    };
    // Mean chat prompt: system + question + on average 2.5 earlier turns of question + answer.
    let chat_prompt = 1000.0 + 150.0 + 2.5 * 200.0;
    // Long/short: 10% Pareto(1500, 1.2) capped at 8000 (mean ≈ 4,300), the rest 200.
    let mix_prompt = 0.9 * 200.0 + 0.1 * 4300.0;
    vec![
        shape("shared-prefix", shared, 2200.0, 50.0),
        shape("multi-turn", chat, chat_prompt, 50.0),
        shape("long-short-mix", mix, mix_prompt, 50.0),
        shape("no-sharing", random, 1000.0, 50.0),
        agentic(dir),
    ]
}

fn shape(name: &str, workload: Workload, prompt: f64, output: f64) -> Shape {
    Shape {
        name: name.into(),
        workload,
        prompt_tokens: prompt,
        output_tokens: output,
        trace_rate: None,
    }
}

/// Agentic sessions: a shared 1,000-token system block, then 3,000 tokens of the session's
/// own (tools, documents), 8 turns each adding 500 (the answer and a tool output), 6 s
/// (exponential) of thinking between turns. 96 sessions hold ~700,000 tokens against 16,000
/// per pod: a session's blocks are evicted during its idle gaps unless it is placed well.
const AGENTIC: (usize, usize, usize, usize, usize, usize) = (96, 8, 1000, 4000, 500, 64);

fn agentic_entries(seed: u64) -> Vec<trace::TraceEntry> {
    let (sessions, turns, system, first, growth, output) = AGENTIC;
    let (stagger_ms, think_ms, block) = AGENTIC_PACE;
    trace::agentic(
        sessions, turns, system, first, growth, output, stagger_ms, think_ms, block, seed,
    )
}

/// The agentic sessions' pace: ms between session starts, mean think time, block size.
const AGENTIC_PACE: (f64, f64, usize) = (500.0, 6000.0, 16);

/// The agentic trace of `seed`, written once into `dir`. Its name carries the generator's
/// parameters as well as the seed, so a file an earlier version wrote with other parameters is
/// never read for this one (it was, and a sweep ran on stale sessions).
fn agentic_file(dir: &Path, seed: u64) -> anyhow::Result<String> {
    let (sessions, turns, system, first, growth, output) = AGENTIC;
    let (stagger_ms, think_ms, block) = AGENTIC_PACE;
    let shape = format!(
        "{sessions}x{turns}-{system}-{first}-{growth}-{output}-{stagger_ms}-{think_ms}-{block}"
    );
    let path = dir.join(format!("agentic-{shape}-{seed}.jsonl"));
    if !path.exists() {
        std::fs::create_dir_all(dir)?;
        let tmp = dir.join(format!("agentic-{seed}.jsonl.{}", std::process::id()));
        trace::write(&tmp, &agentic_entries(seed))?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(path.to_string_lossy().into_owned())
}

fn agentic(dir: &Path) -> Shape {
    let entries = agentic_entries(1);
    let n = entries.len().max(1) as f64;
    let span = entries.last().map_or(1.0, |e| e.timestamp / 1e3).max(1.0);
    let prompt = entries.iter().map(|e| e.input_length as f64).sum::<f64>() / n;
    Shape {
        name: "agentic".into(),
        workload: Workload::Trace {
            path: dir.to_string_lossy().into_owned(),
            replay: Replay {
                block_size: 16,
                tokens_per_block: 16,
                time_scale: 1.0,
            },
        },
        prompt_tokens: prompt,
        output_tokens: AGENTIC.5 as f64,
        trace_rate: Some(n / span),
    }
}

/// The cells as a markdown table: mean [95% interval] per figure.
pub fn markdown(cells: &[Cell]) -> String {
    let mut out = String::from(
        "| workload | load | rate | router | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | E2E p90 ms | tok/s | hit rate | floor p90 ms | oracle hit | ideal hit | failed |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for c in cells {
        out.push_str(&format!(
            "| {} | {:.0}% | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} |\n",
            c.workload,
            c.load * 100.0,
            c.rate,
            c.router,
            ms(&c.ttft_p50),
            ms(&c.ttft_p90),
            ms(&c.ttft_p99),
            ms(&c.e2e_p90),
            ms(&c.throughput),
            pct(&c.hit_rate),
            ms(&c.floor_p90),
            pct(&c.oracle_hit),
            pct(&c.ideal_hit),
            c.failed.mean,
        ));
    }
    out
}

fn ms(i: &Interval) -> String {
    format!("{:.0} [{:.0}–{:.0}]", i.mean, i.lo, i.hi)
}

fn pct(i: &Interval) -> String {
    if i.mean.is_nan() {
        return "n/a".into();
    }
    format!("{:.1}% [±{:.1}]", i.mean * 100.0, (i.hi - i.lo) * 50.0)
}

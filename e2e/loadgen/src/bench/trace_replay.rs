//! `trace-replay` (issue 20): a replayed multi-turn trace, the shape of the held-out production
//! trace of the issue — one shared system block, sessions of varying length whose prompts grow
//! every turn, send times from the file (open loop) — written by the bench itself in the
//! Mooncake format (`crate::trace`) and replayed by `loadgen --workload trace`.
//!
//! The trace is a window cut out of a longer stream: sessions start uniformly over
//! [−[`LEAD_S`], duration] and only the turns sent inside [0, duration] are kept, so the run opens
//! with conversations already under way (their first turn seen is a late one, in no pod's cache)
//! and ends with some unfinished, as a real capture does. Sessions come in four lengths (2, 4, 8
//! and 16 turns, as many of each); a turn adds [`GROWTH`] tokens (the answer and a tool output)
//! to the previous prompt; the session count is the smallest that offers `--random-rate` req/s
//! over the window.

use std::path::Path;

use super::compare::Scenario;
use super::plan::PlanOptions;
use crate::trace::{self, TraceEntry};

/// The scenario's name.
pub const NAME: &str = "trace-replay";
/// Seconds of the stream before the window opens.
pub const LEAD_S: f64 = 30.0;
/// Tokens a turn adds to the prompt.
pub const GROWTH: usize = 300;
const SYSTEM_LEN: usize = 2000;
const FIRST_LEN: usize = 2400;
const OUTPUT_LEN: usize = 64;
const THINK_MS: f64 = 6000.0;
const BLOCK: usize = 16;
const TURNS: [usize; 4] = [2, 4, 8, 16];
/// Hash ids of one length group are offset by this much times the group's rank (+1), so the
/// groups share the system block and nothing else.
const GROUP_STRIDE: u64 = 1 << 32;

/// The trace of `o`: `o.random_rate` req/s over `o.duration_s`, seeded by `o.seed`.
pub fn entries(o: &PlanOptions) -> Vec<TraceEntry> {
    let want = (o.random_rate * o.duration_s).ceil() as usize;
    // Bounded: one session more per length group each round.
    let mut out = Vec::new();
    for per_group in 1..=2_000 {
        out = window(per_group, o.duration_s, o.seed);
        if out.len() >= want {
            break;
        }
    }
    out
}

/// `per_group` sessions of each length, cut to the window [0, `duration_s`].
fn window(per_group: usize, duration_s: f64, seed: u64) -> Vec<TraceEntry> {
    let span_ms = (duration_s + LEAD_S) * 1e3;
    let stagger = span_ms / per_group as f64;
    let system_blocks = (SYSTEM_LEN / BLOCK) as u64;
    let mut out = Vec::new();
    for (g, turns) in TURNS.into_iter().enumerate() {
        let group = trace::agentic(
            per_group,
            turns,
            SYSTEM_LEN,
            FIRST_LEN,
            GROWTH,
            OUTPUT_LEN,
            stagger,
            THINK_MS,
            BLOCK,
            seed.wrapping_mul(31).wrapping_add(g as u64),
        );
        // The groups' sessions interleave: each group's starts are shifted by a quarter stagger.
        let shift = stagger * g as f64 / TURNS.len() as f64 - LEAD_S * 1e3;
        out.extend(group.into_iter().filter_map(|mut e| {
            e.timestamp = (e.timestamp + shift).round();
            for h in &mut e.hash_ids {
                if *h >= system_blocks {
                    *h += GROUP_STRIDE * (g as u64 + 1);
                }
            }
            (0.0..duration_s * 1e3).contains(&e.timestamp).then_some(e)
        }));
    }
    out.sort_by(|a, b| a.timestamp.total_cmp(&b.timestamp));
    out
}

/// The scenario, through `routers`; its trace file is written by [`write_trace`].
pub fn scenario(o: &PlanOptions, routers: &[super::routers::Router]) -> Scenario {
    let sim = super::plan::sim(o, 8);
    let drain = (o.duration_s / 2.0).clamp(5.0, 20.0);
    let loadgen_args = [
        "--workload",
        "trace",
        "--trace-block-size",
        "16",
        "--drain-secs",
        &drain.to_string(),
        "--warmup-secs",
        &o.warmup_s.to_string(),
        "--seed",
        "1",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    Scenario {
        name: NAME.into(),
        sim,
        loadgen_args,
        routers: routers.to_vec(),
        model: super::plan::MODEL.into(),
    }
}

/// Writes the trace of `s` (when it is the trace scenario) under `dir` and points its `loadgen`
/// at it; other scenarios are left as they are.
pub fn write_trace(s: &mut Scenario, o: &PlanOptions, dir: &Path) -> anyhow::Result<()> {
    if s.name != NAME {
        return Ok(());
    }
    let path = dir.join(format!("{NAME}-seed{}.jsonl", o.seed));
    trace::write(&path, &entries(o))?;
    let path = std::fs::canonicalize(&path)?;
    s.loadgen_args
        .extend(["--trace".to_owned(), path.display().to_string()]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::plan::Mode;

    fn opts(seed: u64) -> PlanOptions {
        PlanOptions {
            duration_s: 30.0,
            warmup_s: 8.0,
            seed,
            ..crate::bench::plan::tests::options(Mode::Full)
        }
    }

    #[test]
    fn the_window_offers_the_rate_with_sessions_of_every_length_sharing_only_the_system_block() {
        let t = entries(&opts(1));
        let n = t.len() as f64;
        assert!(
            (165.0..=190.0).contains(&n),
            "{n} requests for 5.5 req/s × 30 s"
        );
        assert!(t.iter().all(|e| (0.0..30_000.0).contains(&e.timestamp)));
        assert!(t.windows(2).all(|w| w[0].timestamp <= w[1].timestamp));
        let system = (SYSTEM_LEN / BLOCK) as u64;
        assert!(t
            .iter()
            .all(|e| e.hash_ids[..system as usize] == (0..system).collect::<Vec<_>>()[..]));
        // Every length group is present (its ids carry its stride), and some sessions are seen
        // from a late turn (prompts longer than a first turn's).
        for g in 1..=TURNS.len() as u64 {
            assert!(t
                .iter()
                .any(|e| e.hash_ids[system as usize] / GROUP_STRIDE == g));
        }
        assert!(t.iter().any(|e| e.input_length > FIRST_LEN + 3 * GROWTH));
        assert!(t.iter().any(|e| e.input_length == FIRST_LEN));
    }

    #[test]
    fn the_seed_changes_the_trace_and_the_same_seed_repeats_it() {
        assert_eq!(entries(&opts(1)), entries(&opts(1)));
        assert_ne!(entries(&opts(1)), entries(&opts(2)));
    }

    #[test]
    fn the_scenario_replays_the_written_trace() {
        let o = opts(3);
        let mut s = scenario(&o, &[]);
        let dir = std::env::temp_dir().join(format!("epp-trace-replay-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write_trace(&mut s, &o, &dir).unwrap();
        let at = s.loadgen_args.iter().position(|a| a == "--trace").unwrap();
        let written = trace::read(Path::new(&s.loadgen_args[at + 1])).unwrap();
        assert_eq!(written, entries(&o));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

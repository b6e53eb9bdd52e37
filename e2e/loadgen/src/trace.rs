//! Trace replay in the aiperf / Dynamo "mooncake" JSONL format, one request per line:
//!
//! ```json
//! {"timestamp": 1200, "input_length": 6755, "output_length": 500, "hash_ids": [46, 47, 48]}
//! ```
//!
//! `timestamp` is the send time in milliseconds from the start; `hash_ids` name the prompt's
//! fixed-size blocks (`block_size` tokens each, 512 in the Mooncake traces), so two requests whose
//! `hash_ids` start alike share that prompt prefix; the last block may be partial
//! (`input_length` ≤ blocks × block size). Replaying, block `h` becomes a seeded run of one-token
//! words (the same for every request naming `h`), `tokens_per_block` long (scale the trace's
//! token counts by `tokens_per_block / block_size`), and timestamps are multiplied by
//! `time_scale` (0.1 = ten times faster).
//!
//! [`agentic`] and [`rl_bursts`] write synthetic traces in the same format: multi-turn agent
//! sessions that resend most of the previous context, and RL-style bursts of the same prompt.

use std::io::{BufRead, Write};
use std::path::Path;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// One line of a trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceEntry {
    /// Send time, ms from the start of the trace.
    pub timestamp: f64,
    pub input_length: usize,
    pub output_length: usize,
    pub hash_ids: Vec<u64>,
}

/// How a trace is replayed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Replay {
    /// Tokens per hash block in the trace (Mooncake: 512).
    pub block_size: usize,
    /// Tokens per hash block when replayed.
    pub tokens_per_block: usize,
    /// Multiplies every timestamp (0.1 = ten times faster).
    pub time_scale: f64,
}

impl Replay {
    /// Prompt tokens of `e` when replayed.
    pub fn input_tokens(&self, e: &TraceEntry) -> usize {
        let scaled = (e.input_length as f64 * self.tokens_per_block as f64
            / self.block_size.max(1) as f64)
            .round() as usize;
        scaled.clamp(1, e.hash_ids.len().max(1) * self.tokens_per_block.max(1))
    }

    /// The prompt of `e`: block `h`'s words for each of its hash ids, cut at its length.
    pub fn prompt(&self, e: &TraceEntry) -> String {
        let want = self.input_tokens(e);
        let per = self.tokens_per_block.max(1);
        let mut s = String::with_capacity(want * 6);
        let mut left = want;
        for &h in &e.hash_ids {
            if left == 0 {
                break;
            }
            let n = left.min(per);
            let mut rng = SmallRng::seed_from_u64(h ^ 0x7ace_b10c);
            s.push_str(&super::workload::words(&mut rng, n));
            left -= n;
        }
        if left > 0 {
            // A trace line with no hash ids: words of its own.
            let mut rng = SmallRng::seed_from_u64(e.timestamp.to_bits());
            s.push_str(&super::workload::words(&mut rng, left));
        }
        s
    }

    /// Send offset of `e` in seconds.
    pub fn at_secs(&self, e: &TraceEntry) -> f64 {
        (e.timestamp * self.time_scale / 1e3).max(0.0)
    }
}

/// Reads a JSONL trace (blank lines skipped), sorted by timestamp.
pub fn read(path: &Path) -> anyhow::Result<Vec<TraceEntry>> {
    let f = std::fs::File::open(path)
        .map_err(|e| anyhow::anyhow!("opening trace {}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let e: TraceEntry = serde_json::from_str(&line)
            .map_err(|err| anyhow::anyhow!("{}:{}: {err}", path.display(), i + 1))?;
        out.push(e);
    }
    out.sort_by(|a, b| a.timestamp.total_cmp(&b.timestamp));
    Ok(out)
}

/// Writes `entries` as JSONL.
pub fn write(path: &Path, entries: &[TraceEntry]) -> anyhow::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    for e in entries {
        serde_json::to_writer(&mut f, e)?;
        f.write_all(b"\n")?;
    }
    f.flush()?;
    Ok(())
}

/// Multi-turn agentic sessions: each session starts with `first_len` tokens (a shared system
/// block of `system_len` tokens common to all sessions, then its own), and every turn resends
/// the whole previous input plus `growth` new tokens (the previous answer and tool output):
/// the previous turn's full blocks keep their hash ids, the rest get new ones. Sessions start
/// `stagger_ms` apart; turns follow after `think_ms` (exponential, seeded).
#[allow(clippy::too_many_arguments)]
pub fn agentic(
    sessions: usize,
    turns: usize,
    system_len: usize,
    first_len: usize,
    growth: usize,
    output_len: usize,
    stagger_ms: f64,
    think_ms: f64,
    block_size: usize,
    seed: u64,
) -> Vec<TraceEntry> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let block = block_size.max(1);
    let mut next_id: u64 = 0;
    let mut fresh = |n: usize| -> Vec<u64> {
        let v = (next_id..next_id + n as u64).collect();
        next_id += n as u64;
        v
    };
    let system_blocks = fresh(system_len / block);
    let mut out = Vec::new();
    for s in 0..sessions {
        let mut t = s as f64 * stagger_ms;
        let mut len = first_len.max(system_blocks.len() * block + 1);
        let mut ids = system_blocks.clone();
        ids.extend(fresh(len.div_ceil(block) - ids.len()));
        for _ in 0..turns {
            out.push(TraceEntry {
                timestamp: t.round(),
                input_length: len,
                output_length: output_len,
                hash_ids: ids.clone(),
            });
            // Next turn: keep the full blocks, replace the partial one, add the growth.
            ids.truncate(len / block);
            len += growth;
            let more = len.div_ceil(block) - ids.len();
            ids.extend(fresh(more));
            let u: f64 = rng.random_range(f64::EPSILON..1.0);
            t += -u.ln() * think_ms;
        }
    }
    out.sort_by(|a, b| a.timestamp.total_cmp(&b.timestamp));
    out
}

/// RL-style rollouts: `bursts` bursts `gap_ms` apart, each sending the same prompt
/// (`input_len` tokens, its own hash ids) `burst_size` times at once, outputs of
/// `output_len` ± 50% (seeded).
pub fn rl_bursts(
    bursts: usize,
    burst_size: usize,
    input_len: usize,
    output_len: usize,
    gap_ms: f64,
    block_size: usize,
    seed: u64,
) -> Vec<TraceEntry> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let block = block_size.max(1);
    let per = input_len.div_ceil(block) as u64;
    let mut out = Vec::new();
    for b in 0..bursts {
        let ids: Vec<u64> = (b as u64 * per..(b as u64 + 1) * per).collect();
        for _ in 0..burst_size {
            let out_len = (output_len as f64 * rng.random_range(0.5..1.5)).round() as usize;
            out.push(TraceEntry {
                timestamp: (b as f64 * gap_ms).round(),
                input_length: input_len,
                output_length: out_len.max(1),
                hash_ids: ids.clone(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use inference_sim::{Tokenizer, TokenizerKind};

    fn replay(tokens_per_block: usize) -> Replay {
        Replay {
            block_size: 512,
            tokens_per_block,
            time_scale: 0.5,
        }
    }

    #[test]
    fn a_mooncake_line_parses_and_shared_hash_ids_share_the_prompt_prefix() {
        let a: TraceEntry = serde_json::from_str(
            r#"{"timestamp": 1000, "input_length": 1200, "output_length": 10, "hash_ids": [1, 2, 3]}"#,
        )
        .unwrap();
        let b = TraceEntry {
            hash_ids: vec![1, 2, 9],
            ..a.clone()
        };
        let r = replay(16);
        // 1200 tokens at 512 per block, scaled to 16 per block: 37.5 → 38 tokens.
        assert_eq!(r.input_tokens(&a), 38);
        let (pa, pb) = (r.prompt(&a), r.prompt(&b));
        let tok = Tokenizer::new(TokenizerKind::Cl100kBase);
        assert_eq!(tok.encode(&pa).len(), 38);
        let (ta, tb) = (tok.encode(&pa), tok.encode(&pb));
        assert_eq!(ta[..32], tb[..32], "two shared blocks of 16 tokens");
        assert_ne!(ta[32..], tb[32..]);
        assert!((r.at_secs(&a) - 0.5).abs() < 1e-9);
    }

    #[test]
    fn agentic_turns_keep_the_previous_full_blocks_and_grow() {
        let one = agentic(1, 3, 1024, 1500, 700, 50, 100.0, 1000.0, 512, 1);
        assert_eq!(one.len(), 3);
        let (first, second) = (&one[0], &one[1]);
        assert_eq!(second.input_length, first.input_length + 700);
        let full = first.input_length / 512;
        assert_eq!(second.hash_ids[..full], first.hash_ids[..full]);
        assert_eq!(second.hash_ids.len(), second.input_length.div_ceil(512));
        let two = agentic(2, 3, 1024, 1500, 700, 50, 100.0, 1000.0, 512, 1);
        assert_eq!(two.len(), 6);
        // Every session starts with the two shared system blocks.
        assert!(two.iter().all(|e| e.hash_ids[..2] == [0, 1]));
        assert!(two.windows(2).all(|w| w[0].timestamp <= w[1].timestamp));
    }

    #[test]
    fn rl_bursts_repeat_one_prompt_per_burst_at_one_time() {
        let t = rl_bursts(3, 4, 1000, 100, 2000.0, 512, 1);
        assert_eq!(t.len(), 12);
        assert!(t[..4]
            .iter()
            .all(|e| e.hash_ids == t[0].hash_ids && e.timestamp == 0.0));
        assert_ne!(t[4].hash_ids, t[0].hash_ids);
        assert_eq!(t[4].timestamp, 2000.0);
        let dir = std::env::temp_dir().join(format!("epp-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rl.jsonl");
        write(&path, &t).unwrap();
        assert_eq!(read(&path).unwrap(), t);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

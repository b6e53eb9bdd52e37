//! Step planning: which sequences compute how many tokens, block allocation,
//! preemption, and the step's simulated duration (see the parent module).

use std::collections::HashSet;
use std::time::Duration;

use tokio::time::Instant;

use super::{Engine, FinishReason, KvTransfer, Seq, StepPlan};
use crate::kv_cache::CacheBlocks;

/// Outcome of trying to give one sequence its blocks.
enum Alloc {
    Done,
    NoRoom,
}

impl Engine {
    /// Plans the next step, or `None` when there is nothing to run.
    pub fn schedule(&mut self, now: Instant) -> Option<StepPlan> {
        self.reap_aborted(now);
        let mut budget = self.cfg.max_num_batched_tokens;
        self.schedule_running(&mut budget, now);
        self.schedule_waiting(&mut budget, now);
        if self.running.iter().all(|s| s.scheduled == 0) {
            self.abort_unschedulable(now);
            return None;
        }
        Some(self.plan())
    }

    fn schedule_running(&mut self, budget: &mut usize, now: Instant) {
        let mut i = 0;
        while i < self.running.len() && *budget > 0 {
            if self.running[i].ready_at.is_some_and(|t| t > now) {
                i += 1;
                continue;
            }
            self.running[i].ready_at = None;
            let want = self.running[i].tokens.len() - self.running[i].num_computed;
            let n = want.min(*budget);
            loop {
                match self.allocate(i, n) {
                    Alloc::Done => {
                        self.running[i].scheduled = n;
                        *budget -= n;
                        i += 1;
                        break;
                    }
                    Alloc::NoRoom => {
                        let last = self.running.len() - 1;
                        self.preempt_last();
                        if last == i {
                            return;
                        }
                    }
                }
            }
        }
    }

    /// vLLM FCFS preemption: the last running sequence loses its blocks and
    /// progress and goes back to the front of the waiting queue.
    fn preempt_last(&mut self) {
        if let Some(mut seq) = self.running.pop() {
            self.pool.free(&seq.table);
            seq.table.clear();
            seq.num_cached_blocks = 0;
            seq.num_computed = 0;
            seq.scheduled = 0;
            self.report.preemptions += 1;
            self.waiting.push_front(seq);
        }
    }

    fn schedule_waiting(&mut self, budget: &mut usize, now: Instant) {
        let mut loras: HashSet<String> = self
            .running
            .iter()
            .filter_map(|s| s.req.lora.as_ref().map(|l| l.name.clone()))
            .collect();
        let mut skipped = Vec::new();
        while *budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            let Some(mut seq) = self.waiting.pop_front() else {
                break;
            };
            if let Some(lora) = &seq.req.lora {
                if !loras.contains(&lora.name) && loras.len() >= self.cfg.max_loras {
                    skipped.push(seq);
                    continue;
                }
            }
            let hits = self.lookup_hits(&mut seq);
            let remote = self.remote_tokens(&seq);
            let n = (seq.tokens.len() - seq.num_computed - remote).min(*budget);
            if !self.fits(&seq, &hits, remote + n) {
                self.waiting.push_front(seq);
                break;
            }
            self.pool.touch(&hits);
            seq.table = hits;
            seq.num_cached_blocks = seq.table.len();
            seq.first_scheduled.get_or_insert(now);
            if let Some(lora) = &seq.req.lora {
                loras.insert(lora.name.clone());
            }
            self.running.push(seq);
            let i = self.running.len() - 1;
            if remote > 0 {
                if matches!(self.allocate(i, remote), Alloc::Done) {
                    self.start_pull(i, remote, now);
                }
            } else if matches!(self.allocate(i, n), Alloc::Done) {
                self.running[i].scheduled = n;
                *budget -= n;
            }
        }
        for seq in skipped.into_iter().rev() {
            self.waiting.push_front(seq);
        }
    }

    /// Prefix-cache lookup for a sequence with nothing computed: full blocks
    /// only, and at most `len - 1` tokens so the last token is recomputed.
    fn lookup_hits(&mut self, seq: &mut Seq) -> Vec<u32> {
        let bs = self.cfg.block_size;
        let max_blocks = (seq.tokens.len() - 1) / bs;
        let hits = self.pool.lookup_prefix(seq.hasher.hashes(), max_blocks);
        seq.num_computed = hits.len() * bs;
        self.report.prefix_queries += seq.tokens.len() as u64;
        self.report.prefix_hits += seq.num_computed as u64;
        seq.cached_tokens.get_or_insert(seq.num_computed);
        hits
    }

    /// Prompt tokens a remote-prefilled sequence pulls instead of computing: what the
    /// prefill pod holds beyond this pod's own hits, less the last prompt token (computed
    /// here to sample the first output token, as vLLM does).
    fn remote_tokens(&self, seq: &Seq) -> usize {
        let KvTransfer::RemotePrefill { blocks } = seq.req.kv else {
            return 0;
        };
        let held = (blocks * self.cfg.block_size).min(seq.tokens.len() - 1);
        held.saturating_sub(seq.num_computed)
    }

    /// The pulled tokens count as computed (and cached) once they land, at the configured
    /// bandwidth; the engine charges no prefill for them.
    fn start_pull(&mut self, i: usize, tokens: usize, now: Instant) {
        let (bytes, secs) = match &self.cfg.kv_transfer {
            Some(t) => t.transfer(tokens),
            None => (0.0, 0.0),
        };
        let wall = Duration::from_secs_f64(secs / self.cfg.time_scale);
        let seq = &mut self.running[i];
        seq.num_computed += tokens;
        seq.cached_tokens = Some(seq.num_computed);
        seq.ready_at = Some(now + wall);
        self.report.kv_transfers.push((secs, bytes));
    }

    fn fits(&self, seq: &Seq, hits: &[u32], n: usize) -> bool {
        let bs = self.cfg.block_size;
        let need = (seq.num_computed + n)
            .div_ceil(bs)
            .saturating_sub(hits.len());
        let free = self.pool.num_free() - self.pool.count_evictable(hits);
        need <= free
    }

    /// Gives running sequence `i` blocks for `n` more tokens and caches the
    /// blocks that those tokens fill.
    fn allocate(&mut self, i: usize, n: usize) -> Alloc {
        let bs = self.cfg.block_size;
        let seq = &self.running[i];
        let need = (seq.num_computed + n)
            .div_ceil(bs)
            .saturating_sub(seq.table.len());
        let Some(mut blocks) = self.pool.allocate(need) else {
            return Alloc::NoRoom;
        };
        let seq = &mut self.running[i];
        seq.table.append(&mut blocks);
        let full = ((seq.num_computed + n) / bs).min(seq.hasher.hashes().len());
        if full > seq.num_cached_blocks {
            let lora = seq.req.lora.as_ref().map(|l| (l.id, l.name.as_str()));
            self.pool.cache_blocks(CacheBlocks {
                table: &seq.table,
                hashes: seq.hasher.hashes(),
                tokens: &seq.tokens,
                from: seq.num_cached_blocks,
                to: full,
                lora,
            });
            seq.num_cached_blocks = full;
        }
        Alloc::Done
    }

    /// A waiting sequence that cannot run even on an idle engine (it needs
    /// more blocks than exist) would block the queue forever: abort it.
    fn abort_unschedulable(&mut self, now: Instant) {
        if self.running.is_empty() {
            if let Some(seq) = self.waiting.pop_front() {
                self.finish(seq, FinishReason::Abort, now, None);
            }
        }
    }

    fn plan(&mut self) -> StepPlan {
        let t = &self.cfg.timing;
        let (mut prefill, mut decode, mut context) = (0usize, 0usize, 0usize);
        for seq in self.running.iter().filter(|s| s.scheduled > 0) {
            let is_decode = seq.scheduled == 1
                && seq.output_len() > 0
                && seq.num_computed + 1 == seq.tokens.len();
            if is_decode {
                decode += 1;
            } else {
                prefill += seq.scheduled;
            }
            context += seq.num_computed + seq.scheduled;
        }
        self.report.scheduled_tokens += prefill + decode;
        let times = |d: Duration, n: usize| d.saturating_mul(u32::try_from(n).unwrap_or(u32::MAX));
        let duration = t.step_overhead
            + times(t.prefill_per_token, prefill)
            + times(t.decode_per_seq, decode)
            + times(t.attention_per_context_token, context);
        StepPlan {
            duration,
            prefill_tokens: prefill,
            decode_seqs: decode,
        }
    }
}

//! `burst-prefix-cache-producer` (llm-d v0.10, alpha): co-locates bursts of requests sharing a
//! prompt, so a shared prefix is prefilled once instead of on every replica of a cold pool
//! (the `n` samples of an RL rollout step arrive together, and a cache-state scorer sees no
//! replica holding any of them yet).
//!
//! Requests arriving within `windowDurationMs` of the first request of a window are held and
//! placed together when it closes ([`assign`]): identical prompts form a group, placed whole
//! (up to `maxPerReplica` a replica) on the least-loaded replica; with `minColocateBlocks` a
//! single request sharing that many leading blocks with another request of the window is
//! placed too, preferring a replica that holds the shared prefix while it is under its fair
//! share of the window (`balanceBy`: requests, or prefix blocks). A request is then scored as
//! a full prefix match on its replica and none elsewhere by the `prefix-cache-scorer` whose
//! `prefixMatchInfoProducerName` names this instance ([`crate::scheduling::gather`]).
//!
//! The prompt is cut into `blockSizeTokens` blocks of its tokens (a token-id prompt), or of
//! 4-byte pseudo-tokens of its text (llm-d's default `estimate` token producer), the last
//! block partial, chained from the model and `cache_salt`. A window holds at most
//! `maxBatchSize` requests: a request past it goes on at once without this affinity, as
//! upstream's director goes on when a data producer fails.

mod assign;

use crate::plugin::Invalid;
use crate::prefix::{chain_block, chain_seed};
use crate::request::Prompt;
use crate::scheduling::gather::{GatherError, Gathering, Placement, Seat, Ticket};
use crate::scheduling::lifecycle::{Lifecycle, Owned};
use assign::{Entry, Replica, Rules};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Leading blocks a prompt is cut into without `maxPrefixTokensToMatch` (upstream's cap).
const DEFAULT_MAX_BLOCKS: usize = 2048;
/// The longest window a request may be held for.
const MAX_WINDOW_MS: i64 = 10_000;
/// Bytes of text one pseudo-token stands for.
const BYTES_PER_TOKEN: usize = 4;

#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub(crate) struct BurstPrefixProducer {
    /// The window, ms (1..=10000): every request waits up to this long.
    pub(crate) window_duration_ms: i64,
    /// Requests of one group a replica takes at most; -1: the whole group on one replica.
    pub(crate) max_per_replica: i64,
    pub(crate) block_size_tokens: i64,
    /// Cap on the tokens cut into blocks; 0: 2048 blocks.
    pub(crate) max_prefix_tokens_to_match: i64,
    /// Shared leading blocks that co-locate distinct prompts; 0: identical prompts only.
    pub(crate) min_colocate_blocks: i64,
    /// Requests one window holds at most; -1: unlimited.
    pub(crate) max_batch_size: i64,
    /// `requests` or `tokens`: what a window balances across replicas.
    pub(crate) balance_by: String,
    #[serde(skip)]
    windows: Owned<Option<Arc<Window>>>,
}

impl Default for BurstPrefixProducer {
    fn default() -> Self {
        Self {
            window_duration_ms: 100,
            max_per_replica: -1,
            block_size_tokens: 64,
            max_prefix_tokens_to_match: 0,
            min_colocate_blocks: 0,
            max_batch_size: 1000,
            balance_by: "requests".into(),
            windows: Owned::default(),
        }
    }
}

impl BurstPrefixProducer {
    /// Checks every parameter (upstream's checks and words), reporting all problems at once.
    pub(crate) fn validate(mut self) -> Result<Self, Vec<Invalid>> {
        if self.balance_by.is_empty() {
            self.balance_by = "requests".into();
        }
        let (w, k, bs) = (
            self.window_duration_ms,
            self.max_per_replica,
            self.block_size_tokens,
        );
        let (cap, min, batch) = (
            self.max_prefix_tokens_to_match,
            self.min_colocate_blocks,
            self.max_batch_size,
        );
        let by = &self.balance_by;
        let too_small = format!("maxPrefixTokensToMatch ({cap}) must be 0 or >= blockSizeTokens ({bs}); a smaller positive value yields zero prefix blocks");
        let checks = [
            (
                w > 0,
                "windowDurationMs",
                format!("windowDurationMs must be > 0 (current value: {w})"),
            ),
            (
                w <= MAX_WINDOW_MS,
                "windowDurationMs",
                format!("windowDurationMs must be <= {MAX_WINDOW_MS} (current value: {w})"),
            ),
            (
                k == -1 || k >= 1,
                "maxPerReplica",
                format!("maxPerReplica must be -1 (unlimited) or >= 1 (current value: {k})"),
            ),
            (
                bs > 0,
                "blockSizeTokens",
                format!("blockSizeTokens must be > 0 (current value: {bs})"),
            ),
            (
                cap >= 0,
                "maxPrefixTokensToMatch",
                format!("maxPrefixTokensToMatch must be >= 0 (current value: {cap})"),
            ),
            (
                cap <= 0 || bs <= 0 || cap >= bs,
                "maxPrefixTokensToMatch",
                too_small,
            ),
            (
                min >= 0,
                "minColocateBlocks",
                format!("minColocateBlocks must be >= 0 (current value: {min})"),
            ),
            (
                batch == -1 || batch >= 1,
                "maxBatchSize",
                format!("maxBatchSize must be -1 (unlimited) or >= 1 (current value: {batch})"),
            ),
            (
                by == "requests" || by == "tokens",
                "balanceBy",
                format!("balanceBy must be \"requests\" or \"tokens\" (current value: {by:?})"),
            ),
        ];
        let bad: Vec<Invalid> = checks
            .into_iter()
            .filter(|(ok, _, _)| !ok)
            .map(|(_, parameter, message)| Invalid::new(parameter, message))
            .collect();
        match bad.is_empty() {
            true => Ok(self),
            false => Err(bad),
        }
    }

    fn window(&self) -> Duration {
        Duration::from_millis(self.window_duration_ms as u64)
    }

    fn block_size(&self) -> usize {
        self.block_size_tokens as usize
    }

    /// Leading blocks a prompt is cut into at most.
    fn max_blocks(&self) -> usize {
        match self.max_prefix_tokens_to_match {
            0 => DEFAULT_MAX_BLOCKS,
            cap => cap as usize / self.block_size(),
        }
    }

    fn rules(&self) -> Rules {
        Rules {
            per_replica: usize::try_from(self.max_per_replica).ok(),
            min_colocate: self.min_colocate_blocks as usize,
            by_tokens: self.balance_by == "tokens",
        }
    }

    /// The prompt's chained block hashes: blocks of its tokens (text: 4-byte pseudo-tokens,
    /// zero-padded), the last one partial, at most [`Self::max_blocks`].
    fn hashes(&self, g: &Gathering<'_>) -> Vec<u64> {
        let tokens: Vec<u32> = match g.prompt {
            Prompt::Tokens(t) => t.clone(),
            Prompt::Text(text) => text
                .as_bytes()
                .chunks(BYTES_PER_TOKEN)
                .map(|c| {
                    let mut b = [0u8; BYTES_PER_TOKEN];
                    b[..c.len()].copy_from_slice(c);
                    u32::from_le_bytes(b)
                })
                .collect(),
        };
        let mut parent = chain_seed(g.model, g.cache_salt);
        tokens
            .chunks(self.block_size())
            .take(self.max_blocks())
            .map(|block| {
                parent = chain_block(parent, block);
                parent
            })
            .collect()
    }

    /// Adds `entry` to the window open at `now` (a new one when the last has closed or was
    /// placed): the window and the entry's index in it. The producer's lock is held while
    /// the entry is added, so a window placed meanwhile takes no more.
    fn join(
        &self,
        now: Instant,
        entry: Entry,
        replicas: impl FnOnce() -> Vec<Replica>,
    ) -> Result<(Arc<Window>, usize), GatherError> {
        let mut open = self.windows.lock();
        if let Some(w) = open.as_ref().filter(|w| now < w.closes) {
            let batch = w.batch();
            if !batch.placed {
                let index = self.add(batch, entry, replicas)?;
                return Ok((Arc::clone(w), index));
            }
        }
        let w = Arc::new(Window {
            closes: now + self.window(),
            rules: self.rules(),
            batch: Mutex::default(),
        });
        *open = Some(Arc::clone(&w));
        let index = self.add(w.batch(), entry, replicas)?;
        Ok((w, index))
    }

    /// Adds `entry` to an open window's batch (the replicas from its first prompt): its index.
    fn add(
        &self,
        mut batch: std::sync::MutexGuard<'_, Batch>,
        entry: Entry,
        replicas: impl FnOnce() -> Vec<Replica>,
    ) -> Result<usize, GatherError> {
        if self.max_batch_size > 0 && batch.entries.len() >= self.max_batch_size as usize {
            return Err(GatherError::WindowFull {
                plugin: "burst prefix",
                max: self.max_batch_size as usize,
            });
        }
        if batch.replicas.is_empty() && !entry.hashes.is_empty() {
            batch.replicas = replicas();
        }
        batch.entries.push(entry);
        Ok(batch.entries.len() - 1)
    }
}

/// One window of requests, placed together by whichever of them asks first once it closed.
#[derive(Debug)]
struct Window {
    closes: Instant,
    rules: Rules,
    batch: Mutex<Batch>,
}

#[derive(Debug, Default)]
struct Batch {
    entries: Vec<Entry>,
    /// The candidates of the window's first request with a prompt: the replicas it places over.
    replicas: Vec<Replica>,
    placed: bool,
}

impl Window {
    fn batch(&self) -> std::sync::MutexGuard<'_, Batch> {
        self.batch.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A request's entry in a window.
#[derive(Debug)]
struct Held {
    window: Arc<Window>,
    entry: usize,
    instance: usize,
    block_size: usize,
}

impl Ticket for Held {
    fn placement(&self) -> Option<Placement> {
        let mut batch = self.window.batch();
        if !batch.placed {
            let Batch {
                entries, replicas, ..
            } = &mut *batch;
            assign::assign(entries, replicas, self.window.rules);
            batch.placed = true;
        }
        let entry = &batch.entries[self.entry];
        Some(Placement {
            instance: self.instance,
            endpoint: entry.assigned?,
            blocks: entry.hashes.len(),
            block_size: self.block_size,
        })
    }
}

impl Lifecycle for BurstPrefixProducer {
    fn gathers(&self) -> bool {
        true
    }

    fn gather(&self, g: &Gathering<'_>) -> Result<Option<Seat>, GatherError> {
        let entry = Entry {
            hashes: self.hashes(g),
            assigned: None,
        };
        let replicas = || {
            let name = |c: &crate::scheduling::Candidate| {
                g.names.name_of(c.id).unwrap_or_else(|| c.id.to_string())
            };
            g.candidates
                .iter()
                .map(|c| Replica {
                    id: c.id,
                    name: name(c),
                    running: c.metrics.as_ref().map_or(0.0, |m| m.running),
                })
                .collect()
        };
        let (window, entry) = self.join(g.now, entry, replicas)?;
        Ok(Some(Seat {
            until: window.closes,
            ticket: Box::new(Held {
                entry,
                instance: self.instance(),
                block_size: self.block_size(),
                window,
            }),
        }))
    }

    fn prompt_bytes(&self) -> usize {
        self.max_blocks() * self.block_size() * BYTES_PER_TOKEN
    }

    fn snapshot(&self) -> Option<serde_json::Value> {
        let open = self.windows.lock();
        let held = open.as_ref().map_or(0, |w| w.batch().entries.len());
        Some(serde_json::json!({
            "type": crate::plugin::PluginKind::BurstPrefixCacheProducer.name(),
            "lastWindowRequests": held,
        }))
    }

    fn instance(&self) -> usize {
        self.windows.instance()
    }
}

#[cfg(test)]
mod tests;

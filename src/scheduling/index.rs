//! What the scheduler's prefix plugins ask of the rest of epp, answered from their parameters
//! so nothing outside the scheduler names them: which prefix index to build, which tokenizer
//! it hashes with, and where the precise index's KV events come from.

use super::scorer::KvEventSockets;
use super::Scheduler;
use crate::prefix::source::{ApproximateParams, Config as PrefixConfig, PreciseParams};
use crate::request::tokenize::TokenizerSource;

impl Scheduler {
    /// The prefix index the scorers read (the precise one wins when both are configured), and
    /// the prompt text the approximate scorer and the lifecycle plugins read (0 without any).
    pub(crate) fn prefix_index(&self) -> (Option<PrefixConfig>, usize) {
        let approximate = self.prefix_params().map(|p| ApproximateParams {
            block_size: p.block_size_tokens,
            max_blocks: p.max_prefix_blocks_to_match,
            max_tokens: p.max_prefix_tokens_to_match,
            capacity: p.lru_capacity_per_server,
            auto_tune: p.auto_tune,
        });
        let floor = self.prefix_params().map_or(0, |p| {
            p.max_blocks(p.block_size_tokens) * p.block_size_tokens * 8
        });
        let read = self.hooks.iter().map(|h| h.prompt_bytes()).max();
        let floor = floor.max(read.unwrap_or(0));
        let precise = self.precise_params().map(|p| PreciseParams {
            block_size: p.block_size,
            max_blocks: p.max_prefix_blocks_to_match,
            speculative_ttl: p.speculative_indexing.then_some(p.speculative_ttl),
            credit_home: p.credit_home,
        });
        let config = precise
            .map(PrefixConfig::Precise)
            .or(approximate.map(PrefixConfig::Approximate));
        (config, floor)
    }

    /// The vocabulary the prefix index hashes with. A local tokenizer.json of the precise
    /// index must win: its block keys must equal the pods'.
    pub(crate) fn tokenizer_source(&self) -> Option<TokenizerSource> {
        let precise_hf = self
            .precise_params()
            .map(|p| p.tokenizer_source())
            .filter(|s| matches!(s, TokenizerSource::HuggingFace(_)));
        precise_hf
            .or_else(|| {
                self.prefix_params()
                    .map(|p| TokenizerSource::Tiktoken(p.tokenizer))
            })
            .or_else(|| self.precise_params().map(|p| p.tokenizer_source()))
    }

    /// Where the precise index's KV events come from (its `kvEventsConfig`), when one is
    /// configured.
    pub(crate) fn kv_event_sockets(&self) -> Option<KvEventSockets> {
        self.precise_params().map(|p| p.kv_event_sockets())
    }
}

//! The approximate index behind the prefix contract: blocks of the prompt text's tokens, salted
//! with `cache_salt`, recorded in the primary's LRU sized by its reported KV blocks.

use super::{Lookup, Pod, Pods, PrefixSource, Query};
use crate::prefix::block_hashes;
use crate::prefix::index::PrefixIndex;
use crate::request::tokenize::Vocabulary;
use crate::request::{estimated_tokens, ApiKind, Prompt};
use std::borrow::Cow;
use std::time::Instant;

/// The `prefix-cache-scorer` parameters the index uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApproximateParams {
    /// Tokens per block unless auto-tuned.
    pub(crate) block_size: usize,
    /// `maxPrefixBlocksToMatch`.
    pub(crate) max_blocks: usize,
    /// `maxPrefixTokensToMatch` (0 = unset; wins over `max_blocks` when set).
    pub(crate) max_tokens: usize,
    /// `lruCapacityPerServer`: blocks per endpoint unless auto-tuned.
    pub(crate) capacity: usize,
    /// Block size and capacity from what the pods report (`vllm:cache_config_info`).
    pub(crate) auto_tune: bool,
}

impl ApproximateParams {
    /// The most blocks a prompt is hashed into at `block_size`.
    fn blocks_at(&self, block_size: usize) -> usize {
        if self.max_tokens > 0 {
            self.max_tokens / block_size.max(1)
        } else {
            self.max_blocks
        }
    }
}

/// The approximate index with its parameters.
pub(crate) struct Approximate<'a> {
    pub(crate) index: &'a PrefixIndex,
    pub(crate) params: &'a ApproximateParams,
}

impl PrefixSource for Approximate<'_> {
    fn prompt_text_cap(&self) -> usize {
        let p = self.params;
        p.blocks_at(p.block_size) * p.block_size * 8
    }

    fn reads_whole_body(&self, _api: ApiKind) -> bool {
        false
    }

    fn lookup(&self, q: &Query<'_>, _now: Instant) -> Option<Lookup> {
        let p = self.params;
        let tuned = p
            .auto_tune
            .then(|| q.pods.iter().find_map(|pod| pod.cache))
            .flatten();
        let block_size = tuned.map_or(p.block_size, |c| c.block_size as usize);
        let max_blocks = p.blocks_at(block_size);
        let (tokens, pseudo_tokens) = match &q.request.prompt {
            Prompt::Tokens(t) => (Cow::Borrowed(t.as_slice()), false),
            Prompt::Text(text) => {
                let tokenizer = q.tokenizer?;
                let tokens = tokenizer.encode_prefix(text, max_blocks * block_size);
                (
                    Cow::Owned(tokens),
                    tokenizer.vocabulary() == Vocabulary::Characters,
                )
            }
        };
        let hashes = block_hashes(
            q.model,
            q.request.cache_salt.as_deref(),
            &tokens,
            block_size,
            max_blocks,
        );
        let matches = self.index.longest_prefix(&hashes);
        // A prompt hashed to the cap goes on past it: by its token count, or for text by the
        // body's size (the director's estimate of its length).
        let cap = max_blocks * block_size;
        let reached = max_blocks > 0 && hashes.len() == max_blocks;
        let past_cap = match &q.request.prompt {
            _ if !reached => 0,
            Prompt::Tokens(t) => t.len().saturating_sub(cap),
            Prompt::Text(_) => estimated_tokens(q.body.len()).saturating_sub(cap),
        };
        let tails = match hashes.last() {
            Some(last) if past_cap > 0 => self
                .index
                .tails_at(*last)
                .into_iter()
                .filter(|(id, _)| matches.contains(&(*id, hashes.len())))
                .map(|(id, blocks)| (id, blocks * block_size))
                .collect(),
            _ => Vec::new(),
        };
        Some(Lookup {
            hashes,
            prompt_tokens: tokens.len(),
            token_cap: cap,
            block_size,
            matches,
            credited: None,
            pseudo_tokens,
            past_cap,
            tails,
        })
    }

    fn room(&self, pods: &dyn Pods, block_size: usize) -> Vec<Option<usize>> {
        self.index
            .free_blocks(pods.iter().map(|p| p.id))
            .into_iter()
            .map(|blocks| blocks.map(|b| b * block_size))
            .collect()
    }

    /// With auto-tuning the LRU holds what the pod reports, converted to pseudo-blocks when the
    /// index counts pseudo-tokens; until their ratio is learned, the configured capacity.
    fn record(&self, lookup: &Lookup, primary: &Pod, _now: Instant) {
        let reported = primary.cache.filter(|_| self.params.auto_tune);
        let capacity = reported.map_or(self.params.capacity, |c| {
            let blocks = c.num_blocks as usize;
            if lookup.pseudo_tokens {
                self.index
                    .scale
                    .blocks(blocks)
                    .unwrap_or(self.params.capacity)
            } else {
                blocks
            }
        });
        let tail = lookup.past_cap.div_ceil(lookup.block_size.max(1));
        self.index
            .record_with_tail(primary.id, &lookup.hashes, tail, capacity);
    }
}

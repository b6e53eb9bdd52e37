//! The precise index behind the prefix contract: blocks of the tokens the pod will see (the
//! prompt as-is, or the rendered chat template) at the block size the pods announce, unsalted
//! (the pods' events carry no salt); a record is a speculative entry, shared with the other
//! replicas, until the pod's own event confirms it.

use super::{Lookup, PlacementSink, Pod, PrefixSource, Query};
use crate::prefix::block_hashes;
use crate::prefix::precise::home::{self, HomeCandidate};
use crate::prefix::precise::PreciseIndex;
use crate::request::{chat, ApiKind, Prompt};
use std::borrow::Cow;
use std::time::{Duration, Instant};

/// The `precise-prefix-cache-scorer` parameters the index uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreciseParams {
    /// Tokens per block until the pods announce theirs.
    pub(crate) block_size: usize,
    /// `maxPrefixBlocksToMatch`.
    pub(crate) max_blocks: usize,
    /// How long a routed prompt counts as held before its BlockStored arrives; `None`: routed
    /// prompts are not recorded (`speculativeIndexing: false`).
    pub(crate) speculative_ttl: Option<Duration>,
    /// Credit the part no endpoint holds to its rendezvous home ([`home`]): epp's
    /// `precise-prefix-cache-scorer` does; llm-d's split form (a `prefix-cache-scorer` scoring a
    /// `precise-prefix-cache-producer`) scores only what is held, as llm-d does.
    pub(crate) credit_home: bool,
}

/// The precise index with its parameters and where speculative entries are shared.
pub(crate) struct Precise<'a> {
    pub(crate) index: &'a PreciseIndex,
    pub(crate) params: &'a PreciseParams,
    pub(crate) sink: Option<&'a dyn PlacementSink>,
}

impl Precise<'_> {
    /// The pods' announced block size, else the configured one.
    fn block_size(&self) -> usize {
        match self.index.block_size() {
            0 => self.params.block_size,
            announced => announced,
        }
    }
}

impl PrefixSource for Precise<'_> {
    fn prompt_text_cap(&self) -> usize {
        self.params.max_blocks * self.block_size() * 8
    }

    /// A chat request's blocks come from its rendered template, which needs every message.
    fn reads_whole_body(&self, api: ApiKind) -> bool {
        api == ApiKind::ChatCompletions
    }

    fn lookup(&self, q: &Query<'_>, now: Instant) -> Option<Lookup> {
        let block_size = self.block_size();
        let max_tokens = self.params.max_blocks * block_size;
        let tokens = match (&q.request.prompt, q.request.api) {
            (Prompt::Tokens(t), _) => Cow::Borrowed(t.as_slice()),
            (_, ApiKind::ChatCompletions) => Cow::Owned(
                q.tokenizer?
                    .encode_prefix(&chat::render(q.body)?, max_tokens),
            ),
            (Prompt::Text(text), _) => Cow::Owned(q.tokenizer?.encode_prefix(text, max_tokens)),
        };
        let hashes = block_hashes(q.model, None, &tokens, block_size, self.params.max_blocks);
        let matches = self.index.longest_prefix(&hashes, now);
        // The part no endpoint holds goes to the same home in every replica (active-active).
        let credited = if self.params.credit_home {
            let shapes = self.index.shapes(q.pods.iter().map(|p| p.id), now);
            let candidates = q.pods.iter().zip(shapes).map(|(p, cache)| HomeCandidate {
                id: p.id,
                load: p.load,
                cache,
            });
            home::home(&hashes, &matches, candidates)
        } else {
            None
        };
        Some(Lookup {
            hashes,
            prompt_tokens: tokens.len(),
            token_cap: max_tokens,
            block_size,
            matches,
            credited,
            pseudo_tokens: false,
            past_cap: 0,
            tails: Vec::new(),
        })
    }

    fn record(&self, lookup: &Lookup, primary: &Pod, now: Instant) {
        let Some(ttl) = self.params.speculative_ttl else {
            return;
        };
        if lookup.hashes.is_empty() {
            return;
        }
        self.index.speculate(primary.id, &lookup.hashes, now, ttl);
        if let Some(sink) = self.sink {
            sink.placed(primary.id, &lookup.hashes, ttl);
        }
    }
}

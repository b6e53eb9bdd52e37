//! The one contract both prefix indexes keep, so the director reads and records a prefix without
//! knowing which index a configuration uses.
//!
//! Per request: [`PrefixSource::lookup`] once (tokenize, hash, match: the [`Lookup`]), then, after
//! the scheduler decided, [`PrefixSource::record`] once with the primary. What differs between
//! the indexes stays behind the contract: how the prompt is cut into blocks (block size from the
//! pods' `cache_config_info` or from their KV events; the chat template rendered or not), what a
//! record does (an LRU entry sized by the pod's cache, or a speculative entry that expires and is
//! shared with the other replicas), and the blocks credited to the precise index's "home".
//!
//! The configuration picks one ([`Config`], decided once when the configuration is built); a
//! request binds it to the app-owned [`Indexes`] ([`Config::bind`]). Both implementations run
//! the same table-driven test suite (`source/tests.rs`).

mod approximate;
mod precise;

pub(crate) use approximate::{Approximate, ApproximateParams};
pub(crate) use precise::{Precise, PreciseParams};

use super::index::PrefixIndex;
use super::precise::PreciseIndex;
use crate::endpoint::{CacheInfo, EndpointId};
use crate::request::tokenize::Tokenizer;
use crate::request::{ApiKind, LlmRequest};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A request as a prefix index reads it.
#[derive(Clone, Copy)]
pub(crate) struct Query<'a> {
    pub(crate) request: &'a LlmRequest,
    /// The body received: the precise index renders the chat template from it.
    pub(crate) body: &'a [u8],
    /// The model the request goes to (after any rewrite): it seeds the block chain.
    pub(crate) model: &'a str,
    /// The configuration's tokenizer; without one a text prompt has no blocks.
    pub(crate) tokenizer: Option<&'a Tokenizer>,
    /// The candidate endpoints, in snapshot order.
    pub(crate) pods: &'a dyn Pods,
}

/// The candidate endpoints as an index reads them: walked where they already are (the
/// director's candidates), never collected into a list per request.
pub(crate) trait Pods {
    /// How many candidates there are.
    fn count(&self) -> usize;
    /// The `i`-th candidate, `i < count()`.
    fn pod(&self, i: usize) -> Pod;
}

impl dyn Pods + '_ {
    /// The candidates in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = Pod> + '_ {
        (0..self.count()).map(|i| self.pod(i))
    }
}

impl Pods for Vec<Pod> {
    fn count(&self) -> usize {
        self.len()
    }
    fn pod(&self, i: usize) -> Pod {
        self[i]
    }
}

/// What an index weighs of a candidate besides what it holds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Pod {
    pub(crate) id: EndpointId,
    /// Waiting + running requests as last scraped (0 without metrics).
    pub(crate) load: f64,
    /// The KV-cache geometry the pod reports, if any.
    pub(crate) cache: Option<CacheInfo>,
}

/// What an index answered for one request: the same shape from both, and no mode flags.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Lookup {
    /// The prompt's block keys, at most the match cap of them.
    pub(crate) hashes: Vec<u64>,
    /// Prompt tokens tokenized (up to the match cap): the request's prefill size.
    pub(crate) prompt_tokens: usize,
    /// The match cap in tokens: a prompt tokenized up to it is longer than `prompt_tokens`.
    pub(crate) token_cap: usize,
    pub(crate) block_size: usize,
    /// The longest consecutive prefix each endpoint holds, in blocks; endpoints holding none
    /// are absent.
    pub(crate) matches: Vec<(EndpointId, usize)>,
    /// An endpoint credited with blocks it does not hold yet (the precise index's home for the
    /// part nobody holds, [`super::precise::home`]): scored as held, never reported as a hit.
    pub(crate) credited: Option<(EndpointId, usize)>,
    /// `prompt_tokens` and the blocks count 4-byte pseudo-tokens (`tokenizer: characters`),
    /// not the model server's tokens: see [`super::index::TokenScale`].
    pub(crate) pseudo_tokens: bool,
    /// Tokens of the prompt past the match cap (not hashed; estimated from the body's size
    /// for a text prompt): 0 for a prompt shorter than the cap.
    pub(crate) past_cap: usize,
    /// Tokens past the cap each endpoint holding every hashed block was last sent after them
    /// (the approximate index's [`super::index::PrefixIndex::tails_at`]); empty otherwise.
    pub(crate) tails: Vec<(EndpointId, usize)>,
}

impl Lookup {
    /// Tokens past the cap `id` is taken to hold of this prompt: as far as both this prompt and
    /// the one last sent there after the same capped prefix go. An assumption, not a
    /// measurement: the cap is where hashing stops, so a prompt that diverges from the last one
    /// only past the cap looks held to its end (a conversation that grows past the cap, a long
    /// document asked about again, is held as credited).
    pub(crate) fn held_past_cap(&self, id: EndpointId) -> usize {
        self.tails
            .iter()
            .find(|(e, _)| *e == id)
            .map_or(0, |(_, t)| (*t).min(self.past_cap))
    }

    /// Blocks `id` holds.
    pub(crate) fn held(&self, id: EndpointId) -> usize {
        self.matches
            .iter()
            .find(|(e, _)| *e == id)
            .map_or(0, |(_, n)| *n)
    }

    /// Blocks `id` is scored with: held, or credited when that is more.
    pub(crate) fn scored(&self, id: EndpointId) -> usize {
        let credited = self
            .credited
            .filter(|(e, _)| *e == id)
            .map_or(0, |(_, n)| n);
        self.held(id).max(credited)
    }
}

/// The contract of a prefix index, as a request sees it.
pub(crate) trait PrefixSource {
    /// Bytes of prompt text the lookup reads (parsing must keep at least this much).
    fn prompt_text_cap(&self) -> usize;
    /// Whether the lookup of an `api` request needs the whole body, not a prompt prefix.
    fn reads_whole_body(&self, api: ApiKind) -> bool;
    /// The prompt's blocks and who holds them; `None` when the prompt cannot be tokenized.
    fn lookup(&self, query: &Query<'_>, now: Instant) -> Option<Lookup>;
    /// The decision: `lookup`'s prompt went to `primary`.
    fn record(&self, lookup: &Lookup, primary: &Pod, now: Instant);
    /// Tokens (of `block_size`-token blocks) each of `pods` has room for before what this index
    /// recorded there is evicted, in their order; `None` for a pod nothing was recorded on.
    /// Empty from an index that does not size itself to the pods' caches (the precise one).
    /// Asked only by a scheduler that prices eviction ([`crate::scheduling::scorer::PrefillLoad::cache_free_tokens`]).
    fn room(&self, _pods: &dyn Pods, _block_size: usize) -> Vec<Option<usize>> {
        Vec::new()
    }
}

/// Which index a configuration scores with, and its parameters.
#[derive(Clone, Debug, PartialEq)]
pub enum Config {
    /// `prefix-cache-scorer` (or the approximate producer): what epp routed.
    Approximate(ApproximateParams),
    /// `precise-prefix-cache-scorer`: what the pods' KV-cache events say they hold.
    Precise(PreciseParams),
}

impl Config {
    /// This configuration's index, for one request. `sink` also receives the precise index's
    /// speculative entries (the other replicas).
    pub(crate) fn bind<'a>(
        &'a self,
        indexes: &'a Indexes,
        sink: Option<&'a dyn PlacementSink>,
    ) -> Source<'a> {
        match self {
            Self::Approximate(params) => Source::Approximate(Approximate {
                index: &indexes.approximate,
                params,
            }),
            Self::Precise(params) => Source::Precise(Precise {
                index: &indexes.precise,
                params,
                sink,
            }),
        }
    }
}

/// A bound [`Config`]: one of the two implementations.
pub(crate) enum Source<'a> {
    Approximate(Approximate<'a>),
    Precise(Precise<'a>),
}

impl Source<'_> {
    fn inner(&self) -> &dyn PrefixSource {
        match self {
            Self::Approximate(a) => a,
            Self::Precise(p) => p,
        }
    }
}

impl PrefixSource for Source<'_> {
    fn prompt_text_cap(&self) -> usize {
        self.inner().prompt_text_cap()
    }
    fn reads_whole_body(&self, api: ApiKind) -> bool {
        self.inner().reads_whole_body(api)
    }
    fn lookup(&self, query: &Query<'_>, now: Instant) -> Option<Lookup> {
        self.inner().lookup(query, now)
    }
    fn record(&self, lookup: &Lookup, primary: &Pod, now: Instant) {
        self.inner().record(lookup, primary, now);
    }
    fn room(&self, pods: &dyn Pods, block_size: usize) -> Vec<Option<usize>> {
        self.inner().room(pods, block_size)
    }
}

/// Both prefix indexes. `app` owns them: the director reads and records, the KV-event
/// subscribers write the precise one, the metrics port reports their sizes, and a task owned by
/// `app` forgets endpoints that left the pool ([`Indexes::retain`]).
#[derive(Default)]
pub struct Indexes {
    pub(crate) approximate: Arc<PrefixIndex>,
    pub precise: Arc<PreciseIndex>,
}

impl Indexes {
    /// Forgets the entries of endpoints not in `live`.
    pub(crate) fn retain(&self, live: &HashSet<EndpointId>) {
        self.approximate.retain(live);
        self.precise.retain(live);
    }
}

/// Told of every speculative entry the precise index records, so other epp replicas can record
/// it too. Must not block: it runs on the request path.
pub trait PlacementSink: Send + Sync {
    fn placed(&self, endpoint: EndpointId, keys: &[u64], ttl: Duration);
}

#[cfg(test)]
mod tests;

//! Scorers: rate each candidate in [0, 1] (higher is better). One per file under `scorer/`.

mod active_request;
mod context_length_aware;
mod endpoint_attribute;
mod estimated_ttft;
mod gathered;
mod gpu_utilization;
mod header_label_affinity;
mod kv_cache;
mod latency;
mod latency_observation;
mod load_aware;
mod lora_affinity;
mod mm_embeddings;
mod mrl;
mod multicluster_kv_cache;
mod multicluster_queue;
mod network_cost;
mod no_hit_lru;
mod precise_prefix;
mod prefix;
mod queue;
mod running_requests;
mod session_affinity;
mod token_load;
mod topology_affinity;

use super::{Candidate, SchedulingRequest};
use crate::plugin::{Parameters, PluginKind};
pub(crate) use active_request::ActiveRequestScorer;
pub use context_length_aware::ContextLengthAware;
pub(crate) use endpoint_attribute::EndpointAttributeScorer;
pub use estimated_ttft::{EstimatedTtftScorer, PrefillLoad, TtftInputs, TtftRates};
pub(crate) use gathered::GatheredScorer;
pub(crate) use gpu_utilization::GpuUtilizationScorer;
pub(crate) use header_label_affinity::HeaderLabelAffinityScorer;
pub(crate) use kv_cache::KvCacheScorer;
pub(crate) use latency::{LatencyEstimate, LatencyScorer};
pub(crate) use latency_observation::LatencyObservationScorer;
pub(crate) use load_aware::LoadAwareScorer;
pub(crate) use lora_affinity::LoraAffinityScorer;
pub(crate) use mm_embeddings::MmEmbeddingsScorer;
pub(crate) use mrl::MrlScorer;
pub(crate) use multicluster_kv_cache::MulticlusterKvCacheScorer;
pub(crate) use multicluster_queue::MulticlusterQueueScorer;
pub(crate) use network_cost::NetworkCostScorer;
pub(crate) use no_hit_lru::NoHitLruScorer;
pub(crate) use precise_prefix::{KvEventSockets, PrecisePrefixParams, PrecisePrefixScorer};
pub(crate) use prefix::{PrefixParams, PrefixScorer};
pub(crate) use queue::QueueScorer;
pub(crate) use running_requests::RunningRequestsScorer;
#[cfg(test)]
pub(crate) use session_affinity::SessionIdConfig;
pub use session_affinity::{decode_token, encode_token};
pub(crate) use session_affinity::{
    Pin, SessionAffinityParams, SessionAffinityScorer, SESSION_HEADER,
};
pub(crate) use token_load::TokenLoadScorer;
pub use topology_affinity::{TopologyAffinityScorer, TopologyAffinityScorerParams};

/// Every scorer epp knows; [`Scorer::from_plugin`] builds each from its plugin's parameters.
#[derive(Clone, Debug)]
pub enum Scorer {
    Queue(QueueScorer),
    KvCache(KvCacheScorer),
    Prefix(PrefixScorer),
    /// Boxed: its parameters make it several times larger than every other scorer.
    PrecisePrefix(Box<PrecisePrefixScorer>),
    LoraAffinity(LoraAffinityScorer),
    RunningRequests(RunningRequestsScorer),
    Latency(LatencyScorer),
    SessionAffinity(SessionAffinityScorer),
    GpuUtilization(GpuUtilizationScorer),
    EstimatedTtft(EstimatedTtftScorer),
    TokenLoad(TokenLoadScorer),
    ActiveRequest(ActiveRequestScorer),
    LoadAware(LoadAwareScorer),
    NoHitLru(NoHitLruScorer),
    HeaderLabelAffinity(HeaderLabelAffinityScorer),
    /// Also a filter when `enableFiltering` ([`Scorer::as_filter`]).
    ContextLength(ContextLengthAware),
    /// A hub's clusters by their pool's average queue.
    MulticlusterQueue(MulticlusterQueueScorer),
    /// A hub's clusters by their pool's average KV-cache utilization.
    MulticlusterKvCache(MulticlusterKvCacheScorer),
    /// A hub's clusters by estimated TTFT plus the round trip to them.
    NetworkCost(NetworkCostScorer),
    TopologyAffinity(TopologyAffinityScorer),
    /// TTFT predicted at the current load from a latency observer's curve.
    LatencyObservation(Box<LatencyObservationScorer>),
    /// Expected remaining in-flight work from a sojourn observer's digests.
    Mrl(Box<MrlScorer>),
    MmEmbeddings(Box<MmEmbeddingsScorer>),
    EndpointAttribute(EndpointAttributeScorer),
    /// `prefix-cache-scorer` scoring a gathering producer's placements (its
    /// `prefixMatchInfoProducerName` names one): put in its place when profiles are built.
    Gathered(GatheredScorer),
}

impl Scorer {
    /// The scorer a `kind` plugin configures, from its parameters, decoded and checked (`None`
    /// when `kind` is no scorer). The configuration decoder calls this for every plugin.
    pub(crate) fn from_plugin<P: Parameters>(
        kind: PluginKind,
        p: &P,
    ) -> Result<Option<Self>, P::Error> {
        use PluginKind as K;
        Ok(Some(match kind {
            K::QueueScorer => Self::Queue(p.decode()?),
            K::KvCacheUtilizationScorer => Self::KvCache(p.decode()?),
            // The hub's prefix scorer is this one (llm-d: "delegates without change"): a hub's
            // candidates are its clusters, so the index keys on clusters.
            K::PrefixCacheScorer | K::MulticlusterPrefixCacheScorer => {
                Self::Prefix(PrefixScorer::new(prefix_params(p)?))
            }
            K::PrecisePrefixCacheScorer => {
                let params = p.decode::<PrecisePrefixParams>()?.validate()?;
                Self::PrecisePrefix(Box::new(PrecisePrefixScorer::new(params)))
            }
            K::LoraAffinityScorer => Self::LoraAffinity(p.decode()?),
            K::RunningRequestsSizeScorer => Self::RunningRequests(p.decode()?),
            K::LatencyScorer => Self::Latency(p.decode()?),
            K::SessionAffinityScorer => {
                Self::SessionAffinity(p.decode::<SessionAffinityScorer>()?.validate()?)
            }
            K::GpuUtilizationScorer => {
                Self::GpuUtilization(p.decode::<GpuUtilizationScorer>()?.validate()?)
            }
            K::EstimatedTtftScorer => {
                Self::EstimatedTtft(p.decode::<EstimatedTtftScorer>()?.validate()?)
            }
            K::TokenLoadScorer => Self::TokenLoad(p.decode::<TokenLoadScorer>()?.validate()?),
            K::ActiveRequestScorer => {
                Self::ActiveRequest(p.decode::<ActiveRequestScorer>()?.validate()?)
            }
            K::LoadAwareScorer => Self::LoadAware(p.decode::<LoadAwareScorer>()?.validate()?),
            K::NoHitLruScorer => Self::NoHitLru(p.decode::<NoHitLruScorer>()?.validate()?),
            K::HeaderLabelAffinityScorer => {
                Self::HeaderLabelAffinity(p.decode::<HeaderLabelAffinityScorer>()?.validate()?)
            }
            K::ContextLengthAware => {
                Self::ContextLength(p.decode::<ContextLengthAware>()?.validate()?)
            }
            K::TopologyAffinityScorer => {
                Self::TopologyAffinity(p.decode::<TopologyAffinityScorerParams>()?.into())
            }
            K::EndpointAttributeScorer => {
                Self::EndpointAttribute(p.decode::<EndpointAttributeScorer>()?.validate()?)
            }
            K::MulticlusterQueueScorer => Self::MulticlusterQueue(p.decode()?),
            K::MulticlusterKvCacheUtilizationScorer => Self::MulticlusterKvCache(p.decode()?),
            K::NetworkCostScorer => Self::NetworkCost(p.decode::<NetworkCostScorer>()?.validate()?),
            K::LatencyObservationScorerHub => Self::LatencyObservation(Box::new(
                p.decode::<LatencyObservationScorer>()?.validate()?,
            )),
            K::MrlScorerHub => Self::Mrl(Box::new(p.decode::<MrlScorer>()?.validate()?)),
            K::MmEmbeddingsCacheScorer => Self::MmEmbeddings(Box::new(p.decode()?)),
            _ => return Ok(None),
        }))
    }

    /// Writes one score per candidate of `pool` into `out` (same length).
    pub(crate) fn score(
        &self,
        req: &SchedulingRequest<'_>,
        pool: &[&Candidate],
        out: &mut [f64],
        rng: &mut impl rand::Rng,
    ) {
        match self {
            Self::Queue(s) => s.score(pool, out),
            Self::KvCache(s) => s.score(pool, out),
            Self::Prefix(s) => s.score(req, pool, out),
            Self::PrecisePrefix(s) => s.score(req, pool, out),
            Self::LoraAffinity(s) => s.score(req, pool, out),
            Self::RunningRequests(s) => s.score(pool, out),
            Self::Latency(s) => s.score(pool, out),
            Self::SessionAffinity(s) => s.score(req, pool, out),
            Self::GpuUtilization(s) => s.score(pool, out),
            Self::EstimatedTtft(s) => s.score(req, pool, out),
            Self::TokenLoad(s) => s.score(req, pool, out),
            Self::ActiveRequest(s) => s.score(pool, out),
            Self::LoadAware(s) => s.score(pool, out),
            Self::NoHitLru(s) => s.score(req, pool, out),
            Self::HeaderLabelAffinity(s) => s.score(req, pool, out),
            Self::ContextLength(s) => s.score(req, pool, out),
            Self::MulticlusterQueue(s) => s.score(pool, out),
            Self::MulticlusterKvCache(s) => s.score(pool, out),
            Self::NetworkCost(s) => s.score(req, pool, out),
            Self::TopologyAffinity(s) => s.score(req, pool, out),
            Self::LatencyObservation(s) => s.score(pool, out, rng),
            Self::Mrl(s) => s.score(req, pool, out, rng),
            Self::MmEmbeddings(s) => s.score(req, pool, out),
            Self::EndpointAttribute(s) => s.score(pool, out),
            Self::Gathered(s) => s.score(req, pool, out),
        }
    }

    /// The producer whose learned state this scorer reads: its kind and the instance the
    /// configuration names (`None`: the one configured). The scheduler binds it
    /// ([`Scorer::bind`]) when it is assembled.
    pub(crate) fn reads_producer(&self) -> Option<(PluginKind, Option<&str>)> {
        match self {
            Self::LatencyObservation(s) => {
                Some((PluginKind::LatencyObserverProducerHub, s.producer_name()))
            }
            Self::Mrl(s) => Some((PluginKind::SojournTimeObserverHub, s.producer_name())),
            Self::MmEmbeddings(s) => {
                Some((PluginKind::MmEmbeddingsCacheProducer, s.producer_name()))
            }
            _ => None,
        }
    }

    /// This scorer reading `observer`'s state (`None`: not the producer it reads).
    pub(crate) fn bind(&self, observer: &super::producer::Observer) -> Option<Self> {
        use super::producer::Observer as O;
        match (self, observer) {
            (Self::LatencyObservation(s), O::Latency(o)) => {
                let mut s = s.clone();
                s.observer = Some(o.clone());
                Some(Self::LatencyObservation(s))
            }
            (Self::Mrl(s), O::Sojourn(o)) => {
                let mut s = s.clone();
                s.observer = Some(o.clone());
                Some(Self::Mrl(s))
            }
            (Self::MmEmbeddings(s), O::MmEmbeddings(o)) => {
                let mut s = s.clone();
                s.producer = Some(o.clone());
                Some(Self::MmEmbeddings(s))
            }
            _ => None,
        }
    }

    /// The filter half of a plugin that is both (`context-length-aware`).
    pub(crate) fn as_filter(&self) -> Option<super::filter::Filter> {
        match self {
            Self::ContextLength(s) if s.enable_filtering => {
                Some(super::filter::Filter::ContextLength(s.clone()))
            }
            _ => None,
        }
    }

    /// The scorer's part in the request lifecycle, if it keeps state or writes headers.
    pub(crate) fn lifecycle(&self) -> Option<std::sync::Arc<dyn super::lifecycle::Lifecycle>> {
        match self {
            Self::SessionAffinity(s) => Some(std::sync::Arc::new(s.params.clone())),
            Self::NoHitLru(s) => Some(std::sync::Arc::new(s.clone())),
            Self::HeaderLabelAffinity(s) => Some(std::sync::Arc::new(s.clone())),
            _ => None,
        }
    }

    /// Whether this scorer reads the candidates' labels.
    /// Whether this scorer reads the body's multimodal items.
    pub(crate) fn reads_multimodal_items(&self) -> bool {
        matches!(self, Self::MmEmbeddings(_))
    }

    pub(crate) fn reads_labels(&self) -> bool {
        matches!(
            self,
            Self::ContextLength(_)
                | Self::TopologyAffinity(_)
                | Self::HeaderLabelAffinity(_)
                | Self::NetworkCost(_)
        )
    }

    pub(crate) fn prefix_params(&self) -> Option<&PrefixParams> {
        match self {
            Self::Prefix(s) => Some(&s.params),
            _ => None,
        }
    }

    pub(crate) fn precise_params(&self) -> Option<&PrecisePrefixParams> {
        match self {
            Self::PrecisePrefix(s) => Some(&s.params),
            _ => None,
        }
    }
}

/// `prefix-cache-scorer`'s (and the approximate producer's) parameters: the legacy character
/// `blockSize` is accepted only beside `blockSizeTokens`.
pub(crate) fn prefix_params<P: Parameters>(p: &P) -> Result<PrefixParams, P::Error> {
    let explicit_tokens = p.names("blockSizeTokens");
    Ok(p.decode::<PrefixParams>()?.validate(explicit_tokens)?)
}

/// Min-max normalisation where less is better: the smallest value scores 1, the largest 0, all
/// equal scores 1. Shared by the queue, running-requests, latency-observation and MRL scorers.
pub(crate) fn min_max_inverse(values: impl Iterator<Item = f64> + Clone, out: &mut [f64]) {
    let (lo, hi) = values
        .clone()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    for (o, v) in out.iter_mut().zip(values) {
        *o = if hi > lo { (hi - v) / (hi - lo) } else { 1.0 };
    }
}

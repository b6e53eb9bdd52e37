//! Data producers: plugins that watch requests go by and keep what they learn, at the request
//! lifecycle's points ([`super::lifecycle`]), for other plugins and operators to read; and the
//! request-control plugins that act at those points (the rollout screener, the attribute
//! reporter). One per file under `producer/`.

mod attribute_reporter;
mod burst_prefix;
mod latency_observer;
mod mm_embeddings;
mod rollout_screener;
mod session_state;
mod sojourn_observer;

use super::lifecycle::Lifecycle;
use crate::plugin::{Parameters, PluginKind};
use attribute_reporter::AttributeReporterParams;
use burst_prefix::BurstPrefixProducer;
pub(crate) use latency_observer::LatencyObserver;
pub(crate) use latency_observer::Percentiles;
pub(crate) use mm_embeddings::MmEmbeddingsCache;
use rollout_screener::RolloutScreener;
pub(crate) use session_state::SessionStateProducer;
pub(crate) use sojourn_observer::Sojourn;
pub use sojourn_observer::SojournObserver;
use std::sync::Arc;

/// A producer whose learned state a scorer reads (the scorer names it by instance), shared
/// with the producer's lifecycle: [`Lifecycle::observer`].
#[derive(Clone, Debug)]
pub enum Observer {
    Latency(LatencyObserver),
    Sojourn(SojournObserver),
    MmEmbeddings(MmEmbeddingsCache),
}

impl Observer {
    /// The producer's kind, which a scorer's reference must match.
    pub(crate) fn kind(&self) -> PluginKind {
        match self {
            Self::Latency(_) => PluginKind::LatencyObserverProducerHub,
            Self::Sojourn(_) => PluginKind::SojournTimeObserverHub,
            Self::MmEmbeddings(_) => PluginKind::MmEmbeddingsCacheProducer,
        }
    }
}

/// The producer a `kind` plugin configures, from its parameters, decoded and checked (`None`
/// when `kind` is no producer of this kind). The configuration decoder calls this for every
/// plugin.
pub(crate) fn from_plugin<P: Parameters>(
    kind: PluginKind,
    p: &P,
) -> Result<Option<Arc<dyn Lifecycle>>, P::Error> {
    Ok(Some(match kind {
        PluginKind::SessionStateProducer => {
            Arc::new(p.decode::<SessionStateProducer>()?.validate()?)
        }
        PluginKind::LatencyObserverProducerHub => {
            Arc::new(p.decode::<LatencyObserver>()?.validate()?)
        }
        PluginKind::SojournTimeObserverHub => Arc::new(p.decode::<SojournObserver>()?.validate()?),
        PluginKind::MmEmbeddingsCacheProducer => {
            Arc::new(p.decode::<MmEmbeddingsCache>()?.validate()?)
        }
        PluginKind::RequestAttributeReporter => {
            Arc::new(p.decode::<AttributeReporterParams>()?.validate()?)
        }
        PluginKind::DisaggregatedsetRolloutScreener => {
            Arc::new(p.decode::<RolloutScreener>()?.validate()?)
        }
        PluginKind::BurstPrefixCacheProducer => {
            Arc::new(p.decode::<BurstPrefixProducer>()?.validate()?)
        }
        _ => return Ok(None),
    }))
}

//! Data producers: plugins that watch requests go by and keep what they learn, at the request
//! lifecycle's points ([`super::lifecycle`]), for other plugins and operators to read. One per
//! file under `producer/`.

mod rollout_screener;
mod session_state;

use super::lifecycle::Lifecycle;
use crate::plugin::{Parameters, PluginKind};
use rollout_screener::RolloutScreener;
pub use session_state::SessionStateProducer;
use std::sync::Arc;

/// The producer a `kind` plugin configures, from its parameters, decoded and checked (`None`
/// when `kind` is no producer of this kind). The configuration decoder calls this for every
/// plugin.
pub fn from_plugin<P: Parameters>(
    kind: PluginKind,
    p: &P,
) -> Result<Option<Arc<dyn Lifecycle>>, P::Error> {
    Ok(Some(match kind {
        PluginKind::SessionStateProducer => {
            Arc::new(p.decode::<SessionStateProducer>()?.validate()?)
        }
        PluginKind::DisaggregatedsetRolloutScreener => {
            Arc::new(p.decode::<RolloutScreener>()?.validate()?)
        }
        _ => return Ok(None),
    }))
}

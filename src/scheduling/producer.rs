//! Data producers: plugins that watch requests go by and keep what they learn, at the request
//! lifecycle's points ([`super::lifecycle`]), for other plugins and operators to read. One per
//! file under `producer/`.

mod session_state;

use super::lifecycle::Lifecycle;
use crate::plugin::{Parameters, PluginKind};
pub(crate) use session_state::SessionStateProducer;
use std::sync::Arc;

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
        _ => return Ok(None),
    }))
}

//! Filters: drop candidates that must not serve a request. One per file under `filter/`.

mod active_request;
mod by_label;
mod endpoint_attribute;
mod gpu_memory;
mod header_based_testing;
mod label_selector;
mod prefix_cache_affinity;
mod session_affinity;
mod topology_affinity;
mod utilization;

use super::{Candidate, SchedulingRequest};
use crate::plugin::{Parameters, PluginKind};
use active_request::ActiveRequestFilter;
#[cfg(test)]
pub(crate) use by_label::ROLE_LABEL;
pub(crate) use by_label::{ByLabelFilter, Role};
pub(crate) use endpoint_attribute::EndpointAttributeFilter;
pub(crate) use gpu_memory::GpuMemoryFilter;
pub(crate) use header_based_testing::HeaderBasedTestingFilter;
pub(crate) use label_selector::LabelSelectorFilter;
pub(crate) use label_selector::{check_key, check_value, Requirement};
pub(crate) use prefix_cache_affinity::PrefixCacheAffinityFilter;
use rand::Rng;
pub(crate) use session_affinity::SessionAffinityFilter;
pub(crate) use topology_affinity::{TopologyAffinityFilter, TopologyAffinityFilterParams};
pub use utilization::UtilizationFilter;

/// Every filter epp knows; [`Filter::from_plugin`] builds each from its plugin's parameters.
#[derive(Clone, Debug)]
pub enum Filter {
    HeaderBasedTesting(HeaderBasedTestingFilter),
    GpuMemory(GpuMemoryFilter),
    PrefixCacheAffinity(PrefixCacheAffinityFilter),
    LabelSelector(LabelSelectorFilter),
    /// `by-label` and the role filters.
    ByLabel(ByLabelFilter),
    Utilization(UtilizationFilter),
    EndpointAttribute(EndpointAttributeFilter),
    SessionAffinity(SessionAffinityFilter),
    /// `context-length-aware` with `enableFiltering` (built as a scorer).
    ContextLength(super::scorer::ContextLengthAware),
    TopologyAffinity(TopologyAffinityFilter),
}

impl Filter {
    /// The filter a `kind` plugin configures, from its parameters, decoded and checked (`None`
    /// when `kind` is no filter). The configuration decoder calls this for every plugin.
    pub(crate) fn from_plugin<P: Parameters>(
        kind: PluginKind,
        p: &P,
    ) -> Result<Option<Self>, P::Error> {
        use PluginKind as K;
        Ok(Some(match kind {
            K::HeaderBasedTestingFilter => Self::HeaderBasedTesting(p.decode()?),
            K::GpuMemoryFilter => Self::GpuMemory(p.decode::<GpuMemoryFilter>()?.validate()?),
            K::PrefixCacheAffinityFilter => {
                Self::PrefixCacheAffinity(p.decode::<PrefixCacheAffinityFilter>()?.validate()?)
            }
            K::LabelSelectorFilter => {
                Self::LabelSelector(p.decode::<LabelSelectorFilter>()?.validate()?)
            }
            K::ByLabelSelector => {
                tracing::info!("Deprecated: plugin type 'by-label-selector' is deprecated, use 'label-selector-filter' instead");
                Self::LabelSelector(p.decode::<LabelSelectorFilter>()?.validate()?)
            }
            // The hub's session filter is this one (llm-d: "delegates without translation"): a
            // hub's candidates are its clusters, so a session pins to its cluster.
            K::SessionAffinityFilter | K::MulticlusterSessionAffinityFilter => {
                Self::SessionAffinity(p.decode::<SessionAffinityFilter>()?.validate()?)
            }
            K::TopologyAffinityFilter => {
                Self::TopologyAffinity(p.decode::<TopologyAffinityFilterParams>()?.validate()?)
            }
            K::UtilizationFilter => Self::Utilization(p.decode::<UtilizationFilter>()?.validate()?),
            K::ActiveRequestFilter => {
                Self::Utilization(p.decode::<ActiveRequestFilter>()?.validate()?)
            }
            K::EndpointAttributeFilter => {
                Self::EndpointAttribute(p.decode::<EndpointAttributeFilter>()?.validate()?)
            }
            K::ByLabel => Self::ByLabel(p.decode::<ByLabelFilter>()?.validate()?),
            // The role filters take no parameters; as before, whatever is given is not read.
            K::DecodeFilter => Self::ByLabel(ByLabelFilter::role(Role::Decode)),
            K::PrefillFilter => Self::ByLabel(ByLabelFilter::role(Role::Prefill)),
            K::EncodeFilter => Self::ByLabel(ByLabelFilter::role(Role::Encode)),
            _ => return Ok(None),
        }))
    }

    /// Gives the filter its instance's name (the label of the decisions it counts).
    pub(crate) fn name_instance(&mut self, name: &str) {
        if let Self::PrefixCacheAffinity(f) = self {
            f.plugin_name = name.to_owned();
        }
    }

    pub(crate) fn filter<'c>(
        &self,
        req: &SchedulingRequest<'_>,
        pool: Vec<&'c Candidate>,
        rng: &mut impl Rng,
    ) -> Vec<&'c Candidate> {
        match self {
            Self::HeaderBasedTesting(f) => f.filter(req, pool),
            Self::GpuMemory(f) => f.filter(pool),
            Self::PrefixCacheAffinity(f) => f.filter(req, pool, rng),
            Self::LabelSelector(f) => f.filter(pool),
            Self::ByLabel(f) => f.filter(pool),
            Self::Utilization(f) => f.filter(pool),
            Self::EndpointAttribute(f) => f.filter(pool),
            Self::SessionAffinity(f) => f.filter(req, pool),
            Self::ContextLength(f) => f.filter(req, pool),
            Self::TopologyAffinity(f) => f.filter(req, pool),
        }
    }

    /// The verdict of a filter that reads nothing but labels (`by-label` and the role
    /// filters, `label-selector-filter`) on an endpoint with `labels`; `None` for the others.
    pub(crate) fn keeps_labels(
        &self,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Option<bool> {
        match self {
            Self::LabelSelector(f) => Some(f.matches(labels)),
            Self::ByLabel(f) => Some(f.keeps_labels(labels)),
            _ => None,
        }
    }

    /// The filter's part in the request lifecycle, if it keeps state or writes headers.
    pub(crate) fn lifecycle(&self) -> Option<std::sync::Arc<dyn super::lifecycle::Lifecycle>> {
        match self {
            Self::SessionAffinity(f) => Some(std::sync::Arc::new(f.params.clone())),
            _ => None,
        }
    }

    /// Whether this filter reads the candidates' labels.
    pub(crate) fn reads_labels(&self) -> bool {
        matches!(
            self,
            Self::LabelSelector(_)
                | Self::ByLabel(_)
                | Self::ContextLength(_)
                | Self::TopologyAffinity(_)
        )
    }
}

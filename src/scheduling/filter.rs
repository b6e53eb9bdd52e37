//! Filters: drop candidates that must not serve a request. One per file under `filter/`.

mod gpu_memory;
mod header_based_testing;
mod prefix_cache_affinity;

use super::scorer::{checked, params};
use super::{Candidate, SchedulingRequest};
pub use gpu_memory::GpuMemoryFilter;
pub use header_based_testing::HeaderBasedTestingFilter;
pub use prefix_cache_affinity::PrefixCacheAffinityFilter;
use rand::Rng;

/// Every filter epp knows, by upstream type name.
#[derive(Clone, Debug)]
pub enum Filter {
    HeaderBasedTesting(HeaderBasedTestingFilter),
    GpuMemory(GpuMemoryFilter),
    PrefixCacheAffinity(PrefixCacheAffinityFilter),
}

impl Filter {
    /// Builds the filter for `plugin_type`, or `None` when the type is not a filter.
    pub fn build(
        plugin_type: &str,
        p: &serde_yaml::Value,
    ) -> Result<Option<Self>, serde_yaml::Error> {
        Ok(Some(match plugin_type {
            HeaderBasedTestingFilter::TYPE => Self::HeaderBasedTesting(params(p)?),
            GpuMemoryFilter::TYPE => {
                Self::GpuMemory(checked(params::<GpuMemoryFilter>(p)?.validate())?)
            }
            PrefixCacheAffinityFilter::TYPE => Self::PrefixCacheAffinity(checked(
                params::<PrefixCacheAffinityFilter>(p)?.validate(),
            )?),
            _ => return Ok(None),
        }))
    }

    pub fn filter<'c>(
        &self,
        req: &SchedulingRequest<'_>,
        pool: Vec<&'c Candidate>,
        rng: &mut impl Rng,
    ) -> Vec<&'c Candidate> {
        match self {
            Self::HeaderBasedTesting(f) => f.filter(req, pool),
            Self::GpuMemory(f) => f.filter(pool),
            Self::PrefixCacheAffinity(f) => f.filter(req, pool, rng),
        }
    }

    /// Whether this filter reads the candidates' labels.
    pub fn reads_labels(&self) -> bool {
        false
    }
}

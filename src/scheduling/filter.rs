//! Filters: drop candidates that must not serve a request. One per file under `filter/`.

mod gpu_memory;
mod header_based_testing;

use super::{Candidate, SchedulingRequest};
pub use gpu_memory::GpuMemoryFilter;
pub use header_based_testing::HeaderBasedTestingFilter;

/// Every filter epp knows, by upstream type name.
#[derive(Clone, Debug)]
pub enum Filter {
    HeaderBasedTesting(HeaderBasedTestingFilter),
    GpuMemory(GpuMemoryFilter),
}

impl Filter {
    /// Builds the filter for `plugin_type`, or `None` when the type is not a filter.
    pub fn build(
        plugin_type: &str,
        params: &serde_yaml::Value,
    ) -> Result<Option<Self>, serde_yaml::Error> {
        Ok(match plugin_type {
            HeaderBasedTestingFilter::TYPE => {
                Some(Self::HeaderBasedTesting(super::scorer::params(params)?))
            }
            GpuMemoryFilter::TYPE => {
                let f: GpuMemoryFilter = super::scorer::params(params)?;
                Some(Self::GpuMemory(
                    f.validate()
                        .map_err(<serde_yaml::Error as serde::de::Error>::custom)?,
                ))
            }
            _ => None,
        })
    }

    pub fn filter<'c>(
        &self,
        req: &SchedulingRequest<'_>,
        pool: Vec<&'c Candidate>,
    ) -> Vec<&'c Candidate> {
        match self {
            Self::HeaderBasedTesting(f) => f.filter(req, pool),
            Self::GpuMemory(f) => f.filter(pool),
        }
    }
}

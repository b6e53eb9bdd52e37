//! `gpu-memory-filter`: a pod whose GPU memory is exhausted gets no traffic, even while its
//! `/health` answers 200 (seed 003's deep health check: such a pod fails every large request
//! with CUDA OOM).
//!
//! The reading is DCGM's `DCGM_FI_DEV_FB_FREE` of the pod's fullest GPU, from the last scrape
//! (the pod's own `/metrics` or the per-node exporter, see `scrape::dcgm`). A pod below
//! `minFreeMiB` is dropped; a pod without readings passes, so a fleet without an exporter is
//! unaffected. If every candidate is exhausted the request fails with 429 like any other
//! fully filtered request: there is nowhere it could succeed.

use crate::plugin::Invalid;
use crate::scheduling::Candidate;

#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct GpuMemoryFilter {
    /// Free framebuffer (MiB) below which a pod counts as exhausted. Default 2048 (2 GiB).
    #[serde(rename = "minFreeMiB")]
    pub(crate) min_free_mib: f64,
}

impl Default for GpuMemoryFilter {
    fn default() -> Self {
        Self {
            min_free_mib: 2048.0,
        }
    }
}

impl GpuMemoryFilter {
    pub(crate) fn validate(self) -> Result<Self, Invalid> {
        if self.min_free_mib.is_finite() && self.min_free_mib >= 0.0 {
            Ok(self)
        } else {
            Err(Invalid::new(
                "minFreeMiB",
                format!(
                    "minFreeMiB must be a number >= 0, got {}",
                    self.min_free_mib
                ),
            ))
        }
    }

    /// Whether the candidate's last reading says its GPU memory is exhausted.
    pub(crate) fn exhausted(&self, c: &Candidate) -> bool {
        c.metrics
            .as_ref()
            .and_then(|m| m.gpu)
            .and_then(|g| g.fb_free_mib)
            .is_some_and(|free| free < self.min_free_mib)
    }

    pub(crate) fn filter<'c>(&self, mut pool: Vec<&'c Candidate>) -> Vec<&'c Candidate> {
        pool.retain(|c| !self.exhausted(c));
        pool
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::GpuMetrics;
    use crate::scheduling::testing::cand;

    fn with_free(port: u16, free: Option<f64>) -> Candidate {
        let gpu = GpuMetrics {
            fb_free_mib: free,
            fb_used_mib: Some(1000.0),
            devices: 1,
            ..Default::default()
        };
        Candidate {
            metrics: Some(crate::fixtures::metrics().gpu(gpu).arc()),
            ..cand(port, 0.0, 0.0, 0)
        }
    }

    #[test]
    fn drops_exhausted_pods_and_keeps_pods_without_readings() {
        let cands = [
            with_free(1, Some(100.0)),
            with_free(2, Some(40_000.0)),
            with_free(3, None),
            cand(4, 0.0, 0.0, 0),
        ];
        let kept: Vec<u16> = GpuMemoryFilter::default()
            .filter(cands.iter().collect())
            .iter()
            .map(|c| c.id.0.port())
            .collect();
        assert_eq!(kept, vec![2, 3, 4]);
        let strict = GpuMemoryFilter {
            min_free_mib: 50_000.0,
        };
        assert!(strict.exhausted(&cands[1]));
        assert!(GpuMemoryFilter { min_free_mib: -1.0 }.validate().is_err());
    }
}

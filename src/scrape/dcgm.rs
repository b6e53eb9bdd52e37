//! NVIDIA DCGM exporter series: GPU utilisation and framebuffer (GPU memory) used/free.
//!
//! Why: a pod can answer `/health` with 200 while its GPU memory is exhausted and every large
//! request would fail with CUDA OOM (seed 003's "deep health check"). The exporter's series
//! come either from the pod's own `/metrics` (a sidecar exporter, or the simulator) or from a
//! per-node exporter shared by many pods; then its `pod` label says which GPU serves which pod.
//!
//! Series (dcgm-exporter's default counters): `DCGM_FI_DEV_GPU_UTIL` (percent),
//! `DCGM_FI_DEV_FB_USED` and `DCGM_FI_DEV_FB_FREE` (MiB), one sample per GPU.

use super::parse::Sample;
use crate::endpoint::GpuMetrics;

pub(crate) const GPU_UTIL: &str = "DCGM_FI_DEV_GPU_UTIL";
pub(crate) const FB_USED: &str = "DCGM_FI_DEV_FB_USED";
pub(crate) const FB_FREE: &str = "DCGM_FI_DEV_FB_FREE";

/// Folds DCGM samples into [`GpuMetrics`]. `pod`, when set, keeps only samples whose `pod`
/// label names it (a per-node exporter); samples of other pods or of unassigned GPUs are
/// ignored.
#[derive(Debug, Default)]
pub(crate) struct GpuAccumulator<'p> {
    pod: Option<&'p str>,
    util_sum: f64,
    util_n: u32,
    used: Option<f64>,
    free: Option<f64>,
    devices: u32,
}

impl<'p> GpuAccumulator<'p> {
    pub(crate) fn new(pod: Option<&'p str>) -> Self {
        Self {
            pod,
            ..Self::default()
        }
    }

    /// The DCGM series this accumulator reads.
    pub(crate) const NAMES: [&'static str; 3] = [GPU_UTIL, FB_USED, FB_FREE];

    /// Whether `name` is a DCGM series this accumulator reads.
    pub(crate) fn wants(name: &str) -> bool {
        matches!(name, GPU_UTIL | FB_USED | FB_FREE)
    }

    pub(crate) fn observe(&mut self, s: &Sample<'_>) {
        if !s.value.is_finite() || s.value < 0.0 {
            return;
        }
        if let Some(pod) = self.pod {
            if s.label("pod") != Some(pod) {
                return;
            }
        }
        match s.name {
            GPU_UTIL => {
                self.util_sum += s.value.min(100.0);
                self.util_n += 1;
            }
            FB_USED => {
                *self.used.get_or_insert(0.0) += s.value;
                self.devices += 1;
            }
            FB_FREE => self.free = Some(self.free.map_or(s.value, |f| f.min(s.value))),
            _ => {}
        }
    }

    /// `None` when no DCGM sample (for this pod) was seen.
    pub(crate) fn finish(self) -> Option<GpuMetrics> {
        if self.util_n == 0 && self.used.is_none() && self.free.is_none() {
            return None;
        }
        let utilization = (self.util_n > 0).then(|| self.util_sum / f64::from(self.util_n) / 100.0);
        Some(GpuMetrics {
            utilization,
            fb_used_mib: self.used,
            fb_free_mib: self.free,
            devices: self.devices.max(self.util_n),
        })
    }
}

/// The GPU readings for `pod` in a per-node exporter's text (`None` if it has none).
pub(crate) fn extract_for_pod(text: &str, pod: &str) -> Option<GpuMetrics> {
    let mut acc = GpuAccumulator::new(Some(pod));
    for s in super::parse::samples_named(text, GpuAccumulator::wants) {
        acc.observe(&s);
    }
    acc.finish()
}

/// The pod name a per-node exporter labels an endpoint's GPUs with: data-parallel ranks
/// (`<pod>-rank-<n>`) share their pod's GPUs.
pub(crate) fn pod_label(endpoint_name: &str) -> &str {
    match endpoint_name.rsplit_once("-rank-") {
        Some((pod, rank)) if !rank.is_empty() && rank.bytes().all(|b| b.is_ascii_digit()) => pod,
        _ => endpoint_name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: &str = r#"# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",modelName="NVIDIA A100-SXM4-80GB",Hostname="n1",pod="llama-0",namespace="default"} 80
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",modelName="NVIDIA A100-SXM4-80GB",Hostname="n1",pod="llama-0",namespace="default"} 40
DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="GPU-c",modelName="NVIDIA A100-SXM4-80GB",Hostname="n1",pod="llama-1",namespace="default"} 5
DCGM_FI_DEV_GPU_UTIL{gpu="3",UUID="GPU-d",modelName="NVIDIA A100-SXM4-80GB",Hostname="n1"} 0
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",pod="llama-0"} 70000
DCGM_FI_DEV_FB_USED{gpu="1",pod="llama-0"} 79000
DCGM_FI_DEV_FB_USED{gpu="2",pod="llama-1"} 20000
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0",pod="llama-0"} 11000
DCGM_FI_DEV_FB_FREE{gpu="1",pod="llama-0"} 1000
DCGM_FI_DEV_FB_FREE{gpu="2",pod="llama-1"} 61000
"#;

    #[test]
    fn a_node_exporter_is_split_by_pod_label() {
        let g = extract_for_pod(NODE, "llama-0").unwrap();
        assert_eq!(g.utilization, Some(0.6));
        assert_eq!(g.fb_used_mib, Some(149_000.0));
        assert_eq!(g.fb_free_mib, Some(1000.0), "the fullest GPU decides");
        assert_eq!(g.devices, 2);
        let other = extract_for_pod(NODE, "llama-1").unwrap();
        assert_eq!(
            (other.utilization, other.fb_free_mib),
            (Some(0.05), Some(61_000.0))
        );
        assert_eq!(extract_for_pod(NODE, "llama-9"), None);
        assert_eq!(
            extract_for_pod("vllm:num_requests_waiting 1\n", "llama-0"),
            None
        );
    }

    #[test]
    fn garbage_values_are_ignored_and_percent_is_capped() {
        let text = "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} 250\nDCGM_FI_DEV_FB_FREE{gpu=\"0\"} NaN\nDCGM_FI_DEV_FB_USED{gpu=\"0\"} -3\n";
        let mut acc = GpuAccumulator::new(None);
        for s in super::super::parse::samples(text) {
            acc.observe(&s);
        }
        let g = acc.finish().unwrap();
        assert_eq!(
            (g.utilization, g.fb_free_mib, g.fb_used_mib),
            (Some(1.0), None, None)
        );
    }

    #[test]
    fn a_pods_own_exposition_carries_its_gpu_readings() {
        let text = format!("vllm:num_requests_waiting 1\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.5\n{NODE}");
        let m = super::super::parse::extract(
            &text,
            crate::endpoint::EngineType::Vllm,
            std::time::Instant::now(),
        )
        .unwrap();
        let g = m.gpu.unwrap();
        assert_eq!(
            (g.devices, g.fb_free_mib),
            (4, Some(1000.0)),
            "no pod filter: every GPU of the exposition"
        );
        let plain = super::super::parse::extract("vllm:num_requests_waiting 1\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.5\n", crate::endpoint::EngineType::Vllm, std::time::Instant::now()).unwrap();
        assert_eq!(plain.gpu, None);
    }

    #[test]
    fn data_parallel_ranks_map_to_their_pod() {
        assert_eq!(pod_label("llama-0-rank-1"), "llama-0");
        assert_eq!(pod_label("llama-0"), "llama-0");
        assert_eq!(pod_label("odd-rank-x"), "odd-rank-x");
    }
}

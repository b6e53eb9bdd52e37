//! NVIDIA DCGM exporter series for a simulated pod, as a dcgm-exporter sidecar would add them
//! to the pod's `/metrics`: GPU utilisation and framebuffer (GPU memory) used and free.
//!
//! Why: epp's `gpu-utilization-scorer` and `gpu-memory-filter` read these series, and the
//! deep-health case (a pod answering `/health` 200 with its GPU memory exhausted) needs a pod
//! that can be pushed into that state at run time (the `gpu_memory_exhausted` fault).
//!
//! The model, one 80 GiB GPU: utilisation is the batch occupancy (`running / max_num_seqs`, in
//! percent, integer as the exporter reports); framebuffer used is the weights plus the share of
//! the KV pool in use (`gpu_memory_utilization` 0.9 of the GPU minus the weights); free is the
//! rest. The fault reports 128 MiB free.

use crate::config::PodConfig;
use crate::engine::EngineGauges;
use std::fmt::Write;

pub const FB_TOTAL_MIB: f64 = 81_920.0;
const WEIGHTS_MIB: f64 = 16_384.0;
const RUNTIME_MIB: f64 = 512.0;
const EXHAUSTED_FREE_MIB: f64 = 128.0;

/// One GPU's readings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuReading {
    pub util_percent: f64,
    pub fb_used_mib: f64,
    pub fb_free_mib: f64,
}

impl GpuReading {
    pub fn of(g: &EngineGauges, max_num_seqs: usize, exhausted: bool) -> Self {
        let util_percent = (100.0 * g.running as f64 / max_num_seqs.max(1) as f64)
            .min(100.0)
            .round();
        let kv_pool = 0.9 * FB_TOTAL_MIB - WEIGHTS_MIB;
        let used = (WEIGHTS_MIB + RUNTIME_MIB + g.kv_usage.clamp(0.0, 1.0) * kv_pool).round();
        let used = if exhausted {
            FB_TOTAL_MIB - EXHAUSTED_FREE_MIB
        } else {
            used
        };
        Self {
            util_percent,
            fb_used_mib: used,
            fb_free_mib: FB_TOTAL_MIB - used,
        }
    }
}

/// Appends the three families to an exposition.
pub fn append(out: &mut String, g: &EngineGauges, cfg: &PodConfig, exhausted: bool) {
    let r = GpuReading::of(g, cfg.engine.max_num_seqs, exhausted);
    let pod = &cfg.pod_name;
    let namespace = cfg.namespace.as_deref().unwrap_or("default");
    let labels = format!(
        r#"gpu="0",UUID="GPU-sim-{pod}",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="sim-node",container="vllm",namespace="{namespace}",pod="{pod}""#
    );
    let families = [
        (
            "DCGM_FI_DEV_GPU_UTIL",
            "GPU utilization (in %).",
            r.util_percent,
        ),
        (
            "DCGM_FI_DEV_FB_USED",
            "Framebuffer memory used (in MiB).",
            r.fb_used_mib,
        ),
        (
            "DCGM_FI_DEV_FB_FREE",
            "Framebuffer memory free (in MiB).",
            r.fb_free_mib,
        ),
    ];
    for (name, help, value) in families {
        let _ = write!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{labels}}} {value}\n"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_follow_batch_and_kv_usage_and_the_fault() {
        let idle = GpuReading::of(&EngineGauges::default(), 8, false);
        assert_eq!(idle.util_percent, 0.0);
        assert_eq!(idle.fb_used_mib + idle.fb_free_mib, FB_TOTAL_MIB);
        let busy = EngineGauges {
            running: 4,
            kv_usage: 1.0,
            ..Default::default()
        };
        let r = GpuReading::of(&busy, 8, false);
        assert_eq!(r.util_percent, 50.0);
        assert!(r.fb_free_mib > 7000.0 && r.fb_free_mib < 8500.0, "{r:?}");
        assert_eq!(GpuReading::of(&busy, 8, true).fb_free_mib, 128.0);
    }

    #[test]
    fn families_render_with_pod_labels() {
        let cfg = PodConfig {
            pod_name: "sim-1".into(),
            ..Default::default()
        };
        let mut text = String::new();
        append(&mut text, &EngineGauges::default(), &cfg, true);
        assert!(text.contains("# TYPE DCGM_FI_DEV_FB_FREE gauge\n"));
        assert!(
            text.lines()
                .any(|l| l.starts_with("DCGM_FI_DEV_FB_FREE{gpu=\"0\"")
                    && l.contains("pod=\"sim-1\"")
                    && l.ends_with("} 128")),
            "{text}"
        );
    }
}

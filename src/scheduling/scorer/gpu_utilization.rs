//! `gpu-utilization-scorer`: seed 003's GPU-aware composite, as a score.
//!
//! `cost = q·queue + g·gpu + k·kv`, lower is better, where `queue` is the outstanding requests
//! per unit of weight `(running + waiting) / weight` divided by the largest over the candidates,
//! `gpu` is the DCGM utilisation (0..=1) and `kv` the KV-cache usage; the score is
//! `1 − cost / (q + g + k)`. Defaults follow the seed (0.4 queue, 0.3 GPU, 0.2 KV; the seed's
//! 0.1 latency term belongs to a latency scorer in the same profile).
//!
//! A candidate without GPU readings (no exporter configured, or a scrape without DCGM series)
//! takes the mean utilisation of those that have them, so a missing exporter neither rewards
//! nor punishes a pod; when none has readings the GPU term is constant and drops out.

use crate::plugin::Invalid;
use crate::scheduling::Candidate;

#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct GpuUtilizationScorer {
    pub(crate) queue_weight: f64,
    pub(crate) gpu_weight: f64,
    pub(crate) kv_cache_weight: f64,
}

impl Default for GpuUtilizationScorer {
    fn default() -> Self {
        Self {
            queue_weight: 0.4,
            gpu_weight: 0.3,
            kv_cache_weight: 0.2,
        }
    }
}

impl GpuUtilizationScorer {
    pub(crate) fn validate(self) -> Result<Self, Invalid> {
        let ws = [self.queue_weight, self.gpu_weight, self.kv_cache_weight];
        if ws.iter().any(|w| !w.is_finite() || *w < 0.0) || ws.iter().sum::<f64>() <= 0.0 {
            return Err(Invalid::new("queueWeight, gpuWeight, kvCacheWeight", format!("queueWeight, gpuWeight and kvCacheWeight must be finite, >= 0 and not all 0, got {ws:?}")));
        }
        Ok(self)
    }

    pub(crate) fn score(&self, pool: &[&Candidate], out: &mut [f64]) {
        let util = |c: &Candidate| {
            c.metrics
                .as_ref()
                .and_then(|m| m.gpu)
                .and_then(|g| g.utilization)
        };
        let known: Vec<f64> = pool.iter().filter_map(|c| util(c)).collect();
        let mean_util = if known.is_empty() {
            0.0
        } else {
            known.iter().sum::<f64>() / known.len() as f64
        };
        let queue = |c: &Candidate| (c.running + c.waiting).max(0.0) / f64::from(c.weight.max(1));
        let max_queue = pool.iter().map(|c| queue(c)).fold(0.0, f64::max);
        let total = self.queue_weight + self.gpu_weight + self.kv_cache_weight;
        for (o, c) in out.iter_mut().zip(pool) {
            let q = if max_queue > 0.0 {
                queue(c) / max_queue
            } else {
                0.0
            };
            let g = util(c).unwrap_or(mean_util).clamp(0.0, 1.0);
            let cost = self.queue_weight * q
                + self.gpu_weight * g
                + self.kv_cache_weight * c.kv_usage.clamp(0.0, 1.0);
            *o = 1.0 - cost / total;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::GpuMetrics;
    use crate::scheduling::testing::cand;
    use proptest::prelude::*;

    fn with_gpu(port: u16, running: f64, kv: f64, util: Option<f64>) -> Candidate {
        let gpu = util.map(|u| GpuMetrics {
            utilization: Some(u),
            devices: 1,
            ..Default::default()
        });
        let mut m = crate::fixtures::metrics().running(running).kv_usage(kv);
        if let Some(gpu) = gpu {
            m = m.gpu(gpu);
        }
        Candidate {
            running,
            metrics: Some(m.arc()),
            ..cand(port, 0.0, kv, 0)
        }
    }

    #[test]
    fn composite_prefers_idle_gpu_at_equal_queue() {
        let cands = [
            with_gpu(1, 2.0, 0.3, Some(0.9)),
            with_gpu(2, 2.0, 0.3, Some(0.1)),
            with_gpu(3, 4.0, 0.3, Some(0.1)),
        ];
        let pool: Vec<&Candidate> = cands.iter().collect();
        let mut out = [0.0; 3];
        GpuUtilizationScorer::default().score(&pool, &mut out);
        // cost: 0.4·0.5 + 0.3·0.9 + 0.2·0.3 = 0.53; 0.4·0.5 + 0.03 + 0.06 = 0.29; 0.4 + 0.03 + 0.06 = 0.49
        let expect = [1.0 - 0.53 / 0.9, 1.0 - 0.29 / 0.9, 1.0 - 0.49 / 0.9];
        for (o, e) in out.iter().zip(expect) {
            assert!((o - e).abs() < 1e-9, "{out:?}");
        }
    }

    #[test]
    fn missing_readings_take_the_mean_and_weights_are_checked() {
        let cands = [
            with_gpu(1, 0.0, 0.0, Some(0.2)),
            with_gpu(2, 0.0, 0.0, Some(0.6)),
            with_gpu(3, 0.0, 0.0, None),
        ];
        let pool: Vec<&Candidate> = cands.iter().collect();
        let mut out = [0.0; 3];
        GpuUtilizationScorer::default().score(&pool, &mut out);
        assert!((out[2] - (1.0 - 0.3 * 0.4 / 0.9)).abs() < 1e-9);
        assert!(GpuUtilizationScorer {
            queue_weight: 0.0,
            gpu_weight: 0.0,
            kv_cache_weight: 0.0
        }
        .validate()
        .is_err());
        assert!(GpuUtilizationScorer {
            gpu_weight: f64::NAN,
            ..Default::default()
        }
        .validate()
        .is_err());
    }

    proptest! {
        #[test]
        fn scores_are_finite_and_in_unit_range(
            xs in proptest::collection::vec((0.0f64..100.0, 0.0f64..1.0, proptest::option::of(0.0f64..1.0), 0u32..5), 1..10),
        ) {
            let cands: Vec<Candidate> = xs.iter().enumerate().map(|(i, (r, kv, u, w))| Candidate { weight: *w, ..with_gpu(i as u16 + 1, *r, *kv, *u) }).collect();
            let pool: Vec<&Candidate> = cands.iter().collect();
            let mut out = vec![0.0; pool.len()];
            GpuUtilizationScorer::default().score(&pool, &mut out);
            for s in out {
                prop_assert!(s.is_finite() && (0.0..=1.0).contains(&s));
            }
        }
    }
}

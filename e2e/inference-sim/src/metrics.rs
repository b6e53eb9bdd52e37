//! The pod's vLLM metrics: typed state updated once per engine step, rendered
//! on `/metrics` exactly as vLLM's Python `prometheus_client` would.
//!
//! Why hand-rendered: the names, label sets (`engine`, `model_name`, sorted),
//! `_total`/`_created` families, bucket boundaries and Python float formatting
//! are part of what a scraper must cope with, and a generic Rust Prometheus
//! library renders them differently (see `exposition`).
//!
//! Durations are simulated seconds (wall time × time scale), so a run at
//! `--time-scale 10` reports the histograms a real GPU would.

use super::engine::{EngineGauges, FinishReason, StepReport};

pub mod dcgm;
mod exposition;
pub mod filter;

pub use exposition::{py_float, render};

/// vLLM's TTFT buckets.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// Inter-token latency / TPOT buckets.
pub const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// "Request latency" buckets (e2e, queue, inference, prefill, decode).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
/// `iteration_tokens_total` buckets.
pub const ITERATION_BUCKETS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];
/// `request_params_n` buckets.
pub const N_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0];

/// vLLM `build_1_2_5_buckets(max)`: 1, 2, 5, 10, 20, 50, … up to `max`.
pub fn buckets_1_2_5(max: usize) -> Vec<f64> {
    let mut out = Vec::new();
    let mut exp = 1usize;
    loop {
        for m in [1, 2, 5] {
            let v = m * exp;
            if v > max {
                return out;
            }
            out.push(v as f64);
        }
        exp = exp.saturating_mul(10);
    }
}

/// A cumulative-on-render histogram with fixed bounds.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    pub bounds: Vec<f64>,
    /// Per-bucket counts; the last entry is the `+Inf` overflow.
    pub counts: Vec<u64>,
    pub sum: f64,
}

impl Histogram {
    pub fn new(bounds: &[f64]) -> Self {
        Self {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
        }
    }

    pub fn observe(&mut self, v: f64) {
        let i = self
            .bounds
            .iter()
            .position(|&b| v <= b)
            .unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += v;
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// Every histogram family, as typed fields.
#[derive(Clone, Debug, PartialEq)]
pub struct Histograms {
    pub prompt_tokens: Histogram,
    pub generation_tokens: Histogram,
    pub iteration_tokens: Histogram,
    pub max_num_generation_tokens: Histogram,
    pub params_n: Histogram,
    pub params_max_tokens: Histogram,
    pub ttft: Histogram,
    pub time_per_output_token: Histogram,
    pub inter_token_latency: Histogram,
    pub request_time_per_output_token: Histogram,
    pub e2e: Histogram,
    pub queue: Histogram,
    pub inference: Histogram,
    pub prefill: Histogram,
    pub decode: Histogram,
    pub prefill_kv_computed: Histogram,
    /// NIXL pulls (rendered only with a KV connector configured): duration and size.
    pub nixl_xfer_time: Histogram,
    pub nixl_bytes: Histogram,
}

/// `vllm:nixl_xfer_time_seconds` buckets.
pub const NIXL_TIME_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];
/// `vllm:nixl_bytes_transferred` buckets.
pub const NIXL_BYTES_BUCKETS: &[f64] = &[
    1048576.0,
    4194304.0,
    16777216.0,
    67108864.0,
    268435456.0,
    1073741824.0,
    4294967296.0,
];

impl Histograms {
    fn new(max_model_len: usize) -> Self {
        let tokens = buckets_1_2_5(max_model_len);
        Self {
            prompt_tokens: Histogram::new(&tokens),
            generation_tokens: Histogram::new(&tokens),
            iteration_tokens: Histogram::new(ITERATION_BUCKETS),
            max_num_generation_tokens: Histogram::new(&tokens),
            params_n: Histogram::new(N_BUCKETS),
            params_max_tokens: Histogram::new(&tokens),
            ttft: Histogram::new(TTFT_BUCKETS),
            time_per_output_token: Histogram::new(ITL_BUCKETS),
            inter_token_latency: Histogram::new(ITL_BUCKETS),
            request_time_per_output_token: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(LATENCY_BUCKETS),
            queue: Histogram::new(LATENCY_BUCKETS),
            inference: Histogram::new(LATENCY_BUCKETS),
            prefill: Histogram::new(LATENCY_BUCKETS),
            decode: Histogram::new(LATENCY_BUCKETS),
            prefill_kv_computed: Histogram::new(&tokens),
            nixl_xfer_time: Histogram::new(NIXL_TIME_BUCKETS),
            nixl_bytes: Histogram::new(NIXL_BYTES_BUCKETS),
        }
    }
}

/// Monotonic counters (exposed with `_total`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counters {
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub preemptions: u64,
    pub prompt_tokens: u64,
    pub prompt_tokens_cached: u64,
    pub generation_tokens: u64,
    /// Indexed like `FinishReason::ALL`.
    pub success: [u64; 3],
}

/// One label combination of `vllm:lora_requests_info` and its last timestamp.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraInfo {
    pub running: String,
    pub waiting: String,
    pub timestamp: f64,
}

/// All metric state of one pod.
#[derive(Clone, Debug, PartialEq)]
pub struct PodMetrics {
    /// UNIX time the families were created (`_created` values).
    pub created: f64,
    /// `cache_config_info` appears once the engine is initialised.
    pub initialised: bool,
    pub gauges: EngineGauges,
    pub counters: Counters,
    pub histograms: Histograms,
    /// Every label combination ever seen, as `prometheus_client` keeps them.
    pub lora_info: Vec<LoraInfo>,
}

impl PodMetrics {
    pub fn new(max_model_len: usize, created: f64) -> Self {
        Self {
            created,
            initialised: false,
            gauges: EngineGauges::default(),
            counters: Counters::default(),
            histograms: Histograms::new(max_model_len),
            lora_info: Vec::new(),
        }
    }

    /// Sets the gauges (and, with LoRA enabled, stamps the adapters' series).
    pub fn set_gauges(&mut self, gauges: EngineGauges, lora_enabled: bool, now_unix: f64) {
        if lora_enabled {
            let running = gauges.running_loras.join(",");
            let waiting = gauges.waiting_loras.join(",");
            match self
                .lora_info
                .iter_mut()
                .find(|l| l.running == running && l.waiting == waiting)
            {
                Some(info) => info.timestamp = now_unix,
                None => self.lora_info.push(LoraInfo {
                    running,
                    waiting,
                    timestamp: now_unix,
                }),
            }
        }
        self.gauges = gauges;
    }

    /// Folds one step's report into the counters and histograms.
    pub fn record(&mut self, r: &StepReport) {
        let c = &mut self.counters;
        c.prefix_cache_queries += r.prefix_queries;
        c.prefix_cache_hits += r.prefix_hits;
        c.preemptions += r.preemptions;
        c.prompt_tokens += r.prompt_tokens;
        c.prompt_tokens_cached += r.prompt_tokens_cached;
        c.generation_tokens += r.generation_tokens;
        let h = &mut self.histograms;
        if r.scheduled_tokens > 0 {
            h.iteration_tokens.observe(r.scheduled_tokens as f64);
        }
        for &(ttft, computed) in &r.first_tokens {
            h.ttft.observe(ttft);
            h.prefill_kv_computed.observe(computed as f64);
        }
        for &(secs, bytes) in &r.kv_transfers {
            h.nixl_xfer_time.observe(secs);
            h.nixl_bytes.observe(bytes);
        }
        for &itl in &r.inter_token {
            h.inter_token_latency.observe(itl);
            h.time_per_output_token.observe(itl);
        }
        for f in &r.finished {
            self.record_finished(f);
        }
    }

    fn record_finished(&mut self, f: &super::engine::FinishedRecord) {
        let reason = FinishReason::ALL
            .iter()
            .position(|&r| r == f.usage.reason)
            .unwrap_or(2);
        self.counters.success[reason] += 1;
        let h = &mut self.histograms;
        let generated = f.usage.completion_tokens as f64;
        h.prompt_tokens.observe(f.usage.prompt_tokens as f64);
        h.generation_tokens.observe(generated);
        h.max_num_generation_tokens.observe(generated);
        h.params_n.observe(1.0);
        if let Some(max) = f.params_max_tokens {
            h.params_max_tokens.observe(max as f64);
        }
        h.e2e.observe(f.e2e);
        h.queue.observe(f.queue);
        h.inference.observe(f.inference);
        h.prefill.observe(f.prefill);
        h.decode.observe(f.decode);
        if f.usage.completion_tokens > 1 {
            h.request_time_per_output_token
                .observe(f.decode / (generated - 1.0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_two_five_buckets_stop_at_max_model_len() {
        assert_eq!(buckets_1_2_5(60), vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0]);
        assert_eq!(buckets_1_2_5(8192).last(), Some(&5000.0));
    }

    #[test]
    fn histogram_puts_values_on_the_upper_inclusive_bound() {
        let mut h = Histogram::new(&[1.0, 2.0]);
        for v in [0.5, 1.0, 1.5, 3.0] {
            h.observe(v);
        }
        assert_eq!(h.counts, vec![2, 1, 1]);
        assert_eq!(h.count(), 4);
    }

    #[test]
    fn lora_info_keeps_every_label_combination_with_its_last_timestamp() {
        let mut m = PodMetrics::new(1024, 1.0);
        let busy = EngineGauges {
            running_loras: vec!["a".into(), "b".into()],
            ..Default::default()
        };
        m.set_gauges(busy.clone(), true, 10.0);
        m.set_gauges(EngineGauges::default(), true, 11.0);
        m.set_gauges(busy, true, 12.0);
        assert_eq!(m.lora_info.len(), 2);
        assert_eq!(m.lora_info[0].running, "a,b");
        assert_eq!(m.lora_info[0].timestamp, 12.0);
    }
}

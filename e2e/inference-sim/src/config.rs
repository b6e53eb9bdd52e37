//! Configuration of one simulated pod: engine geometry, timing profile,
//! identity, metrics and KV-event options.
//!
//! Why a separate module: the binary's flags, the in-process test API and the
//! cluster all build the same immutable `PodConfig`, validated once (every
//! problem reported at once) and shared as `Arc<PodConfig>`.

use std::time::Duration;

use thiserror::Error;

use super::faults::Faults;
use super::hashing::DEFAULT_HASH_SEED;
use super::kv_events::KvEventsConfig;
use super::tokenizer::TokenizerKind;

/// Problems found when validating a configuration (all of them at once).
#[derive(Debug, Error)]
#[error("invalid inference-sim configuration: {}", .problems.join("; "))]
pub struct ConfigError {
    pub problems: Vec<String>,
}

/// Per-step cost model. Step time = `step_overhead + prefill_per_token × prefill
/// tokens + decode_per_seq × decoding sequences + attention_per_context_token ×
/// context tokens of the batch`, then divided by the pod's speed and the time scale.
#[derive(Clone, Debug, PartialEq)]
pub struct TimingProfile {
    /// Fixed cost of one forward pass (weights read, kernel launches, sampling).
    pub step_overhead: Duration,
    /// Cost of each prompt token computed in the step (compute-bound prefill).
    pub prefill_per_token: Duration,
    /// Cost of each sequence decoding one token in the step.
    pub decode_per_seq: Duration,
    /// Attention cost per token of context held by the scheduled sequences.
    pub attention_per_context_token: Duration,
}

/// Named timing profiles; every field can be overridden by a flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    /// An 8B model (Llama-3.1-8B class, bf16) on one H100: ~7 ms decode steps
    /// at batch 1 rising to ~25-30 ms at batch 256 with 1k-token contexts;
    /// prefill ~16k tokens/s (a 1,000-token prompt alone: ~67 ms TTFT).
    #[value(name = "h100-8b")]
    H100Llama8b,
    /// llm-d-inference-sim's `8b-h100-balanced-per-token` profile mapped onto
    /// the step model: 30 ms prefill overhead, 250 µs per prompt token,
    /// 12 ms inter-token latency doubling at 16 running sequences.
    #[value(name = "llmd-h100-8b")]
    LlmdH100Llama8b,
}

impl Profile {
    pub fn timing(self) -> TimingProfile {
        match self {
            Profile::H100Llama8b => TimingProfile {
                step_overhead: Duration::from_micros(7_000),
                prefill_per_token: Duration::from_micros(60),
                decode_per_seq: Duration::from_micros(60),
                attention_per_context_token: Duration::from_nanos(25),
            },
            Profile::LlmdH100Llama8b => TimingProfile {
                step_overhead: Duration::from_micros(12_000),
                prefill_per_token: Duration::from_micros(250),
                decode_per_seq: Duration::from_micros(800),
                attention_per_context_token: Duration::ZERO,
            },
        }
    }
}

/// The engine of one pod: capacities and costs (vLLM flag names where they exist).
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Served model name (`--model` / `--served-model-name`).
    pub model: String,
    /// At most this many running sequences (`--max-num-seqs`).
    pub max_num_seqs: usize,
    /// Token budget of one step, prefill chunks included (`--max-num-batched-tokens`).
    pub max_num_batched_tokens: usize,
    /// Prompt + output limit (`--max-model-len`).
    pub max_model_len: usize,
    /// Blocks in the KV pool, the null block included (`--num-gpu-blocks-override`).
    pub num_gpu_blocks: usize,
    /// Tokens per KV block (`--block-size`).
    pub block_size: usize,
    /// Distinct adapters in one batch (`--max-loras`).
    pub max_loras: usize,
    /// Requests beyond this many waiting are refused with 503 (vLLM has no limit).
    pub max_waiting: usize,
    /// `PYTHONHASHSEED` equivalent; `NONE_HASH = sha256(cbor(seed))`.
    pub hash_seed: String,
    /// Output length when a request sets no `max_tokens`: uniform in 1..=this.
    pub default_max_output: usize,
    pub timing: TimingProfile,
    /// This pod's speed relative to the profile (2.0 = twice as fast).
    pub speed: f64,
    /// Simulated seconds per wall second (10.0 = ten times faster than real time).
    pub time_scale: f64,
    /// vLLM's `--kv-transfer-config` with the NIXL connector (prefill/decode split);
    /// `None`: requests' `kv_transfer_params` are ignored, as vLLM without a connector.
    pub kv_transfer: Option<KvTransferConfig>,
}

/// Which side of a prefill/decode split a pod may take (vLLM's `kv_role`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
pub enum KvRole {
    /// Prefills for remote decodes (`do_remote_decode`).
    #[serde(rename = "kv_producer")]
    Producer,
    /// Decodes remotely prefilled requests (`do_remote_prefill`).
    #[serde(rename = "kv_consumer")]
    Consumer,
    #[serde(rename = "kv_both")]
    Both,
}

/// The simulated NIXL connector: who may do what, and what a KV pull costs.
#[derive(Clone, Debug, PartialEq)]
pub struct KvTransferConfig {
    pub role: KvRole,
    /// KV bytes per token, all layers, K and V (131,072 for an 8B Llama in bf16).
    pub bytes_per_token: f64,
    /// Pull bandwidth, GB/s (10⁹ bytes per simulated second).
    pub bandwidth_gbps: f64,
    /// `remote_engine_id` this pod reports (vLLM: a uuid per engine).
    pub engine_id: String,
    /// `remote_host` / `remote_port`: the NIXL side channel this pod would listen on.
    pub host: String,
    pub port: u16,
}

/// `--kv-transfer-config` as vLLM takes it (the keys the simulation reads; others ignored).
#[derive(serde::Deserialize)]
struct KvTransferJson {
    kv_connector: String,
    kv_role: KvRole,
}

impl KvTransferConfig {
    /// Parses vLLM's `--kv-transfer-config` JSON; only `NixlConnector` is simulated.
    pub fn from_vllm_json(
        json: &str,
        bytes_per_token: f64,
        bandwidth_gbps: f64,
        host: String,
        port: u16,
    ) -> Result<Self, String> {
        let j: KvTransferJson =
            serde_json::from_str(json).map_err(|e| format!("--kv-transfer-config: {e}"))?;
        if j.kv_connector != "NixlConnector" {
            return Err(format!(
                "--kv-transfer-config: kv_connector {:?} is not simulated (NixlConnector is)",
                j.kv_connector
            ));
        }
        Ok(Self {
            role: j.kv_role,
            bytes_per_token,
            bandwidth_gbps,
            engine_id: format!("inference-sim-{host}-{port}"),
            host,
            port,
        })
    }

    /// Bytes and simulated seconds of pulling `tokens` tokens' KV.
    pub fn transfer(&self, tokens: usize) -> (f64, f64) {
        let bytes = tokens as f64 * self.bytes_per_token;
        (bytes, bytes / (self.bandwidth_gbps * 1e9))
    }

    pub fn produces(&self) -> bool {
        matches!(self.role, KvRole::Producer | KvRole::Both)
    }

    pub fn consumes(&self) -> bool {
        matches!(self.role, KvRole::Consumer | KvRole::Both)
    }

    fn problems(&self, out: &mut Vec<String>) {
        if !(self.bytes_per_token.is_finite() && self.bytes_per_token > 0.0) {
            out.push("kv-bytes-per-token must be > 0".into());
        }
        if !(self.bandwidth_gbps.is_finite() && self.bandwidth_gbps > 0.0) {
            out.push("kv-transfer-bandwidth-gbps must be > 0".into());
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            model: "meta-llama/Llama-3.1-8B-Instruct".into(),
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            max_model_len: 8192,
            num_gpu_blocks: 27493,
            block_size: 16,
            max_loras: 4,
            max_waiting: 10_000,
            hash_seed: DEFAULT_HASH_SEED.into(),
            default_max_output: 128,
            timing: Profile::H100Llama8b.timing(),
            speed: 1.0,
            time_scale: 1.0,
            kv_transfer: None,
        }
    }
}

impl EngineConfig {
    /// Converts a simulated duration into the wall duration to sleep.
    pub fn wall(&self, simulated: Duration) -> Duration {
        simulated.div_f64(self.speed * self.time_scale)
    }

    fn problems(&self, out: &mut Vec<String>) {
        let mut check = |ok: bool, what: &str| {
            if !ok {
                out.push(what.to_owned());
            }
        };
        check(!self.model.is_empty(), "model must not be empty");
        check(self.max_num_seqs > 0, "max-num-seqs must be > 0");
        check(
            self.max_num_batched_tokens > 0,
            "max-num-batched-tokens must be > 0",
        );
        check(self.max_model_len > 1, "max-model-len must be > 1");
        check(self.num_gpu_blocks >= 2, "num-gpu-blocks must be >= 2");
        check(self.block_size > 0, "block-size must be > 0");
        check(
            self.default_max_output > 0,
            "default-max-output must be > 0",
        );
        check(
            self.speed.is_finite() && self.speed > 0.0,
            "speed must be > 0",
        );
        check(
            self.time_scale.is_finite() && self.time_scale > 0.0,
            "time-scale must be > 0",
        );
        if let Some(t) = &self.kv_transfer {
            t.problems(out);
        }
    }
}

/// Which KV-usage series to expose (the name changed in vLLM 0.9.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KvUsageMetric {
    /// `vllm:kv_cache_usage_perc` only (vLLM ≥ 0.11).
    New,
    /// `vllm:gpu_cache_usage_perc` only (old EPPs).
    Old,
    /// Both names (vLLM 0.10.x default).
    Both,
}

/// Exposition options.
#[derive(Clone, Debug)]
pub struct MetricsOptions {
    pub kv_usage: KvUsageMetric,
    /// Emit `<name>_created` gauges after counters and histograms, as a single
    /// API server's default registry does.
    pub created_series: bool,
    /// Append NVIDIA DCGM exporter series (GPU util, framebuffer used/free), as a
    /// dcgm-exporter sidecar would (`--dcgm-metrics`).
    pub dcgm: bool,
    /// Whose names the queue, running, KV-usage and cache-info series carry.
    pub naming: EngineNaming,
}

/// The engine whose metric names a pod exposes (the load metrics only; counters and
/// histograms keep vLLM's names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineNaming {
    #[default]
    Vllm,
    /// `sglang:num_queue_reqs`, `sglang:num_running_reqs`, `sglang:token_usage`,
    /// `sglang:cache_config_info{page_size,num_pages}`.
    Sglang,
    /// `trtllm_num_requests_waiting`, `trtllm_num_requests_running`,
    /// `trtllm_kv_cache_utilization`, `trtllm_kv_cache_tokens_per_block`,
    /// `trtllm_kv_cache_max_blocks`, also served on `/prometheus/metrics` as trtllm-serve does.
    #[value(name = "trtllm-serve")]
    TrtllmServe,
}

impl Default for MetricsOptions {
    fn default() -> Self {
        Self {
            kv_usage: KvUsageMetric::Both,
            created_series: true,
            dcgm: false,
            naming: EngineNaming::Vllm,
        }
    }
}

/// Everything one simulated pod needs; shared read-only.
#[derive(Clone, Debug, Default)]
pub struct PodConfig {
    pub engine: EngineConfig,
    /// Value of the `x-inference-pod` header (llm-d-inference-sim: `POD_NAME`).
    pub pod_name: String,
    /// Value of `x-inference-namespace`, if any.
    pub namespace: Option<String>,
    /// BPE vocabulary (the same one epp tokenizes with).
    pub tokenizer: TokenizerKind,
    /// Seed of the pod's RNG (output lengths, failure injection).
    pub seed: u64,
    /// LoRA serving on (`--enable-lora`): adapters accepted, `lora_requests_info` exposed.
    pub enable_lora: bool,
    /// LoRA adapters loaded at start.
    pub lora_modules: Vec<String>,
    /// Report `usage.prompt_tokens_details.cached_tokens` (vLLM: `--enable-prompt-tokens-details`).
    pub prompt_tokens_details: bool,
    /// `/health` fails and requests get 503 for this long after start (simulated time).
    pub startup_delay: Duration,
    pub metrics: MetricsOptions,
    pub kv_events: Option<KvEventsConfig>,
    /// Faults in force at start; changed at run time through `PodControl`.
    pub faults: Faults,
    /// Keep every request as received, byte for byte, for tests (`PodControl::hook`).
    pub record_requests: bool,
}

impl PodConfig {
    /// Validates and reports every problem at once.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        self.engine.problems(&mut problems);
        self.faults.problems(&mut problems);
        if self.lora_modules.len() > 1024 {
            problems.push("at most 1024 lora modules".into());
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError { problems })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_reports_every_problem_at_once() {
        let mut cfg = PodConfig::default();
        cfg.engine.max_num_seqs = 0;
        cfg.engine.speed = 0.0;
        let err = cfg.validate().unwrap_err();
        assert_eq!(err.problems.len(), 2, "{err}");
    }

    #[test]
    fn wall_time_divides_by_speed_and_time_scale() {
        let cfg = EngineConfig {
            speed: 2.0,
            time_scale: 10.0,
            ..EngineConfig::default()
        };
        assert_eq!(
            cfg.wall(Duration::from_millis(200)),
            Duration::from_millis(10)
        );
    }
}

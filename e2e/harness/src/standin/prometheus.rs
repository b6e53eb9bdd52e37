//! `/metrics` in vLLM's Prometheus text format (V1 engine, single API server): the series an
//! endpoint picker reads (queue, running, KV usage under both names, LoRA info, cache geometry)
//! plus the token and request counters, with vLLM's labels and Python-style number formatting.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use super::state::MetricValues;
use super::StandInOptions;

/// One metric family: name, type and help text, as vLLM declares them.
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
}

const fn family(name: &'static str, kind: &'static str, help: &'static str) -> Family {
    Family { name, kind, help }
}

const RUNNING: Family = family(
    "vllm:num_requests_running",
    "gauge",
    "Number of requests in model execution batches.",
);
const WAITING: Family = family(
    "vllm:num_requests_waiting",
    "gauge",
    "Number of requests waiting to be processed.",
);
const GPU_CACHE: Family = family(
    "vllm:gpu_cache_usage_perc",
    "gauge",
    "GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
);
const KV_CACHE: Family = family(
    "vllm:kv_cache_usage_perc",
    "gauge",
    "KV-cache usage. 1 means 100 percent usage.",
);
const PROMPT_TOKENS: Family = family(
    "vllm:prompt_tokens_total",
    "counter",
    "Number of prefill tokens processed.",
);
const GENERATION_TOKENS: Family = family(
    "vllm:generation_tokens_total",
    "counter",
    "Number of generation tokens processed.",
);
const SUCCESS: Family = family(
    "vllm:request_success_total",
    "counter",
    "Count of successfully processed requests.",
);
const LORA: Family = family(
    "vllm:lora_requests_info",
    "gauge",
    "Running stats on lora requests.",
);
const CACHE_CONFIG: Family = family(
    "vllm:cache_config_info",
    "gauge",
    "Information of the LLMEngine CacheConfig",
);

/// Renders the exposition text.
pub fn render(opts: &StandInOptions, v: &MetricValues) -> String {
    let labels = format!("{{engine=\"0\",model_name=\"{}\"}}", opts.model);
    let success = format!(
        "{{engine=\"0\",finished_reason=\"stop\",model_name=\"{}\"}}",
        opts.model
    );
    let mut out = String::with_capacity(2048);
    write(&mut out, &RUNNING, &labels, v.running as f64);
    write(&mut out, &WAITING, &labels, v.waiting as f64);
    write(&mut out, &GPU_CACHE, &labels, v.kv_usage);
    write(&mut out, &KV_CACHE, &labels, v.kv_usage);
    write(
        &mut out,
        &PROMPT_TOKENS,
        &labels,
        v.prompt_tokens_total as f64,
    );
    write(
        &mut out,
        &GENERATION_TOKENS,
        &labels,
        v.generation_tokens_total as f64,
    );
    write(&mut out, &SUCCESS, &success, v.requests_total as f64);
    if !opts.lora_adapters.is_empty() {
        write(&mut out, &LORA, &lora_labels(opts, v), unix_now());
    }
    write(&mut out, &CACHE_CONFIG, &cache_config_labels(opts), 1.0);
    out
}

/// Appends a family with one sample.
fn write(out: &mut String, family: &Family, labels: &str, value: f64) {
    let Family { name, kind, help } = family;
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    let _ = writeln!(out, "{name}{labels} {}", py_float(value));
}

/// `vllm:lora_requests_info` has only its own three labels (no engine, no model_name).
fn lora_labels(opts: &StandInOptions, v: &MetricValues) -> String {
    format!(
        "{{max_lora=\"{}\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"{}\"}}",
        opts.max_lora,
        v.running_adapters.join(","),
        v.waiting_adapters.join(",")
    )
}

/// A typical `CacheConfig` label set, sorted as Python's client sorts labels.
fn cache_config_labels(opts: &StandInOptions) -> String {
    format!(
        "{{block_size=\"{}\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"0\",\
         gpu_memory_utilization=\"0.9\",num_cpu_blocks=\"None\",num_gpu_blocks=\"{}\",\
         prefix_caching_hash_algo=\"sha256\",sliding_window=\"None\"}}",
        opts.block_size, opts.num_gpu_blocks
    )
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Formats like Python's `prometheus_client` (`floatToGoString`): `repr` (`3.0`, `0.25`), and for
/// positive values with more than 6 integer digits Go's exponent form (`6.4929219e+07`).
pub fn py_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    let repr = format!("{v:?}");
    match repr.find('.') {
        Some(dot) if v > 0.0 && dot > 6 => {
            let digits = format!("{}.{}{}", &repr[..1], &repr[1..dot], &repr[dot + 1..]);
            let mantissa = digits.trim_end_matches(['0', '.']);
            format!("{mantissa}e+0{}", dot - 1)
        }
        _ => repr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values() -> MetricValues {
        MetricValues {
            waiting: 3,
            running: 12,
            kv_usage: 0.4171875,
            running_adapters: vec!["sql-lora".into(), "tweet-lora".into()],
            waiting_adapters: Vec::new(),
            prompt_tokens_total: 0,
            generation_tokens_total: 0,
            requests_total: 0,
        }
    }

    #[test]
    fn formats_numbers_like_python() {
        assert_eq!(py_float(3.0), "3.0");
        assert_eq!(py_float(0.25), "0.25");
        assert_eq!(py_float(64_929_219.0), "6.4929219e+07");
        assert_eq!(py_float(1_755_000_456.2), "1.7550004562e+09");
        assert_eq!(py_float(1e6), "1e+06");
    }

    #[test]
    fn renders_the_series_an_endpoint_picker_reads() {
        let opts = StandInOptions {
            model: "m".into(),
            lora_adapters: vec!["sql-lora".into()],
            ..StandInOptions::default()
        };
        let text = render(&opts, &values());
        for line in [
            "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 12.0",
            "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3.0",
            "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.4171875",
            "vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.4171875",
            "# TYPE vllm:cache_config_info gauge",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        assert!(text.contains("running_lora_adapters=\"sql-lora,tweet-lora\""));
        assert!(text.contains("block_size=\"16\""));
    }

    #[test]
    fn omits_lora_info_without_adapters() {
        let text = render(&StandInOptions::default(), &values());
        assert!(!text.contains("lora_requests_info"));
    }
}

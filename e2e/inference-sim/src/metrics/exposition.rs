//! Prometheus text exposition in the exact shape of vLLM's `prometheus_client`.
//!
//! What must stay true (reference section 2.4): every family has `# HELP` and
//! `# TYPE`; counters are exposed as `<name>_total`, followed (single API
//! server) by a `<name>_created` gauge family; histogram samples are all
//! `_bucket` lines in ascending `le` then `_count` then `_sum`; labels are
//! sorted; values use Python's float repr with `prometheus_client`'s switch to
//! exponent form above six integer digits (`1.843712e+06`).

use std::fmt::Write;

use super::{Histogram, PodMetrics};
use crate::config::{EngineNaming, KvUsageMetric, PodConfig};
use crate::engine::FinishReason;

/// Python `repr(float)` (shortest round-trip digits, exponent form below 1e-4
/// and from 1e16), then `prometheus_client.utils.floatToGoString`.
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
    let s = py_repr(v);
    match s.find('.') {
        Some(dot) if v > 0.0 && dot > 6 => {
            let mantissa = format!("{}.{}{}", &s[..1], &s[1..dot], &s[dot + 1..]);
            let mantissa = mantissa.trim_end_matches(['0', '.']);
            format!("{mantissa}e+{:02}", dot - 1)
        }
        _ => s,
    }
}

fn py_repr(v: f64) -> String {
    if v == 0.0 {
        return if v.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    let sci = format!("{:e}", v.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if v < 0.0 { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let body = if exp >= 0 {
            let int_len = exp as usize + 1;
            let padded = format!("{digits:0<int_len$}");
            let (int, frac) = padded.split_at(int_len);
            format!("{int}.{}", if frac.is_empty() { "0" } else { frac })
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        };
        return format!("{sign}{body}");
    }
    let (first, rest) = digits.split_at(1);
    let frac = if rest.is_empty() {
        String::new()
    } else {
        format!(".{rest}")
    };
    let esign = if exp < 0 { '-' } else { '+' };
    format!("{sign}{first}{frac}e{esign}{:02}", exp.abs())
}

fn escape(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('\n', r"\n")
        .replace('"', r#"\""#)
}

/// Builds the text, one family at a time.
struct Writer<'a> {
    out: String,
    common: [(&'static str, &'a str); 2],
    created: Option<f64>,
}

impl Writer<'_> {
    fn header(&mut self, name: &str, help: &str, kind: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, extra: &[(&str, &str)], value: f64, common: bool) {
        let mut labels: Vec<(&str, &str)> = extra.to_vec();
        if common {
            labels.extend(self.common.iter().copied());
        }
        labels.sort_by(|a, b| a.0.cmp(b.0));
        let body: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
            .collect();
        let _ = writeln!(self.out, "{name}{{{}}} {}", body.join(","), py_float(value));
    }

    fn gauge(&mut self, name: &str, help: &str, value: f64) {
        self.header(name, help, "gauge");
        self.sample(name, &[], value, true);
    }

    fn created_family(&mut self, base: &str, help: &str, series: &[&[(&str, &str)]]) {
        let Some(created) = self.created else { return };
        let name = format!("{base}_created");
        self.header(&name, help, "gauge");
        for labels in series {
            self.sample(&name, labels, created, true);
        }
    }

    fn counter(&mut self, base: &str, help: &str, value: u64) {
        let name = format!("{base}_total");
        self.header(&name, help, "counter");
        self.sample(&name, &[], value as f64, true);
        self.created_family(base, help, &[&[]]);
    }

    fn histogram(&mut self, name: &str, help: &str, h: &Histogram) {
        self.header(name, help, "histogram");
        let bucket = format!("{name}_bucket");
        let mut cumulative = 0u64;
        for (i, count) in h.counts.iter().enumerate() {
            cumulative += count;
            let le = h
                .bounds
                .get(i)
                .map_or_else(|| "+Inf".to_owned(), |b| py_float(*b));
            self.sample(&bucket, &[("le", &le)], cumulative as f64, true);
        }
        self.sample(&format!("{name}_count"), &[], cumulative as f64, true);
        self.sample(&format!("{name}_sum"), &[], h.sum, true);
        self.created_family(name, help, &[&[]]);
    }
}

/// Renders the `/metrics` text of one pod.
pub fn render(m: &PodMetrics, cfg: &PodConfig) -> String {
    let mut w = Writer {
        out: String::with_capacity(32 * 1024),
        common: [("engine", "0"), ("model_name", &cfg.engine.model)],
        created: cfg.metrics.created_series.then_some(m.created),
    };
    gauges(&mut w, m, cfg);
    counters(&mut w, m);
    histograms(&mut w, m);
    if cfg.engine.kv_transfer.is_some() {
        let h = &m.histograms;
        w.histogram(
            "vllm:nixl_xfer_time_seconds",
            "Histogram of transfer duration for NIXL KV Cache transfers.",
            &h.nixl_xfer_time,
        );
        w.histogram(
            "vllm:nixl_bytes_transferred",
            "Histogram of bytes transferred per NIXL KV Cache transfers.",
            &h.nixl_bytes,
        );
    }
    if cfg.enable_lora {
        lora_info(&mut w, m, cfg.engine.max_loras);
    }
    if m.initialised {
        cache_config(&mut w, cfg);
    }
    w.out
}

fn gauges(w: &mut Writer<'_>, m: &PodMetrics, cfg: &PodConfig) {
    let g = &m.gauges;
    match cfg.metrics.naming {
        EngineNaming::Vllm => {}
        EngineNaming::Sglang => {
            w.gauge(
                "sglang:num_running_reqs",
                "The number of running requests.",
                g.running as f64,
            );
            w.gauge(
                "sglang:num_queue_reqs",
                "The number of requests in the waiting queue.",
                g.waiting as f64,
            );
            w.gauge("sglang:token_usage", "The token usage.", g.kv_usage);
            return;
        }
        EngineNaming::TrtllmServe => {
            w.gauge(
                "trtllm_num_requests_running",
                "Running requests.",
                g.running as f64,
            );
            w.gauge(
                "trtllm_num_requests_waiting",
                "Waiting requests.",
                g.waiting as f64,
            );
            w.gauge(
                "trtllm_kv_cache_utilization",
                "KV-cache utilization.",
                g.kv_usage,
            );
            return;
        }
    }
    w.gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        g.running as f64,
    );
    w.gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        g.waiting as f64,
    );
    if matches!(
        cfg.metrics.kv_usage,
        KvUsageMetric::Old | KvUsageMetric::Both
    ) {
        let help = "GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use vllm:kv_cache_usage_perc instead.";
        w.gauge("vllm:gpu_cache_usage_perc", help, g.kv_usage);
    }
    if matches!(
        cfg.metrics.kv_usage,
        KvUsageMetric::New | KvUsageMetric::Both
    ) {
        w.gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            g.kv_usage,
        );
    }
}

fn counters(w: &mut Writer<'_>, m: &PodMetrics) {
    let c = &m.counters;
    w.counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        c.prefix_cache_queries,
    );
    w.counter(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        c.prefix_cache_hits,
    );
    w.counter(
        "vllm:num_preemptions",
        "Cumulative number of preemption from the engine.",
        c.preemptions,
    );
    w.counter(
        "vllm:prompt_tokens",
        "Number of prefill tokens processed.",
        c.prompt_tokens,
    );
    w.counter(
        "vllm:prompt_tokens_cached",
        "Number of cached prompt tokens (local + external).",
        c.prompt_tokens_cached,
    );
    w.counter(
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        c.generation_tokens,
    );
    let help = "Count of successfully processed requests.";
    w.header("vllm:request_success_total", help, "counter");
    let reasons: Vec<[(&str, &str); 1]> = FinishReason::ALL
        .iter()
        .map(|r| [("finished_reason", r.as_str())])
        .collect();
    for (labels, value) in reasons.iter().zip(c.success) {
        w.sample("vllm:request_success_total", labels, value as f64, true);
    }
    let series: Vec<&[(&str, &str)]> = reasons.iter().map(|l| l.as_slice()).collect();
    w.created_family("vllm:request_success", help, &series);
}

fn histograms(w: &mut Writer<'_>, m: &PodMetrics) {
    let h = &m.histograms;
    let families: [(&str, &str, &Histogram); 16] = [
        ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", &h.prompt_tokens),
        ("vllm:request_generation_tokens", "Number of generation tokens processed.", &h.generation_tokens),
        ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", &h.iteration_tokens),
        ("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.", &h.max_num_generation_tokens),
        ("vllm:request_params_n", "Histogram of the n request parameter.", &h.params_n),
        ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", &h.params_max_tokens),
        ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", &h.ttft),
        ("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.DEPRECATED: Use vllm:inter_token_latency_seconds instead.", &h.time_per_output_token),
        ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", &h.inter_token_latency),
        ("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.", &h.request_time_per_output_token),
        ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", &h.e2e),
        ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", &h.queue),
        ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", &h.inference),
        ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", &h.prefill),
        ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", &h.decode),
        ("vllm:request_prefill_kv_computed_tokens", "Histogram of new KV tokens computed during prefill (excluding cached tokens).", &h.prefill_kv_computed),
    ];
    for (name, help, hist) in families {
        w.histogram(name, help, hist);
    }
}

fn lora_info(w: &mut Writer<'_>, m: &PodMetrics, max_loras: usize) {
    let name = "vllm:lora_requests_info";
    w.header(name, "Running stats on lora requests.", "gauge");
    let max = max_loras.to_string();
    for info in &m.lora_info {
        let labels = [
            ("max_lora", max.as_str()),
            ("running_lora_adapters", info.running.as_str()),
            ("waiting_lora_adapters", info.waiting.as_str()),
        ];
        w.sample(name, &labels, info.timestamp, false);
    }
}

fn cache_config(w: &mut Writer<'_>, cfg: &PodConfig) {
    let block_size = cfg.engine.block_size.to_string();
    let blocks = cfg.engine.num_gpu_blocks.to_string();
    match cfg.metrics.naming {
        EngineNaming::Vllm => {}
        EngineNaming::Sglang => {
            let name = "sglang:cache_config_info";
            w.header(name, "Cache configuration.", "gauge");
            let labels = [
                ("num_pages", blocks.as_str()),
                ("page_size", block_size.as_str()),
            ];
            w.sample(name, &labels, 1.0, false);
            return;
        }
        EngineNaming::TrtllmServe => {
            w.gauge(
                "trtllm_kv_cache_tokens_per_block",
                "Tokens per KV block.",
                cfg.engine.block_size as f64,
            );
            w.gauge(
                "trtllm_kv_cache_max_blocks",
                "KV blocks.",
                cfg.engine.num_gpu_blocks as f64,
            );
            return;
        }
    }
    let name = "vllm:cache_config_info";
    w.header(name, "Information of the LLMEngine CacheConfig", "gauge");
    let block_size = cfg.engine.block_size.to_string();
    let blocks = cfg.engine.num_gpu_blocks.to_string();
    let labels = [
        ("block_size", block_size.as_str()),
        ("cache_dtype", "auto"),
        ("calculate_kv_scales", "False"),
        ("cpu_offload_gb", "0"),
        ("enable_prefix_caching", "True"),
        ("engine", "0"),
        ("gpu_memory_utilization", "0.9"),
        ("is_attention_free", "False"),
        ("num_cpu_blocks", "None"),
        ("num_gpu_blocks", blocks.as_str()),
        ("num_gpu_blocks_override", blocks.as_str()),
        ("prefix_caching_hash_algo", "sha256_cbor"),
        ("sliding_window", "None"),
        ("swap_space", "4"),
    ];
    w.sample(name, &labels, 1.0, false);
}

#[cfg(test)]
mod tests;

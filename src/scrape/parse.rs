//! Prometheus text exposition parsing, and extraction of the few series a picker needs.
//!
//! The parser is small and tolerant: comments are skipped, label values are unescaped, a
//! trailing timestamp is ignored, and a malformed line is skipped rather than failing the
//! scrape (one bad line from an exporter should not blind epp to a pod).

use crate::endpoint::{CacheInfo, EndpointMetrics, EngineType, LoraState};
use std::borrow::Cow;
use std::time::Instant;

/// A sample's labels: name and (unescaped) value.
pub(crate) type Labels<'a> = Vec<(&'a str, Cow<'a, str>)>;

/// One sample line. Label values borrow from the exposition unless they hold an escape.
#[derive(Debug, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    pub labels: Labels<'a>,
    pub value: f64,
}

impl Sample<'_> {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_ref())
    }
}

/// Iterates over the samples of an exposition.
pub fn samples(text: &str) -> impl Iterator<Item = Sample<'_>> {
    samples_named(text, |_| true)
}

/// The samples whose metric name `want` accepts. Other lines are skipped after reading their
/// name only: a vLLM exposition is ~350 samples (mostly histogram buckets) of which a picker
/// reads five, and epp scrapes every pod 20 times a second.
pub(crate) fn samples_named<'a>(
    text: &'a str,
    want: impl Fn(&str) -> bool,
) -> impl Iterator<Item = Sample<'a>> {
    text.lines().filter_map(move |line| {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
        want(&line[..name_end]).then(|| parse_sample(line, name_end))?
    })
}

/// One trimmed, non-comment line whose name ends at `name_end`.
fn parse_sample(line: &str, name_end: usize) -> Option<Sample<'_>> {
    let name = &line[..name_end];
    let (labels, rest) = if line[name_end..].starts_with('{') {
        parse_labels(&line[name_end + 1..])?
    } else {
        (Vec::new(), &line[name_end..])
    };
    let value = parse_value(rest.split_whitespace().next()?)?;
    Some(Sample {
        name,
        labels,
        value,
    })
}

fn parse_value(v: &str) -> Option<f64> {
    match v {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => v.parse().ok(),
    }
}

/// Parses `k="v",...}` and returns the labels and the text after `}`.
fn parse_labels(mut s: &str) -> Option<(Labels<'_>, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches([',', ' ']);
        if let Some(rest) = s.strip_prefix('}') {
            return Some((labels, rest));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim();
        let (value, rest) = parse_quoted(s[eq + 1..].trim_start())?;
        labels.push((key, value));
        s = rest;
    }
}

fn parse_quoted(s: &str) -> Option<(Cow<'_, str>, &str)> {
    let body = s.strip_prefix('"')?;
    // Most values hold no escape: borrow them.
    let end = body.find(['"', '\\'])?;
    if body.as_bytes()[end] == b'"' {
        return Some((Cow::Borrowed(&body[..end]), &body[end + 1..]));
    }
    let mut out = String::from(&body[..end]);
    let mut chars = body[end..].char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((Cow::Owned(out), &body[end + i + 1..])),
            '\\' => match chars.next()?.1 {
                'n' => out.push('\n'),
                other => out.push(other),
            },
            c => out.push(c),
        }
    }
    None
}

/// Which series carry each field, per engine (upstream `factories.go` defaults).
struct Names {
    waiting: Selector,
    running: Selector,
    kv: &'static [Selector],
    cache: CacheSpec,
    lora: Option<&'static str>,
}

/// The names of the series an endpoint's metrics come from (the DCGM GPU series included),
/// for the scrape's `?name[]=` filter.
pub(crate) fn series_names(engine: EngineType, overrides: &NameOverrides) -> Vec<&'static str> {
    let mut out: Vec<_> = overrides.apply(names(engine)).series().collect();
    out.sort_unstable();
    out.dedup();
    out
}

impl Names {
    /// Every series name a field is read from, the DCGM GPU series included.
    fn series(&self) -> impl Iterator<Item = &'static str> + '_ {
        let cache: [Option<&'static str>; 2] = match &self.cache {
            CacheSpec::Labels { series, .. } => [Some(series), None],
            CacheSpec::Gauges {
                block_size,
                num_blocks,
            } => [Some(block_size.0), Some(num_blocks.0)],
        };
        [self.waiting.0, self.running.0]
            .into_iter()
            .chain(self.kv.iter().map(|k| k.0))
            .chain(self.lora)
            .chain(cache.into_iter().flatten())
            .chain(super::dcgm::GpuAccumulator::NAMES)
    }

    /// Whether a series of this name feeds a field.
    fn reads(&self, name: &str) -> bool {
        self.series().any(|s| s == name)
    }
}

#[derive(Clone, Copy, Debug)]
struct Selector(&'static str, Option<(&'static str, &'static str)>);

enum CacheSpec {
    Labels {
        series: &'static str,
        block_size: &'static str,
        num_blocks: &'static str,
    },
    Gauges {
        block_size: Selector,
        num_blocks: Selector,
    },
}

fn names(engine: EngineType) -> Names {
    match engine {
        EngineType::Vllm => Names {
            waiting: Selector("vllm:num_requests_waiting", None),
            running: Selector("vllm:num_requests_running", None),
            kv: &[
                Selector("vllm:kv_cache_usage_perc", None),
                Selector("vllm:gpu_cache_usage_perc", None),
            ],
            cache: CacheSpec::Labels {
                series: "vllm:cache_config_info",
                block_size: "block_size",
                num_blocks: "num_gpu_blocks",
            },
            lora: Some("vllm:lora_requests_info"),
        },
        EngineType::Sglang => Names {
            waiting: Selector("sglang:num_queue_reqs", None),
            running: Selector("sglang:num_running_reqs", None),
            kv: &[Selector("sglang:token_usage", None)],
            cache: CacheSpec::Labels {
                series: "sglang:cache_config_info",
                block_size: "page_size",
                num_blocks: "num_pages",
            },
            lora: None,
        },
        EngineType::TrtllmServe => Names {
            waiting: Selector("trtllm_num_requests_waiting", None),
            running: Selector("trtllm_num_requests_running", None),
            kv: &[Selector("trtllm_kv_cache_utilization", None)],
            cache: CacheSpec::Gauges {
                block_size: Selector("trtllm_kv_cache_tokens_per_block", None),
                num_blocks: Selector("trtllm_kv_cache_max_blocks", None),
            },
            lora: None,
        },
        EngineType::TritonTrtllm => {
            const REQ: &str = "nv_trt_llm_request_metrics";
            const KV: &str = "nv_trt_llm_kv_cache_block_metrics";
            Names {
                waiting: Selector(REQ, Some(("request_type", "waiting"))),
                running: Selector(REQ, Some(("request_type", "scheduled"))),
                kv: &[Selector(KV, Some(("kv_cache_block_type", "fraction")))],
                cache: CacheSpec::Gauges {
                    block_size: Selector(KV, Some(("kv_cache_block_type", "tokens_per"))),
                    num_blocks: Selector(KV, Some(("kv_cache_block_type", "max"))),
                },
                lora: None,
            }
        }
    }
}

/// The metric names given on the command line (upstream's per-engine flags
/// `--total-queued-requests-metric` and friends, which its GIE chart renders for SGLang and
/// TRT-LLM): each replaces the engine's own series for every endpoint. A name may carry one
/// label matcher, `name{label="value"}`.
#[derive(Clone, Copy, Debug, Default)]
pub struct NameOverrides {
    waiting: Option<Selector>,
    running: Option<Selector>,
    kv: Option<&'static [Selector]>,
    lora: Option<&'static str>,
    cache: Option<&'static str>,
}

/// The five metric-name flags, as given.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NameFlags<'a> {
    pub(crate) waiting: Option<&'a str>,
    pub(crate) running: Option<&'a str>,
    pub(crate) kv: Option<&'a str>,
    pub(crate) lora: Option<&'a str>,
    pub cache: Option<&'a str>,
}

/// Why a metric-name flag is refused.
#[derive(Debug, thiserror::Error)]
pub enum NameError {
    #[error("--{flag} {value:?}: expected NAME or NAME{{LABEL=\"VALUE\"}}")]
    Selector { flag: String, value: String },
    #[error("--{0}: a label matcher is not allowed here")]
    LabelMatcher(String),
}

impl NameOverrides {
    /// Parses the flags; the names live for the process (they are set once, at start-up).
    /// A value is unquoted first (the GIE chart renders `--flag="name"` as one argument, and
    /// no shell removes the quotes); an empty value (`--lora-info-metric ''`) means unset.
    pub(crate) fn parse(flags: NameFlags<'_>) -> Result<Self, NameError> {
        let sel = |flag: &str, v: Option<&str>| -> Result<Option<Selector>, NameError> {
            v.map(unquote)
                .filter(|v| !v.is_empty())
                .map(|v| {
                    Selector::parse(v).ok_or_else(|| NameError::Selector {
                        flag: flag.to_owned(),
                        value: v.to_owned(),
                    })
                })
                .transpose()
        };
        let plain = |flag: &str, v: Option<&str>| -> Result<Option<&'static str>, NameError> {
            match sel(flag, v)? {
                Some(Selector(name, None)) => Ok(Some(name)),
                Some(_) => Err(NameError::LabelMatcher(flag.to_owned())),
                None => Ok(None),
            }
        };
        Ok(Self {
            waiting: sel("total-queued-requests-metric", flags.waiting)?,
            running: sel("total-running-requests-metric", flags.running)?,
            kv: sel("kv-cache-usage-percentage-metric", flags.kv)?
                .map(|k| -> &'static [Selector] { Box::leak(Box::new([k])) }),
            lora: plain("lora-info-metric", flags.lora)?,
            cache: plain("cache-info-metric", flags.cache)?,
        })
    }

    fn apply(&self, mut n: Names) -> Names {
        n.waiting = self.waiting.unwrap_or(n.waiting);
        n.running = self.running.unwrap_or(n.running);
        n.kv = self.kv.unwrap_or(n.kv);
        n.lora = self.lora.or(n.lora);
        if let (Some(name), CacheSpec::Labels { series, .. }) = (self.cache, &mut n.cache) {
            *series = name;
        }
        n
    }

    fn is_empty(&self) -> bool {
        self.waiting.is_none()
            && self.running.is_none()
            && self.kv.is_none()
            && self.lora.is_none()
            && self.cache.is_none()
    }
}

/// Removes one pair of surrounding double quotes, and surrounding white space.
pub(crate) fn unquote(v: &str) -> &str {
    let v = v.trim();
    v.strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(v)
}

impl Selector {
    /// `name` or `name{label="value"}` (quotes optional); the strings are leaked, once per flag.
    fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let leak = |s: &str| -> &'static str { Box::leak(s.to_owned().into_boxed_str()) };
        let valid = |s: &str| {
            !s.is_empty() && !s.contains(|c: char| c.is_whitespace() || "{}=\"".contains(c))
        };
        match text.split_once('{') {
            None => valid(text).then(|| Selector(leak(text), None)),
            Some((name, rest)) => {
                let (label, value) = rest.strip_suffix('}')?.split_once('=')?;
                let value = value.trim().trim_matches('"');
                (valid(name) && valid(label.trim()) && valid(value))
                    .then(|| Selector(leak(name), Some((leak(label.trim()), leak(value)))))
            }
        }
    }

    fn matches(&self, s: &Sample<'_>) -> bool {
        s.name == self.0 && self.1.is_none_or(|(k, v)| s.label(k) == Some(v))
    }
}

#[derive(Debug, PartialEq, thiserror::Error)]
pub(crate) enum ExtractError {
    #[error("metric {0} not found in the exposition")]
    Missing(&'static str),
}

/// Extracts an endpoint's metrics from an exposition. Several series of one field (one per
/// engine behind a data-parallel API server) are summed for queues and maximised for KV usage.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn extract(
    text: &str,
    engine: EngineType,
    now: Instant,
) -> Result<EndpointMetrics, ExtractError> {
    extract_with(text, engine, &NameOverrides::default(), now)
}

/// [`extract`] with the command line's metric names.
pub(crate) fn extract_with(
    text: &str,
    engine: EngineType,
    overrides: &NameOverrides,
    now: Instant,
) -> Result<EndpointMetrics, ExtractError> {
    let n = if overrides.is_empty() {
        names(engine)
    } else {
        overrides.apply(names(engine))
    };
    let (mut waiting, mut running) = (None::<f64>, None::<f64>);
    let mut kv: Vec<Option<f64>> = vec![None; n.kv.len()];
    let (mut block_size, mut num_blocks) = (None, None);
    let mut lora: Option<(f64, LoraState)> = None;
    let mut gpu = super::dcgm::GpuAccumulator::new(None);
    for s in samples_named(text, |name| n.reads(name)) {
        if n.waiting.matches(&s) {
            *waiting.get_or_insert(0.0) += s.value;
        } else if n.running.matches(&s) {
            *running.get_or_insert(0.0) += s.value;
        } else if let Some(i) = n.kv.iter().position(|k| k.matches(&s)) {
            kv[i] = Some(kv[i].map_or(s.value, |v: f64| v.max(s.value)));
        } else if n.lora == Some(s.name) {
            if lora.as_ref().is_none_or(|(ts, _)| s.value > *ts) {
                lora = Some((s.value, lora_state(&s)));
            }
        } else if super::dcgm::GpuAccumulator::wants(s.name) {
            gpu.observe(&s);
        } else {
            cache_field(&n.cache, &s, &mut block_size, &mut num_blocks);
        }
    }
    let cache = match (block_size, num_blocks) {
        (Some(b), Some(n)) if b > 0 => Some(CacheInfo {
            block_size: b,
            num_blocks: n,
        }),
        _ => None,
    };
    Ok(EndpointMetrics {
        waiting: waiting.ok_or(ExtractError::Missing(n.waiting.0))?,
        running: running.ok_or(ExtractError::Missing(n.running.0))?,
        kv_usage: kv
            .into_iter()
            .flatten()
            .next()
            .ok_or(ExtractError::Missing(n.kv[0].0))?,
        lora: lora.map(|(_, l)| l),
        cache,
        gpu: gpu.finish(),
        pool: None,
        attributes: Vec::new(),
        updated: now,
    })
}

fn cache_field(
    spec: &CacheSpec,
    s: &Sample<'_>,
    block_size: &mut Option<u32>,
    num_blocks: &mut Option<u64>,
) {
    match spec {
        CacheSpec::Labels {
            series,
            block_size: b,
            num_blocks: n,
        } if s.name == *series => {
            *block_size = s.label(b).and_then(|v| v.parse().ok());
            *num_blocks = s.label(n).and_then(|v| v.parse().ok());
        }
        CacheSpec::Gauges {
            block_size: b,
            num_blocks: n,
        } => {
            if b.matches(s) {
                *block_size = Some(s.value as u32);
            } else if n.matches(s) {
                *num_blocks = Some(s.value as u64);
            }
        }
        CacheSpec::Labels { .. } => {}
    }
}

fn lora_state(s: &Sample<'_>) -> LoraState {
    let list = |key: &str| -> Vec<String> {
        s.label(key)
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(String::from)
            .collect()
    };
    LoraState {
        running: list("running_lora_adapters"),
        waiting: list("waiting_lora_adapters"),
        max_loras: s
            .label("max_lora")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 1.0
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.9
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.4171875
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1.843712e+06
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql-lora,tweet-lora",waiting_lora_adapters=""} 1.7550004562e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.7550004401e+09
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="27493",sliding_window="None"} 1.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 480.0
"#;

    #[test]
    fn command_line_names_replace_the_engines() {
        let o = NameOverrides::parse(NameFlags {
            waiting: Some("my_queue{kind=\"waiting\"}"),
            running: Some("my_running"),
            kv: Some("my_kv"),
            ..NameFlags::default()
        })
        .unwrap();
        let text =
            "my_queue{kind=\"waiting\"} 4\nmy_queue{kind=\"other\"} 9\nmy_running 2\nmy_kv 0.25\n";
        let m = extract_with(text, EngineType::Sglang, &o, Instant::now()).unwrap();
        assert_eq!((m.waiting, m.running, m.kv_usage), (4.0, 2.0, 0.25));
        let quoted = NameOverrides::parse(NameFlags {
            waiting: Some("\"sglang:num_queue_reqs\""),
            lora: Some(""),
            ..NameFlags::default()
        })
        .unwrap();
        assert_eq!(quoted.waiting.map(|s| s.0), Some("sglang:num_queue_reqs"));
        assert!(quoted.lora.is_none());
        for bad in ["a b", "x{y}", "x{=v}", "\"\"x"] {
            let flags = NameFlags {
                waiting: Some(bad),
                ..NameFlags::default()
            };
            assert!(NameOverrides::parse(flags).is_err(), "{bad:?}");
        }
        let flags = NameFlags {
            lora: Some("l{a=b}"),
            ..NameFlags::default()
        };
        assert!(NameOverrides::parse(flags).is_err());
    }

    #[test]
    fn extracts_vllm_metrics_from_a_realistic_exposition() {
        let m = extract(VLLM, EngineType::Vllm, Instant::now()).unwrap();
        assert_eq!((m.waiting, m.running, m.kv_usage), (4.0, 12.0, 0.4171875));
        assert_eq!(
            m.cache,
            Some(CacheInfo {
                block_size: 16,
                num_blocks: 27493
            })
        );
        let lora = m.lora.unwrap();
        assert_eq!(
            lora.running,
            vec!["sql-lora", "tweet-lora"],
            "the newest series wins"
        );
        assert_eq!(lora.max_loras, 4);
    }

    #[test]
    fn falls_back_to_the_old_kv_name_and_names_what_is_missing() {
        let old = VLLM.replace("vllm:kv_cache_usage_perc", "vllm:other");
        assert_eq!(
            extract(&old, EngineType::Vllm, Instant::now())
                .unwrap()
                .kv_usage,
            0.9
        );
        let err = extract(
            "vllm:num_requests_running 1\n",
            EngineType::Vllm,
            Instant::now(),
        )
        .unwrap_err();
        assert_eq!(err, ExtractError::Missing("vllm:num_requests_waiting"));
    }

    #[test]
    fn reads_other_engines() {
        let sg = "sglang:num_queue_reqs 2\nsglang:num_running_reqs 5\nsglang:token_usage 0.3\nsglang:cache_config_info{page_size=\"1\",num_pages=\"900\"} 1\n";
        let m = extract(sg, EngineType::Sglang, Instant::now()).unwrap();
        assert_eq!((m.waiting, m.running, m.kv_usage), (2.0, 5.0, 0.3));
        assert_eq!(m.cache.unwrap().num_blocks, 900);
        let tr = "nv_trt_llm_request_metrics{request_type=\"waiting\"} 7\nnv_trt_llm_request_metrics{request_type=\"scheduled\"} 1\nnv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"fraction\"} 0.5\nnv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"tokens_per\"} 32\nnv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"max\"} 100\n";
        let m = extract(tr, EngineType::TritonTrtllm, Instant::now()).unwrap();
        assert_eq!((m.waiting, m.running, m.kv_usage), (7.0, 1.0, 0.5));
        assert_eq!(
            m.cache,
            Some(CacheInfo {
                block_size: 32,
                num_blocks: 100
            })
        );
    }

    #[test]
    fn parser_unescapes_and_skips_garbage() {
        let text = "a{x=\"q\\\"uote\\\\\",y=\"1\"} 2 1700000000\nbroken{ 1\nb +Inf\n";
        let got: Vec<Sample<'_>> = samples(text).collect();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].label("x"), Some("q\"uote\\"));
        assert_eq!(got[0].value, 2.0);
        assert!(got[1].value.is_infinite());
    }
}

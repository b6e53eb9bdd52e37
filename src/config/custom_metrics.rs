//! `core-metrics-extractor`'s `engineConfigs` `customMetrics` (llm-d-router v0.10's
//! `extractor/metrics`): per engine, series whose value each scrape stores as an endpoint
//! attribute under its `attributeKey`, for the `endpoint-attribute-*` plugins to read.
//!
//! A specification is upstream's: `name` or `name{label=value,...}` (values quoted or not).
//! The scraper reads them (`scrape::custom`).

use crate::endpoint::EngineType;
use crate::plugin::Invalid;

/// One series to read: its name and the labels it must carry.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SeriesSpec {
    name: String,
    labels: Vec<(String, String)>,
}

/// Why a metric specification does not parse (upstream's message).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("not a valid metric specification: {0:?}")]
pub(crate) struct SpecError(String);

impl SeriesSpec {
    pub(crate) fn parse(text: &str) -> Result<Self, SpecError> {
        let bad = || SpecError(text.to_owned());
        let trimmed = text.trim();
        let (name, block) = match trimmed.split_once('{') {
            None => (trimmed, None),
            Some((name, rest)) => (name.trim(), Some(rest.strip_suffix('}').ok_or_else(bad)?)),
        };
        if !valid_name(name, true) {
            return Err(bad());
        }
        let mut labels = Vec::new();
        for pair in block
            .map(str::trim)
            .filter(|b| !b.is_empty())
            .into_iter()
            .flat_map(|b| b.split(','))
        {
            let (k, v) = pair.split_once('=').ok_or_else(bad)?;
            let (k, v) = (k.trim(), v.trim());
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v);
            if !valid_name(k, false) || v.contains('"') {
                return Err(bad());
            }
            labels.push((k.to_owned(), v.to_owned()));
        }
        Ok(Self {
            name: name.to_owned(),
            labels,
        })
    }

    /// The series name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Whether a sample named `name` whose labels `label` looks up is this series.
    pub(crate) fn matches<'l>(&self, name: &str, label: impl Fn(&str) -> Option<&'l str>) -> bool {
        name == self.name
            && self
                .labels
                .iter()
                .all(|(k, v)| label(k) == Some(v.as_str()))
    }
}

/// A Prometheus metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`), or a label name (no colons).
fn valid_name(s: &str, colons: bool) -> bool {
    let ok = |c: char| c.is_ascii_alphanumeric() || c == '_' || (colons && c == ':');
    s.chars()
        .next()
        .is_some_and(|c| ok(c) && !c.is_ascii_digit())
        && s.chars().all(ok)
}

/// Every engine's custom metrics, as the configuration lists them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CustomMetrics(Vec<(EngineType, String, SeriesSpec)>);

impl CustomMetrics {
    /// Reads `spec` into attribute `key` for endpoints of `engine`.
    pub(crate) fn add(&mut self, engine: EngineType, key: String, spec: SeriesSpec) {
        self.0.push((engine, key, spec));
    }

    /// The series read for `engine`'s endpoints (for the scrape's `?name[]=` filter).
    pub(crate) fn names(&self, engine: EngineType) -> impl Iterator<Item = &str> {
        self.0
            .iter()
            .filter(move |(e, ..)| *e == engine)
            .map(|(_, _, s)| s.name.as_str())
    }

    /// `engine`'s (attributeKey, series), in configuration order.
    pub(crate) fn of(&self, engine: EngineType) -> impl Iterator<Item = (&str, &SeriesSpec)> {
        self.0
            .iter()
            .filter(move |(e, ..)| *e == engine)
            .map(|(_, k, s)| (k.as_str(), s))
    }
}

/// One `engineConfigs` entry of `core-metrics-extractor`.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub(crate) struct EngineConfig {
    name: String,
    queued_requests_spec: String,
    running_requests_spec: String,
    kv_usage_spec: String,
    lora_spec: String,
    cache_info_spec: String,
    cache_block_size_label_name: String,
    cache_num_blocks_label_name: String,
    cache_block_size_spec: String,
    cache_num_blocks_spec: String,
    custom_metrics: Vec<CustomMetricParams>,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
struct CustomMetricParams {
    attribute_key: String,
    metric_spec: String,
}

/// Upstream's built-in specifications of an engine epp knows (`defaultEngineConfigs`), in
/// [`EngineConfig::specs`]' order; the label names as upstream reads an empty one.
fn builtin(engine: EngineType) -> [&'static str; 9] {
    match engine {
        EngineType::Vllm => [
            "vllm:num_requests_waiting",
            "vllm:num_requests_running",
            "vllm:kv_cache_usage_perc",
            "vllm:lora_requests_info",
            "vllm:cache_config_info",
            "block_size",
            "num_gpu_blocks",
            "",
            "",
        ],
        EngineType::Sglang => [
            "sglang:num_queue_reqs",
            "sglang:num_running_reqs",
            "sglang:token_usage",
            "",
            "sglang:cache_config_info",
            "page_size",
            "num_pages",
            "",
            "",
        ],
        EngineType::TrtllmServe => [
            "trtllm_num_requests_waiting",
            "trtllm_num_requests_running",
            "trtllm_kv_cache_utilization",
            "",
            "",
            "block_size",
            "num_gpu_blocks",
            "trtllm_kv_cache_tokens_per_block",
            "trtllm_kv_cache_max_blocks",
        ],
        EngineType::TritonTrtllm => [
            "nv_trt_llm_request_metrics{request_type=waiting}",
            "nv_trt_llm_request_metrics{request_type=scheduled}",
            "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}",
            "",
            "",
            "block_size",
            "num_gpu_blocks",
            "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=tokens_per}",
            "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max}",
        ],
    }
}

const SPEC_FIELDS: [&str; 9] = [
    "queuedRequestsSpec",
    "runningRequestsSpec",
    "kvUsageSpec",
    "loraSpec",
    "cacheInfoSpec",
    "cacheBlockSizeLabelName",
    "cacheNumBlocksLabelName",
    "cacheBlockSizeSpec",
    "cacheNumBlocksSpec",
];

impl EngineConfig {
    /// The series specifications and label names, in [`SPEC_FIELDS`]' order (an empty label
    /// name is upstream's default).
    fn specs(&self) -> [&str; 9] {
        [
            &self.queued_requests_spec,
            &self.running_requests_spec,
            &self.kv_usage_spec,
            &self.lora_spec,
            &self.cache_info_spec,
            non_empty(&self.cache_block_size_label_name, "block_size"),
            non_empty(&self.cache_num_blocks_label_name, "num_gpu_blocks"),
            &self.cache_block_size_spec,
            &self.cache_num_blocks_spec,
        ]
    }
}

fn non_empty<'a>(s: &'a str, default: &'a str) -> &'a str {
    if s.is_empty() {
        default
    } else {
        s
    }
}

/// The custom metrics of `configs`, checked as upstream checks them, and each entry's series
/// checked against epp's: epp reads its built-in series for each engine (the command line's
/// `--total-queued-requests-metric` family renames them), so an entry must name an engine
/// epp knows and repeat upstream's built-in specifications for it, adding `customMetrics`.
pub(crate) fn engine_configs(configs: &[EngineConfig]) -> Result<CustomMetrics, Vec<Invalid>> {
    let mut out = CustomMetrics::default();
    let mut problems = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (i, c) in configs.iter().enumerate() {
        let bad = |m: String| Invalid::new("engineConfigs", m);
        let engine = match c.name.as_str() {
            "" => Err(bad("engine config name cannot be empty".into())),
            "default" => Err(bad("engine config name cannot be \"default\" (reserved)".into())),
            name => EngineType::from_label(name).ok_or_else(|| bad(format!("engineConfigs[{i}].name {name:?} is not supported by epp: its engines are vllm, sglang, trtllm-serve and triton-tensorrt-llm"))),
        };
        let engine = match engine {
            Ok(e) if !seen.insert(e) => Err(bad(format!(
                "engineConfigs: engine {:?} is listed twice",
                c.name
            ))),
            other => other,
        };
        match engine.and_then(|e| check_entry(i, e, c, &mut out)) {
            Ok(()) => {}
            Err(p) => problems.push(p),
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

/// One entry's specifications against epp's, and its custom metrics added to `out`.
fn check_entry(
    i: usize,
    engine: EngineType,
    c: &EngineConfig,
    out: &mut CustomMetrics,
) -> Result<(), Invalid> {
    let bad = |m: String| Invalid::new("engineConfigs", m);
    for ((field, given), want) in SPEC_FIELDS.iter().zip(c.specs()).zip(builtin(engine)) {
        let same = given == want
            || matches!((SeriesSpec::parse(given), SeriesSpec::parse(want)), (Ok(a), Ok(b)) if a == b);
        if !same {
            return Err(bad(format!("engineConfigs[{i}].{field} {given:?} is not supported by epp: it reads {}'s built-in {want:?} (give upstream's built-in specifications, or rename series with the --total-queued-requests-metric family of flags)", c.name)));
        }
    }
    let mut keys = std::collections::BTreeSet::new();
    for m in &c.custom_metrics {
        let key = &m.attribute_key;
        let problem = if key.is_empty() {
            "custom metric attributeKey cannot be empty".to_owned()
        } else if !keys.insert(key) {
            format!("custom metric attributeKey {key:?} is duplicated")
        } else if m.metric_spec.trim().is_empty() {
            format!("custom metric {key:?} spec cannot be empty")
        } else {
            match SeriesSpec::parse(&m.metric_spec) {
                Ok(spec) => {
                    out.add(engine, key.clone(), spec);
                    continue;
                }
                Err(e) => format!("custom metric {key:?}: {e}"),
            }
        };
        return Err(bad(format!(
            "failed to create mapping for engine {:?}: {problem}",
            c.name
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specifications_parse_as_upstreams_and_bad_ones_are_refused() {
        let s = SeriesSpec::parse(" vllm:gpu_cache { model_name = \"m\", tier=gold } ").unwrap();
        assert_eq!(s.name, "vllm:gpu_cache");
        assert_eq!(
            s.labels,
            [
                ("model_name".into(), "m".into()),
                ("tier".into(), "gold".into())
            ]
        );
        assert_eq!(SeriesSpec::parse("queue").unwrap().labels, []);
        for bad in ["", "9lives", "a b", "a{b}", "a{b=c", "a{b:c=d}", "a{=x}"] {
            assert!(SeriesSpec::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn each_engine_has_its_own_series() {
        let mut c = CustomMetrics::default();
        let spec = |t| SeriesSpec::parse(t).unwrap();
        c.add(
            EngineType::Vllm,
            "slots".into(),
            spec("free_slots{kind=gpu}"),
        );
        c.add(EngineType::Sglang, "other".into(), spec("waiting"));
        let vllm: Vec<&str> = c.of(EngineType::Vllm).map(|(k, _)| k).collect();
        assert_eq!(vllm, ["slots"]);
        assert_eq!(c.names(EngineType::Sglang).collect::<Vec<_>>(), ["waiting"]);
        let s = spec("free_slots{kind=gpu}");
        let labels = [("kind", "gpu")];
        let find = |k: &str| labels.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
        assert!(s.matches("free_slots", find));
        assert!(!s.matches("free_slots", |_| None));
        assert!(!s.matches("other", find));
    }
}

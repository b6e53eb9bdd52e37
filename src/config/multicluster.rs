//! The data-layer plugins of llm-d-router v0.10's multi-cluster hub (alpha): a hub EPP treats
//! each cluster (a spoke EPP behind its gateway) as one endpoint, and reads each spoke EPP's
//! pool aggregates from its `/metrics` instead of a pod's gauges.
//!
//! - `multicluster-metrics-data-source`: `metrics-data-source`'s parameters with upstream's
//!   hub defaults: `scheme: https` and the peer's certificate verified (a cross-cluster scrape
//!   crosses a trust boundary), a private CA by `caCertPath`, a client certificate by
//!   `clientCertPath` + `clientKeyPath`; an answer is read up to 8 MiB. `port` is decoded and,
//!   as upstream, not used (a cluster names its metrics port with a `metricsPort` label).
//! - `multicluster-metrics-extractor`: which series carry the pool's KV-cache utilization and
//!   queue size (`kvCacheUtilizationMetric`, `queueSizeMetric`: `name` or
//!   `name{label="value",...}`; the first matching sample is read, as upstream's).
//!
//! `multicluster-file-discovery` shares `file-discovery`'s parameters ([`super::FileDiscovery`]
//! with `clusters`); its file is read by `crate::discovery::multicluster`.

use super::plugin::{NamedPlugin, Plugin};
use crate::plugin::Invalid;
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

/// Upstream's cap on a peer's answer (`maxResponseBytes`).
pub(crate) const MAX_ANSWER_BYTES: usize = 8 << 20;
/// The series a spoke EPP publishes (llm-d-router's and epp's name of the GIE pool gauges).
pub(crate) const DEFAULT_KV_METRIC: &str = "llm_d_epp_average_kv_cache_utilization";
pub(crate) const DEFAULT_QUEUE_METRIC: &str = "llm_d_epp_average_queue_size";

/// How the hub reaches a spoke's metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

/// `multicluster-metrics-data-source`, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterSource {
    pub(crate) scheme: Scheme,
    pub(crate) path: String,
    /// `insecureSkipVerify`: the peer's certificate is not checked (off by default).
    pub(crate) insecure_skip_verify: bool,
    /// `caCertPath`: the PEM bundle a spoke's certificate must chain to; otherwise the
    /// system's roots.
    pub(crate) ca_cert: Option<PathBuf>,
    /// `clientCertPath` + `clientKeyPath`: the hub's certificate, for spokes that ask for one.
    pub(crate) client_identity: Option<(PathBuf, PathBuf)>,
    /// `interval`: the scrape period, when longer than `--refresh-metrics-interval`.
    pub(crate) interval: Option<Duration>,
}

/// A series and the labels it must carry (`name{label="value"}`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MetricSpec {
    pub(crate) name: String,
    pub labels: Vec<(String, String)>,
}

/// `multicluster-metrics-extractor`, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterExtractor {
    pub(crate) kv_usage: MetricSpec,
    pub(crate) queue: MetricSpec,
}

/// What a hub scrapes: set when the configuration has a `multicluster-metrics-data-source`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ClusterMetrics {
    pub(crate) source: ClusterSource,
    pub(crate) extractor: ClusterExtractor,
}

/// `multicluster-metrics-data-source` parameters, decoded strictly.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub(crate) struct ClusterSourceParams {
    scheme: Option<String>,
    path: Option<String>,
    #[allow(dead_code)] // decoded, not used: upstream's hub source ignores it too
    port: Option<i64>,
    insecure_skip_verify: bool,
    ca_cert_path: String,
    client_cert_path: String,
    client_key_path: String,
    interval: String,
}

impl ClusterSourceParams {
    /// Upstream's checks: the scheme, the interval, a client certificate with its key.
    pub(crate) fn validate(self) -> Result<ClusterSource, Vec<Invalid>> {
        let mut problems = Vec::new();
        let scheme = match self.scheme.as_deref().unwrap_or("https") {
            "https" => Scheme::Https,
            "http" => Scheme::Http,
            other => {
                problems.push(Invalid::new(
                    "scheme",
                    format!("unsupported scheme: {other}"),
                ));
                Scheme::Https
            }
        };
        let interval = match self.interval.trim() {
            "" => None,
            text => match crate::duration::parse(text) {
                Ok(d) => Some(d),
                Err(e) => {
                    problems.push(Invalid::new(
                        "interval",
                        format!("invalid interval {text:?}: {e}"),
                    ));
                    None
                }
            },
        };
        let path_of = |s: &str| (!s.trim().is_empty()).then(|| PathBuf::from(s));
        let (cert, key) = (
            path_of(&self.client_cert_path),
            path_of(&self.client_key_path),
        );
        let client_identity = match (cert, key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => {
                problems.push(Invalid::new(
                    "clientCertPath/clientKeyPath",
                    "loading client cert: clientCertPath and clientKeyPath are set together",
                ));
                None
            }
        };
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(ClusterSource {
            scheme,
            path: self
                .path
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| "/metrics".to_owned()),
            insecure_skip_verify: self.insecure_skip_verify,
            ca_cert: path_of(&self.ca_cert_path).filter(|_| !self.insecure_skip_verify),
            client_identity,
            interval,
        })
    }
}

/// `multicluster-metrics-extractor` parameters, decoded strictly.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub(crate) struct ClusterExtractorParams {
    kv_cache_utilization_metric: String,
    queue_size_metric: String,
}

impl ClusterExtractorParams {
    /// Each name parsed (empty means the spoke EPP's own series), every bad one reported.
    pub(crate) fn validate(self) -> Result<ClusterExtractor, Vec<Invalid>> {
        let spec = |parameter: &'static str, what: &str, text: &str, default: &str| {
            let text = if text.is_empty() { default } else { text };
            MetricSpec::parse(text).ok_or_else(|| {
                Invalid::new(
                    parameter,
                    format!("{what} metric: not a valid metric specification: {text:?}"),
                )
            })
        };
        let kv = spec(
            "kvCacheUtilizationMetric",
            "kv-cache utilization",
            &self.kv_cache_utilization_metric,
            DEFAULT_KV_METRIC,
        );
        let queue = spec(
            "queueSizeMetric",
            "queue size",
            &self.queue_size_metric,
            DEFAULT_QUEUE_METRIC,
        );
        match (kv, queue) {
            (Ok(kv_usage), Ok(queue)) => Ok(ClusterExtractor { kv_usage, queue }),
            (kv, queue) => Err([kv.err(), queue.err()].into_iter().flatten().collect()),
        }
    }
}

impl Default for ClusterExtractor {
    /// The spoke EPP's own series.
    fn default() -> Self {
        let spec = |name: &str| MetricSpec {
            name: name.to_owned(),
            labels: Vec::new(),
        };
        Self {
            kv_usage: spec(DEFAULT_KV_METRIC),
            queue: spec(DEFAULT_QUEUE_METRIC),
        }
    }
}

impl MetricSpec {
    /// `name`, or `name{label="value",...}` (a value's quotes may be left out), as upstream's
    /// `parseStringToSpec`; `None` when it is not one.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let (name, block) = match text.split_once('{') {
            None => (text, ""),
            Some((name, rest)) => (name.trim_end(), rest.trim_end().strip_suffix('}')?),
        };
        if !valid_name(name, true) || block.contains('}') {
            return None;
        }
        let mut labels = Vec::new();
        for pair in block.split(',').filter(|p| !p.trim().is_empty()) {
            let (key, value) = pair.split_once('=')?;
            let (key, value) = (key.trim(), value.trim());
            let value = match value.strip_prefix('"') {
                Some(v) => v.strip_suffix('"')?,
                None => value,
            };
            if !valid_name(key, false) || value.contains('"') {
                return None;
            }
            labels.push((key.to_owned(), value.to_owned()));
        }
        Some(Self {
            name: name.to_owned(),
            labels,
        })
    }

    /// Whether a sample called `name`, whose labels `label` looks up, is this series.
    pub(crate) fn matches<'a>(&self, name: &str, label: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.name == name
            && self
                .labels
                .iter()
                .all(|(k, v)| label(k).is_some_and(|got| got == v))
    }
}

/// Prometheus's legacy name rule (`:` only in metric names).
fn valid_name(s: &str, metric: bool) -> bool {
    let mut chars = s.chars();
    let ok = |c: char| c.is_ascii_alphabetic() || c == '_' || (metric && c == ':');
    chars.next().is_some_and(ok) && chars.all(|c| ok(c) || c.is_ascii_digit())
}

/// The hub's scrape settings, when the configuration has a `multicluster-metrics-data-source`
/// (the last one wins; its extractor, or the default series when none is configured).
pub(crate) fn cluster_metrics(plugins: &[NamedPlugin]) -> Option<ClusterMetrics> {
    let source = plugins.iter().rev().find_map(|p| match &p.plugin {
        Plugin::ClusterMetricsSource(s) => Some(s.clone()),
        _ => None,
    })?;
    let extractor = plugins
        .iter()
        .rev()
        .find_map(|p| match &p.plugin {
            Plugin::ClusterMetricsExtractor(e) => Some(e.clone()),
            _ => None,
        })
        .unwrap_or_default();
    Some(ClusterMetrics { source, extractor })
}

#[cfg(test)]
mod tests;

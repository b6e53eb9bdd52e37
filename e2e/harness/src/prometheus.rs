//! Reading Prometheus text (epp's, a simulated pod's, Envoy's) in tests and benchmarks, with
//! epp's own exposition parser (`epp::scrape::parse`), so what a test reads is what epp's
//! scraper would read.
//!
//! A series is written as in the exposition: `name`, or `name{key="value",...}`. A sample
//! matches when its name is equal and its labels include every given label (others may be
//! present; a selector cut short after a label, `name{key="value"`, reads the same).

use std::collections::BTreeSet;
use std::net::SocketAddr;

pub use epp::scrape::parse::{samples, Sample};

/// A metric name and the labels a sample must carry.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub labels: Vec<(String, String)>,
}

impl Series {
    /// `name` with `labels`.
    pub fn new(name: &str, labels: &[(&str, &str)]) -> Self {
        Self {
            name: name.to_owned(),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    /// Parses `name` or `name{key="value",...}` (the closing brace may be left out). `None` when
    /// the label text is not valid exposition syntax.
    pub fn parse(series: &str) -> Option<Self> {
        let (name, labels) = match series.split_once('{') {
            None => (series, ""),
            Some((name, rest)) => (name, rest.strip_suffix('}').unwrap_or(rest)),
        };
        let line = format!("{name}{{{}}} 0", labels.trim_end_matches(','));
        let sample = samples(&line).next()?;
        Some(Self {
            name: sample.name.to_owned(),
            labels: sample
                .labels
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.into_owned()))
                .collect(),
        })
    }

    fn matches(&self, sample: &Sample<'_>) -> bool {
        sample.name == self.name
            && self
                .labels
                .iter()
                .all(|(k, v)| sample.label(k) == Some(v.as_str()))
    }

    /// Values of the matching samples of `text`, in order.
    pub fn values<'t>(&'t self, text: &'t str) -> impl Iterator<Item = f64> + 't {
        samples(text).filter(|s| self.matches(s)).map(|s| s.value)
    }
}

fn parsed(series: &str) -> Series {
    Series::parse(series).unwrap_or_else(|| panic!("not a series selector: {series}"))
}

/// The first sample of `series` in `text`. Panics when `series` is not a selector (a test bug).
pub fn value(text: &str, series: &str) -> Option<f64> {
    parsed(series).values(text).next()
}

/// The sum over every sample of `series` in `text` (0 when there is none).
pub fn sum(text: &str, series: &str) -> f64 {
    parsed(series).values(text).sum()
}

/// The first sample of `name` whose labels include every `(key, value)` of `labels`.
pub fn labelled(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    Series::new(name, labels).values(text).next()
}

/// Every metric name with at least one sample in `text`.
pub fn names(text: &str) -> BTreeSet<String> {
    samples(text).map(|s| s.name.to_owned()).collect()
}

/// `GET {path}` from `addr`, the body as text.
pub async fn scrape(addr: SocketAddr, path: &str) -> Result<String, crate::client::ClientError> {
    Ok(crate::client::get(addr, path).await?.text())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP vllm:num_requests_running Running.\n\
        # TYPE vllm:num_requests_running gauge\n\
        vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n\
        vllm:num_requests_running_created{engine=\"0\"} 1.7e9\n\
        epp_ejections_total{pod=\"a\"} 1\n\
        epp_ejections_total{pod=\"b\"} 2\n\
        bucket{engine=\"0\",le=\"0.3\",model_name=\"m\"} 2\n";

    #[test]
    fn a_series_matches_its_name_exactly_and_a_subset_of_its_labels() {
        assert_eq!(value(TEXT, "vllm:num_requests_running"), Some(3.0));
        assert_eq!(
            value(TEXT, "vllm:num_requests_running{model_name=\"m\"}"),
            Some(3.0)
        );
        assert_eq!(
            value(TEXT, "vllm:num_requests_running{model_name=\"x\"}"),
            None
        );
        assert_eq!(value(TEXT, "vllm:num_requests"), None);
        assert_eq!(value(TEXT, "bucket{engine=\"0\",le=\"0.3\""), Some(2.0));
        assert_eq!(
            labelled(TEXT, "epp_ejections_total", &[("pod", "b")]),
            Some(2.0)
        );
    }

    #[test]
    fn sums_add_every_matching_sample_and_names_list_the_families() {
        assert_eq!(sum(TEXT, "epp_ejections_total"), 3.0);
        assert_eq!(sum(TEXT, "absent"), 0.0);
        let names = names(TEXT);
        assert!(
            names.contains("epp_ejections_total") && names.len() == 4,
            "{names:?}"
        );
    }

    #[test]
    fn a_malformed_selector_is_refused() {
        assert_eq!(Series::parse("x{a=unquoted}"), None);
    }
}

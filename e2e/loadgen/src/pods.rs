//! Reads the model servers' own counters before and after a run (vLLM names): prefix-cache
//! queries and hits (tokens), finished requests and generated tokens per pod. The difference is
//! what this run did, whichever router was in front, even when a router hides which pod served.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// One pod's counters at one moment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PodCounters {
    pub prefix_queries: f64,
    pub prefix_hits: f64,
    pub requests: f64,
    pub generation_tokens: f64,
}

impl PodCounters {
    /// Parses the Prometheus text of a vLLM (or inference-sim) `/metrics`.
    pub fn parse(text: &str) -> Self {
        let mut c = Self::default();
        for sample in harness::prometheus::samples(text) {
            let v = sample.value;
            match sample.name {
                "vllm:prefix_cache_queries_total" | "vllm:prefix_cache_queries" => {
                    c.prefix_queries += v
                }
                "vllm:prefix_cache_hits_total" | "vllm:prefix_cache_hits" => c.prefix_hits += v,
                "vllm:request_success_total" => c.requests += v,
                "vllm:generation_tokens_total" | "vllm:generation_tokens" => {
                    c.generation_tokens += v
                }
                _ => {}
            }
        }
        c
    }

    /// `self - before`, field by field (a restarted pod counts from zero).
    pub fn since(&self, before: &Self) -> Self {
        let d = |a: f64, b: f64| if a >= b { a - b } else { a };
        Self {
            prefix_queries: d(self.prefix_queries, before.prefix_queries),
            prefix_hits: d(self.prefix_hits, before.prefix_hits),
            requests: d(self.requests, before.requests),
            generation_tokens: d(self.generation_tokens, before.generation_tokens),
        }
    }
}

/// Every pod's counters, keyed by its address (pods that do not answer are left out).
pub async fn scrape_all(pods: &[SocketAddr]) -> BTreeMap<String, PodCounters> {
    let mut out = BTreeMap::new();
    for &pod in pods {
        if let Ok(resp) = harness::client::get(pod, "/metrics").await {
            out.insert(pod.to_string(), PodCounters::parse(&resp.text()));
        }
    }
    out
}

/// Per-pod differences between two scrapes.
pub fn delta(
    after: &BTreeMap<String, PodCounters>,
    before: &BTreeMap<String, PodCounters>,
) -> BTreeMap<String, PodCounters> {
    after
        .iter()
        .map(|(pod, a)| {
            (
                pod.clone(),
                before.get(pod).map_or_else(|| a.clone(), |b| a.since(b)),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_summed_over_labels_and_created_series_ignored() {
        let text = "# HELP x\nvllm:prefix_cache_queries_total{model_name=\"m\"} 100.0\n\
            vllm:prefix_cache_hits_total{model_name=\"m\"} 40.0\nvllm:prefix_cache_hits_created{model_name=\"m\"} 1.7e9\n\
            vllm:request_success_total{finished_reason=\"stop\"} 3\nvllm:request_success_total{finished_reason=\"length\"} 2\n";
        let c = PodCounters::parse(text);
        assert_eq!(
            (c.prefix_queries, c.prefix_hits, c.requests),
            (100.0, 40.0, 5.0)
        );
        let later = PodCounters {
            prefix_queries: 150.0,
            ..c.clone()
        };
        assert_eq!(later.since(&c).prefix_queries, 50.0);
    }
}

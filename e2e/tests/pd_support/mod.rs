//! Helpers of the P/D end-to-end tests (`pd.rs`, `pd_dp.rs`): epp's and the pods' metrics,
//! the pods' recorded requests, forced queues, seeded long prompts.

#![allow(dead_code, clippy::unwrap_used)]

use std::time::{Duration, Instant};

use harness::client;
use harness::pd_sidecar::SidecarConfig;
use harness::stack::pd::{PdOptions, PdStack};
use inference_sim::EngineConfig;

/// The model every P/D test pod serves.
pub const MODEL: &str = "m";

/// Waits until every endpoint's queue has been scraped by epp.
pub async fn wait_scraped(stack: &PdStack) {
    let names = stack.endpoint_names();
    wait_for_epp(stack, "every endpoint scraped", |t| {
        names.iter().all(|e| {
            sample(
                t,
                "inference_pool_per_pod_queue_size",
                &[("model_server_pod", e)],
            )
            .is_some()
        })
    })
    .await;
}

pub async fn wait_for_epp(stack: &PdStack, what: &str, ready: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = stack.epp.metrics_text().await.unwrap();
        if ready(&text) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "epp never showed {what}:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A series of sim pod `i`'s `/metrics` (decode pods' ranks first, then prefill), summed over
/// its label sets.
pub async fn pod_metric(stack: &PdStack, i: usize, name: &str) -> f64 {
    let text = client::get(stack.cluster.addrs()[i], "/metrics")
        .await
        .unwrap()
        .text();
    sum(&text, name)
}

pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, label_text) = series.split_once('{').unwrap_or((series, ""));
            let wanted = labels
                .iter()
                .all(|(k, v)| label_text.contains(&format!("{k}=\"{v}\"")));
            (metric == name && wanted).then(|| value.parse().ok())?
        })
}

pub fn sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let metric = series.split_once('{').map_or(series, |(m, _)| m);
            (metric == name).then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

pub fn decisions(text: &str, decision: &str) -> f64 {
    let labels = [
        ("plugin_type", "disagg-profile-handler"),
        ("decision_type", decision),
    ];
    sample(text, "llm_d_epp_disagg_decision_total", &labels).unwrap_or(0.0)
}

/// About 2,000 tokens of seeded words.
pub fn long_prompt(seed: u64) -> String {
    use rand::{Rng, SeedableRng};
    const WORDS: [&str; 8] = [
        "river", "copper", "lantern", "meadow", "signal", "harbor", "violet", "engine",
    ];
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let words: Vec<&str> = (0..2000).map(|_| WORDS[rng.random_range(0..8)]).collect();
    words.join(" ")
}

/// The POSTs pod `i` received, as JSON bodies with their headers.
pub async fn posts(stack: &PdStack, i: usize) -> Vec<(http::HeaderMap, serde_json::Value)> {
    let control = stack.cluster.control(i).await.unwrap().unwrap();
    control
        .hook()
        .requests()
        .into_iter()
        .filter(|r| r.method == http::Method::POST)
        .map(|r| (r.headers, serde_json::from_slice(&r.body).unwrap()))
        .collect()
}

/// Forces pod `i`'s scraped queue and waits until epp has read it.
pub async fn set_queue(stack: &PdStack, i: usize, waiting: Option<u64>) {
    let control = stack.cluster.control(i).await.unwrap().unwrap();
    control.hook().set_waiting(waiting);
    let endpoint = stack.endpoint_names()[i].clone();
    let want = waiting.unwrap_or(0) as f64;
    wait_for_epp(stack, "the pod's queue scraped", |t| {
        sample(
            t,
            "inference_pool_per_pod_queue_size",
            &[("model_server_pod", &endpoint)],
        ) == Some(want)
    })
    .await;
}

/// The stack's options: one decode pod, `prefill` prefill pods, an example configuration.
pub fn options(
    prefill: usize,
    sidecar: SidecarConfig,
    record: bool,
    example: &str,
    flags: &[&str],
) -> PdOptions {
    let path = harness::envoy::repo_root()
        .join("config/examples")
        .join(example);
    let config = std::fs::read_to_string(path).unwrap();
    PdOptions {
        prefill,
        decode: 1,
        aggregated: false,
        engine: EngineConfig {
            model: MODEL.into(),
            time_scale: 10.0,
            default_max_output: 4,
            ..EngineConfig::default()
        },
        kv_bytes_per_token: 131_072.0,
        kv_bandwidth_gbps: 25.0,
        sidecar,
        epp_config: config,
        epp_args: [
            "--refresh-metrics-interval",
            "20ms",
            "--metrics-staleness-threshold",
            "1s",
            "--refresh-prometheus-metrics-interval",
            "50ms",
        ]
        .iter()
        .chain(flags)
        .map(|s| (*s).to_owned())
        .collect(),
        record_requests: record,
        data_parallel: 1,
        llmd_epp: None,
    }
}

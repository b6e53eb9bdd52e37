//! Compat cases where one pod is clearly the best by one signal, set up with real requests sent
//! straight to the pods (not through the router), so every EPP scrapes the same kind of state:
//!
//! - **queue**: every pod runs three 4,800-token requests (KV about 0.9 everywhere); the other
//!   pods also hold two more that wait for KV, the best pod none. Queue alone separates them.
//! - **kv-cache**: no pod has a queue and every pod runs three requests, 4,800-token prompts on
//!   the others and 100-token prompts on the best (KV about 0.9 against 0.03).
//! - **LoRA** ([`LORA`], pods serving two adapters, one at a time): every pod runs one 100-token
//!   request, for adapter [`LORA_BEST`] on the best pod and [`LORA_OTHER`] on the others, and the
//!   probe asks for [`LORA_BEST`]: same queue and KV everywhere, the adapter is active on the best
//!   pod only and the others have no room to load it. Run with each EPP's LoRA configuration.
//!
//! The probe (a short prompt no pod holds) is sent once every pod's own `/metrics` shows the
//! state and two scrape intervals have passed; the pods' states at that moment are recorded
//! with the outcome. The loads are dropped (their connections closed) after the probe.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use tokio::task::JoinSet;

use super::Outcome;
use harness::client;

/// Index of the pod that should win (the third).
pub const BEST: usize = 2;

/// One case: requests `(count, prompt tokens)` sent to every other pod and to the best one, and
/// what the scraped states must show before the probe.
#[derive(Clone, Copy, Debug)]
pub struct LoadCase {
    pub name: &'static str,
    pub slug: &'static str,
    others: (usize, usize),
    best: (usize, usize),
    /// The adapters the loads ask for (others, best) and the probe's (`None`: the base model).
    adapters: Option<(&'static str, &'static str)>,
    ready: fn(other: &PodState, best: &PodState) -> bool,
}

pub const CASES: [LoadCase; 2] = [
    LoadCase {
        name: "load: the third pod clearly best by queue",
        slug: "load-queue",
        others: (5, 4_800),
        best: (3, 4_800),
        adapters: None,
        ready: |o, b| o.waiting >= 1.0 && b.waiting == 0.0 && b.running >= 3.0,
    },
    LoadCase {
        name: "load: the third pod clearly best by KV cache",
        slug: "load-kv",
        others: (3, 4_800),
        best: (3, 100),
        adapters: None,
        ready: |o, b| {
            o.waiting == 0.0 && b.waiting == 0.0 && o.kv >= 0.5 && b.kv < 0.2 && b.running >= 3.0
        },
    },
];

/// The adapter the LoRA case's probe asks for, active on the best pod only.
pub const LORA_BEST: &str = "adapter-best";
/// The adapter active on every other pod (each can hold one).
pub const LORA_OTHER: &str = "adapter-other";

/// The LoRA case (the pods serve [`LORA_BEST`] and [`LORA_OTHER`], `--max-loras 1`).
pub const LORA: LoadCase = LoadCase {
    name: "load: the third pod clearly best by LoRA adapter",
    slug: "load-lora",
    others: (1, 100),
    best: (1, 100),
    adapters: Some((LORA_OTHER, LORA_BEST)),
    ready: |o, b| {
        o.waiting == 0.0
            && b.waiting == 0.0
            && o.running >= 1.0
            && b.running >= 1.0
            && o.lora == Some(Lora::Other)
            && b.lora == Some(Lora::Best)
    },
};

/// Which of the LoRA case's adapters a pod reports running (`vllm:lora_requests_info`, the
/// newest sample).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lora {
    Best,
    Other,
    /// Both, or an adapter of another name.
    Mixed,
}

/// What a pod's `/metrics` says.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PodState {
    pub waiting: f64,
    pub running: f64,
    pub kv: f64,
    /// The running adapters, `None` when none runs.
    pub lora: Option<Lora>,
}

impl PodState {
    /// Reads the vLLM gauges out of an exposition text.
    pub fn parse(text: &str) -> Self {
        let mut s = Self::default();
        let mut newest_lora = f64::NEG_INFINITY;
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (Some(name), Some(value)) = (
                line.split(['{', ' ']).next(),
                line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()),
            ) else {
                continue;
            };
            match name {
                "vllm:num_requests_waiting" => s.waiting = value,
                "vllm:num_requests_running" => s.running = value,
                "vllm:kv_cache_usage_perc" => s.kv = value,
                "vllm:lora_requests_info" if value > newest_lora => {
                    newest_lora = value;
                    s.lora = running_lora(line);
                }
                _ => {}
            }
        }
        s
    }
}

/// The `running_lora_adapters` label of a `vllm:lora_requests_info` line, as a [`Lora`].
fn running_lora(line: &str) -> Option<Lora> {
    let key = "running_lora_adapters=\"";
    let start = line.find(key)? + key.len();
    let value = &line[start..start + line[start..].find('"')?];
    let names: Vec<&str> = value.split(',').filter(|n| !n.is_empty()).collect();
    match names.as_slice() {
        [] => None,
        [n] if *n == LORA_BEST => Some(Lora::Best),
        [n] if *n == LORA_OTHER => Some(Lora::Other),
        _ => Some(Lora::Mixed),
    }
}

/// How long the pods get to reach a case's state.
const SETUP_LIMIT: Duration = Duration::from_secs(30);

/// Sets `case` up on `pods`, then sends the probe through `target`.
pub async fn run(case: &LoadCase, pods: &[SocketAddr], target: SocketAddr, model: &str) -> Outcome {
    let mut loads = JoinSet::new();
    for (i, pod) in pods.iter().enumerate() {
        let (count, tokens) = if i == BEST { case.best } else { case.others };
        let load_model = match case.adapters {
            Some((other, best)) => {
                if i == BEST {
                    best
                } else {
                    other
                }
            }
            None => model,
        };
        for r in 0..count {
            let body = load_body(load_model, i * 100 + r, tokens);
            let pod = *pod;
            loads.spawn(async move { client::post_json(pod, "/v1/completions", body).await });
        }
    }
    let states = match wait_ready(case, pods).await {
        Ok(s) => s,
        Err(last) => {
            return Outcome {
                note: format!("setup not reached in {SETUP_LIMIT:?}: {}", describe(&last)),
                ..Outcome::default()
            };
        }
    };
    // Two scrape intervals (50 ms for every EPP) so each has read the state.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let probe_model = case.adapters.map_or(model, |(_, best)| best);
    let body = format!(
        r#"{{"model":"{probe_model}","prompt":"probe {}: where does this go","max_tokens":1}}"#,
        case.slug
    );
    let probe = client::request(Method::POST, "/v1/completions", Bytes::from(body));
    let mut o = match probe {
        Ok(req) => super::outcome(client::send(target, req).await),
        Err(e) => Outcome {
            body: e.to_string(),
            ..Outcome::default()
        },
    };
    loads.abort_all();
    o.note = describe(&states);
    if o.pod.as_deref() != Some(BEST.to_string().as_str()) {
        o.note.push_str(&format!("; expected pod {BEST}"));
    }
    o
}

/// A completion of about `tokens` prompt tokens (" hello" is one cl100k token) that no other
/// request shares a block with, decoding long enough to stay running through the probe.
fn load_body(model: &str, id: usize, tokens: usize) -> String {
    let words = " hello".repeat(tokens.saturating_sub(4));
    format!(r#"{{"model":"{model}","prompt":"load {id}:{words}","max_tokens":3000}}"#)
}

/// Polls every pod until the case's state holds (`Err`: the last states seen).
async fn wait_ready(case: &LoadCase, pods: &[SocketAddr]) -> Result<Vec<PodState>, Vec<PodState>> {
    let deadline = Instant::now() + SETUP_LIMIT;
    loop {
        let mut states = Vec::with_capacity(pods.len());
        for pod in pods {
            let text = client::get(*pod, "/metrics")
                .await
                .map(|r| r.text())
                .unwrap_or_default();
            states.push(PodState::parse(&text));
        }
        let best = states.get(BEST).copied().unwrap_or_default();
        let ready = states
            .iter()
            .enumerate()
            .all(|(i, s)| i == BEST || (case.ready)(s, &best));
        if ready {
            return Ok(states);
        }
        if Instant::now() >= deadline {
            return Err(states);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `waiting w0/w1/…, kv k0/k1/…` as scraped (and the running adapters when any runs).
fn describe(states: &[PodState]) -> String {
    let join = |f: fn(&PodState) -> String| states.iter().map(f).collect::<Vec<_>>().join("/");
    let mut s = format!(
        "waiting {}, running {}, kv {}",
        join(|s| format!("{}", s.waiting)),
        join(|s| format!("{}", s.running)),
        join(|s| format!("{:.2}", s.kv))
    );
    if states.iter().any(|s| s.lora.is_some()) {
        s.push_str(&format!(
            ", adapters {}",
            join(|s| match s.lora {
                Some(Lora::Best) => "best".into(),
                Some(Lora::Other) => "other".into(),
                Some(Lora::Mixed) => "mixed".into(),
                None => "none".into(),
            })
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_vllm_gauges_with_and_without_labels() {
        let text = "# HELP x\nvllm:num_requests_waiting{model_name=\"m\"} 2\n\
                    vllm:num_requests_running 3\nvllm:kv_cache_usage_perc{engine=\"0\"} 0.93\n\
                    vllm:gpu_cache_usage_perc 0.5\n";
        assert_eq!(
            PodState::parse(text),
            PodState {
                waiting: 2.0,
                running: 3.0,
                kv: 0.93,
                lora: None,
            }
        );
    }

    #[test]
    fn reads_the_newest_lora_sample_and_the_case_needs_the_adapters_apart() {
        let text = "vllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"adapter-other\",waiting_lora_adapters=\"\"} 1700000001\n\
                    vllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"adapter-best\",waiting_lora_adapters=\"\"} 1700000009\n\
                    vllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"} 1700000005\n\
                    vllm:num_requests_running 1\n";
        let best = PodState::parse(text);
        assert_eq!(best.lora, Some(Lora::Best));
        let other = PodState {
            lora: Some(Lora::Other),
            ..best
        };
        assert!((LORA.ready)(&other, &best));
        assert!(!(LORA.ready)(&best, &best), "the adapter active everywhere");
        let idle = PodState {
            lora: None,
            ..other
        };
        assert!(!(LORA.ready)(&idle, &best), "a pod with room to load it");
    }

    #[test]
    fn each_case_separates_the_best_pod_by_its_signal_only() {
        let queued = PodState {
            waiting: 2.0,
            running: 3.0,
            kv: 0.93,
            lora: None,
        };
        let free = PodState {
            waiting: 0.0,
            ..queued
        };
        let low_kv = PodState { kv: 0.03, ..free };
        let [queue, kv] = CASES;
        assert!((queue.ready)(&queued, &free));
        assert!(
            !(queue.ready)(&free, &free),
            "no queue anywhere is not the case"
        );
        assert!((kv.ready)(&free, &low_kv));
        assert!(
            !(kv.ready)(&queued, &low_kv),
            "a queue elsewhere would decide it"
        );
        assert!(!(kv.ready)(&free, &free));
    }
}

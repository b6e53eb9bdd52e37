//! The test hook: what a test of a router needs to see and force that a real vLLM does not
//! offer. Every request as it arrived, byte for byte (with `record_requests`), so a test can
//! check that the router forwarded the body unchanged; metric values forced over the simulated
//! ones, so a test can put a pod in a state (a long queue, a full cache, busy adapters) without
//! generating the load; and `/metrics` failing or hanging, a broken scrape target.
//!
//! Reached through [`PodControl::hook`](super::PodControl::hook); shared between the pod's
//! connection tasks and the test, every lock held only to copy or push a value.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, Method};
use tokio::sync::watch;

use super::engine::EngineGauges;
use super::metrics::PodMetrics;

/// One request as the pod received it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    pub method: Method,
    /// Path and query.
    pub path: String,
    pub headers: HeaderMap,
    /// The body, byte for byte.
    pub body: Bytes,
    pub received_at: Instant,
}

impl RecordedRequest {
    /// The value of a header, if present and valid UTF-8.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// How `/metrics` behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MetricsMode {
    /// Answer with the current values.
    #[default]
    Normal,
    /// Answer 500 (a scrape error).
    Error,
    /// Do not answer until the mode changes or the pod stops (a hung scrape target).
    Hang,
}

/// Values forced over the simulated ones; `None` keeps the simulated value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ForcedMetrics {
    pub waiting: Option<u64>,
    pub running: Option<u64>,
    /// Both KV-usage gauges, 0..=1.
    pub kv_usage: Option<f64>,
    /// The adapter lists of `vllm:lora_requests_info` (LoRA enabled only).
    pub running_adapters: Option<Vec<String>>,
    pub waiting_adapters: Option<Vec<String>>,
}

impl ForcedMetrics {
    fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    fn apply(&self, gauges: &EngineGauges) -> EngineGauges {
        let count = |forced: Option<u64>, simulated: usize| {
            forced.map_or(simulated, |v| usize::try_from(v).unwrap_or(usize::MAX))
        };
        EngineGauges {
            running: count(self.running, gauges.running),
            waiting: count(self.waiting, gauges.waiting),
            kv_usage: self.kv_usage.unwrap_or(gauges.kv_usage),
            running_loras: (self.running_adapters.clone())
                .unwrap_or_else(|| gauges.running_loras.clone()),
            waiting_loras: (self.waiting_adapters.clone())
                .unwrap_or_else(|| gauges.waiting_loras.clone()),
        }
    }
}

/// The values `/metrics` reports now for the gauges a router reads.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricValues {
    pub waiting: u64,
    pub running: u64,
    pub kv_usage: f64,
    pub running_adapters: Vec<String>,
    pub waiting_adapters: Vec<String>,
}

/// The hook of one pod.
#[derive(Debug)]
pub struct TestHook {
    record: bool,
    requests: Mutex<Vec<RecordedRequest>>,
    forced: Mutex<ForcedMetrics>,
    mode: watch::Sender<MetricsMode>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl TestHook {
    pub(crate) fn new(record: bool) -> Self {
        Self {
            record,
            requests: Mutex::new(Vec::new()),
            forced: Mutex::new(ForcedMetrics::default()),
            mode: watch::Sender::new(MetricsMode::Normal),
        }
    }

    /// Whether requests are recorded (`PodConfig::record_requests`).
    pub fn records(&self) -> bool {
        self.record
    }

    pub(crate) fn record(&self, request: RecordedRequest) {
        lock(&self.requests).push(request);
    }

    /// Every request received so far, in arrival order (empty unless recording).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.requests).clone()
    }

    /// Forgets the recorded requests.
    pub fn clear_requests(&self) {
        lock(&self.requests).clear();
    }

    /// Changes the forced values.
    pub fn force(&self, change: impl FnOnce(&mut ForcedMetrics)) {
        change(&mut lock(&self.forced));
    }

    /// Forces `vllm:num_requests_waiting` (`None`: the simulated queue again).
    pub fn set_waiting(&self, waiting: Option<u64>) {
        self.force(|f| f.waiting = waiting);
    }

    /// Forces `vllm:num_requests_running` (`None`: the simulated batch again).
    pub fn set_running(&self, running: Option<u64>) {
        self.force(|f| f.running = running);
    }

    /// Forces both KV-usage gauges, 0..=1 (`None`: the simulated usage again).
    pub fn set_kv_usage(&self, usage: Option<f64>) {
        self.force(|f| f.kv_usage = usage);
    }

    /// Forces the adapter lists of `vllm:lora_requests_info` (`None`: simulated).
    pub fn set_lora_adapters(&self, running: Option<Vec<String>>, waiting: Option<Vec<String>>) {
        self.force(|f| {
            f.running_adapters = running;
            f.waiting_adapters = waiting;
        });
    }

    /// Makes `/metrics` answer normally, fail with 500, or hang.
    pub fn set_metrics_mode(&self, mode: MetricsMode) {
        self.mode.send_replace(mode);
    }

    pub(crate) fn metrics_mode(&self) -> watch::Receiver<MetricsMode> {
        self.mode.subscribe()
    }

    /// `m` with the forced values over the simulated ones (`None` when nothing is forced).
    pub(crate) fn forced_view(
        &self,
        m: &PodMetrics,
        lora_enabled: bool,
        now_unix: f64,
    ) -> Option<PodMetrics> {
        let forced = lock(&self.forced);
        if forced.is_empty() {
            return None;
        }
        let mut view = m.clone();
        view.set_gauges(forced.apply(&m.gauges), lora_enabled, now_unix);
        Some(view)
    }

    /// The gauge values `/metrics` reports now, given the simulated ones.
    pub(crate) fn values(&self, gauges: &EngineGauges) -> MetricValues {
        let g = lock(&self.forced).apply(gauges);
        MetricValues {
            waiting: g.waiting as u64,
            running: g.running as u64,
            kv_usage: g.kv_usage,
            running_adapters: g.running_loras,
            waiting_adapters: g.waiting_loras,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forced_values_replace_only_what_is_forced() {
        let hook = TestHook::new(false);
        let simulated = EngineGauges {
            running: 2,
            waiting: 1,
            kv_usage: 0.25,
            running_loras: vec!["a".into()],
            waiting_loras: Vec::new(),
        };
        let m = PodMetrics::new(1024, 0.0);
        assert!(hook.forced_view(&m, false, 0.0).is_none());
        hook.set_waiting(Some(7));
        hook.set_kv_usage(Some(0.5));
        let v = hook.values(&simulated);
        assert_eq!((v.waiting, v.running, v.kv_usage), (7, 2, 0.5));
        assert_eq!(v.running_adapters, vec!["a".to_owned()]);
        hook.set_waiting(None);
        assert_eq!(hook.values(&simulated).waiting, 1);
    }

    #[test]
    fn a_forced_view_stamps_the_forced_adapters() {
        let hook = TestHook::new(false);
        hook.set_lora_adapters(Some(vec!["a2".into()]), Some(vec!["a1".into()]));
        let m = PodMetrics::new(1024, 0.0);
        let view = hook.forced_view(&m, true, 5.0).expect("forced");
        let info = view.lora_info.last().expect("a series");
        assert_eq!((info.running.as_str(), info.waiting.as_str()), ("a2", "a1"));
    }
}

//! What one stand-in knows: the requests it received, the requests in flight (which drive the
//! default metric values), the values tests force, and the `/metrics` failure mode.
//!
//! Shared between the server's connection tasks and the test through `Arc<Shared>`; every lock
//! is held only to copy or push a value.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::watch;

use super::StandInOptions;

// The recorded request and the `/metrics` modes are the simulator's test hook's: one shape for
// both model servers the tests drive.
pub use inference_sim::{MetricsMode, RecordedRequest};

/// Values a test forces; `None` means "derive from the requests in flight".
#[derive(Debug, Clone, Default)]
pub struct MetricOverrides {
    pub waiting: Option<u64>,
    pub running: Option<u64>,
    pub kv_usage: Option<f64>,
    pub running_adapters: Option<Vec<String>>,
    pub waiting_adapters: Option<Vec<String>>,
}

/// The values `/metrics` reports right now.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricValues {
    pub waiting: u64,
    pub running: u64,
    pub kv_usage: f64,
    pub running_adapters: Vec<String>,
    pub waiting_adapters: Vec<String>,
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    pub requests_total: u64,
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub opts: StandInOptions,
    pub port: u16,
    requests: Mutex<Vec<RecordedRequest>>,
    in_flight: AtomicU64,
    in_flight_blocks: AtomicU64,
    adapters_in_flight: Mutex<BTreeMap<String, u64>>,
    overrides: Mutex<MetricOverrides>,
    pub metrics_mode: watch::Sender<MetricsMode>,
    next_id: AtomicU64,
    prompt_tokens_total: AtomicU64,
    generation_tokens_total: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    pub fn new(opts: StandInOptions, port: u16) -> Self {
        Self {
            opts,
            port,
            requests: Mutex::default(),
            in_flight: AtomicU64::new(0),
            in_flight_blocks: AtomicU64::new(0),
            adapters_in_flight: Mutex::default(),
            overrides: Mutex::default(),
            metrics_mode: watch::Sender::new(MetricsMode::Normal),
            next_id: AtomicU64::new(1),
            prompt_tokens_total: AtomicU64::new(0),
            generation_tokens_total: AtomicU64::new(0),
        }
    }

    pub fn record(&self, request: RecordedRequest) {
        lock(&self.requests).push(request);
    }

    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.requests).clone()
    }

    pub fn clear_requests(&self) {
        lock(&self.requests).clear();
    }

    pub fn overrides(&self) -> MutexGuard<'_, MetricOverrides> {
        lock(&self.overrides)
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// A fresh id for a response (`cmpl-<pod>-<n>`).
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Counts a request as running until the returned guard is dropped.
    pub fn start_request(
        self: &Arc<Self>,
        model: &str,
        prompt_tokens: u64,
        completion_tokens: u64,
    ) -> InFlight {
        let block_size = u64::from(self.opts.block_size.max(1));
        let blocks = (prompt_tokens + completion_tokens).div_ceil(block_size);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.in_flight_blocks.fetch_add(blocks, Ordering::Relaxed);
        self.prompt_tokens_total
            .fetch_add(prompt_tokens, Ordering::Relaxed);
        let adapter = self
            .opts
            .lora_adapters
            .iter()
            .any(|a| a == model)
            .then(|| model.to_owned());
        if let Some(name) = &adapter {
            *lock(&self.adapters_in_flight)
                .entry(name.clone())
                .or_default() += 1;
        }
        InFlight {
            shared: Arc::clone(self),
            blocks,
            completion_tokens,
            adapter,
        }
    }

    /// The values to report: forced ones where set, otherwise derived from requests in flight.
    pub fn metric_values(&self) -> MetricValues {
        let forced = self.overrides().clone();
        let blocks = self.in_flight_blocks.load(Ordering::Relaxed) as f64;
        let capacity = self.opts.num_gpu_blocks.max(1) as f64;
        let running_adapters = lock(&self.adapters_in_flight).keys().cloned().collect();
        MetricValues {
            waiting: forced.waiting.unwrap_or(0),
            running: forced.running.unwrap_or_else(|| self.in_flight()),
            kv_usage: forced.kv_usage.unwrap_or((blocks / capacity).min(1.0)),
            running_adapters: forced.running_adapters.unwrap_or(running_adapters),
            waiting_adapters: forced.waiting_adapters.unwrap_or_default(),
            prompt_tokens_total: self.prompt_tokens_total.load(Ordering::Relaxed),
            generation_tokens_total: self.generation_tokens_total.load(Ordering::Relaxed),
            requests_total: self.next_id.load(Ordering::Relaxed) - 1,
        }
    }
}

/// A request in flight; dropping it (response finished or client gone) releases its load.
#[derive(Debug)]
pub(crate) struct InFlight {
    shared: Arc<Shared>,
    blocks: u64,
    completion_tokens: u64,
    adapter: Option<String>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let s = &self.shared;
        s.in_flight.fetch_sub(1, Ordering::Relaxed);
        s.in_flight_blocks.fetch_sub(self.blocks, Ordering::Relaxed);
        s.generation_tokens_total
            .fetch_add(self.completion_tokens, Ordering::Relaxed);
        if let Some(name) = &self.adapter {
            let mut adapters = lock(&s.adapters_in_flight);
            if let Some(count) = adapters.get_mut(name) {
                *count -= 1;
                if *count == 0 {
                    adapters.remove(name);
                }
            }
        }
    }
}

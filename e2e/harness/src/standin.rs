//! A small model-server stand-in (HTTP/1.1, hyper) for tests, until the full simulator lands.
//!
//! It serves the OpenAI routes an endpoint picker sees (`/v1/completions`,
//! `/v1/chat/completions`, `/v1/embeddings`, `/v1/responses`, with SSE for `"stream": true`),
//! `GET /v1/models`, `GET /health` and `GET /metrics` in vLLM's format. Every response carries
//! `x-inference-pod` and `x-inference-port`; every request is recorded byte for byte so tests can
//! check what arrived where. Metrics default to values derived from the requests in flight
//! (running = requests being answered; KV usage = their blocks / `num_gpu_blocks`) and can be
//! forced, or `/metrics` made to fail or hang, through the [`StandIn`] handle.

mod handlers;
mod openai;
mod prometheus;
mod state;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::server::ServerHandle;
pub use handlers::RETURN_ERROR_HEADER;
pub use openai::Api;
use state::Shared;
pub use state::{MetricValues, MetricsMode, RecordedRequest};

/// How a stand-in behaves.
#[derive(Debug, Clone)]
pub struct StandInOptions {
    /// Pod name, sent as `x-inference-pod` and used in response ids.
    pub name: String,
    /// Base model served (for `/v1/models` and the metrics' `model_name` label).
    pub model: String,
    /// LoRA adapters served; `vllm:lora_requests_info` appears only when there are some.
    pub lora_adapters: Vec<String>,
    /// `max_lora` label of `vllm:lora_requests_info`.
    pub max_lora: u32,
    /// Tokens generated per request (capped by the request's `max_tokens`); one SSE event each.
    pub completion_tokens: u64,
    /// Delay before a non-streamed answer and before the first SSE event.
    pub latency: Duration,
    /// Gap between SSE token events.
    pub stream_interval: Duration,
    /// `block_size` of `vllm:cache_config_info`; also the unit of derived KV usage.
    pub block_size: u32,
    /// `num_gpu_blocks` of `vllm:cache_config_info`; the capacity for derived KV usage.
    pub num_gpu_blocks: u64,
}

impl Default for StandInOptions {
    fn default() -> Self {
        Self {
            name: "standin".to_owned(),
            model: "test-model".to_owned(),
            lora_adapters: Vec::new(),
            max_lora: 4,
            completion_tokens: 5,
            latency: Duration::ZERO,
            stream_interval: Duration::from_millis(100),
            block_size: 16,
            num_gpu_blocks: 1024,
        }
    }
}

impl StandInOptions {
    /// Defaults with this pod name.
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ..Self::default()
        }
    }
}

/// A running stand-in; dropping it stops the server.
#[derive(Debug)]
pub struct StandIn {
    shared: Arc<Shared>,
    server: ServerHandle,
}

impl StandIn {
    /// Serves on `listener` until [`shutdown`](Self::shutdown) or drop. Needs a Tokio runtime.
    pub fn start(listener: TcpListener, opts: StandInOptions) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new(opts, addr.port()));
        let for_server = Arc::clone(&shared);
        let server = ServerHandle::spawn(addr, move |tracker, cancel| {
            serve(listener, for_server, tracker, cancel)
        });
        Ok(Self { shared, server })
    }

    /// Binds 127.0.0.1:0 and starts.
    pub async fn bind(opts: StandInOptions) -> std::io::Result<Self> {
        Self::start(TcpListener::bind("127.0.0.1:0").await?, opts)
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `ip:port`, as an endpoint picker names it in `x-gateway-destination-endpoint`.
    pub fn endpoint(&self) -> String {
        self.addr().to_string()
    }

    pub fn name(&self) -> &str {
        &self.shared.opts.name
    }

    pub fn options(&self) -> &StandInOptions {
        &self.shared.opts
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.requests()
    }

    /// Forgets the recorded requests.
    pub fn clear_requests(&self) {
        self.shared.clear_requests();
    }

    /// Inference requests being answered right now.
    pub fn in_flight(&self) -> u64 {
        self.shared.in_flight()
    }

    /// The values `/metrics` would report now.
    pub fn metric_values(&self) -> MetricValues {
        self.shared.metric_values()
    }

    /// Forces `vllm:num_requests_waiting` (`None`: back to 0).
    pub fn set_waiting(&self, waiting: Option<u64>) {
        self.shared.overrides().waiting = waiting;
    }

    /// Forces `vllm:num_requests_running` (`None`: back to the in-flight count).
    pub fn set_running(&self, running: Option<u64>) {
        self.shared.overrides().running = running;
    }

    /// Forces both KV usage gauges, 0..=1 (`None`: back to the derived value).
    pub fn set_kv_usage(&self, usage: Option<f64>) {
        self.shared.overrides().kv_usage = usage;
    }

    /// Forces the adapter lists of `vllm:lora_requests_info` (`None`: derived / empty).
    pub fn set_lora_adapters(&self, running: Option<Vec<String>>, waiting: Option<Vec<String>>) {
        let mut forced = self.shared.overrides();
        forced.running_adapters = running;
        forced.waiting_adapters = waiting;
    }

    /// Makes `/metrics` answer normally, fail with 500, or hang (a stale scrape target).
    pub fn set_metrics_mode(&self, mode: MetricsMode) {
        self.shared.metrics_mode.send_replace(mode);
    }

    /// Stops accepting, closes open connections and waits for the server's tasks.
    pub async fn shutdown(self) {
        self.server.shutdown().await;
    }
}

async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    tracker: TaskTracker,
    cancel: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            () = cancel.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(err) => {
                tracing::warn!(%err, "stand-in accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await; // back off, e.g. on EMFILE
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let shared = Arc::clone(&shared);
        let cancel = cancel.clone();
        tracker.spawn(async move {
            let service = service_fn(move |req| handlers::handle(Arc::clone(&shared), req));
            let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                () = cancel.cancelled() => {}
                served = conn => if let Err(err) = served {
                    tracing::debug!(%err, "stand-in connection ended with an error");
                },
            }
        });
    }
}

//! Metric scrapers: one poller per endpoint, `GET /metrics` every `--refresh-metrics-interval`.
//!
//! A supervisor follows the datastore's endpoint set, starting a poller for each new endpoint
//! and cancelling the pollers of removed ones. A failed scrape leaves the last metrics in place;
//! they age past the staleness threshold and the scheduler then treats the endpoint as a last
//! resort. Failures are logged once per failing streak and counted in `epp_metrics_scrapes`.

pub mod dcgm;
pub mod parse;

use crate::datastore::{Datastore, EndpointState};
use crate::endpoint::EngineType;
use crate::metrics::{Metrics, Outcome, OutcomeLabels};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Largest exposition accepted; vLLM's is tens of kilobytes.
const MAX_BODY: usize = 16 << 20;

#[derive(Clone, Debug)]
pub struct ScrapeOptions {
    pub interval: Duration,
    pub timeout: Duration,
    /// A DCGM exporter (per node, or a Prometheus `/federate` URL) whose GPU series, matched
    /// to each endpoint by their `pod` label, replace those of the pod's own `/metrics`.
    pub gpu_metrics_url: Option<String>,
    /// `--model-server-metrics-path`: replaces the engine's path for every endpoint.
    pub path: Option<String>,
    /// `--model-server-metrics-port`: scrape this port instead of the serving port (0 = no).
    pub port: u16,
    /// The metric names given on the command line.
    pub names: parse::NameOverrides,
    /// The engine of endpoints that name none (`core-metrics-extractor` `defaultEngine`).
    pub default_engine: Option<EngineType>,
    /// The label naming an endpoint's engine (`engineLabelKey`); otherwise
    /// `llm-d.ai/engine-type`, then `inference.networking.k8s.io/engine-type`.
    pub engine_label_key: Option<String>,
}

/// The engine label keys, llm-d-router's first (GIE's is its fallback).
pub const ENGINE_LABELS: [&str; 2] = [
    "llm-d.ai/engine-type",
    "inference.networking.k8s.io/engine-type",
];

impl ScrapeOptions {
    /// The engine whose metric names an endpoint's exposition uses: its engine label, else the
    /// engine discovery gave it (a static endpoint's `engineType`), else the configured
    /// default.
    pub fn engine_of(&self, endpoint: &crate::endpoint::Endpoint) -> EngineType {
        let labelled = match &self.engine_label_key {
            Some(key) => endpoint.labels.get(key),
            None => ENGINE_LABELS.iter().find_map(|k| endpoint.labels.get(*k)),
        };
        labelled
            .and_then(|v| EngineType::from_label(v))
            .or((endpoint.engine != EngineType::default()).then_some(endpoint.engine))
            .or(self.default_engine)
            .unwrap_or_default()
    }
}

impl Default for ScrapeOptions {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(50),
            timeout: Duration::from_secs(1),
            gpu_metrics_url: None,
            path: None,
            port: 0,
            names: parse::NameOverrides::default(),
            default_engine: None,
            engine_label_key: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("request failed: {0}")]
    Request(#[source] hyper_util::client::legacy::Error),
    #[error("status {0}")]
    Status(http::StatusCode),
    #[error("reading body failed: {0}")]
    Body(String),
    #[error("exposition is not UTF-8")]
    NotUtf8,
    #[error(transparent)]
    Extract(#[from] parse::ExtractError),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("bad uri: {0}")]
    Uri(#[from] http::uri::InvalidUri),
}

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// Everything a poller needs, shared by all of them.
struct Shared {
    client: HttpClient,
    opts: ScrapeOptions,
    metrics: Arc<Metrics>,
    /// For the health policy: a failed scrape counts as a local-origin failure (passive health).
    datastore: Arc<Datastore>,
}

/// Runs the supervisor until `shutdown`; pollers are spawned on `tracker`.
pub async fn run(
    datastore: Arc<Datastore>,
    metrics: Arc<Metrics>,
    opts: ScrapeOptions,
    tracker: TaskTracker,
    shutdown: CancellationToken,
) {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(opts.timeout));
    connector.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1)
        .build(connector);
    let shared = Arc::new(Shared {
        client,
        opts,
        metrics,
        datastore: Arc::clone(&datastore),
    });
    datastore
        .per_endpoint(&tracker, &shutdown, |tracker, state, token| {
            tracker.spawn(poll(state, Arc::clone(&shared), token));
        })
        .await;
}

async fn poll(state: Arc<EndpointState>, shared: Arc<Shared>, cancel: CancellationToken) {
    let id = state.id();
    let engine = shared.opts.engine_of(&state.endpoint);
    let opts = &shared.opts;
    let path = opts
        .path
        .as_deref()
        .map(parse::unquote)
        .filter(|p| !p.is_empty())
        .unwrap_or(engine.metrics_path());
    let uri = match opts.port {
        0 => format!("http://{id}{path}"),
        port => format!(
            "http://{}{path}",
            std::net::SocketAddr::new(id.0.ip(), port)
        ),
    };
    let mut tick = tokio::time::interval(shared.opts.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let result = match tokio::time::timeout(
            shared.opts.timeout,
            scrape_once(&shared.client, &uri),
        )
        .await
        {
            Ok(r) => r.and_then(|text| {
                Ok(parse::extract_with(
                    &text,
                    engine,
                    &shared.opts.names,
                    Instant::now(),
                )?)
            }),
            Err(_) => Err(ScrapeError::Timeout(shared.opts.timeout)),
        };
        let result = match (result, &shared.opts.gpu_metrics_url) {
            (Ok(mut m), Some(url)) => {
                m.gpu = node_gpu(&shared, url, &state.endpoint.name).await.or(m.gpu);
                Ok(m)
            }
            (other, _) => other,
        };
        let outcome = match result {
            Ok(m) => {
                state.store_metrics(m);
                if std::mem::take(&mut failing) {
                    tracing::info!(endpoint = %id, "metrics scrape recovered");
                }
                Outcome::success
            }
            Err(e) => {
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!(endpoint = %id, error = %e, "metrics scrape failing; the endpoint becomes a last resort once its metrics are stale");
                }
                Outcome::failure
            }
        };
        shared
            .metrics
            .scrapes
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
        let health = state.record_probe(
            crate::datastore::health::Prober::Scrape,
            outcome == Outcome::success,
            &shared.datastore.health_policy(),
            Instant::now(),
        );
        crate::datastore::report(&shared.metrics, &state.endpoint, health, "metrics scrape");
    }
}

/// This endpoint's GPU readings from the shared DCGM exporter; `None` (logged) when that
/// scrape fails or names no GPU of this pod.
async fn node_gpu(
    shared: &Shared,
    url: &str,
    endpoint_name: &str,
) -> Option<crate::endpoint::GpuMetrics> {
    let text =
        match tokio::time::timeout(shared.opts.timeout, scrape_once(&shared.client, url)).await {
            Ok(Ok(text)) => text,
            Ok(Err(e)) => return log_gpu_failure(url, &e),
            Err(_) => return log_gpu_failure(url, &ScrapeError::Timeout(shared.opts.timeout)),
        };
    dcgm::extract_for_pod(&text, dcgm::pod_label(endpoint_name))
}

fn log_gpu_failure(url: &str, e: &ScrapeError) -> Option<crate::endpoint::GpuMetrics> {
    tracing::debug!(url, error = %e, "GPU metrics scrape failed");
    None
}

async fn scrape_once(client: &HttpClient, uri: &str) -> Result<String, ScrapeError> {
    let resp = client
        .get(uri.parse()?)
        .await
        .map_err(ScrapeError::Request)?;
    if !resp.status().is_success() {
        return Err(ScrapeError::Status(resp.status()));
    }
    let body = Limited::new(resp.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| ScrapeError::Body(e.to_string()))?;
    String::from_utf8(body.to_bytes().to_vec()).map_err(|_| ScrapeError::NotUtf8)
}

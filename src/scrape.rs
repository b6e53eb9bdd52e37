//! The endpoint poller: one task per endpoint, on a thread of its own, that scrapes
//! `GET /metrics` every `--refresh-metrics-interval` and, with `--health-check-interval`, probes
//! `GET /health` on its own schedule ([`probe`]).
//!
//! A supervisor follows the datastore's endpoint set, starting a poller for each new endpoint
//! and cancelling the pollers of removed ones. A failed scrape leaves the last metrics in place;
//! they age past the staleness threshold and the scheduler then treats the endpoint as a last
//! resort. Failures are logged once per failing streak and counted in `epp_metrics_scrapes`.
//! Scrape and probe failures both feed passive health, each as its own prober.

pub(crate) mod client;
pub(crate) mod cluster;
pub(crate) mod custom;
pub(crate) mod dcgm;
pub mod parse;
pub(crate) mod probe;

use crate::datastore::{Datastore, EndpointState};
use crate::endpoint::EngineType;
use crate::metrics::{Metrics, Outcome, OutcomeLabels};
use client::{Conn, HttpError, Url};
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
    /// `--model-server-metrics-filter`: ask for only the series epp reads (`?name[]=`).
    pub filter: bool,
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
    /// `core-metrics-extractor`'s `engineConfigs` `customMetrics`: the endpoint attributes.
    pub custom: crate::config::CustomMetrics,
    /// The label naming an endpoint's engine (`engineLabelKey`); otherwise
    /// `llm-d.ai/engine-type`, then `inference.networking.k8s.io/engine-type`.
    pub engine_label_key: Option<String>,
    /// The active health probes (`--health-check-interval` above zero), run by the same poller.
    pub probe: Option<probe::ProbeOptions>,
    /// A multi-cluster hub's scrape: every endpoint is a cluster, scraped for its spoke EPP's
    /// pool aggregates ([`cluster`]) instead of a model server's gauges.
    pub clusters: Option<Arc<cluster::ClusterScrape>>,
}

/// The engine label keys, llm-d-router's first (GIE's is its fallback).
pub(crate) const ENGINE_LABELS: [&str; 2] = [
    "llm-d.ai/engine-type",
    "inference.networking.k8s.io/engine-type",
];

impl ScrapeOptions {
    /// The engine whose metric names an endpoint's exposition uses: its engine label, else the
    /// engine discovery gave it (a static endpoint's `engineType`), else the configured
    /// default.
    pub(crate) fn engine_of(&self, endpoint: &crate::endpoint::Endpoint) -> EngineType {
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
            filter: true,
            gpu_metrics_url: None,
            path: None,
            port: 0,
            names: parse::NameOverrides::default(),
            default_engine: None,
            custom: crate::config::CustomMetrics::default(),
            engine_label_key: None,
            probe: None,
            clusters: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ScrapeError {
    #[error("request failed: {0}")]
    Request(#[from] HttpError),
    #[error("status {0}")]
    Status(u16),
    #[error("exposition is not UTF-8")]
    NotUtf8,
    #[error(transparent)]
    Extract(#[from] parse::ExtractError),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The configured path makes no URL.
    #[error(transparent)]
    BadUrl(client::BadUrl),
    /// A spoke EPP's page without the pool series a hub reads.
    #[error("neither {kv} nor {queue} is in the exposition")]
    NoPoolSeries { kv: String, queue: String },
}

/// Everything a poller needs, shared by all of them.
struct Shared {
    /// The instant every poller's schedule counts from.
    epoch: tokio::time::Instant,
    opts: ScrapeOptions,
    metrics: Arc<Metrics>,
    /// For the health policy: a failed scrape counts as a local-origin failure (passive health).
    datastore: Arc<Datastore>,
    /// The active health probes, when configured.
    probes: Option<probe::Probes>,
}

/// Starts [`run`] on a thread of its own with a single-threaded runtime. The scrapes (and probes) of every
/// endpoint then share one thread that sleeps in `epoll` between rounds, instead of waking the
/// request path's workers (and each other) for every answer: at 100 pods every 50 ms this
/// halved the CPU per scrape, and a burst of answers no longer queues ahead of ext_proc
/// streams. The thread ends when `shutdown` fires; `tracker` waits for it.
pub(crate) fn spawn(
    datastore: Arc<Datastore>,
    metrics: Arc<Metrics>,
    opts: ScrapeOptions,
    tracker: TaskTracker,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let task = tracker.track_future(run(datastore, metrics, opts, tracker.clone(), shutdown));
    std::thread::Builder::new()
        .name("epp-scrape".into())
        .spawn(move || runtime.block_on(task))?;
    Ok(())
}

/// Runs the supervisor until `shutdown`; pollers are spawned on `tracker`.
pub async fn run(
    datastore: Arc<Datastore>,
    metrics: Arc<Metrics>,
    opts: ScrapeOptions,
    tracker: TaskTracker,
    shutdown: CancellationToken,
) {
    let shared = Arc::new(Shared {
        epoch: tokio::time::Instant::now(),
        probes: opts.probe.clone().map(probe::Probes::new),
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

/// One endpoint's poller: its scrapes and, when configured, its probes, each on its own
/// schedule, side by side in one task (a slow probe never holds back a scrape, nor the reverse),
/// until the endpoint leaves the set or epp shuts down.
async fn poll(state: Arc<EndpointState>, shared: Arc<Shared>, cancel: CancellationToken) {
    let scrapes = scrape_loop(&state, &shared, &cancel);
    match &shared.probes {
        Some(probes) => {
            let probes = probes.run(&state, &shared.metrics, &shared.datastore, &cancel);
            tokio::join!(scrapes, probes);
        }
        None => scrapes.await,
    }
}

/// Scrapes every interval, on the schedule all endpoints share, until `cancel`.
async fn scrape_loop(state: &EndpointState, shared: &Shared, cancel: &CancellationToken) {
    let (mut target, period) = match &shared.opts.clusters {
        None => (
            Poller::Pod(Target::new(&state.endpoint, &shared.opts)),
            shared.opts.interval,
        ),
        Some(c) => (
            Poller::Cluster(cluster::Target::new(&state.endpoint, c)),
            c.period(shared.opts.interval),
        ),
    };
    // Every poller ticks on one shared schedule: the runtime wakes once per interval for all
    // endpoints (and their answers arrive together) instead of once per endpoint at scattered
    // times, which at 100 pods × 20 Hz cost more in thread wake-ups than the scrapes did.
    // `Skip` keeps a late poller on that schedule.
    let mut tick = tokio::time::interval_at(shared.epoch, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let result = match &mut target {
            Poller::Pod(t) => t.scrape(shared, state).await,
            Poller::Cluster(t) => t.scrape(shared.opts.timeout).await,
        };
        record(state, shared, result, &mut failing);
    }
}

/// What one poller scrapes: a model-server pod, or a hub's cluster.
enum Poller {
    Pod(Target),
    Cluster(cluster::Target),
}

/// Where one endpoint's metrics are, whether it is still asked for the filtered page, and the
/// connections this poller keeps (to the pod, and to the DCGM exporter when configured).
struct Target {
    engine: EngineType,
    /// The whole page: `GET` target, or why the configured path makes no URL.
    page: Result<String, client::BadUrl>,
    /// The page with only the series epp reads, while the server serves it.
    filtered: Option<String>,
    conn: Conn,
    /// The DCGM exporter's page and connection (`--gpu-metrics-url`, checked at start-up).
    gpu: Option<(String, Conn)>,
}

impl Target {
    fn new(endpoint: &crate::endpoint::Endpoint, opts: &ScrapeOptions) -> Self {
        let (id, engine) = (endpoint.id, opts.engine_of(endpoint));
        let path = opts
            .path
            .as_deref()
            .map(parse::unquote)
            .filter(|p| !p.is_empty())
            .unwrap_or(engine.metrics_path());
        let authority = match opts.port {
            0 => id.to_string(),
            port => std::net::SocketAddr::new(id.0.ip(), port).to_string(),
        };
        let url = Url::parse(&format!("http://{authority}{path}"));
        // prometheus_client (vLLM, SGLang) serves only the named series when asked; a server
        // that ignores the filter sends the whole page, which parses the same.
        let filtered = match &url {
            Ok(u) if opts.filter => {
                let mut names: Vec<&str> = parse::series_names(engine, &opts.names);
                names.extend(opts.custom.names(engine));
                Some(filtered_uri(&u.target, &names))
            }
            _ => None,
        };
        let gpu = opts
            .gpu_metrics_url
            .as_deref()
            .and_then(|u| Url::parse(u).ok())
            .map(|u| (u.target, Conn::new(&u.authority)));
        Self {
            engine,
            conn: Conn::new(&authority),
            page: url.map(|u| u.target),
            filtered,
            gpu,
        }
    }

    /// One scrape (filtered while that works), with the node's GPU readings when configured.
    async fn scrape(
        &mut self,
        shared: &Shared,
        state: &EndpointState,
    ) -> Result<crate::endpoint::EndpointMetrics, ScrapeError> {
        let page = match &self.page {
            Ok(page) => page,
            Err(e) => return Err(ScrapeError::BadUrl(e.clone())),
        };
        let target = self.filtered.as_deref().unwrap_or(page);
        let mut result = scrape_metrics(&mut self.conn, shared, target, self.engine).await;
        if self.filtered.is_some() && filter_refused(&result) {
            // A server that answers the filter with an error or without the series (a
            // multi-process prometheus_client registry serves none): try the whole page, and
            // keep scraping it whole once that works.
            let whole = scrape_metrics(&mut self.conn, shared, page, self.engine).await;
            if whole.is_ok() {
                tracing::info!(endpoint = %state.id(), "the model server does not serve `?name[]=` filtered metrics; scraping its whole page");
                self.filtered = None;
            }
            result = whole;
        }
        match (result, &mut self.gpu) {
            (Ok(mut m), Some((page, conn))) => {
                m.gpu = node_gpu(conn, page, shared, &state.endpoint.name)
                    .await
                    .or(m.gpu);
                Ok(m)
            }
            (other, _) => other,
        }
    }
}

/// Stores a scrape's metrics, counts its outcome, feeds passive health, and logs the first
/// failure of a streak and the recovery.
fn record(
    state: &EndpointState,
    shared: &Shared,
    result: Result<crate::endpoint::EndpointMetrics, ScrapeError>,
    failing: &mut bool,
) {
    let id = state.id();
    let outcome = match result {
        Ok(m) => {
            state.store_metrics(m);
            if std::mem::take(failing) {
                tracing::info!(endpoint = %id, "metrics scrape recovered");
            }
            Outcome::success
        }
        Err(e) => {
            if !std::mem::replace(failing, true) {
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
        crate::datastore::ejection::Prober::Scrape,
        outcome == Outcome::success,
        &shared.datastore.health_policy(),
        Instant::now(),
    );
    crate::datastore::report(&shared.metrics, &state.endpoint, health, "metrics scrape");
}

/// One scrape of `target`, extracted.
async fn scrape_metrics(
    conn: &mut Conn,
    shared: &Shared,
    target: &str,
    engine: EngineType,
) -> Result<crate::endpoint::EndpointMetrics, ScrapeError> {
    let timeout = shared.opts.timeout;
    match tokio::time::timeout(timeout, scrape_once(conn, target)).await {
        Ok(r) => r.and_then(|text| {
            let mut m = parse::extract_with(&text, engine, &shared.opts.names, Instant::now())?;
            m.attributes = custom::read(&shared.opts.custom, &text, engine);
            Ok(m)
        }),
        Err(_) => Err(ScrapeError::Timeout(timeout)),
    }
}

/// Whether a filtered scrape's failure may be the filter's doing: a client error, or a page
/// without the series epp reads.
fn filter_refused<T>(result: &Result<T, ScrapeError>) -> bool {
    match result {
        Err(ScrapeError::Status(s)) => (400..500).contains(s),
        Err(ScrapeError::Extract(parse::ExtractError::Missing(_))) => true,
        _ => false,
    }
}

/// `uri` with one `name[]=` query parameter per series (percent-encoded, as
/// prometheus_client's `parse_qs` reads them).
fn filtered_uri(uri: &str, names: &[&str]) -> String {
    let mut out = String::from(uri);
    let mut sep = if uri.contains('?') { '&' } else { '?' };
    for name in names {
        out.push(sep);
        out.push_str("name%5B%5D=");
        for b in name.bytes() {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                out.push(char::from(b));
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
        sep = '&';
    }
    out
}

/// This endpoint's GPU readings from the shared DCGM exporter; `None` (logged) when that
/// scrape fails or names no GPU of this pod.
async fn node_gpu(
    conn: &mut Conn,
    target: &str,
    shared: &Shared,
    endpoint_name: &str,
) -> Option<crate::endpoint::GpuMetrics> {
    let timeout = shared.opts.timeout;
    let text = match tokio::time::timeout(timeout, scrape_once(conn, target)).await {
        Ok(Ok(text)) => text,
        Ok(Err(e)) => return log_gpu_failure(target, &e),
        Err(_) => return log_gpu_failure(target, &ScrapeError::Timeout(timeout)),
    };
    dcgm::extract_for_pod(&text, dcgm::pod_label(endpoint_name))
}

fn log_gpu_failure(target: &str, e: &ScrapeError) -> Option<crate::endpoint::GpuMetrics> {
    tracing::debug!(target, error = %e, "GPU metrics scrape failed");
    None
}

async fn scrape_once(conn: &mut Conn, target: &str) -> Result<String, ScrapeError> {
    let resp = conn.get(target, MAX_BODY).await?;
    if !(200..300).contains(&resp.status) {
        return Err(ScrapeError::Status(resp.status));
    }
    String::from_utf8(resp.body).map_err(|_| ScrapeError::NotUtf8)
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // the test's own HTTP server
mod tests {
    use super::*;
    use crate::endpoint::{Endpoint, EndpointId};
    use std::sync::Mutex;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const PAGE: &str = "# TYPE vllm:num_requests_running gauge\n\
vllm:num_requests_running{engine=\"0\"} 2.0\n\
vllm:num_requests_waiting{engine=\"0\"} 5.0\n\
vllm:kv_cache_usage_perc{engine=\"0\"} 0.25\n\
vllm:e2e_request_latency_seconds_bucket{engine=\"0\",le=\"0.3\"} 1.0\n";

    /// A loopback HTTP/1.1 server recording request targets; `honours_filter` false answers a
    /// filtered request with an empty page (a multi-process prometheus_client registry).
    async fn server(honours_filter: bool) -> (std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let log = Arc::clone(&log);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                            match sock.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                            continue;
                        };
                        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                        buf.drain(..end + 4);
                        let target = head.split(' ').nth(1).unwrap_or("").to_owned();
                        let filtered = target.contains("name%5B%5D=");
                        log.lock().unwrap().push(target);
                        let body = if filtered && !honours_filter {
                            ""
                        } else {
                            PAGE
                        };
                        let resp = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if sock.write_all(resp.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, seen)
    }

    /// Scrapes one endpoint served by [`server`] until it has metrics, then a few ticks more.
    async fn scrape_for_a_while(honours_filter: bool) -> (Vec<String>, f64) {
        let (addr, seen) = server(honours_filter).await;
        let datastore = Arc::new(Datastore::new());
        datastore.set_endpoints(vec![Endpoint::from_id(EndpointId(addr))]);
        let metrics = Arc::new(Metrics::register(&mut Default::default()));
        let opts = ScrapeOptions {
            interval: Duration::from_millis(10),
            ..ScrapeOptions::default()
        };
        let (tracker, shutdown) = (TaskTracker::new(), CancellationToken::new());
        let task = tokio::spawn(run(
            Arc::clone(&datastore),
            metrics,
            opts,
            tracker.clone(),
            shutdown.clone(),
        ));
        let deadline = Instant::now() + Duration::from_secs(5);
        let waiting = loop {
            let m = datastore
                .snapshot()
                .get(&EndpointId(addr))
                .and_then(|s| s.metrics());
            if let Some(m) = m {
                break m.waiting;
            }
            assert!(
                Instant::now() < deadline,
                "no metrics after 5 s: {:?}",
                seen.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        tokio::time::sleep(Duration::from_millis(60)).await;
        shutdown.cancel();
        tracker.close();
        tracker.wait().await;
        task.await.unwrap();
        let seen = seen.lock().unwrap().clone();
        (seen, waiting)
    }

    #[tokio::test]
    async fn only_the_series_epp_reads_are_asked_for() {
        let (seen, waiting) = scrape_for_a_while(true).await;
        assert_eq!(waiting, 5.0);
        assert!(seen.len() >= 3, "{seen:?}");
        for target in &seen {
            assert!(target.starts_with("/metrics?name%5B%5D="), "{target}");
            assert!(
                target.contains("name%5B%5D=vllm%3Anum_requests_waiting"),
                "{target}"
            );
            assert!(!target.contains("e2e_request_latency"), "{target}");
        }
    }

    #[tokio::test]
    async fn a_server_that_serves_nothing_filtered_is_scraped_whole_from_then_on() {
        let (seen, waiting) = scrape_for_a_while(false).await;
        assert_eq!(waiting, 5.0);
        assert!(seen.len() >= 4, "{seen:?}");
        // One filtered attempt, then the whole page at once and at every tick after.
        assert!(seen[0].contains("name%5B%5D="), "{seen:?}");
        assert!(seen[1..].iter().all(|t| t == "/metrics"), "{seen:?}");
    }

    #[test]
    fn names_are_percent_encoded_as_prometheus_client_decodes_them() {
        assert_eq!(
            filtered_uri("http://a/metrics", &["vllm:x", "b_c"]),
            "http://a/metrics?name%5B%5D=vllm%3Ax&name%5B%5D=b_c"
        );
        assert_eq!(
            filtered_uri("http://a/m?x=1", &["y"]),
            "http://a/m?x=1&name%5B%5D=y"
        );
    }
}

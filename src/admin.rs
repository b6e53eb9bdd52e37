//! The metrics port (`--metrics-port`, 9090): Prometheus `/metrics`, `GET /debug/snapshot`
//! (what the picker currently believes, as JSON: see [`debug_snapshot`]), plus the task that
//! refreshes the pool gauges every `--refresh-prometheus-metrics-interval` ([`PoolGauges`]). With
//! `--metrics-endpoint-auth` every path is served only to callers the API server authenticates
//! and authorizes ([`auth`]).

pub(crate) mod auth;

use crate::datastore::Datastore;
use crate::director::LiveConfig;
use crate::metrics::{Metrics, PodLabels, PoolLabels};
use crate::prefix::source::Indexes;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What the metrics port serves.
pub(crate) struct AdminState {
    pub(crate) registry: Registry,
    pub(crate) datastore: Arc<Datastore>,
    /// The configuration in force (its text is shown).
    pub(crate) config: Arc<LiveConfig>,
    /// The prefix indexes (their sizes are shown).
    pub(crate) indexes: Arc<Indexes>,
    /// The pool's name, as the metrics label it.
    pub(crate) pool_name: String,
    /// Where the active configuration came from (`--config-file <path>`, `--config-text`, or
    /// the built-in default).
    pub(crate) config_origin: String,
    /// Metrics older than this are reported stale (`--metrics-staleness-threshold`).
    pub(crate) staleness: Duration,
    /// TokenReview + SubjectAccessReview in front of every path (`--metrics-endpoint-auth`).
    pub(crate) auth: Option<auth::MetricsAuth>,
}

/// Serves the metrics port on `listener` until `shutdown`; connections run on `tracker`.
pub(crate) async fn serve(
    listener: TcpListener,
    state: Arc<AdminState>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
) {
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics listener accept failed");
                    continue;
                }
            },
        };
        let state = Arc::clone(&state);
        let shutdown = shutdown.clone();
        tracker.spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let state = Arc::clone(&state);
                async move { Ok::<_, std::convert::Infallible>(authorized(&req, &state).await) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {}
                _ = shutdown.cancelled() => {}
            }
        });
    }
}

fn reply(status: StatusCode, ctype: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(ctype) {
        r.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    r
}

/// [`handle`], behind the auth gate when there is one; a refusal answers as upstream (plain text).
async fn authorized(req: &Request<Incoming>, state: &AdminState) -> Response<Full<Bytes>> {
    if let Some(gate) = &state.auth {
        if let Err(refusal) = gate
            .check(req.method(), req.uri().path(), req.headers())
            .await
        {
            return reply(
                refusal.status(),
                "text/plain; charset=utf-8",
                format!("{refusal}\n"),
            );
        }
    }
    handle(req, state)
}

fn handle(req: &Request<Incoming>, state: &AdminState) -> Response<Full<Bytes>> {
    if req.method() != Method::GET {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "application/json",
            r#"{"error":{"message":"only GET is served","code":405}}"#.into(),
        );
    }
    match req.uri().path() {
        "/metrics" => {
            let mut text = String::new();
            match prometheus_client::encoding::text::encode(&mut text, &state.registry) {
                Ok(()) => reply(StatusCode::OK, "application/openmetrics-text; version=1.0.0; charset=utf-8", text),
                Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", e.to_string()),
            }
        }
        "/debug/snapshot" => {
            let body = debug_snapshot(state, Instant::now());
            reply(StatusCode::OK, "application/json", serde_json::to_string_pretty(&body).unwrap_or_default())
        }
        _ => reply(StatusCode::NOT_FOUND, "application/json", r#"{"error":{"message":"not found; try GET /metrics or GET /debug/snapshot","code":404}}"#.into()),
    }
}

/// The picker's current view, for operators: every endpoint with its scraped metrics and their
/// age, in-flight counts, the prefix index sizes and the active configuration.
pub(crate) fn debug_snapshot(state: &AdminState, now: Instant) -> serde_json::Value {
    let snapshot = state.datastore.snapshot();
    let endpoints: Vec<serde_json::Value> = snapshot
        .iter()
        .map(|s| endpoint_json(s, now, state.staleness))
        .collect();
    let precise = &state.indexes.precise;
    let runtime = state.config.load();
    serde_json::json!({
        "pool": state.pool_name,
        "endpoints": endpoints,
        "inflight_total": snapshot.iter().map(|s| u64::from(s.inflight())).sum::<u64>(),
        "prefix_index": {
            "approximate_blocks": state.indexes.approximate.size(),
            "precise_entries": precise.entries(),
            "precise_heap_bytes": precise.heap_bytes(),
        },
        "config": {
            "origin": state.config_origin,
            "text": runtime.source,
            "restart_needed": *state.config.restart_needed(),
        },
        "plugins": runtime.scheduler.plugin_state(),
        "metrics_staleness_ms": millis(state.staleness),
    })
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn endpoint_json(
    s: &crate::datastore::EndpointState,
    now: Instant,
    staleness: Duration,
) -> serde_json::Value {
    let e = &s.endpoint;
    let metrics = s.metrics().map(|m| {
        let age = m.age(now);
        serde_json::json!({
            "age_ms": millis(age),
            "stale": age > staleness,
            "waiting": m.waiting,
            "running": m.running,
            "kv_usage": m.kv_usage,
            "lora": m.lora.as_ref().map(|l| serde_json::json!({ "running": l.running, "waiting": l.waiting, "max_loras": l.max_loras })),
            "cache": m.cache.as_ref().map(|c| serde_json::json!({ "block_size": c.block_size, "num_blocks": c.num_blocks })),
        })
    });
    serde_json::json!({
        "name": e.name,
        "address": e.id.to_string(),
        "engine": format!("{:?}", e.engine),
        "labels": e.labels,
        "weight": e.weight,
        "inflight": s.inflight(),
        "dispatched_since_scrape": s.dispatched_since_scrape(),
        "metrics": metrics,
    })
}

/// The pool gauges and what they are computed from.
pub(crate) struct PoolGauges {
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) datastore: Arc<Datastore>,
    /// The approximate index's size is a gauge.
    pub(crate) indexes: Arc<Indexes>,
    pub(crate) pool: String,
    /// Endpoints whose metrics are older count as stale.
    pub(crate) staleness: Duration,
}

impl PoolGauges {
    /// Refreshes the pool gauges every `every` until `shutdown`.
    pub(crate) async fn run(self, every: Duration, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(every);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            self.refresh();
        }
    }

    fn refresh(&self) {
        let (m, datastore, staleness) = (&self.metrics, &self.datastore, self.staleness);
        let pool = PoolLabels {
            name: self.pool.clone(),
        };
        let snapshot = datastore.snapshot();
        let now = Instant::now();
        let (mut kv, mut queue, mut running, mut n, mut stale) = (0.0, 0.0, 0.0, 0u32, 0i64);
        for s in snapshot.iter() {
            match s.metrics() {
                Some(x) if x.age(now) <= staleness => {
                    kv += x.kv_usage;
                    queue += x.waiting;
                    running += x.running;
                    n += 1;
                    let labels = PodLabels {
                        name: pool.name.clone(),
                        model_server_pod: s.endpoint.name.clone(),
                    };
                    m.pool_per_pod_queue.get_or_create(&labels).set(x.waiting);
                }
                _ => stale += 1,
            }
        }
        let avg = |v: f64| if n > 0 { v / f64::from(n) } else { 0.0 };
        m.pool_avg_kv.get_or_create(&pool).set(avg(kv));
        m.pool_avg_queue.get_or_create(&pool).set(avg(queue));
        m.pool_avg_running.get_or_create(&pool).set(avg(running));
        m.pool_ready_pods
            .get_or_create(&pool)
            .set(snapshot.len() as i64);
        m.stale_endpoints.set(stale);
        m.prefix_indexer_size
            .set(self.indexes.approximate.size() as i64);
        m.prefix_token_scale
            .set(self.indexes.approximate.scale.get());
    }
}

//! The metrics port (`--metrics-port`, 9090): Prometheus `/metrics`, plus the task that
//! refreshes the pool gauges every `--refresh-prometheus-metrics-interval`.

use crate::director::Director;
use crate::metrics::{PodLabels, PoolLabels};
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

/// Serves `/metrics` on `listener` until `shutdown`; connections run on `tracker`.
pub async fn serve(listener: TcpListener, registry: Arc<Registry>, tracker: TaskTracker, shutdown: CancellationToken) {
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
        let registry = Arc::clone(&registry);
        let shutdown = shutdown.clone();
        tracker.spawn(async move {
            let svc = hyper::service::service_fn(move |req| std::future::ready(Ok::<_, std::convert::Infallible>(handle(&req, &registry))));
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {}
                _ = shutdown.cancelled() => {}
            }
        });
    }
}

fn handle(req: &Request<Incoming>, registry: &Registry) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, ctype: &str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        if let Ok(v) = http::HeaderValue::from_str(ctype) {
            r.headers_mut().insert(http::header::CONTENT_TYPE, v);
        }
        r
    };
    if req.method() != Method::GET || req.uri().path() != "/metrics" {
        return reply(StatusCode::NOT_FOUND, "application/json", r#"{"error":{"message":"not found; try GET /metrics","code":404}}"#.into());
    }
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, registry) {
        Ok(()) => reply(StatusCode::OK, "application/openmetrics-text; version=1.0.0; charset=utf-8", text),
        Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", e.to_string()),
    }
}

/// Refreshes the pool gauges and prunes the prefix index of removed endpoints, until `shutdown`.
pub async fn refresh_pool_gauges(director: Arc<Director>, datastore: Arc<crate::datastore::Datastore>, every: Duration, staleness: Duration, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        refresh_once(&director, &datastore, staleness);
    }
}

fn refresh_once(director: &Director, datastore: &crate::datastore::Datastore, staleness: Duration) {
    let m = director.metrics();
    let pool = PoolLabels { name: director.pool_name().to_owned() };
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
                let labels = PodLabels { name: pool.name.clone(), model_server_pod: s.endpoint.name.clone() };
                m.pool_per_pod_queue.get_or_create(&labels).set(x.waiting);
            }
            _ => stale += 1,
        }
    }
    let avg = |v: f64| if n > 0 { v / f64::from(n) } else { 0.0 };
    m.pool_avg_kv.get_or_create(&pool).set(avg(kv));
    m.pool_avg_queue.get_or_create(&pool).set(avg(queue));
    m.pool_avg_running.get_or_create(&pool).set(avg(running));
    m.pool_ready_pods.get_or_create(&pool).set(snapshot.len() as i64);
    m.stale_endpoints.set(stale);
    director.prune_index();
    m.prefix_indexer_size.set(director.prefix_index().size() as i64);
}

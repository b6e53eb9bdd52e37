//! A multi-cluster hub's scrape of one cluster (llm-d-router v0.10's
//! `multicluster-metrics-data-source` + `multicluster-metrics-extractor`): `GET` the spoke
//! EPP's metrics page at the cluster's metrics host (its `metricsAddress`/`metricsPort` labels,
//! else its own address as the clusters file wrote it), over https with the peer's certificate
//! verified unless configured otherwise ([`tls`]), and read the two pool aggregates
//! ([`PoolMetrics`]) into the endpoint's metrics. An answer is read up to 8 MiB (upstream's
//! cap; a longer one is a failed scrape, where upstream parses its first 8 MiB).
//!
//! A page with neither series is a failed scrape, and so is a spoke that does not answer: its
//! metrics then age past `--metrics-staleness-threshold` and the scheduler leaves the cluster
//! out while any other is fresh (ejected, beyond upstream, which keeps routing on the last
//! values it read); its next good answer brings it back. With `outlier-detection` configured
//! each failed scrape also counts as a local-origin failure.

pub(crate) mod tls;

use super::client::{BadUrl, Conn, Tls};
use super::parse::samples_named;
use super::ScrapeError;
use crate::config::{ClusterExtractor, ClusterMetrics, MetricSpec, Scheme, MAX_ANSWER_BYTES};
use crate::endpoint::{Endpoint, EndpointMetrics, PoolMetrics};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How every cluster is scraped: the configured source and extractor, and the TLS client
/// configuration built from them once.
#[derive(Clone, Debug)]
pub struct ClusterScrape {
    pub(crate) settings: ClusterMetrics,
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl ClusterScrape {
    /// Reads the source's CA bundle and client certificate (https), failing start-up on a
    /// file that is missing or not PEM, as upstream's factory does.
    pub(crate) fn new(settings: ClusterMetrics) -> Result<Self, tls::TlsError> {
        let tls = match settings.source.scheme {
            Scheme::Https => Some(Arc::new(tls::client_config(&settings.source)?)),
            Scheme::Http => None,
        };
        Ok(Self { settings, tls })
    }

    /// The scrape period: `--refresh-metrics-interval`, or the source's longer `interval`.
    pub(crate) fn period(&self, base: Duration) -> Duration {
        self.settings.source.interval.map_or(base, |i| i.max(base))
    }
}

/// Where a cluster's metrics page is, or why its metrics host makes no target.
enum Page {
    Path(String),
    Unusable(BadUrl),
}

/// One cluster's metrics page and connection.
pub(crate) struct Target {
    page: Page,
    conn: Conn,
    scrape: Arc<ClusterScrape>,
}

impl Target {
    pub(crate) fn new(endpoint: &Endpoint, scrape: &Arc<ClusterScrape>) -> Self {
        let authority = endpoint
            .metrics_host
            .clone()
            .unwrap_or_else(|| endpoint.id.to_string());
        let path = &scrape.settings.source.path;
        let mut page = match path.starts_with('/') {
            true => Page::Path(path.clone()),
            false => Page::Unusable(BadUrl {
                url: path.clone(),
                why: "the metrics path does not start with '/'",
            }),
        };
        let conn = match &scrape.tls {
            None => Conn::new(&authority),
            Some(config) => match Tls::new(Arc::clone(config), &authority) {
                Ok(tls) => Conn::with_tls(&authority, tls),
                Err(e) => {
                    page = Page::Unusable(e);
                    Conn::new(&authority)
                }
            },
        };
        Self {
            page,
            conn,
            scrape: Arc::clone(scrape),
        }
    }

    /// One scrape of the cluster's page, bounded by `timeout`.
    pub(crate) async fn scrape(
        &mut self,
        timeout: Duration,
    ) -> Result<EndpointMetrics, ScrapeError> {
        let page = match &self.page {
            Page::Path(p) => p,
            Page::Unusable(why) => return Err(ScrapeError::BadUrl(why.clone())),
        };
        let answer = tokio::time::timeout(timeout, self.conn.get(page, MAX_ANSWER_BYTES))
            .await
            .map_err(|_| ScrapeError::Timeout(timeout))??;
        if !(200..300).contains(&answer.status) {
            return Err(ScrapeError::Status(answer.status));
        }
        let text = String::from_utf8(answer.body).map_err(|_| ScrapeError::NotUtf8)?;
        extract(&text, &self.scrape.settings.extractor, Instant::now())
    }
}

/// The pool aggregates of a spoke's page: the first sample of each configured series (as
/// upstream reads them); an error when it carries neither.
pub(crate) fn extract(
    text: &str,
    series: &ClusterExtractor,
    now: Instant,
) -> Result<EndpointMetrics, ScrapeError> {
    let (kv, queue) = (&series.kv_usage, &series.queue);
    let mut pool = PoolMetrics::default();
    let wanted = |name: &str| name == kv.name || name == queue.name;
    for s in samples_named(text, wanted) {
        let is = |spec: &MetricSpec| spec.matches(s.name, |k| s.label(k));
        if pool.kv_usage.is_none() && is(kv) {
            pool.kv_usage = Some(s.value);
        }
        if pool.queue.is_none() && is(queue) {
            pool.queue = Some(s.value);
        }
    }
    if pool.kv_usage.is_none() && pool.queue.is_none() {
        return Err(ScrapeError::NoPoolSeries {
            kv: kv.name.clone(),
            queue: queue.name.clone(),
        });
    }
    Ok(EndpointMetrics {
        waiting: 0.0,
        running: 0.0,
        kv_usage: 0.0,
        lora: None,
        cache: None,
        gpu: None,
        pool: Some(pool),
        attributes: Vec::new(),
        updated: now,
    })
}

#[cfg(test)]
mod tests;

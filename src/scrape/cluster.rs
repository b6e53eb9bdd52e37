//! A multi-cluster hub's scrape of one cluster (llm-d-router v0.10's
//! `multicluster-metrics-data-source` + `multicluster-metrics-extractor`): `GET` the spoke
//! EPP's metrics page at the cluster's metrics host (its `metricsAddress`/`metricsPort` labels,
//! else its own address as the clusters file wrote it), over https with the peer's certificate
//! verified unless configured otherwise ([`tls`]), and read the two pool aggregates
//! ([`PoolMetrics`]) into the endpoint's metrics. An answer is read up to 8 MiB (upstream's
//! cap; a longer one is a failed scrape, where upstream parses its first 8 MiB). Each scrape is
//! timed, and the smallest of the last eight times is the cluster's round trip
//! ([`PoolMetrics::rtt_ms`], read by `network-cost-scorer`).
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
use std::collections::VecDeque;
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

/// How many of the last scrapes' times the round trip is the smallest of.
const RTT_SAMPLES: usize = 8;

/// The last [`RTT_SAMPLES`] scrape times of one cluster. Their minimum is the round trip: set-up
/// of a new connection and a slow answer inflate a sample, nothing shrinks one below the path's
/// round trip (TCP's and BBR's minimum filters); a lasting change shows within the window.
#[derive(Debug, Default)]
struct RttWindow(VecDeque<Duration>);

impl RttWindow {
    fn push(&mut self, sample: Duration) {
        if self.0.len() == RTT_SAMPLES {
            self.0.pop_front();
        }
        self.0.push_back(sample);
    }

    fn min_ms(&self) -> Option<f64> {
        self.0.iter().min().map(|d| d.as_secs_f64() * 1e3)
    }
}

/// One cluster's metrics page and connection.
pub(crate) struct Target {
    page: Page,
    conn: Conn,
    scrape: Arc<ClusterScrape>,
    rtt: RttWindow,
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
            rtt: RttWindow::default(),
        }
    }

    /// One scrape of the cluster's page, bounded by `timeout`, its time a round-trip sample.
    pub(crate) async fn scrape(
        &mut self,
        timeout: Duration,
    ) -> Result<EndpointMetrics, ScrapeError> {
        let page = match &self.page {
            Page::Path(p) => p,
            Page::Unusable(why) => return Err(ScrapeError::BadUrl(why.clone())),
        };
        let sent = Instant::now();
        let answer = tokio::time::timeout(timeout, self.conn.get(page, MAX_ANSWER_BYTES))
            .await
            .map_err(|_| ScrapeError::Timeout(timeout))??;
        let now = Instant::now();
        if !(200..300).contains(&answer.status) {
            return Err(ScrapeError::Status(answer.status));
        }
        self.rtt.push(now - sent);
        let text = String::from_utf8(answer.body).map_err(|_| ScrapeError::NotUtf8)?;
        let mut metrics = extract(&text, &self.scrape.settings.extractor, now)?;
        if let Some(pool) = metrics.pool.as_mut() {
            pool.rtt_ms = self.rtt.min_ms();
        }
        Ok(metrics)
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

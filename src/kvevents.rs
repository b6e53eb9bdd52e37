//! KV-cache event subscribers: one ZMQ SUB socket per endpoint, feeding the precise prefix
//! index with what each pod's cache actually holds.
//!
//! Why: the approximate index guesses from epp's own routing and is wrong whenever a pod
//! evicts, restarts, or is sent traffic by another epp replica. vLLM publishes every cache
//! change (`--kv-events-config`), so every epp replica that subscribes to every pod builds the
//! same index of what the pods hold (active-active). What a replica routed but no pod has
//! stored yet (its speculative entries) only it knows; replica sharing ([`crate::replicas`]) sends those to the others.
//!
//! A supervisor follows the datastore's endpoint set like the metric scrapers do. An endpoint's
//! event port is its `kv-events-port` label (pod label or static-file label) or
//! `--kv-events-port`; its replay port likewise (`kv-events-replay-port`,
//! `--kv-events-replay-port`). Both name the pod's rank-0 sockets, as vLLM's
//! `--kv-events-config` does: a data-parallel engine offsets each rank's PUB and replay ports by
//! its rank, so the endpoint of rank `r` (`<pod>-rank-<r>`, [`Endpoint::rank`]) subscribes to
//! port + `r` (upstream's `socketPort + RankIndex`) and its entries are that rank's alone. Each subscriber checks the sequence frame: a gap is repaired
//! through the pod's replay ROUTER when there is one, otherwise the endpoint's entries are
//! dropped and rebuilt from the following events; a sequence that goes backwards, or a disconnect, is a
//! restarted publisher, whose cache starts empty. When an endpoint leaves, its subscriber stops and its
//! entries are dropped.
//!
//! Everything above is counted in the `epp_kv_event*` metric families ([`KvEventMetrics`]):
//! batches by decode outcome, events by kind, gaps by repair, resets, per-endpoint connection
//! state, and the index's size (sampled every [`INDEX_GAUGE_EVERY`]; counting walks the index).

pub mod bound;
pub mod decode;
mod subscriber;

use crate::datastore::Datastore;
use crate::endpoint::{Endpoint, EndpointId};
use crate::metrics::{KvEventMetrics, Metrics};
use crate::prefix::precise::PreciseIndex;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Endpoint label naming the pod's KV-event PUB port.
pub const PORT_LABEL: &str = "kv-events-port";
/// Endpoint label naming the pod's KV-event replay ROUTER port.
pub const REPLAY_PORT_LABEL: &str = "kv-events-replay-port";

/// How often the index-size gauge is refreshed.
pub(crate) const INDEX_GAUGE_EVERY: Duration = Duration::from_secs(1);

/// Where subscribers put what they receive: the index, and the counts of it.
#[derive(Clone)]
pub struct Sink {
    pub(crate) index: Arc<PreciseIndex>,
    metrics: Arc<Metrics>,
}

impl Sink {
    pub fn new(index: Arc<PreciseIndex>, metrics: Arc<Metrics>) -> Self {
        Self { index, metrics }
    }

    fn metrics(&self) -> &KvEventMetrics {
        &self.metrics.kv
    }
}

#[derive(Clone, Debug, Default)]
pub struct KvEventsOptions {
    /// PUB port of every endpoint unless its label says otherwise.
    pub port: Option<u16>,
    /// Replay ROUTER port of every endpoint unless its label says otherwise.
    pub replay_port: Option<u16>,
    /// Bind mode ([`bound`]): the SUB socket's address, which the pods' PUB sockets connect to;
    /// no per-endpoint connections are made then.
    pub bind: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum KvEventsError {
    #[error("connecting to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: zeromq::ZmqError,
    },
    #[error("receiving from {addr}: {source}")]
    Recv {
        addr: String,
        #[source]
        source: zeromq::ZmqError,
    },
    #[error("{addr} disconnected; its entries were dropped")]
    Disconnected { addr: String },
    #[error("replay from {addr} failed: {reason}")]
    Replay { addr: String, reason: String },
}

/// Where one endpoint publishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Source {
    pub(crate) endpoint: EndpointId,
    pub(crate) publish: String,
    pub(crate) replay: Option<String>,
}

impl KvEventsOptions {
    /// The endpoint's sockets, or `None` when it has no event port.
    pub(crate) fn source(&self, e: &Endpoint) -> Option<Source> {
        let port = rank_port(e, label_port(e, PORT_LABEL).or(self.port)?)?;
        Some(Source {
            endpoint: e.id,
            publish: tcp(e, port),
            replay: self.replay(e),
        })
    }

    /// The endpoint's replay ROUTER address, if it has one.
    pub(crate) fn replay(&self, e: &Endpoint) -> Option<String> {
        let port = label_port(e, REPLAY_PORT_LABEL).or(self.replay_port)?;
        rank_port(e, port).map(|p| tcp(e, p))
    }
}

fn label_port(e: &Endpoint, key: &str) -> Option<u16> {
    e.labels.get(key).and_then(|v| v.parse().ok())
}

/// The endpoints whose events bind mode never receives: data-parallel ranks above 0.
fn ranks_bind_mode_misses<'a>(endpoints: impl IntoIterator<Item = &'a Endpoint>) -> Vec<&'a str> {
    endpoints
        .into_iter()
        .filter(|e| e.rank > 0)
        .map(|e| e.name.as_str())
        .collect()
}

/// The port of `e`'s rank given its pod's rank-0 port; `None` (logged) past 65535.
fn rank_port(e: &Endpoint, base: u16) -> Option<u16> {
    let port = base.checked_add(e.rank);
    if port.is_none() {
        tracing::warn!(endpoint = %e.name, base, rank = e.rank, "KV-event port + rank is past 65535; not subscribing");
    }
    port
}

/// `tcp://<endpoint ip>:<port>`.
fn tcp(e: &Endpoint, port: u16) -> String {
    match e.id.0.ip() {
        std::net::IpAddr::V6(v6) => format!("tcp://[{v6}]:{port}"),
        std::net::IpAddr::V4(v4) => format!("tcp://{v4}:{port}"),
    }
}

/// Runs the supervisor until `shutdown`; subscribers are spawned on `tracker`.
pub async fn run(
    datastore: Arc<Datastore>,
    sink: Sink,
    opts: KvEventsOptions,
    tracker: TaskTracker,
    shutdown: CancellationToken,
) {
    if let Some(bind) = opts.bind.clone() {
        tracker.spawn(bound::supervise(
            bind,
            Arc::clone(&datastore),
            sink.clone(),
            opts.clone(),
            shutdown.clone(),
        ));
    }
    let mut changes = datastore.subscribe();
    let mut gauge = tokio::time::interval(INDEX_GAUGE_EVERY);
    let mut running: HashMap<EndpointId, (Source, CancellationToken)> = HashMap::new();
    let mut warned_ranks = false;
    loop {
        let snapshot = datastore.snapshot();
        let connect = opts.bind.is_none();
        if !connect && !warned_ranks {
            let ranked = ranks_bind_mode_misses(snapshot.iter().map(|s| &s.endpoint));
            if !ranked.is_empty() {
                warned_ranks = true;
                tracing::warn!(endpoints = ?ranked, "KV-event bind mode does not reach data-parallel ranks > 0: vLLM connects rank r's publisher to the bound port + r, which epp does not bind; these endpoints get no events (subscribe per endpoint with --kv-events-port instead)");
            }
        }
        let wanted: HashMap<EndpointId, Source> = snapshot
            .iter()
            .filter(|_| connect)
            .filter_map(|s| opts.source(&s.endpoint))
            .map(|s| (s.endpoint, s))
            .collect();
        running.retain(|id, (source, token)| {
            let keep = wanted.get(id) == Some(source);
            if !keep {
                token.cancel();
            }
            keep
        });
        for (id, source) in wanted {
            if let std::collections::hash_map::Entry::Vacant(slot) = running.entry(id) {
                let token = shutdown.child_token();
                slot.insert((source.clone(), token.clone()));
                tracker.spawn(subscriber::run(source, sink.clone(), token));
            }
        }
        let live: HashSet<EndpointId> = snapshot.iter().map(|s| s.id()).collect();
        sink.index.retain(&live);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                changed = changes.changed() => if changed.is_err() { return } else { break },
                _ = gauge.tick() => {
                    sink.metrics().index_entries.set(i64::try_from(sink.index.entries()).unwrap_or(i64::MAX));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(port: u16, rank: u16, label: Option<&str>) -> Endpoint {
        let mut e = Endpoint::from_id(EndpointId(([10, 0, 0, 1], port).into()));
        e.rank = rank;
        if let Some(p) = label {
            e.labels.insert(PORT_LABEL.into(), p.into());
        }
        e
    }

    #[test]
    fn each_data_parallel_rank_subscribes_to_its_own_sockets() {
        let opts = KvEventsOptions {
            port: Some(5557),
            replay_port: Some(5657),
            bind: None,
        };
        let r0 = opts.source(&rank(8000, 0, None)).unwrap();
        let r1 = opts.source(&rank(8001, 1, None)).unwrap();
        assert_eq!(r0.publish, "tcp://10.0.0.1:5557");
        assert_eq!(r0.replay.as_deref(), Some("tcp://10.0.0.1:5657"));
        assert_eq!(
            r1.publish, "tcp://10.0.0.1:5558",
            "vLLM's rank 1 publishes on 5557 + 1"
        );
        assert_eq!(r1.replay.as_deref(), Some("tcp://10.0.0.1:5658"));
        assert_eq!(r1.endpoint, EndpointId(([10, 0, 0, 1], 8001).into()));
        let labelled = opts.source(&rank(8003, 3, Some("6000"))).unwrap();
        assert_eq!(
            labelled.publish, "tcp://10.0.0.1:6003",
            "the pod label is the rank-0 port too"
        );
    }

    #[test]
    fn bind_mode_names_the_ranks_it_cannot_reach() {
        let mut r1 = rank(8001, 1, None);
        r1.name = "pod-rank-1".into();
        let eps = [rank(8000, 0, None), r1];
        assert_eq!(ranks_bind_mode_misses(&eps), ["pod-rank-1"]);
        assert!(ranks_bind_mode_misses(&eps[..1]).is_empty());
    }

    #[test]
    fn a_rank_past_the_last_port_is_not_subscribed() {
        let opts = KvEventsOptions {
            port: Some(65535),
            ..KvEventsOptions::default()
        };
        assert!(opts.source(&rank(8000, 0, None)).is_some());
        assert!(opts.source(&rank(8001, 1, None)).is_none());
    }
}

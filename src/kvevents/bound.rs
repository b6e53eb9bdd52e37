//! Bind mode: one SUB socket that epp binds (`--kv-events-bind`, llm-d's `zmqEndpoint`,
//! e.g. `tcp://*:5557`) and every pod's PUB connects to (vLLM `--kv-events-config` with
//! `endpoint: tcp://<epp>:5557`, which connects because it has no wildcard).
//!
//! One socket carries every pod's stream, so the publisher is told apart by the topic,
//! `kv@<ip>:<port>@<model>` (or `kv@<ip>@<model>`), resolved against the datastore's endpoints
//! ([`resolve`]); messages from unknown publishers are skipped. Each publisher keeps its own
//! sequence: gaps are repaired through its replay socket (the endpoint's replay port, as in
//! connect mode) and a sequence that goes back is a restart. A pod's disconnect is not visible
//! on a bound socket (peers are anonymous), so only a restart that shows in the sequence drops
//! its entries. Replays run inline: other pods' batches wait in the socket meanwhile (bounded
//! by the replay timeout).

use super::subscriber::{apply, classify, repair, seq_of, topic_parts, Arrival};
use super::{KvEventsError, KvEventsOptions, Sink, Source};
use crate::datastore::Datastore;
use crate::endpoint::{Endpoint, EndpointId};
use crate::metrics::EndpointLabels;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use zeromq::{Socket, SocketRecv, SubSocket};

/// The topic prefix subscribed to (llm-d's `topicFilter` default).
pub(crate) const TOPIC_FILTER: &str = "kv@";

/// The endpoint a topic's publisher part names: the endpoint at that address; else the endpoint
/// on that IP whose KV-event port (label or flag) is that port; else the only endpoint on that IP.
pub(crate) fn resolve<'a>(
    publisher: &str,
    endpoints: impl IntoIterator<Item = &'a Endpoint>,
    opts: &KvEventsOptions,
) -> Option<EndpointId> {
    let (ip, port): (IpAddr, Option<u16>) = match publisher.parse::<SocketAddr>() {
        Ok(addr) => (addr.ip(), Some(addr.port())),
        Err(_) => (
            publisher
                .trim_matches(|c| c == '[' || c == ']')
                .parse()
                .ok()?,
            None,
        ),
    };
    let on_ip: Vec<&Endpoint> = endpoints
        .into_iter()
        .filter(|e| e.id.0.ip() == ip)
        .collect();
    if let Some(port) = port {
        if let Some(e) = on_ip.iter().find(|e| e.id.0.port() == port) {
            return Some(e.id);
        }
        let kv_port = |e: &Endpoint| {
            let base = super::label_port(e, super::PORT_LABEL).or(opts.port)?;
            base.checked_add(e.rank)
        };
        if let Some(e) = on_ip.iter().find(|e| kv_port(e) == Some(port)) {
            return Some(e.id);
        }
    }
    match on_ip.as_slice() {
        [e] => Some(e.id),
        _ => None,
    }
}

/// Binds `endpoint` and follows every publisher that connects, until the socket fails.
pub(super) async fn run(
    endpoint: &str,
    datastore: &Datastore,
    sink: &Sink,
    opts: &KvEventsOptions,
) -> Result<(), KvEventsError> {
    let mut sub = SubSocket::new();
    let bound = sub
        .bind(&endpoint.replace("//*:", "//0.0.0.0:"))
        .await
        .map_err(|e| KvEventsError::Connect {
            addr: endpoint.to_owned(),
            source: e,
        })?;
    sub.subscribe(TOPIC_FILTER)
        .await
        .map_err(|e| KvEventsError::Connect {
            addr: endpoint.to_owned(),
            source: e,
        })?;
    tracing::info!(%bound, "KV-event SUB socket bound; pods connect to it");
    let mut next: HashMap<EndpointId, u64> = HashMap::new();
    loop {
        let msg = sub.recv().await.map_err(|e| KvEventsError::Recv {
            addr: endpoint.to_owned(),
            source: e,
        })?;
        let frames = msg.into_vec();
        let [topic, seq, payload] = frames.as_slice() else {
            continue;
        };
        let Some(seq) = seq_of(seq) else { continue };
        let (publisher, model) = topic_parts(topic);
        let snapshot = datastore.snapshot();
        let Some(id) = resolve(&publisher, snapshot.iter().map(|s| &s.endpoint), opts) else {
            tracing::debug!(topic = %String::from_utf8_lossy(topic), "KV events from a publisher that is no endpoint; skipped");
            continue;
        };
        let Some(source) = snapshot
            .iter()
            .find(|s| s.id() == id)
            .map(|s| source_of(&s.endpoint, endpoint, opts))
        else {
            continue;
        };
        next.retain(|id, _| {
            let live = snapshot.get(id).is_some();
            if !live {
                sink.metrics().connected.remove(&EndpointLabels {
                    endpoint: id.to_string(),
                });
            }
            live
        });
        let labels = EndpointLabels {
            endpoint: id.to_string(),
        };
        sink.metrics().connected.get_or_create(&labels).set(1);
        match classify(next.get(&id).copied(), seq) {
            Arrival::InOrder => {}
            Arrival::Restarted => {
                tracing::info!(endpoint = %id, seq, "KV-event publisher restarted; dropping the endpoint's entries");
                sink.index.writer(id).clear();
                sink.metrics().resets.inc();
            }
            Arrival::Gap { from } => {
                repair(&source, sink, &model, from, seq, !next.contains_key(&id)).await
            }
        }
        apply(sink, &source, &model, payload);
        next.insert(id, seq + 1);
    }
}

/// The endpoint's replay socket, with the bound address standing in for its publisher.
fn source_of(e: &Endpoint, bound: &str, opts: &KvEventsOptions) -> Source {
    Source {
        endpoint: e.id,
        publish: bound.to_owned(),
        replay: opts.replay(e),
    }
}

/// Keeps the bound socket up until `shutdown`, rebinding after a failure.
pub(super) async fn supervise(
    endpoint: String,
    datastore: Arc<Datastore>,
    sink: Sink,
    opts: KvEventsOptions,
    shutdown: tokio_util::sync::CancellationToken,
) {
    loop {
        let result = tokio::select! {
            r = run(&endpoint, &datastore, &sink, &opts) => r,
            () = shutdown.cancelled() => return,
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, "KV-event bound socket failed; rebinding");
        }
        tokio::select! {
            () = tokio::time::sleep(super::subscriber::RETRY) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(addr: &str, kv_port: Option<u16>) -> Endpoint {
        let mut e = Endpoint {
            id: EndpointId(addr.parse().unwrap()),
            name: addr.into(),
            engine: Default::default(),
            labels: Default::default(),
            weight: 1,
            rank: 0,
            metrics_host: None,
        };
        if let Some(p) = kv_port {
            e.labels
                .insert(super::super::PORT_LABEL.into(), p.to_string());
        }
        e
    }

    #[test]
    fn topics_resolve_by_address_then_event_port_then_unique_ip() {
        let eps = [
            endpoint("10.0.0.1:8000", None),
            endpoint("10.0.0.1:8001", None),
            endpoint("10.0.0.2:8000", Some(5557)),
            endpoint("127.0.0.1:9000", Some(6000)),
            endpoint("127.0.0.1:9001", Some(6001)),
        ];
        let opts = KvEventsOptions::default();
        let r = |p: &str| resolve(p, eps.iter(), &opts).map(|id| id.to_string());
        assert_eq!(r("10.0.0.1:8001").as_deref(), Some("10.0.0.1:8001"));
        assert_eq!(
            r("10.0.0.2:5557").as_deref(),
            Some("10.0.0.2:8000"),
            "the event port names the endpoint"
        );
        assert_eq!(r("127.0.0.1:6001").as_deref(), Some("127.0.0.1:9001"));
        assert_eq!(
            r("10.0.0.2").as_deref(),
            Some("10.0.0.2:8000"),
            "a bare IP with one endpoint"
        );
        assert_eq!(
            r("10.0.0.1"),
            None,
            "a bare IP with two endpoints is ambiguous"
        );
        assert_eq!(r("10.0.0.9:8000"), None);
        assert_eq!(r("pod-name"), None);
    }
}

//! One endpoint's subscription: the SUB session, sequence checking, replay and applying
//! batches to the index.

use super::decode::{decode_batch, KvEvent};
use super::{KvEventsError, Sink, Source};
use crate::metrics::{
    EndpointLabels, KvEventKind, KvEventLabels, KvGapLabels, KvGapOutcome, Outcome, OutcomeLabels,
};
use crate::prefix::precise::Stored;
use bytes::Bytes;
use futures::StreamExt;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use zeromq::{DealerSocket, Socket, SocketEvent, SocketRecv, SocketSend, SubSocket, ZmqMessage};

/// Pause between failed sessions (the socket itself reconnects within a session).
pub(super) const RETRY: Duration = Duration::from_millis(200);
/// Longest wait for a replay to finish.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(2);
/// Sequence frame of the replay end marker.
const END_OF_REPLAY: [u8; 8] = [0xff; 8];

/// Subscribes until cancelled, starting a new session after a failure.
pub(super) async fn run(source: Source, sink: Sink, cancel: CancellationToken) {
    let mut failing = false;
    let labels = EndpointLabels {
        endpoint: source.endpoint.to_string(),
    };
    loop {
        let result = tokio::select! {
            r = session(&source, &sink) => r,
            () = cancel.cancelled() => break,
        };
        sink.metrics().connected.get_or_create(&labels).set(0);
        if let Err(e) = result {
            if !std::mem::replace(&mut failing, true) {
                tracing::warn!(endpoint = %source.endpoint, error = %e, "KV-event subscription failing; retrying");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(RETRY) => {}
            () = cancel.cancelled() => break,
        }
    }
    sink.metrics().connected.remove(&labels);
}

/// What the sequence number of an arriving batch means.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Arrival {
    /// The next one (or the first one seen from sequence 0).
    InOrder,
    /// Batches `from..seq` were missed.
    Gap { from: u64 },
    /// The publisher restarted (its sequence went back): the pod's cache is empty.
    Restarted,
}

pub(super) fn classify(next: Option<u64>, seq: u64) -> Arrival {
    match next {
        None if seq == 0 => Arrival::InOrder,
        None => Arrival::Gap { from: 0 },
        Some(n) if seq == n => Arrival::InOrder,
        Some(n) if seq > n => Arrival::Gap { from: n },
        Some(_) => Arrival::Restarted,
    }
}

async fn session(source: &Source, sink: &Sink) -> Result<(), KvEventsError> {
    let index = &*sink.index;
    let mut sub = SubSocket::new();
    let addr = &source.publish;
    sub.connect(addr)
        .await
        .map_err(|e| KvEventsError::Connect {
            addr: addr.clone(),
            source: e,
        })?;
    sub.subscribe("")
        .await
        .map_err(|e| KvEventsError::Connect {
            addr: addr.clone(),
            source: e,
        })?;
    tracing::info!(endpoint = %source.endpoint, %addr, "KV-event subscription started");
    sink.metrics()
        .connected
        .get_or_create(&EndpointLabels {
            endpoint: source.endpoint.to_string(),
        })
        .set(1);
    let mut monitor = sub.monitor();
    let mut next: Option<u64> = None;
    let mut monitoring = true;
    loop {
        let msg = tokio::select! {
            msg = sub.recv() => msg.map_err(|e| KvEventsError::Recv { addr: addr.clone(), source: e })?,
            event = monitor.next(), if monitoring => {
                monitoring = event.is_some();
                // The pod went away: whatever comes back is a new process with an empty cache,
                // or a gap we cannot see. Drop its entries and start a fresh session (a new
                // socket: relying on the socket's own reconnection lost the restarted pod).
                if let Some(SocketEvent::Disconnected(_)) = event {
                    index.writer(source.endpoint).clear();
                    sink.metrics().resets.inc();
                    return Err(KvEventsError::Disconnected { addr: addr.clone() });
                }
                continue;
            }
        };
        let frames = msg.into_vec();
        let [topic, seq, payload] = frames.as_slice() else {
            continue;
        };
        let Some(seq) = seq_of(seq) else { continue };
        let model = topic_model(topic);
        tracing::trace!(endpoint = %source.endpoint, seq, "KV-event batch");
        match classify(next, seq) {
            Arrival::InOrder => {}
            Arrival::Restarted => {
                tracing::info!(endpoint = %source.endpoint, seq, "KV-event publisher restarted; dropping the endpoint's entries");
                index.writer(source.endpoint).clear();
                sink.metrics().resets.inc();
            }
            Arrival::Gap { from } => repair(source, sink, &model, from, seq, next.is_none()).await,
        }
        apply(sink, source, &model, payload);
        next = Some(seq + 1);
    }
}

/// Fills batches `from..to` through the replay socket; without one (or when the pod's buffer
/// no longer reaches back to `from`), drops the endpoint's entries so that they are rebuilt from
/// what follows. A first batch with a sequence above 0 is a late join: nothing to drop.
pub(super) async fn repair(
    source: &Source,
    sink: &Sink,
    model: &str,
    from: u64,
    to: u64,
    first: bool,
) {
    let replayed = match &source.replay {
        Some(addr) => match tokio::time::timeout(REPLAY_TIMEOUT, replay(addr, from)).await {
            Ok(Ok(batches)) => Some(batches),
            Ok(Err(e)) => {
                tracing::warn!(endpoint = %source.endpoint, error = %e, "KV-event replay failed");
                None
            }
            Err(_) => {
                tracing::warn!(endpoint = %source.endpoint, "KV-event replay timed out");
                None
            }
        },
        None => None,
    };
    tracing::debug!(endpoint = %source.endpoint, from, to, replayed = ?replayed.as_ref().map(|b| b.iter().map(|(s, _)| *s).collect::<Vec<_>>()), "KV-event replay");
    let complete = replayed
        .as_ref()
        .is_some_and(|b| b.first().is_some_and(|(s, _)| *s <= from));
    if !complete && !first {
        tracing::info!(endpoint = %source.endpoint, from, to, "KV-event gap not repairable; rebuilding the endpoint's entries");
        sink.index.writer(source.endpoint).clear();
    }
    let outcome = if complete {
        Some(KvGapOutcome::replayed)
    } else {
        (!first).then_some(KvGapOutcome::dropped)
    };
    if let Some(outcome) = outcome {
        sink.metrics()
            .gaps
            .get_or_create(&KvGapLabels { outcome })
            .inc();
    }
    for (_, payload) in replayed
        .unwrap_or_default()
        .iter()
        .filter(|(s, _)| (from..to).contains(s))
    {
        apply(sink, source, model, payload);
    }
}

/// Asks the ROUTER at `addr` for every buffered batch from `start` on.
async fn replay(addr: &str, start: u64) -> Result<Vec<(u64, Bytes)>, KvEventsError> {
    let fail = |reason: String| KvEventsError::Replay {
        addr: addr.to_owned(),
        reason,
    };
    let mut dealer = DealerSocket::new();
    dealer
        .connect(addr)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let request = ZmqMessage::try_from(vec![
        Bytes::new(),
        Bytes::copy_from_slice(&start.to_be_bytes()),
    ])
    .map_err(|e| fail(e.to_string()))?;
    dealer
        .send(request)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let mut out = Vec::new();
    loop {
        let frames = dealer
            .recv()
            .await
            .map_err(|e| fail(e.to_string()))?
            .into_vec();
        // [empty delimiter, seq, payload]
        let [_, seq, payload] = frames.as_slice() else {
            return Err(fail(format!("{} frames", frames.len())));
        };
        if seq.as_ref() == END_OF_REPLAY {
            return Ok(out);
        }
        let seq = seq_of(seq).ok_or_else(|| fail("short sequence frame".into()))?;
        out.push((seq, payload.clone()));
    }
}

pub(super) fn seq_of(frame: &[u8]) -> Option<u64> {
    frame
        .get(..8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_be_bytes)
}

/// The model part of `kv@<ip>:<port>@<model>` (the whole topic when it has another shape).
fn topic_model(topic: &[u8]) -> String {
    topic_parts(topic).1
}

/// The publisher and model parts of `kv@<ip>:<port>@<model>`; for another shape, no publisher
/// and the whole topic as the model.
pub(super) fn topic_parts(topic: &[u8]) -> (String, String) {
    let topic = String::from_utf8_lossy(topic);
    let mut parts = topic.splitn(3, '@');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(_), Some(publisher), Some(model)) => (publisher.to_owned(), model.to_owned()),
        _ => (String::new(), topic.into_owned()),
    }
}

/// Decodes one batch and applies it under one write lock, counting batches and events.
pub(super) fn apply(sink: &Sink, source: &Source, model: &str, payload: &[u8]) {
    let m = sink.metrics();
    let batch = match decode_batch(payload) {
        Ok(b) => b,
        Err(e) => {
            tracing::debug!(endpoint = %source.endpoint, error = %e, "undecodable KV-event batch skipped");
            m.batches
                .get_or_create(&OutcomeLabels {
                    outcome: Outcome::failure,
                })
                .inc();
            return;
        }
    };
    m.batches
        .get_or_create(&OutcomeLabels {
            outcome: Outcome::success,
        })
        .inc();
    let mut counts = [0u64; 4];
    let mut w = sink.index.writer(source.endpoint);
    let gpu = |m: &Option<String>| m.as_deref().is_none_or(|m| m.eq_ignore_ascii_case("gpu"));
    for event in &batch.events {
        let kind = match event {
            KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_name,
                medium,
            } if gpu(medium) => {
                let model = lora_name.as_deref().unwrap_or(model);
                w.store(&Stored {
                    model,
                    parent: *parent_block_hash,
                    hashes: block_hashes,
                    tokens: token_ids,
                    block_size: *block_size,
                });
                KvEventKind::stored
            }
            KvEvent::BlockRemoved {
                block_hashes,
                medium,
            } if gpu(medium) => {
                w.remove(block_hashes);
                KvEventKind::removed
            }
            KvEvent::AllBlocksCleared => {
                w.clear();
                KvEventKind::cleared
            }
            _ => KvEventKind::ignored,
        };
        counts[kind as usize] += 1;
    }
    drop(w);
    for (kind, n) in [
        KvEventKind::stored,
        KvEventKind::removed,
        KvEventKind::cleared,
        KvEventKind::ignored,
    ]
    .into_iter()
    .zip(counts)
    {
        if n > 0 {
            m.events.get_or_create(&KvEventLabels { kind }).inc_by(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_classify_gaps_and_restarts() {
        assert_eq!(classify(None, 0), Arrival::InOrder);
        assert_eq!(classify(None, 7), Arrival::Gap { from: 0 });
        assert_eq!(classify(Some(3), 3), Arrival::InOrder);
        assert_eq!(classify(Some(3), 5), Arrival::Gap { from: 3 });
        assert_eq!(classify(Some(3), 0), Arrival::Restarted);
    }

    #[test]
    fn topics_name_the_model() {
        assert_eq!(topic_model(b"kv@10.0.0.1:8000@meta/llama"), "meta/llama");
        assert_eq!(topic_model(b"kv@pod@m@x"), "m@x");
        assert_eq!(topic_model(b"other"), "other");
    }
}

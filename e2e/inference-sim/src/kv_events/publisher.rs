//! The ZMQ side of KV events: the PUB publisher task and the ROUTER replay task.
//!
//! The engine hands each step's events to [`KvPublisher::publish`] (never
//! blocking: a full queue drops the batch, like vLLM's bounded queue); the
//! publisher task numbers, encodes, buffers for replay and sends them. Both
//! tasks live in the pod's `JoinSet` and stop with its cancellation token.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use super::{encode_batch, KvEventsConfig, KvEventsError};
use crate::kv_cache::KvEvent;

/// Queue between the engine and the publisher (vLLM `max_queue_size`).
const QUEUE: usize = 100_000;
/// Sequence frame of the replay end marker.
const END_OF_REPLAY: [u8; 8] = [0xff; 8];

type ReplayBuffer = Arc<Mutex<VecDeque<(u64, Bytes)>>>;

/// Resolved endpoints, for tests and logs (`None` where the socket connects
/// or is not configured).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PublisherEndpoints {
    pub publish: Option<String>,
    pub replay: Option<String>,
}

/// The engine's handle: hands over one batch per step.
#[derive(Clone, Debug)]
pub struct KvPublisher {
    tx: mpsc::Sender<(f64, Vec<KvEvent>)>,
}

fn zmq_endpoint(endpoint: &str) -> String {
    endpoint.replace("//*:", "//0.0.0.0:")
}

impl KvPublisher {
    /// Binds the sockets that bind (so their ports are known on return) and
    /// starts the publisher and replay tasks in `tasks`.
    pub async fn start(
        cfg: &KvEventsConfig,
        tasks: &mut JoinSet<()>,
        cancel: CancellationToken,
    ) -> Result<(Self, PublisherEndpoints), KvEventsError> {
        let mut endpoints = PublisherEndpoints::default();
        let mut socket = PubSocket::new();
        if cfg.binds() {
            endpoints.publish = Some(bind(&mut socket, &cfg.endpoint).await?);
        }
        let buffer: ReplayBuffer = Arc::default();
        if let Some(replay) = &cfg.replay_endpoint {
            let mut router = RouterSocket::new();
            endpoints.replay = Some(bind(&mut router, replay).await?);
            tasks.spawn(serve_replay(router, buffer.clone(), cancel.clone()));
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        let task = PublisherTask {
            cfg: cfg.clone(),
            socket,
            buffer,
            rx,
            next_seq: 0,
        };
        tasks.spawn(task.run(cancel));
        Ok((Self { tx }, endpoints))
    }

    /// Queues one step's events (dropped if the queue is full).
    pub fn publish(&self, ts: f64, events: Vec<KvEvent>) {
        if !events.is_empty() && self.tx.try_send((ts, events)).is_err() {
            tracing::warn!("KV-event queue full; batch dropped");
        }
    }
}

async fn bind(socket: &mut impl Socket, endpoint: &str) -> Result<String, KvEventsError> {
    let bound = socket
        .bind(&zmq_endpoint(endpoint))
        .await
        .map_err(|source| KvEventsError::Bind {
            endpoint: endpoint.to_owned(),
            source,
        })?;
    Ok(bound.to_string())
}

struct PublisherTask {
    cfg: KvEventsConfig,
    socket: PubSocket,
    buffer: ReplayBuffer,
    rx: mpsc::Receiver<(f64, Vec<KvEvent>)>,
    next_seq: u64,
}

impl PublisherTask {
    async fn run(mut self, cancel: CancellationToken) {
        if !self.cfg.binds() {
            tokio::select! {
                () = self.connect() => {}
                () = cancel.cancelled() => return,
            }
        }
        loop {
            let batch = tokio::select! {
                batch = self.rx.recv() => batch,
                () = cancel.cancelled() => None,
            };
            let Some((ts, events)) = batch else { return };
            self.send(ts, &events).await;
        }
    }

    /// Dials the subscriber, retrying until it listens (as libzmq does).
    async fn connect(&mut self) {
        let endpoint = zmq_endpoint(&self.cfg.endpoint);
        while let Err(e) = self.socket.connect(&endpoint).await {
            tracing::debug!(%endpoint, error = %e, "KV-event subscriber not reachable yet");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn send(&mut self, ts: f64, events: &[KvEvent]) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let payload = Bytes::from(encode_batch(
            ts,
            events,
            self.cfg.encoding,
            self.cfg.dp_rank,
        ));
        {
            let mut buffer = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
            if buffer.len() >= self.cfg.buffer_steps.max(1) {
                buffer.pop_front();
            }
            buffer.push_back((seq, payload.clone()));
        }
        let frames = vec![
            Bytes::from(self.cfg.topic.clone().into_bytes()),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            payload,
        ];
        if let Ok(msg) = ZmqMessage::try_from(frames) {
            if let Err(e) = self.socket.send(msg).await {
                tracing::debug!(error = %e, "KV-event send failed");
            }
        }
    }
}

/// Answers replay requests `[id, "", start_seq]` from the buffer.
async fn serve_replay(mut router: RouterSocket, buffer: ReplayBuffer, cancel: CancellationToken) {
    loop {
        let msg = tokio::select! {
            msg = router.recv() => msg,
            () = cancel.cancelled() => return,
        };
        let Ok(msg) = msg else { continue };
        let frames = msg.into_vec();
        let (Some(id), Some(last)) = (frames.first(), frames.last()) else {
            continue;
        };
        let Ok(start) = <[u8; 8]>::try_from(last.as_ref()) else {
            continue;
        };
        let start = u64::from_be_bytes(start);
        let batches: Vec<(u64, Bytes)> = {
            let buffer = buffer.lock().unwrap_or_else(|e| e.into_inner());
            buffer
                .iter()
                .filter(|(seq, _)| *seq >= start)
                .cloned()
                .collect()
        };
        for (seq, payload) in batches {
            let seq = Bytes::copy_from_slice(&seq.to_be_bytes());
            reply(&mut router, vec![id.clone(), Bytes::new(), seq, payload]).await;
        }
        let end = Bytes::from_static(&END_OF_REPLAY);
        reply(
            &mut router,
            vec![id.clone(), Bytes::new(), end, Bytes::new()],
        )
        .await;
    }
}

async fn reply(router: &mut RouterSocket, frames: Vec<Bytes>) {
    if let Ok(msg) = ZmqMessage::try_from(frames) {
        if let Err(e) = router.send(msg).await {
            tracing::debug!(error = %e, "replay reply failed");
        }
    }
}

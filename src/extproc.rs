//! The ext_proc gRPC service: `envoy.service.ext_proc.v3.ExternalProcessor/Process`.
//!
//! Each stream is driven inline by its own future (no task or channel per stream): the stream
//! returned to tonic pulls Envoy's next message, runs the [`stream::StreamMachine`] and yields
//! its responses. Until the routing decision a deadline bounds the wait for the body, so a
//! stalled client cannot hold a stream forever. Envoy ends every stream with a reset
//! (`RST_STREAM INTERNAL_ERROR`); after a complete exchange that is a normal end and is neither
//! logged as an error nor counted.
//!
//! With flow control, a stream whose decision is parked awaits its turn here before reading
//! on; if the gateway drops the stream meanwhile, the wait is dropped and leaves the queue.

pub(crate) mod grpc;
pub(crate) mod render;
pub(crate) mod status;
pub(crate) mod stream;
pub mod wire;

use crate::director::flowcontrol::FlowControl;
use envoy_types::pb::envoy::service::ext_proc::v3::ProcessingResponse;
use std::collections::VecDeque;
use std::sync::Arc;
use stream::{Limits, Services, StreamMachine};
use tonic::Status;

/// The gRPC service name, also served by the health service.
pub(crate) const SERVICE_NAME: &str = "envoy.service.ext_proc.v3.ExternalProcessor";

pub(crate) struct ExtProc {
    services: Arc<Services>,
    limits: Limits,
    /// `--flow-control`: every stream waits in the flow-control queue, whatever the
    /// configuration's gate says.
    flow_forced: bool,
    /// `--emit-endpoint-scores`: every candidate's score in the routing metadata.
    emit_endpoint_scores: bool,
}

impl ExtProc {
    pub(crate) fn new(services: Services, limits: Limits) -> Self {
        Self {
            services: Arc::new(services),
            limits,
            flow_forced: false,
            emit_endpoint_scores: false,
        }
    }

    /// Sends the scheduler's score of every candidate in the routing metadata
    /// (`envoy.lb/x-gateway-destination-endpoint-scores`, upstream's `--emit-endpoint-scores`).
    pub(crate) fn with_endpoint_scores(mut self, emit: bool) -> Self {
        self.emit_endpoint_scores = emit;
        self
    }

    /// Routing decisions wait for their turn in the live configuration's flow-control queue
    /// always (`--flow-control`), not only while its `flowControl` gate is on (read per
    /// stream, so a reload turns it on or off).
    pub(crate) fn with_flow_control_forced(mut self, forced: bool) -> Self {
        self.flow_forced = forced;
        self
    }

    /// The queue this stream's decision waits in, if flow control is on now.
    fn flow_now(&self) -> Option<Arc<FlowControl>> {
        let config = &self.services.config;
        let on = self.flow_forced || config.load().flow.enabled;
        on.then(|| Arc::clone(config.flow_control()))
    }

    /// The gRPC service, accepting buffered bodies up to the body limit.
    pub(crate) fn into_server(self) -> grpc::ExtProcServer {
        let max = self.limits.max_body_bytes.saturating_add(1 << 20);
        grpc::ExtProcServer::new(self, max)
    }

    /// A new stream's driver.
    fn driver(&self, inbound: grpc::Inbound) -> Driver {
        let mut machine = StreamMachine::new(Arc::clone(&self.services), self.limits);
        let flow = self.flow_now();
        if flow.is_some() {
            machine.use_flow_control();
        }
        if self.emit_endpoint_scores {
            machine.emit_endpoint_scores();
        }
        Driver {
            inbound,
            flow,
            machine,
            pending: VecDeque::new(),
            deadline: tokio::time::Instant::now() + self.limits.body_timeout,
        }
    }
}

/// One stream: pulls Envoy's messages, runs the machine, hands out its responses in order.
struct Driver {
    inbound: grpc::Inbound,
    flow: Option<Arc<FlowControl>>,
    machine: StreamMachine,
    pending: VecDeque<ProcessingResponse>,
    deadline: tokio::time::Instant,
}

impl Driver {
    /// The next response to send, or `None` when the stream is over.
    async fn next(&mut self) -> Option<ProcessingResponse> {
        loop {
            if let Some(r) = self.pending.pop_front() {
                return Some(r);
            }
            if self.machine.is_done() {
                return None;
            }
            let mut out = Vec::new();
            if let Some(job) = self.machine.take_render_job() {
                let result = job.run().await;
                self.machine.on_rendered(result, &mut out);
                self.pending.extend(out);
                continue;
            }
            if let (Some(flow), Some(ticket)) = (&self.flow, self.machine.take_flow_ticket()) {
                let result = flow.admit(ticket).await;
                self.machine.on_admission(result, &mut out);
                self.pending.extend(out);
                continue;
            }
            if let Some(until) = self.machine.take_gather() {
                tokio::time::sleep_until(until).await;
                self.machine.on_gathered(&mut out);
                self.pending.extend(out);
                continue;
            }
            let message = if self.machine.awaiting_decision() {
                match tokio::time::timeout_at(self.deadline, self.inbound.message()).await {
                    Ok(m) => m,
                    Err(_) => {
                        self.machine.on_body_timeout(&mut out);
                        self.pending.extend(out);
                        continue;
                    }
                }
            } else {
                self.inbound.message().await
            };
            match message {
                Ok(Some(msg)) => self.machine.handle(msg, &mut out),
                Ok(None) => return None,
                Err(status) => {
                    self.on_reset(&status);
                    return None;
                }
            }
            self.pending.extend(out);
        }
    }

    fn on_reset(&self, status: &Status) {
        if self.machine.interrupted() {
            tracing::debug!(code = ?status.code(), message = status.message(), "ext_proc stream reset before the exchange completed");
        }
    }
}

/// tonic drops the response stream (and this driver) when the gateway resets the stream, often
/// without the reset ever surfacing as an error here; so interruptions are counted on drop.
impl Drop for Driver {
    fn drop(&mut self) {
        if self.machine.interrupted() {
            self.machine.note_reset();
        } else {
            self.machine.closed();
        }
    }
}

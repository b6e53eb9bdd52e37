//! How Envoy sends each direction's body: its five-valued `ProcessingMode.BodySendMode`, read
//! from the `protocol_config` of a stream's first message.

use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::ProtocolConfiguration;

/// How Envoy sends one direction's body (`ProcessingMode.BodySendMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BodyMode {
    /// No body is sent.
    None,
    /// Chunks as they arrive, each answered before the next (`STREAMED`).
    Streamed,
    /// The whole body in one message (`BUFFERED`).
    Buffered,
    /// Up to the buffer limit in one message (`BUFFERED_PARTIAL`).
    BufferedPartial,
    /// Chunks in both directions, answers decoupled from messages (`FULL_DUPLEX_STREAMED`):
    /// the headers answer can wait for the decision, and the body is sent back as chunks.
    FullDuplexStreamed,
}

impl BodyMode {
    /// The mode Envoy's `protocol_config` names; an unknown value is read as buffered (a body
    /// is sent, answered message by message).
    fn from_wire(value: i32) -> Self {
        match value {
            v if v == BodySendMode::None as i32 => Self::None,
            v if v == BodySendMode::Streamed as i32 => Self::Streamed,
            v if v == BodySendMode::BufferedPartial as i32 => Self::BufferedPartial,
            v if v == BodySendMode::FullDuplexStreamed as i32 => Self::FullDuplexStreamed,
            _ => Self::Buffered,
        }
    }

    /// epp answers this mode chunk by chunk and may hold the headers answer back.
    pub(crate) fn duplex(self) -> bool {
        self == Self::FullDuplexStreamed
    }

    /// Envoy will send this direction's body.
    pub(crate) fn sends_body(self) -> bool {
        self != Self::None
    }
}

/// Both directions' body modes. Before Envoy says (older builds send no `protocol_config`),
/// both are assumed duplex: ending a stream early would stall a response that does come.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Modes {
    pub(super) request: BodyMode,
    pub(super) response: BodyMode,
}

impl Default for Modes {
    fn default() -> Self {
        Self {
            request: BodyMode::FullDuplexStreamed,
            response: BodyMode::FullDuplexStreamed,
        }
    }
}

impl From<&ProtocolConfiguration> for Modes {
    fn from(pc: &ProtocolConfiguration) -> Self {
        Self {
            request: BodyMode::from_wire(pc.request_body_mode),
            response: BodyMode::from_wire(pc.response_body_mode),
        }
    }
}

//! The label sets of epp's metric families: typed structs, and enums for every closed set
//! (outcomes, error codes, resources, kinds) encoded as upstream's names.

use super::ModelLabel;
use prometheus_client::encoding::EncodeLabelSet;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    pub model_name: ModelLabel,
    pub target_model_name: ModelLabel,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub model_name: ModelLabel,
    pub target_model_name: ModelLabel,
    pub priority: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub model_name: ModelLabel,
    pub target_model_name: ModelLabel,
    pub error_code: ErrorCode,
}

/// Upstream's error codes (`pkg/common/error/error.go`), the `error_code` label value.
#[derive(
    Clone, Copy, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelValue,
)]
pub enum ErrorCode {
    BadRequest,
    PreconditionFailed,
    RequestTimeout,
    PayloadTooLarge,
    RequestHeaderFieldsTooLarge,
    ResourceExhausted,
    Internal,
    ServiceUnavailable,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RunningLabels {
    pub model_name: ModelLabel,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodLabels {
    pub name: String,
    pub model_server_pod: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AttemptLabels {
    pub status: Outcome,
    pub target_model_name: ModelLabel,
    pub pod_name: String,
    pub namespace: String,
    pub port: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    pub endpoint: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InfoLabels {
    pub commit: String,
    pub build_ref: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CrdRuleLabels {
    pub kind: CrdKind,
    /// The rule's id ([`crate::discovery::k8s::crd::validate::Rule`]): a closed set defined in code.
    pub rule: &'static str,
}

/// A CRD kind whose objects pass the admission gate (label value of `epp_crd_validation_failures`).
#[derive(
    Clone, Copy, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelValue,
)]
pub enum CrdKind {
    InferencePool,
    InferenceObjective,
    InferenceModel,
    InferenceModelRewrite,
}

/// A Kubernetes resource epp reads (label value of `epp_kubernetes_forbidden`).
#[derive(
    Clone, Copy, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelValue,
)]
#[allow(non_camel_case_types)]
pub enum KubeResource {
    pods,
    inferencepools,
    inferenceobjectives,
    inferencemodels,
    inferencemodelrewrites,
    leases,
    /// `/metrics` auth (`--metrics-endpoint-auth`).
    tokenreviews,
    subjectaccessreviews,
}

/// The verb the API server refused (label value of `epp_kubernetes_forbidden`).
#[derive(
    Clone, Copy, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelValue,
)]
#[allow(non_camel_case_types)]
pub enum KubeVerb {
    get,
    list,
    watch,
    create,
    update,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ForbiddenLabels {
    pub resource: KubeResource,
    pub verb: KubeVerb,
}

/// How `/metrics` authentication (`--metrics-endpoint-auth`) answered a request.
#[derive(
    Clone, Copy, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelValue,
)]
#[allow(non_camel_case_types)]
pub enum MetricsAuthOutcome {
    /// Authenticated and authorized (200).
    allowed,
    /// No bearer token, or TokenReview did not authenticate it (401).
    unauthenticated,
    /// Authenticated, but SubjectAccessReview denied `get` on the path (403).
    forbidden,
    /// TokenReview or SubjectAccessReview could not be asked (500).
    error,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MetricsAuthLabels {
    pub outcome: MetricsAuthOutcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KvEventLabels {
    pub kind: KvEventKind,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KvGapLabels {
    pub outcome: KvGapOutcome,
}

/// A flow-control queue's series (upstream's labels; model names as requested, see `flowcontrol`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FlowQueueLabels {
    pub fairness_id: ModelLabel,
    pub priority: String,
    pub inference_pool: String,
    pub model_name: ModelLabel,
    pub target_model_name: ModelLabel,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FlowDurationLabels {
    pub fairness_id: ModelLabel,
    pub priority: String,
    pub outcome: FlowOutcome,
    pub inference_pool: String,
    pub model_name: ModelLabel,
    pub target_model_name: ModelLabel,
}

/// A `program-aware-fairness` program: its fairness key (capped, and swept by the policy's
/// eviction).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProgramLabels {
    pub program_id: ModelLabel,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FlowPoolLabels {
    pub inference_pool: String,
}

/// How a request's time in flow control ended (upstream's `QueueOutcome` names).
#[derive(
    Clone, Copy, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelValue,
)]
pub enum FlowOutcome {
    Dispatched,
    RejectedCapacity,
    RejectedOther,
    EvictedTTL,
    EvictedContextCancelled,
    EvictedOther,
}

/// What a KV event did to the index (`ignored`: another medium than the GPU).
#[derive(
    Clone, Copy, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelValue,
)]
#[allow(non_camel_case_types)]
pub enum KvEventKind {
    stored,
    removed,
    cleared,
    ignored,
}

/// What became of a placement shared with other epp replicas ([`crate::replicas`]).
#[derive(
    Clone, Copy, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelValue,
)]
#[allow(non_camel_case_types)]
pub enum PeerOutcome {
    /// A placement handed to one peer's stream.
    sent,
    /// Not sent to one peer: it was not connected (reconnecting with backoff).
    send_failed,
    /// Not sent: a send queue was full, or the placement expired while queued.
    dropped,
    /// Received from another replica and recorded as a speculative entry.
    applied,
    /// A stream from this replica to itself (a peer name that includes it), refused.
    own,
    /// Received for an endpoint this replica does not know.
    unknown_endpoint,
    /// Received and malformed (or naming no replica): refused, never applied.
    rejected,
    /// A connection refused at the TLS handshake: no certificate of the sharing CA.
    unauthenticated,
    /// A connection to a peer failed (down, unreachable, or refusing our certificate).
    connect_failed,
    /// An established stream to a peer broke.
    disconnected,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerLabels {
    pub outcome: PeerOutcome,
}

/// How a KV-event sequence gap ended: filled through replay, or the endpoint's entries dropped.
#[derive(
    Clone, Copy, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelValue,
)]
#[allow(non_camel_case_types)]
pub enum KvGapOutcome {
    replayed,
    dropped,
}

/// Outcome of a background operation (scrape, config reload).
#[derive(
    Clone, Copy, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelValue,
)]
#[allow(non_camel_case_types)]
pub enum Outcome {
    success,
    failure,
}

//! The label sets of epp's metric families: typed structs, and enums for every closed set
//! (outcomes, error codes, resources, kinds) encoded as upstream's names.

use super::ModelLabel;
use prometheus_client::encoding::EncodeLabelSet;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ModelLabels {
    pub(crate) model_name: ModelLabel,
    pub(crate) target_model_name: ModelLabel,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    pub(crate) model_name: ModelLabel,
    pub(crate) target_model_name: ModelLabel,
    pub(crate) priority: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ErrorLabels {
    pub(crate) model_name: ModelLabel,
    pub(crate) target_model_name: ModelLabel,
    pub(crate) error_code: ErrorCode,
}

/// Upstream's error codes (`pkg/common/error/error.go`), the `error_code` label value.
#[derive(
    Clone, Copy, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelValue,
)]
pub(crate) enum ErrorCode {
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
pub(crate) struct RunningLabels {
    pub(crate) model_name: ModelLabel,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PoolLabels {
    pub(crate) name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PodLabels {
    pub(crate) name: String,
    pub(crate) model_server_pod: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct AttemptLabels {
    pub(crate) status: Outcome,
    pub(crate) target_model_name: ModelLabel,
    pub(crate) pod_name: String,
    pub(crate) namespace: String,
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
pub(crate) struct InfoLabels {
    pub(crate) commit: String,
    pub(crate) build_ref: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CrdRuleLabels {
    pub(crate) kind: CrdKind,
    /// The rule's id ([`crate::discovery::k8s::crd::validate::Rule`]): a closed set defined in code.
    pub(crate) rule: &'static str,
}

/// A CRD kind whose objects pass the admission gate (label value of `epp_crd_validation_failures`).
#[derive(
    Clone, Copy, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelValue,
)]
#[allow(
    clippy::enum_variant_names,
    reason = "the variants are the kinds' own names, exposed as label values"
)]
pub(crate) enum CrdKind {
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
pub(crate) enum KubeResource {
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
pub(crate) enum KubeVerb {
    get,
    list,
    watch,
    create,
    update,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ForbiddenLabels {
    pub(crate) resource: KubeResource,
    pub(crate) verb: KubeVerb,
}

/// How `/metrics` authentication (`--metrics-endpoint-auth`) answered a request.
#[derive(
    Clone, Copy, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelValue,
)]
#[allow(non_camel_case_types)]
pub(crate) enum MetricsAuthOutcome {
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
pub(crate) struct MetricsAuthLabels {
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
pub(crate) struct FlowQueueLabels {
    pub(crate) fairness_id: ModelLabel,
    pub(crate) priority: String,
    pub(crate) inference_pool: String,
    pub(crate) model_name: ModelLabel,
    pub(crate) target_model_name: ModelLabel,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct FlowDurationLabels {
    pub(crate) fairness_id: ModelLabel,
    pub(crate) priority: String,
    pub(crate) outcome: FlowOutcome,
    pub(crate) inference_pool: String,
    pub(crate) model_name: ModelLabel,
    pub(crate) target_model_name: ModelLabel,
}

/// A `program-aware-fairness` program: its fairness key (capped, and swept by the policy's
/// eviction).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ProgramLabels {
    pub(crate) program_id: ModelLabel,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct FlowPoolLabels {
    pub(crate) inference_pool: String,
}

/// How a request's time in flow control ended (upstream's `QueueOutcome` names).
#[derive(
    Clone, Copy, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelValue,
)]
pub(crate) enum FlowOutcome {
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

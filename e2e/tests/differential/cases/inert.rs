//! Types both EPPs load whose output nothing in llm-d v0.10 reads: their cases show the
//! configuration is accepted by both and changes no outcome (`Expect::Inert`), and the list of
//! the accepted upstream types that have no case, each with the reason.

use super::{case, completion, req, waiting, Case, Expect, Req};

/// Why the data sources change nothing.
const NO_READER: &str = "no llm-d v0.10 plugin reads what it collects (its attributes have no \
    consumer there); epp accepts it and collects the same through its own scrape";
/// Why `agent-identity` changes no pick.
const FAIRNESS_ONLY: &str = "the session id it reads becomes the request's fairness key, which \
    flow control's fairness policies and the request metrics' labels read, not a scheduler";

fn inert(kind: &'static str, config: &'static str, requests: Vec<Req>, why: &'static str) -> Case {
    Case {
        expect: Expect::Inert(why),
        ..case(kind, config, waiting(&[3, 0, 2]), requests)
    }
}

fn with_header(name: &'static str, value: &str) -> Req {
    Req {
        headers: vec![(name, value.to_owned())],
        ..req(completion("hello"))
    }
}

pub fn all() -> Vec<Case> {
    let plain = || vec![req(completion("hello"))];
    vec![
        inert(
            "models-data-source",
            super::SOURCE_MODELS,
            plain(),
            NO_READER,
        ),
        inert(
            "models-data-extractor",
            super::SOURCE_MODELS,
            plain(),
            NO_READER,
        ),
        inert("dcgm-data-source", super::SOURCE_DCGM, plain(), NO_READER),
        inert("dcgm-extractor", super::SOURCE_DCGM, plain(), NO_READER),
        inert(
            "agent-identity",
            super::AGENT_IDENTITY,
            vec![
                with_header("x-claude-code-session-id", "agent-a"),
                with_header("x-my-agent-session", "agent-b"),
            ],
            FAIRNESS_ONLY,
        ),
    ]
}

/// Not in llm-d-router v0.10 (a later release's, or GIE's): nothing to compare with.
const LATER: &str = "not in llm-d-router v0.10.0 (nothing to compare with)";

/// The upstream types epp accepts that have no case, and why.
pub fn uncovered() -> Vec<(&'static str, &'static str)> {
    let v011 = "llm-d-router v0.11's (not in v0.10.0: nothing to compare with); measured \
        against the estimated-TTFT scorer in the routing simulator instead (docs/routesim/learned.md)";
    vec![
        (
            "latency-scorer",
            "llm-d's scores the headroom of the latency predictor's predictions \
            (`predicted-latency-producer`, which needs upstream's Python training and prediction \
            servers; epp refuses that producer), epp's the observed TTFT/TPOT (peak-EWMA): no \
            like-for-like case without the predictor",
        ),
        (
            "precise-prefix-cache-scorer",
            "llm-d's tokenizes with the model's HuggingFace \
            tokenizer (downloaded, or a UDS tokenizer sidecar) to match the pods' KV events; \
            this machine has no network to fetch one, so llm-d's side cannot run here. epp's \
            is compared with the pods' own events in `e2e/tests/kvevents_compare.rs`",
        ),
        (
            "precise-prefix-cache-producer",
            "as `precise-prefix-cache-scorer`",
        ),
        (
            "k8s-notification-source",
            "a Kubernetes watch: the suite discovers pods from a file; \
            epp's watch is tested on a real API server (`e2e/tests/kube_*.rs`)",
        ),
        (
            "endpoint-notification-source",
            "as `k8s-notification-source`",
        ),
        ("latency-observer-producer-hub", v011),
        ("latency-observation-scorer-hub", v011),
        ("sojourn-time-observer-hub", v011),
        ("mrl-scorer-hub", v011),
        ("session-state-producer", LATER),
        ("sglanghttp-parser", LATER),
        (
            "eviction-sheddable-filter",
            "GIE v1.5's name, which llm-d-router v0.10 no longer \
            registers (it refuses it); epp accepts it as the new name's alias",
        ),
        (
            "active-request-filter",
            "llm-d-router v0.10 no longer registers it (renamed `utilization-filter`, which has a \
            case; llm-d refuses it); epp builds it as that filter with one `active-requests` \
            condition",
        ),
        (
            "eviction-priority-then-time-ordering",
            "as `eviction-sheddable-filter`",
        ),
    ]
}

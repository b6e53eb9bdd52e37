//! The table of cases: one per upstream plugin type both epp and llm-d-router v0.10's EPP
//! implement, each a small configuration using that type, the pods' states that make it decide
//! and the requests whose outcomes are compared.

mod burst;
mod hub;
mod inert;
mod parsers;
mod request_control;

pub use inert::uncovered;

use harness::envoy::Template;

use super::configs::*;
use crate::hub_support::Pool;

/// What one pod reports (forced over the simulator's own values; `None` keeps the simulated
/// one) and the labels its `file-discovery` entry carries.
#[derive(Clone, Debug, Default)]
pub struct PodState {
    pub waiting: Option<u64>,
    pub running: Option<u64>,
    pub kv: Option<f64>,
    pub running_loras: Option<Vec<String>>,
    pub labels: Vec<(&'static str, &'static str)>,
}

/// One request of a case.
#[derive(Clone, Debug)]
pub struct Req {
    pub path: &'static str,
    pub body: String,
    /// Header values may name pod `i`'s `ip:port` as `{pod<i>}`.
    pub headers: Vec<(&'static str, String)>,
    /// Sent this many times; the outcome is the set of pods that served. A `{n}` in the body
    /// is replaced by the repeat's index.
    pub repeat: usize,
    /// Each pod's waiting queue is forced to these values (and both pickers have scraped them)
    /// before this request is sent.
    pub set_waiting: Option<Vec<u64>>,
    /// Send the `x-session-token` the previous response returned.
    pub echo_session: bool,
    /// Compare the request's `envoy.lb` / `x-gateway-inference-request-cost` dynamic metadata,
    /// as Envoy's access log writes it (`cost=`): what `request-attribute-reporter` reports.
    pub cost: bool,
    /// Send the repeats all at once (a burst), not one after another.
    pub concurrent: bool,
}

/// What the case expects of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Both EPPs answer every request alike.
    Agree,
    /// They differ, on purpose: the reason (the migration table says so too).
    Differ(&'static str),
    /// Both load it and answer alike, and nothing in llm-d v0.10 reads what it produces: why
    /// (the case shows the configuration is accepted and changes no outcome).
    Inert(&'static str),
}

/// One plugin type's case.
#[derive(Clone, Debug)]
pub struct Case {
    /// The upstream plugin type under test.
    pub kind: &'static str,
    /// The configuration's `plugins:` and `schedulingProfiles:` (YAML, without discovery: the
    /// runner adds llm-d's `file-discovery` and metrics data layer, and both EPPs load the
    /// resulting file as it is).
    pub config: &'static str,
    pub pods: Vec<PodState>,
    pub requests: Vec<Req>,
    pub expect: Expect,
    /// A multi-cluster hub case: the pods stand for the clusters' gateways, and these for
    /// their spoke EPPs' metrics ([`crate::hub_support`]).
    pub hub: Option<Hub>,
    /// The Envoy in front of each EPP: `Duplex` (ORIGINAL_DST), or `DuplexOverrideHost` where
    /// a case needs Envoy to report the endpoint that served.
    pub envoy: Template,
}

/// The clusters of a hub case. The configuration names the clusters file `CLUSTERS` and the
/// spokes' CA file `SPOKES_CA`; the runner writes both and puts their paths there. A
/// request's `set_waiting` sets the spokes' queues.
#[derive(Clone, Debug)]
pub struct Hub {
    pub pools: Vec<Pool>,
    /// How the clusters file writes each cluster's address: `127.0.0.1`, or `localhost` (a
    /// host name).
    pub address: &'static str,
    /// Each cluster's `metricsAddress` label (`127.0.0.1` or `localhost`).
    pub metrics_address: &'static str,
}

/// An OpenAI completion for `prompt`, at most one token.
pub fn completion(prompt: &str) -> String {
    serde_json::json!({"model": harness_model(), "prompt": prompt, "max_tokens": 1}).to_string()
}

/// The same, for `model` (a LoRA adapter the pods serve).
pub fn completion_for(model: &str, prompt: &str) -> String {
    serde_json::json!({"model": model, "prompt": prompt, "max_tokens": 1}).to_string()
}

fn harness_model() -> &'static str {
    harness::sim_pod::TEST_MODEL
}

/// A prompt of about `words` words, distinct per `seed`.
pub fn prompt(seed: u32, words: u32) -> String {
    (0..words)
        .map(|i| format!("s{seed}w{}", i % 89))
        .collect::<Vec<_>>()
        .join(" ")
}

pub(super) fn req(body: String) -> Req {
    Req {
        path: "/v1/completions",
        body,
        headers: Vec::new(),
        repeat: 1,
        set_waiting: None,
        echo_session: false,
        cost: false,
        concurrent: false,
    }
}

pub(super) fn times(n: usize, r: Req) -> Req {
    Req { repeat: n, ..r }
}

pub(super) fn waiting(values: &[u64]) -> Vec<PodState> {
    values
        .iter()
        .map(|w| PodState {
            waiting: Some(*w),
            ..PodState::default()
        })
        .collect()
}

fn labelled(labels: &[&[(&'static str, &'static str)]]) -> Vec<PodState> {
    labels
        .iter()
        .map(|l| PodState {
            waiting: Some(0),
            labels: l.to_vec(),
            ..PodState::default()
        })
        .collect()
}

pub(super) fn case(
    kind: &'static str,
    config: &'static str,
    pods: Vec<PodState>,
    requests: Vec<Req>,
) -> Case {
    Case {
        kind,
        config,
        pods,
        requests,
        expect: Expect::Agree,
        hub: None,
        envoy: Template::Duplex,
    }
}

/// Every case, filters first, then scorers, pickers, profile handlers, deciders and parsers.
pub fn all() -> Vec<Case> {
    let mut v = filters();
    v.extend(scorers());
    v.extend(pickers());
    v.extend(handlers());
    v.extend(parsers::parsers());
    v.extend(parsers::other_parsers());
    v.extend(hub::hubs());
    v.extend(hub::topology());
    v.extend(once_refused());
    v.push(rollout_screener());
    v.extend(endpoint_attributes());
    v.extend(flow());
    v.extend(request_control::all());
    v.extend(inert::all());
    v.push(burst::burst_prefix());
    v
}

pub(super) const ROLE: &str = "llm-d.ai/role";

/// Why `header-based-testing-filter` differs.
const HEADER_TESTING: &str = "llm-d de-duplicates the header's entries by IP, so of several \
    listed endpoints on one IP (data-parallel ranks; the loopback pods here) it keeps only the \
    first, where epp keeps each listed `ip:port`; with one IP per pod both keep the same. And \
    epp's 429 for a request no endpoint is left for carries \
    `x-llm-d-request-dropped-reason: rejected-saturated`, as its flow-control refusals do \
    (`src/extproc/status.rs`); llm-d sets no reason on this path";

/// Why `pd-profile-handler` alone differs.
const PD_HEADER: &str = "epp's P/D handlers set `x-prefiller-host-port` themselves; llm-d's \
    deprecated `pd-profile-handler` sets it only with `disagg-headers-handler` (or its alias \
    `prefill-header-handler`) in the configuration, as its configurations have (the next rows: \
    same outcomes). A configuration without one gets no P/D split from llm-d";

/// A filter followed by `random-picker`: the set of pods 20 requests reach is what it kept.
fn kept_set(kind: &'static str, config: &'static str, pods: Vec<PodState>) -> Case {
    case(
        kind,
        config,
        pods,
        vec![times(20, req(completion("hello")))],
    )
}

fn roles() -> Vec<PodState> {
    labelled(&[&[(ROLE, "decode")], &[(ROLE, "prefill")], &[]])
}

fn encode_roles() -> Vec<PodState> {
    labelled(&[&[(ROLE, "encode")], &[(ROLE, "decode")], &[]])
}

fn tiers() -> Vec<PodState> {
    labelled(&[&[("tier", "gold")], &[("tier", "silver")], &[]])
}

fn filters() -> Vec<Case> {
    let mut kv = waiting(&[0, 0, 0]);
    for (p, u) in kv.iter_mut().zip([0.9, 0.3, 0.2]) {
        p.kv = Some(u);
    }
    let mut length = labelled(&[
        &[("llm-d.ai/context-length-range", "0-50")],
        &[("llm-d.ai/context-length-range", "51-100000")],
        &[],
    ]);
    length[2].labels.clear();
    let selected = |h: &str| Req {
        headers: vec![("test-epp-endpoint-selection", h.to_owned())],
        ..req(completion("hello"))
    };
    vec![
        kept_set("decode-filter", FILTER_DECODE, roles()),
        kept_set("prefill-filter", FILTER_PREFILL, roles()),
        kept_set("encode-filter", FILTER_ENCODE, encode_roles()),
        kept_set("by-label", FILTER_BY_LABEL, tiers()),
        kept_set("by-label-selector", FILTER_BY_LABEL_SELECTOR, tiers()),
        kept_set("label-selector-filter", FILTER_SELECTOR, tiers()),
        kept_set("utilization-filter", FILTER_UTILIZATION, kv),
        case(
            "session-affinity-filter",
            FILTER_SESSION,
            waiting(&[3, 0, 3]),
            session_turns(),
        ),
        case(
            "prefix-cache-affinity-filter",
            FILTER_PREFIX_AFFINITY,
            waiting(&[2, 0, 4]),
            prefix_turns(),
        ),
        case(
            "context-length-aware",
            FILTER_CONTEXT_LENGTH,
            length,
            vec![times(20, req(completion(&prompt(1, 400))))],
        ),
        kept_set("file-discovery", DISCOVERY_FILE, waiting(&[0, 0, 0])),
        Case {
            expect: Expect::Differ(HEADER_TESTING),
            ..case(
                "header-based-testing-filter",
                FILTER_HEADER,
                waiting(&[0, 0, 0]),
                vec![
                    times(4, selected("{pod2}")),
                    times(20, selected("{pod0},{pod1}")),
                    req(completion("no header")),
                ],
            )
        },
    ]
}

/// A scorer (with `max-score-picker`) where the pods' states make one pod best.
fn best(kind: &'static str, config: &'static str, pods: Vec<PodState>) -> Case {
    case(kind, config, pods, vec![times(3, req(completion("hello")))])
}

/// A long prompt lands by queue on pod 1; pod 1's queue then grows, and the repeat stays
/// there only by its cached prefix; a new prompt goes by queue (pod 0).
fn prefix_turns() -> Vec<Req> {
    repeat_after_load(7, vec![0, 3, 4])
}

/// A long prompt (`seed`), the same prompt once the queues read `waiting`, then another.
pub(super) fn repeat_after_load(seed: u32, waiting: Vec<u64>) -> Vec<Req> {
    let long = prompt(seed, 300);
    vec![
        req(completion(&long)),
        Req {
            set_waiting: Some(waiting),
            ..req(completion(&long))
        },
        req(completion(&prompt(seed + 1, 300))),
    ]
}

/// A first turn lands by queue on pod 1; pod 1's queue then grows, and the second turn (its
/// `x-session-token` echoed) stays there only by its session; a request without goes to pod 0.
fn session_turns() -> Vec<Req> {
    vec![
        req(completion("first turn")),
        Req {
            set_waiting: Some(vec![0, 3, 3]),
            echo_session: true,
            ..req(completion("second turn"))
        },
        req(completion("no session")),
    ]
}

fn scorers() -> Vec<Case> {
    let mut kv = waiting(&[0, 0, 0]);
    for (p, u) in kv.iter_mut().zip([0.9, 0.2, 0.6]) {
        p.kv = Some(u);
    }
    let mut running = waiting(&[0, 0, 0]);
    for (p, r) in running.iter_mut().zip([8, 1, 4]) {
        p.running = Some(r);
    }
    let mut lora = waiting(&[0, 0, 0]);
    for (i, p) in lora.iter_mut().enumerate() {
        p.running_loras = Some(if i == 1 {
            vec!["lora-a".into()]
        } else {
            vec![]
        });
    }
    let (prefix, session) = (prefix_turns(), session_turns());
    vec![
        best("queue-scorer", SCORER_QUEUE, waiting(&[6, 0, 3])),
        best("kv-cache-utilization-scorer", SCORER_KV, kv),
        best("running-requests-size-scorer", SCORER_RUNNING, running),
        best("load-aware-scorer", SCORER_LOAD_AWARE, waiting(&[8, 12, 3])),
        case(
            "lora-affinity-scorer",
            SCORER_LORA,
            lora,
            vec![times(3, req(completion_for("lora-a", "hello")))],
        ),
        case(
            "prefix-cache-scorer",
            SCORER_PREFIX,
            waiting(&[2, 0, 4]),
            prefix.clone(),
        ),
        case(
            "approx-prefix-cache-producer",
            PRODUCER_APPROX_PREFIX,
            waiting(&[2, 0, 4]),
            prefix.clone(),
        ),
        case(
            "token-producer",
            TOKEN_PRODUCER,
            waiting(&[2, 0, 4]),
            prefix.clone(),
        ),
        case("tokenizer", TOKENIZER, waiting(&[2, 0, 4]), prefix),
        case(
            "session-affinity-scorer",
            SCORER_SESSION,
            waiting(&[3, 0, 3]),
            session,
        ),
    ]
}

fn pickers() -> Vec<Case> {
    let mut mixed = waiting(&[0, 0, 5]);
    for (p, u) in mixed.iter_mut().zip([0.8, 0.1, 0.1]) {
        p.kv = Some(u);
    }
    vec![
        best("max-score-picker", PICKER_MAX_SCORE, mixed),
        case(
            "random-picker",
            PICKER_RANDOM,
            waiting(&[0, 5]),
            vec![times(20, req(completion("hello")))],
        ),
        case(
            "weighted-random-picker",
            PICKER_WEIGHTED_RANDOM,
            waiting(&[0, 5, 10]),
            vec![times(30, req(completion("hello")))],
        ),
    ]
}

fn handlers() -> Vec<Case> {
    // Decode pods 0 (longer queue) and 1, prefill pods 2 and 3 (longer queue).
    let pd = || {
        let mut p = labelled(&[
            &[(ROLE, "decode")],
            &[(ROLE, "decode")],
            &[(ROLE, "prefill")],
            &[(ROLE, "prefill")],
        ]);
        for (s, w) in p.iter_mut().zip([3, 0, 0, 2]) {
            s.waiting = Some(w);
        }
        p
    };
    let long = prompt(11, 400);
    let twice = vec![req(completion(&long)), req(completion(&long))];
    vec![
        best(
            "single-profile-handler",
            HANDLER_SINGLE,
            waiting(&[4, 1, 2]),
        ),
        case(
            "disagg-profile-handler",
            HANDLER_DISAGG,
            pd(),
            twice.clone(),
        ),
        Case {
            expect: Expect::Differ(PD_HEADER),
            ..case("pd-profile-handler", HANDLER_PD, pd(), twice.clone())
        },
        case(
            "disagg-headers-handler",
            HEADERS_DISAGG,
            pd(),
            twice.clone(),
        ),
        case(
            "prefill-header-handler",
            HEADERS_PREFILL,
            pd(),
            twice.clone(),
        ),
        case(
            "prefix-based-pd-decider",
            DECIDER_PREFIX,
            pd(),
            twice.clone(),
        ),
        case("always-disagg-pd-decider", HANDLER_DISAGG, pd(), twice),
    ]
}

fn with_header(name: &'static str, value: &str, r: Req) -> Req {
    Req {
        headers: vec![(name, value.to_owned())],
        ..r
    }
}

/// The types epp refused before issue 33 (item 3) and implements now.
fn once_refused() -> Vec<Case> {
    // Pod 0 has the shortest queue; pod 1 is in zone b, pod 0 in zone a, pod 2 in none.
    let mut zones = labelled(&[&[("zone", "a")], &[("zone", "b")], &[]]);
    for (p, w) in zones.iter_mut().zip([0, 5, 3]) {
        p.waiting = Some(w);
    }
    let hello = || req(completion("hello"));
    // Pod 0 decodes (longer queue), pod 1 prefills, pod 2 has no role (decodes).
    let mut stages = labelled(&[&[(ROLE, "decode")], &[(ROLE, "prefill")], &[]]);
    for (p, w) in stages.iter_mut().zip([3, 1, 0]) {
        p.waiting = Some(w);
    }
    vec![
        case(
            "header-label-affinity-scorer",
            SCORER_HEADER_LABEL,
            zones,
            vec![
                times(3, with_header("x-preferred-zone", "b", hello())),
                with_header("x-preferred-zone", "c", hello()),
                with_header("x-preferred-zone", "", hello()),
                hello(),
            ],
        ),
        case(
            "header-profile-handler",
            HANDLER_HEADER,
            stages,
            vec![
                times(2, with_header("x-stage", "prefill", hello())),
                hello(),
                with_header("x-stage", " decode ", hello()),
                with_header("x-stage", "encode", hello()),
            ],
        ),
        case(
            "priority-holdback-policy",
            LIMIT_HOLDBACK,
            idle_kv(&[5, 4, 6]),
            vec![hello(), relieved(hello())],
        ),
        case(
            "soft-reflective-ceiling-policy",
            LIMIT_SOFT_REFLECTIVE,
            idle_kv(&[12, 10, 14]),
            vec![hello(), relieved(hello())],
        ),
        best(
            "data-parallel-profile-handler",
            HANDLER_DATA_PARALLEL,
            waiting(&[4, 1, 2]),
        ),
        best(
            "sheddable-eviction-filter",
            EVICTION_POLICIES,
            waiting(&[4, 1, 2]),
        ),
        best(
            "priority-then-time-eviction-order-policy",
            EVICTION_POLICIES,
            waiting(&[4, 1, 2]),
        ),
    ]
}

/// The `endpoint-attribute-*` plugins over a `customMetrics` attribute (each pod's running
/// requests: 4, 1, 2): the filter keeps pods 1 and 2, the scorer prefers pod 1.
fn endpoint_attributes() -> Vec<Case> {
    let running = || {
        [4, 1, 2]
            .iter()
            .map(|r| PodState {
                waiting: Some(0),
                running: Some(*r),
                ..PodState::default()
            })
            .collect::<Vec<_>>()
    };
    vec![
        kept_set(
            "endpoint-attribute-filter",
            FILTER_ENDPOINT_ATTRIBUTE,
            running(),
        ),
        best(
            "endpoint-attribute-scorer",
            SCORER_ENDPOINT_ATTRIBUTE,
            running(),
        ),
    ]
}

/// `disaggregatedset-rollout-screener` with revision gating off: llm-d's EPP counts the pods of a
/// revision from a Kubernetes Pod watch, which its file-discovery mode does not run, so with
/// gating on it refuses every request. Off, the strict selector screens by the request's
/// header (none left: 503) and both selectors stamp the serving pod's labels on the response.
/// Pod 0 (revision A, slice s1) has the shortest queue, then pod 2 (B, no slice), then pod 1
/// (B, s2).
fn rollout_screener() -> Case {
    let mut pods = labelled(&[
        &[("app", "x"), ("rev", "A"), ("slice", "s1")],
        &[("app", "x"), ("rev", "B"), ("slice", "s2")],
        &[("app", "x"), ("rev", "B")],
    ]);
    for (p, w) in pods.iter_mut().zip([0, 5, 3]) {
        p.waiting = Some(w);
    }
    let hello = || req(completion("hello"));
    case(
        "disaggregatedset-rollout-screener",
        ROLLOUT_SCREENER,
        pods,
        vec![
            times(3, hello()),
            with_header("x-llm-d-revision", "B", hello()),
            with_header("x-llm-d-revision", "C", hello()),
            with_header("x-llm-d-revision", "", hello()),
        ],
    )
}

/// Pods with these queues and an empty KV cache (the utilization detector reads both).
fn idle_kv(values: &[u64]) -> Vec<PodState> {
    let mut pods = waiting(values);
    for p in &mut pods {
        p.kv = Some(0.0);
    }
    pods
}

/// `r` sent once the queues are down to 2, 1, 3 (saturation 0.2 at threshold 10).
fn relieved(r: Req) -> Req {
    Req {
        set_waiting: Some(vec![2, 1, 3]),
        ..r
    }
}

/// Flow control's parts and the load scorers: each case saturates the pool (utilization
/// detector, queue threshold 10) so the first request waits out its TTL, then relieves it.
fn flow() -> Vec<Case> {
    let hello = || req(completion("hello"));
    let saturated_then_relieved = || vec![hello(), relieved(hello())];
    vec![
        case(
            "static-usage-limit-policy",
            LIMIT_STATIC,
            idle_kv(&[5, 4, 6]),
            vec![hello()],
        ),
        case(
            "utilization-detector",
            DETECTOR_UTILIZATION,
            idle_kv(&[12, 10, 14]),
            saturated_then_relieved(),
        ),
        case(
            "concurrency-detector",
            DETECTOR_CONCURRENCY,
            idle_kv(&[12, 10, 14]),
            vec![times(3, hello())],
        ),
        case(
            "global-strict-fairness-policy",
            FLOW_STRICT_FCFS,
            idle_kv(&[12, 10, 14]),
            saturated_then_relieved(),
        ),
        case(
            "fcfs-ordering-policy",
            FLOW_STRICT_FCFS,
            idle_kv(&[12, 10, 14]),
            saturated_then_relieved(),
        ),
        case(
            "round-robin-fairness-policy",
            FLOW_ROUND_ROBIN_EDF,
            idle_kv(&[12, 10, 14]),
            saturated_then_relieved(),
        ),
        case(
            "edf-ordering-policy",
            FLOW_ROUND_ROBIN_EDF,
            idle_kv(&[12, 10, 14]),
            saturated_then_relieved(),
        ),
        case(
            "slo-deadline-ordering-policy",
            FLOW_STRICT_SLO_DEADLINE,
            idle_kv(&[12, 10, 14]),
            saturated_then_relieved(),
        ),
        case(
            "program-aware-fairness",
            FLOW_PROGRAM_AWARE,
            idle_kv(&[12, 10, 14]),
            saturated_then_relieved(),
        ),
        // The data layer every case runs on (the runner declares both), and the producer the
        // token-load scorer reads.
        best("metrics-data-source", SCORER_QUEUE, waiting(&[4, 1, 2])),
        best("core-metrics-extractor", SCORER_QUEUE, waiting(&[4, 1, 2])),
        best(
            "inflight-load-producer",
            SCORER_TOKEN_LOAD,
            waiting(&[4, 1, 2]),
        ),
        case(
            "session-id-producer",
            PRODUCER_SESSION_ID,
            waiting(&[4, 1, 2]),
            vec![with_header("x-session-id", "s-1", hello())],
        ),
        best(
            "active-request-scorer",
            SCORER_ACTIVE_REQUEST,
            waiting(&[4, 1, 2]),
        ),
        best("token-load-scorer", SCORER_TOKEN_LOAD, waiting(&[4, 1, 2])),
    ]
}

//! The table of cases: one per upstream plugin type both epp and llm-d-router v0.10's EPP
//! implement, each a small configuration using that type, the pods' states that make it decide
//! and the requests whose outcomes are compared.

use super::configs::*;

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
    /// Sent this many times; the outcome is the set of pods that served.
    pub repeat: usize,
    /// Each pod's waiting queue is forced to these values (and both pickers have scraped them)
    /// before this request is sent.
    pub set_waiting: Option<Vec<u64>>,
    /// Send the `x-session-token` the previous response returned.
    pub echo_session: bool,
}

/// What the case expects of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Both EPPs answer every request alike.
    Agree,
    /// They differ, on purpose: the reason (the migration table says so too).
    Differ(&'static str),
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

fn req(body: String) -> Req {
    Req {
        path: "/v1/completions",
        body,
        headers: Vec::new(),
        repeat: 1,
        set_waiting: None,
        echo_session: false,
    }
}

fn times(n: usize, r: Req) -> Req {
    Req { repeat: n, ..r }
}

fn waiting(values: &[u64]) -> Vec<PodState> {
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

fn case(kind: &'static str, config: &'static str, pods: Vec<PodState>, requests: Vec<Req>) -> Case {
    Case {
        kind,
        config,
        pods,
        requests,
        expect: Expect::Agree,
    }
}

/// Every case, filters first, then scorers, pickers, profile handlers, deciders and parsers.
pub fn all() -> Vec<Case> {
    let mut v = filters();
    v.extend(scorers());
    v.extend(pickers());
    v.extend(handlers());
    v.extend(parsers());
    v.extend(other_parsers());
    v
}

const ROLE: &str = "llm-d.ai/role";

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
    let long = prompt(7, 300);
    vec![
        req(completion(&long)),
        Req {
            set_waiting: Some(vec![0, 3, 4]),
            ..req(completion(&long))
        },
        req(completion(&prompt(8, 300))),
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
            prefix,
        ),
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

fn parsers() -> Vec<Case> {
    let bad = |body: &str| req(body.to_owned());
    let chat = Req {
        path: "/v1/chat/completions",
        ..req(
            serde_json::json!({"model": harness_model(), "max_tokens": 1,
                "messages": [{"role": "user", "content": "hi"}]})
            .to_string(),
        )
    };
    vec![case(
        "openai-parser",
        PARSER_OPENAI,
        waiting(&[4, 1, 2]),
        vec![
            req(completion("hello")),
            chat,
            bad("{not json"),
            bad(r#"{"prompt":"no model"}"#),
        ],
    )]
}

/// The parsers of other APIs, and the one that parses nothing.
fn other_parsers() -> Vec<Case> {
    let bad = |body: &str| req(body.to_owned());
    vec![
        case(
            "anthropic-parser",
            PARSER_ANTHROPIC,
            waiting(&[4, 1, 2]),
            vec![
                Req {
                    path: "/v1/messages",
                    ..req(
                        serde_json::json!({"model": harness_model(), "max_tokens": 1,
                        "messages": [{"role": "user", "content": "hi"}]})
                        .to_string(),
                    )
                },
                Req {
                    path: "/v1/messages",
                    ..bad(r#"{"max_tokens":1,"messages":[]}"#)
                },
            ],
        ),
        case(
            "vllmhttp-parser",
            PARSER_VLLMHTTP,
            waiting(&[4, 1, 2]),
            vec![Req {
                path: "/inference/v1/generate",
                ..req(
                    serde_json::json!({"model": harness_model(), "token_ids": [1, 2, 3],
                    "sampling_params": {"max_tokens": 1}})
                    .to_string(),
                )
            }],
        ),
        case(
            "passthrough-parser",
            PARSER_PASSTHROUGH,
            waiting(&[4, 1, 2]),
            vec![req(completion("hello")), bad("{not json")],
        ),
    ]
}

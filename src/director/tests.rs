use super::*;
use crate::config;
use crate::datastore::Datastore;
use crate::endpoint::EndpointId;
use crate::request::{self, ApiKind, LlmRequest};
use crate::scheduling::{ScheduleError, SchedulingRequest};
use rand::{rngs::SmallRng, SeedableRng};
use std::collections::HashSet;

fn director(ports: &[u16]) -> (Arc<Director>, Arc<Datastore>) {
    let graph = crate::fixtures::graph(config::UPSTREAM_DEFAULT_CONFIG)
        .ports(ports)
        .build();
    (graph.director, graph.datastore)
}

/// The adapter's part: `bytes` parsed once by `request`, as the `path`'s API. Leaked so the
/// parsed request lives as long as the test's `Incoming` values.
fn parsed_with<'a>(path: &str, bytes: &'a [u8], cap: usize) -> Body<'a> {
    let request = request::parse(ApiKind::from_path(path), bytes, cap)
        .unwrap_or_else(|e| panic!("test body does not parse: {e}"));
    let request: &'a LlmRequest = Box::leak(Box::new(request));
    Body::Parsed { request, bytes }
}

/// Parses and routes, as the ext_proc adapter does with a whole body.
fn route_body(
    d: &Director,
    path: &str,
    bytes: &[u8],
    rng: &mut SmallRng,
) -> Result<Routed, DirectorError> {
    let request = request::parse(ApiKind::from_path(path), bytes, d.prompt_cap())?;
    let inc = Incoming {
        body: Body::Parsed {
            request: &request,
            bytes,
        },
        ..Default::default()
    };
    d.route(&inc, rng)
}

fn set_metrics(ds: &Datastore, port: u16, waiting: f64, age: Duration) {
    let id: EndpointId = format!("127.0.0.1:{port}").parse().unwrap();
    let m = crate::fixtures::metrics()
        .waiting(waiting)
        .kv_usage(0.1)
        .age(age)
        .build();
    ds.snapshot().get(&id).unwrap().store_metrics(m);
}

fn chat(content: &str) -> Vec<u8> {
    serde_json::json!({"model": "m", "messages": [{"role": "user", "content": content}]})
        .to_string()
        .into_bytes()
}

/// A chat request with `body`, parsed keeping its whole prompt (every test prompt is below
/// the prompt cap of the configurations here).
fn incoming(body: &[u8]) -> Incoming<'_> {
    Incoming {
        body: parsed_with("/v1/chat/completions", body, 1 << 20),
        ..Default::default()
    }
}

#[test]
fn a_deep_queue_gets_no_new_traffic() {
    let (d, ds) = director(&[1, 2]);
    set_metrics(&ds, 1, 40.0, Duration::ZERO);
    set_metrics(&ds, 2, 0.0, Duration::ZERO);
    let mut rng = SmallRng::seed_from_u64(1);
    for i in 0..5 {
        let body = chat(&format!("question {i}"));
        let routed = d.route(&incoming(&body), &mut rng).unwrap();
        assert_eq!(routed.destinations[0].0.port(), 2);
    }
}

#[test]
fn a_burst_between_scrapes_spreads_instead_of_herding() {
    let (d, ds) = director(&[1, 2, 3, 4]);
    for p in 1..=4 {
        set_metrics(&ds, p, 0.0, Duration::ZERO);
    }
    let mut rng = SmallRng::seed_from_u64(2);
    let leases: Vec<Routed> = (0..4)
        .map(|i| {
            d.route(&incoming(&chat(&format!("distinct {i}"))), &mut rng)
                .unwrap()
        })
        .collect();
    let ports: HashSet<u16> = leases.iter().map(|r| r.destinations[0].0.port()).collect();
    assert_eq!(
        ports.len(),
        4,
        "each request of the burst saw the previous ones"
    );
}

#[test]
fn repeated_long_prompts_stick_to_one_pod() {
    let (d, ds) = director(&[1, 2, 3]);
    for p in 1..=3 {
        set_metrics(&ds, p, 0.0, Duration::ZERO);
    }
    let long = "You are a careful assistant. ".repeat(200);
    let mut rng = SmallRng::seed_from_u64(3);
    let first = d
        .route(&incoming(&chat(&long)), &mut rng)
        .unwrap()
        .destinations[0];
    for _ in 0..10 {
        let routed = d.route(&incoming(&chat(&long)), &mut rng).unwrap();
        assert_eq!(routed.destinations[0], first);
    }
    assert!(d.indexes.approximate.size() > 0);
}

#[test]
fn stale_pods_are_avoided() {
    let (d, ds) = director(&[1, 2]);
    set_metrics(&ds, 1, 0.0, Duration::from_secs(10));
    set_metrics(&ds, 2, 30.0, Duration::ZERO);
    let mut rng = SmallRng::seed_from_u64(4);
    for i in 0..5 {
        assert_eq!(
            d.route(&incoming(&chat(&i.to_string())), &mut rng)
                .unwrap()
                .destinations[0]
                .0
                .port(),
            2
        );
    }
}

#[test]
fn subset_hints_restrict_or_reject() {
    let (d, _ds) = director(&[1, 2, 3]);
    let mut rng = SmallRng::seed_from_u64(5);
    let body = chat("hi");
    let only3 = vec!["127.0.0.1:3".to_string()];
    for _ in 0..5 {
        let inc = Incoming {
            subset: Some(&only3),
            ..incoming(&body)
        };
        assert_eq!(d.route(&inc, &mut rng).unwrap().destinations[0].0.port(), 3);
    }
    let empty: Vec<String> = Vec::new();
    let err = d
        .route(
            &Incoming {
                subset: Some(&empty),
                ..incoming(&body)
            },
            &mut rng,
        )
        .unwrap_err();
    assert!(matches!(err, DirectorError::NoCandidates(_)));
    let other = vec!["10.9.9.9".to_string()];
    assert!(d
        .route(
            &Incoming {
                subset: Some(&other),
                ..incoming(&body)
            },
            &mut rng
        )
        .is_err());
}

#[test]
fn rewrite_changes_only_the_model_value() {
    let (d, _ds) = director(&[1]);
    let body = br#"{ "model" : "m",  "messages":[{"role":"user","content":"x"}], "b": 1.50 }"#;
    let inc = Incoming {
        model_rewrite: Some("m-v2"),
        ..incoming(body)
    };
    let routed = d.route(&inc, &mut SmallRng::seed_from_u64(6)).unwrap();
    assert_eq!(
        routed.body.clone().unwrap(),
        br#"{ "model" : "m-v2",  "messages":[{"role":"user","content":"x"}], "b": 1.50 }"#.to_vec()
    );
    assert_eq!(
        (routed.model.as_str(), routed.target_model()),
        ("m", "m-v2")
    );
    let same = d
        .route(&incoming(body), &mut SmallRng::seed_from_u64(6))
        .unwrap();
    assert!(
        same.body.is_none(),
        "nothing changed, the original bytes are forwarded"
    );
}

#[test]
fn leases_count_inflight_until_dropped() {
    let (d, ds) = director(&[1]);
    let routed = d
        .route(&incoming(&chat("x")), &mut SmallRng::seed_from_u64(7))
        .unwrap();
    let state = Arc::clone(ds.snapshot().get(&routed.destinations[0]).unwrap());
    assert_eq!(state.inflight(), 1);
    drop(routed);
    assert_eq!(state.inflight(), 0);
}

#[test]
fn no_endpoints_is_no_candidates_and_bad_body_is_bad_request() {
    let (d, _ds) = director(&[]);
    let mut rng = SmallRng::seed_from_u64(8);
    assert!(matches!(
        d.route(&incoming(&chat("x")), &mut rng),
        Err(DirectorError::NoCandidates(_))
    ));
    assert!(matches!(
        route_body(&d, "/v1/chat/completions", b"{", &mut rng),
        Err(DirectorError::BadRequest(_))
    ));
    assert!(matches!(
        d.route(&Incoming::default(), &mut rng),
        Err(DirectorError::NoCandidates(_))
    ));
}

#[test]
fn sheddable_requests_are_shed_only_when_the_pool_is_saturated() {
    let (d, ds) = director(&[1]);
    let mut o = crate::datastore::objectives::Objectives::default();
    o.objectives.insert("batch".into(), -1);
    o.objectives.insert("critical".into(), 10);
    ds.set_objectives(o);
    let body = chat("x");
    let mut rng = SmallRng::seed_from_u64(9);
    set_metrics(&ds, 1, 1.0, Duration::ZERO);
    assert!(d
        .route(
            &Incoming {
                objective: Some("batch"),
                ..incoming(&body)
            },
            &mut rng
        )
        .is_ok());
    set_metrics(&ds, 1, 50.0, Duration::ZERO);
    let err = d
        .route(
            &Incoming {
                objective: Some("batch"),
                ..incoming(&body)
            },
            &mut rng,
        )
        .unwrap_err();
    assert!(matches!(err, DirectorError::Shed(_)), "{err}");
    assert!(d
        .route(
            &Incoming {
                objective: Some("critical"),
                ..incoming(&body)
            },
            &mut rng
        )
        .is_ok());
    assert!(
        d.route(&incoming(&body), &mut rng).is_ok(),
        "no objective is priority 0, never shed"
    );
}

#[test]
fn inference_model_targets_rewrite_the_body() {
    let (d, ds) = director(&[1]);
    let mut o = crate::datastore::objectives::Objectives::default();
    let targets = crate::datastore::objectives::WeightedTargets::new(vec![("m-canary".into(), 1)]);
    o.models.insert(
        "m".into(),
        crate::datastore::objectives::ModelPolicy {
            priority: 0,
            targets,
        },
    );
    ds.set_objectives(o);
    let routed = d
        .route(&incoming(&chat("x")), &mut SmallRng::seed_from_u64(10))
        .unwrap();
    assert_eq!(routed.target_model(), "m-canary");
    assert!(String::from_utf8(routed.body.unwrap())
        .unwrap()
        .contains(r#""model":"m-canary""#));
}

fn director_with(ports: &[u16], config_text: &str) -> (Arc<Director>, Arc<Datastore>) {
    let (d, ds) = director(ports);
    // Test configurations may use alpha plugins (session-affinity-scorer).
    let load = config::LoadOptions {
        allow_experimental: true,
    };
    d.config
        .store(Runtime::build_with(config_text, None, load).unwrap());
    for p in ports {
        set_metrics(&ds, *p, 0.0, Duration::ZERO);
    }
    (d, ds)
}

#[test]
fn a_session_token_routes_back_to_the_pod_it_names() {
    let text = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: session-affinity-scorer\n- type: random-picker\n- type: max-score-picker\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: session-affinity-scorer\n  - pluginRef: max-score-picker\n";
    let (d, _ds) = director_with(&[1, 2, 3], text);
    let mut rng = SmallRng::seed_from_u64(5);
    let body = chat("hello");
    let first = d.route(&incoming(&body), &mut rng).unwrap();
    // The adapter encodes the name into the response's token and decodes the next request's.
    let (_, token) = first
        .client_headers
        .iter()
        .find(|(h, _)| h == crate::extproc::wire::SESSION_HEADER)
        .cloned()
        .unwrap();
    let name = crate::extproc::wire::decode_token(&token);
    assert_eq!(
        crate::extproc::wire::decode_token(&token),
        Some(first.destinations[0].to_string())
    );
    for _ in 0..10 {
        let r = d
            .route(
                &Incoming {
                    session_token: Some(&token),
                    session_endpoint: name.as_deref(),
                    ..incoming(&body)
                },
                &mut rng,
            )
            .unwrap();
        assert_eq!(r.destinations[0], first.destinations[0]);
    }
}

#[test]
fn consistent_hashing_keys_on_the_first_prompt_block_without_a_prefix_scorer() {
    let text = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: approx-prefix-cache-producer\n- type: consistent-hash-picker\n  parameters: {loadFactor: 100}\n";
    let (d, _ds) = director_with(&[1, 2, 3, 4], text);
    let mut rng = SmallRng::seed_from_u64(6);
    let system = "You are a careful assistant who answers briefly. ".repeat(20);
    let owner = d
        .route(&incoming(&chat(&format!("{system} first"))), &mut rng)
        .unwrap()
        .destinations[0];
    for i in 0..8 {
        let r = d
            .route(
                &incoming(&chat(&format!("{system} question {i}"))),
                &mut rng,
            )
            .unwrap();
        assert_eq!(r.destinations[0], owner, "same system prompt, same pod");
    }
    let owners: HashSet<EndpointId> = (0..40)
        .map(|i| {
            d.route(
                &incoming(&chat(&format!("{i} distinct {}", "x ".repeat(100)))),
                &mut rng,
            )
            .unwrap()
            .destinations[0]
        })
        .collect();
    assert!(
        owners.len() >= 3,
        "distinct prompts spread over the ring: {owners:?}"
    );
}

const TTFT_CONFIG: &str = "apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
  parameters: {autoTune: false}
- type: estimated-ttft-scorer
  parameters: {peakPrefillThroughput: 2000}
- type: max-score-picker
";

#[test]
fn a_routed_prompt_counts_as_prefill_ahead_until_its_first_token() {
    let (d, ds) = director_with(&[1], TTFT_CONFIG);
    set_metrics(&ds, 1, 0.0, Duration::ZERO);
    let mut rng = SmallRng::seed_from_u64(5);
    let body = chat(&"word ".repeat(300));
    let mut routed = d.route(&incoming(&body), &mut rng).unwrap();
    let state = Arc::clone(ds.snapshot().get(&routed.destinations[0]).unwrap());
    let (tokens, requests) = state.prefill_pending();
    assert!(
        tokens >= 300 && requests == 1,
        "{tokens} tokens, {requests}"
    );
    routed.first_token();
    assert_eq!(state.prefill_pending(), (0, 0));
}

#[test]
fn a_streamed_response_teaches_the_pod_its_prefill_rate() {
    let (d, ds) = director_with(&[1], TTFT_CONFIG);
    set_metrics(&ds, 1, 0.0, Duration::ZERO);
    let mut rng = SmallRng::seed_from_u64(6);
    let body = serde_json::json!({"model": "m", "stream": true, "prompt": "word ".repeat(500)})
        .to_string()
        .into_bytes();
    let inc = Incoming {
        body: parsed_with("/v1/completions", &body, d.prompt_cap()),
        ..Default::default()
    };
    let state_of = |r: &Routed| Arc::clone(ds.snapshot().get(&r.destinations[0]).unwrap());
    for _ in 0..30 {
        // A scrape between requests: the queue the pod reports is empty.
        set_metrics(&ds, 1, 0.0, Duration::ZERO);
        let routed = d.route(&inc, &mut rng).unwrap();
        // 500 uncached tokens in 1 s: 500 tokens/s, four times slower than the seed.
        let summary = ResponseSummary {
            status: Some(200),
            prompt_tokens: Some(500),
            cached_tokens: Some(0),
            first_body_at: Some(routed.started + Duration::from_secs(1)),
            ..Default::default()
        };
        d.finish(&routed, End::Response(summary));
        let _ = state_of(&routed);
    }
    let routed = d.route(&inc, &mut rng).unwrap();
    let learned = state_of(&routed).ttft_learned().unwrap();
    let predicted = learned.coefficients.base + learned.coefficients.per_token * 500.0;
    assert!(
        (0.8..1.2).contains(&predicted),
        "predicted {predicted} s for a request measured at 1 s: {learned:?}"
    );
}

#[test]
fn a_sheddable_request_whose_ttft_slo_no_pod_meets_is_rejected() {
    let (d, ds) = director_with(&[1, 2], TTFT_CONFIG);
    for p in [1, 2] {
        set_metrics(&ds, p, 30.0, Duration::ZERO);
    }
    let mut rng = SmallRng::seed_from_u64(7);
    let body = chat("a question");
    let inc = |slo| Incoming {
        slo_ttft_ms: Some(slo),
        ..incoming(&body)
    };
    // Not sheddable (no objective): never rejected for its SLO, routed to the earliest estimate.
    assert!(d.route(&inc(10.0), &mut rng).is_ok());
    let sched = d.config.load_full();
    let s = sched.scheduler.estimated_ttft().unwrap();
    let cands = [
        crate::scheduling::Candidate {
            waiting: 30.0,
            running: 5.0,
            kv_usage: 0.5,
            ..crate::scheduling::testing::cand(1, 30.0, 0.5, 0)
        },
        crate::scheduling::Candidate {
            running: 5.0,
            ..crate::scheduling::testing::cand(2, 30.0, 0.5, 0)
        },
    ];
    let pool: Vec<&crate::scheduling::Candidate> = cands.iter().collect();
    let req = SchedulingRequest {
        prompt_tokens: 100,
        block_size: 16,
        slo_ttft_s: Some(0.01),
        sheddable: true,
        ..Default::default()
    };
    assert!(s.rejects(&req, &pool));
    let mut rng = SmallRng::seed_from_u64(8);
    assert_eq!(
        sched.scheduler.schedule(&req, &cands, &mut rng),
        Err(ScheduleError::SloUnattainable)
    );
}

/// `tokenizer: characters`: the responses' `usage.prompt_tokens` teach the index how many
/// pseudo-tokens make a server token, which sizes the pod's LRU (auto-tuned from the blocks it
/// reports) and converts the prompt's size for the scorers.
#[test]
fn pseudo_tokens_learn_their_ratio_to_the_servers_tokens() {
    let text = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: prefix-cache-scorer\n  parameters:\n    tokenizer: characters\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: prefix-cache-scorer\n";
    let (d, ds) = director_with(&[1], text);
    let id: EndpointId = "127.0.0.1:1".parse().unwrap();
    // 40 blocks of 16 server tokens.
    let m = crate::fixtures::metrics().cache(16, 40).build();
    ds.snapshot().get(&id).unwrap().store_metrics(m);
    let mut rng = SmallRng::seed_from_u64(9);
    // 625 four-byte pseudo-tokens (39 blocks) each; the server counts 500 tokens.
    let prompt = |w: &str| {
        serde_json::json!({"model": "m", "prompt": w.repeat(625)})
            .to_string()
            .into_bytes()
    };
    let (a, b) = (prompt("alfa"), prompt("brav"));
    let routed = route_body(&d, "/v1/completions", &a, &mut rng).unwrap();
    assert_eq!(routed.pseudo_prompt_tokens, Some(625));
    route_body(&d, "/v1/completions", &b, &mut rng).unwrap();
    assert_eq!(
        d.indexes.approximate.size(),
        78,
        "before any response the configured capacity holds: nothing forgotten yet"
    );
    let summary = ResponseSummary {
        status: Some(200),
        prompt_tokens: Some(500),
        ..Default::default()
    };
    d.finish(&routed, End::Response(summary));
    assert_eq!(d.indexes.approximate.scale.get(), 1.25);
    route_body(&d, "/v1/completions", &a, &mut rng).unwrap();
    route_body(&d, "/v1/completions", &b, &mut rng).unwrap();
    assert_eq!(
        d.indexes.approximate.size(),
        50,
        "40 server blocks hold 50 blocks of pseudo-tokens"
    );
    // A failed response teaches nothing.
    let failed = route_body(&d, "/v1/completions", &a, &mut rng).unwrap();
    let summary = ResponseSummary {
        status: Some(500),
        prompt_tokens: Some(5),
        ..Default::default()
    };
    d.finish(&failed, End::Response(summary));
    assert_eq!(d.indexes.approximate.scale.get(), 1.25);
}

/// With a real vocabulary the index's tokens are the server's: nothing to learn.
#[test]
fn real_tokens_are_not_calibrated() {
    let (d, _ds) = director(&[1]);
    let mut rng = SmallRng::seed_from_u64(10);
    let body = serde_json::json!({"model": "m", "prompt": "word ".repeat(100)})
        .to_string()
        .into_bytes();
    let routed = route_body(&d, "/v1/completions", &body, &mut rng).unwrap();
    assert_eq!(routed.pseudo_prompt_tokens, None);
}

/// Each finished request still counts in `Candidate::waiting` until the next scrape (here: never),
/// which the estimated-TTFT scorer once priced as a whole prompt queued at the prompt's home.
#[test]
fn the_built_in_default_keeps_sequential_repeats_of_a_prompt_home() {
    // Fresh metrics that never change: every finished request stays "dispatched since".
    let (d, _ds) = director_with(&[1, 2, 3], config::DEFAULT_CONFIG);
    let words: String = (0..2500)
        .map(|i| format!("w{} ", i * 7919 % 10007))
        .collect();
    let body = chat(&words);
    let mut rng = SmallRng::seed_from_u64(1);
    let mut got = vec![];
    for _ in 0..8 {
        let r = route_body(&d, "/v1/chat/completions", &body, &mut rng).unwrap();
        got.push(r.destinations[0]);
        let summary = ResponseSummary {
            status: Some(200),
            ..Default::default()
        };
        d.finish(&r, End::Response(summary));
    }
    assert!(got.iter().all(|g| *g == got[0]), "{got:?}");
}

/// llm-d's `probabilistic-admitter`: a sheddable request is refused (500, upstream's message)
/// with a probability that reaches 1 once the candidates' mean saturation passes ≈ 0.34; below
/// its dead zone, and for standard or critical requests, it passes. The saturation detector's
/// own threshold (queue 5) is not reached here: queue 1.8 of 5 is 0.36.
#[test]
fn the_probabilistic_admitter_refuses_sheddable_requests_as_saturation_rises() {
    let config = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: probabilistic-admitter\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins: [{pluginRef: queue-scorer}]\n";
    let (d, ds) = director_with(&[1, 2], config);
    let mut o = crate::datastore::objectives::Objectives::default();
    o.objectives.insert("batch".into(), -1);
    ds.set_objectives(o);
    let body = chat("x");
    let batch = || Incoming {
        objective: Some("batch"),
        ..incoming(&body)
    };
    let mut rng = SmallRng::seed_from_u64(11);
    set_metrics(&ds, 1, 1.8, Duration::ZERO);
    set_metrics(&ds, 2, 1.8, Duration::ZERO);
    for _ in 0..20 {
        let err = d.route(&batch(), &mut rng).unwrap_err();
        assert_eq!(
            err.to_string(),
            "request cannot be admitted: probabilistic-admitter: rejected, saturation=0.360 prob=1.00"
        );
        assert!(
            d.route(&incoming(&body), &mut rng).is_ok(),
            "priority 0 passes"
        );
    }
    // Saturation 0.125 (KV 0.1 of 0.8 over queue 0.5 of 5): p = 0.125^5 × 300 ≈ 0.009.
    set_metrics(&ds, 1, 0.5, Duration::ZERO);
    set_metrics(&ds, 2, 0.5, Duration::ZERO);
    let refused = (0..200)
        .filter(|_| d.route(&batch(), &mut rng).is_err())
        .count();
    assert!(refused <= 8, "{refused} of 200 refused at saturation 0.125");
}

/// llm-d's `agent-identity` (alpha): the configured session headers first, then upstream's
/// four (Claude Code, OpenCode, Codex twice); the first non-empty value is the fairness key of
/// a request without one. Not configured, no header is read.
#[test]
fn agent_identity_reads_the_first_session_header_present() {
    let load = config::LoadOptions {
        allow_experimental: true,
    };
    let text = |plugins: &str| {
        format!("apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n{plugins}- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins: [{{pluginRef: queue-scorer}}]\n")
    };
    let with = Runtime::build_with(
        &text("- type: agent-identity\n  parameters: {additionalSessionHeaders: [X-My-Agent]}\n"),
        None,
        load,
    )
    .unwrap();
    let headers = [
        ("x-my-agent", " "),
        ("session-id", "codex-7"),
        ("x-session-affinity", "opencode-3"),
    ];
    let find = |h: &str| headers.iter().find(|(k, _)| *k == h).map(|(_, v)| *v);
    assert_eq!(with.agent_identity(find).as_deref(), Some("opencode-3"));
    let mine = |h: &str| (h == "x-my-agent").then_some("mine");
    assert_eq!(with.agent_identity(mine).as_deref(), Some("mine"));
    assert_eq!(with.agent_identity(|_| None), None);
    let without = Runtime::build_with(&text(""), None, load).unwrap();
    assert_eq!(without.agent_identity(find), None);
    let alpha = Runtime::build_with(&text("- type: agent-identity\n"), None, Default::default());
    assert!(alpha.is_err(), "alpha: needs --allow-experimental-plugins");
}

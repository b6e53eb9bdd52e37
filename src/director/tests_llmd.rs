//! Director-level tests of llm-d's plugins: configurations that need the director's state
//! (in-flight load, prefix index, LRU and session bindings) recorded between requests.

use super::*;
use crate::datastore::Datastore;
use crate::request::{self, LlmRequest};
use rand::{rngs::SmallRng, SeedableRng};
use std::collections::HashSet;

const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config/examples");

fn director(ports: &[u16], config_text: &str) -> (Arc<Director>, Arc<Datastore>) {
    graph(ports, config_text, |g| g)
}

/// A director over `ports` (each scraped at 10% KV usage) under `config_text`, alpha plugins
/// allowed; `more` adds to the fixture (a clock).
fn graph(
    ports: &[u16],
    config_text: &str,
    more: impl FnOnce(crate::fixtures::GraphBuilder) -> crate::fixtures::GraphBuilder,
) -> (Arc<Director>, Arc<Datastore>) {
    let builder = crate::fixtures::graph(config_text)
        .ports(ports)
        .staleness(Duration::from_secs(60))
        .experimental();
    let graph = more(builder).build();
    for s in graph.datastore.snapshot().iter() {
        s.store_metrics(crate::fixtures::metrics().kv_usage(0.1).build());
    }
    (graph.director, graph.datastore)
}

fn chat(content: &str) -> Vec<u8> {
    serde_json::json!({"model": "m", "messages": [{"role": "user", "content": content}]})
        .to_string()
        .into_bytes()
}

/// The adapter's part: a chat body parsed once by `request` (leaked so the parsed request lives
/// as long as the test's `Incoming` values).
fn chat_body<'a>(d: &Director, body: &'a [u8]) -> Body<'a> {
    let request = request::parse(ApiKind::ChatCompletions, body, d.prompt_cap()).unwrap();
    let request: &'a LlmRequest = Box::leak(Box::new(request));
    Body::Parsed {
        request,
        bytes: body,
    }
}

fn route(d: &Director, body: &[u8], rng: &mut SmallRng) -> Routed {
    let inc = Incoming {
        body: chat_body(d, body),
        ..Default::default()
    };
    d.route(&inc, rng).unwrap()
}

#[test]
fn optimized_baseline_keeps_a_conversation_home_and_spreads_new_prompts_by_token_load() {
    let text =
        std::fs::read_to_string(format!("{EXAMPLES}/llm-d-optimized-baseline.yaml")).unwrap();
    let (d, _ds) = director(&[1, 2, 3], &text);
    let mut rng = SmallRng::seed_from_u64(11);
    let conversation = chat(&"You are a careful assistant. ".repeat(300));
    let first = route(&d, &conversation, &mut rng);
    let home = first.destinations[0];
    let (pending, _) = first.lease.inflight.endpoint().prefill_pending();
    assert!(
        pending > 1000,
        "its uncached prompt counts as in-flight tokens: {pending}"
    );
    // Still prefilling there: token load alone would go elsewhere, the affinity filter keeps
    // the prompt on the pod that holds it (the backlog costs far less than 18 s).
    let again = route(&d, &conversation, &mut rng);
    assert_eq!(again.destinations[0], home);
    // A new prompt holds nothing anywhere: the pod with the fewest tokens in flight wins.
    let other = route(&d, &chat("a short unrelated question"), &mut rng);
    assert_ne!(other.destinations[0], home);
    drop((first, again, other));
}

#[test]
fn no_hit_lru_sends_cold_prompts_to_the_least_recently_cold_pod() {
    let text = "apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: no-hit-lru-scorer
  parameters: {lruSize: 8}
- type: max-score-picker
";
    let (d, _ds) = director(&[1, 2, 3], text);
    let mut rng = SmallRng::seed_from_u64(12);
    let mut order = Vec::new();
    for i in 0..6 {
        // Shorter than a block: nobody can hold it, every request is cold.
        let routed = route(&d, &chat(&format!("q{i}")), &mut rng);
        order.push(routed.destinations[0].0.port());
    }
    let first: HashSet<u16> = order[..3].iter().copied().collect();
    assert_eq!(first.len(), 3, "{order:?}");
    assert_eq!(
        order[3..],
        order[..3],
        "then round the LRU again: {order:?}"
    );
}

#[test]
fn llm_d_well_known_optimized_baseline_with_no_hit_lru_routes() {
    // llm-d-router v0.10.0 test/integration/epp/wellknown_configs_test.go.
    let text = "apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: no-hit-lru-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: no-hit-lru-scorer
    weight: 2
";
    let (d, _ds) = director(&[1, 2], text);
    let mut rng = SmallRng::seed_from_u64(13);
    let long = chat(&"Summarise the following report carefully. ".repeat(100));
    let home = route(&d, &long, &mut rng).destinations[0];
    for _ in 0..3 {
        assert_eq!(route(&d, &long, &mut rng).destinations[0], home);
    }
}

#[test]
fn session_id_affinity_binds_a_session_to_its_first_pod_and_moves_it_when_that_pod_is_gone() {
    let text = "apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: session-affinity-filter
  parameters: {strategy: session_id, sessionIdConfig: {sources: [{header: x-conversation}]}}
- type: queue-scorer
";
    let (d, _ds) = director(&[1, 2, 3], text);
    let session_id = |find: &dyn Fn(&str) -> Option<&'static str>| {
        let runtime = d.config.load();
        let names = runtime.scheduler.request_headers();
        let h = crate::scheduling::lifecycle::Headers::capture(names, find);
        h.first_of(names.iter().map(|n| &**n)).map(str::to_owned)
    };
    assert_eq!(
        session_id(&|h| (h == "x-conversation").then_some(" c1 ")),
        Some("c1".to_owned())
    );
    assert_eq!(session_id(&|_| None), None);
    assert!(
        !d.config.load().scheduler.session_affinity(),
        "no token header with session_id"
    );
    let mut rng = SmallRng::seed_from_u64(14);
    let body = chat("hello");
    let send = |session: &str, subset: Option<&[String]>, rng: &mut SmallRng| {
        let headers = crate::scheduling::lifecycle::Headers::of(&[("x-conversation", session)]);
        let inc = Incoming {
            body: chat_body(&d, &body),
            headers: &headers,
            subset,
            ..Default::default()
        };
        d.route(&inc, rng).unwrap()
    };
    // Queue scoring would spread these (each dispatch counts as queued): the binding holds.
    let held: Vec<Routed> = (0..4).map(|_| send("c1", None, &mut rng)).collect();
    let home = held[0].destinations[0];
    assert!(held.iter().all(|r| r.destinations[0] == home));
    let other = send("c2", None, &mut rng);
    assert_ne!(other.destinations[0], home, "a new session goes by load");
    // The bound pod is not a candidate: the session moves, and stays where it moved.
    let elsewhere: Vec<String> = [1u16, 2, 3]
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .filter(|a| *a != home.to_string())
        .collect();
    let moved = send("c1", Some(&elsewhere), &mut rng).destinations[0];
    assert_ne!(moved, home);
    assert_eq!(send("c1", None, &mut rng).destinations[0], moved);
}

#[test]
fn the_concurrency_detector_measures_saturation_by_epps_in_flight_requests() {
    let text = "apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: concurrency-detector
  parameters: {maxConcurrency: 2}
- type: queue-scorer
flowControl:
  saturationDetector: {pluginRef: concurrency-detector}
";
    let (d, _ds) = director(&[1, 2], text);
    assert_eq!(d.pool_saturation(), 0.0);
    let mut rng = SmallRng::seed_from_u64(15);
    let body = chat("hi");
    let held: Vec<Routed> = (0..3).map(|_| route(&d, &body, &mut rng)).collect();
    assert_eq!(d.pool_saturation(), 0.75, "3 requests over 2 × 2");
    drop(held);
    assert_eq!(d.pool_saturation(), 0.0);
}

/// `session-state-producer` through the director: the lifecycle's points reach a plugin the
/// director does not know (turns at `pre_request`, time at `response_complete`), and the
/// adapter's capture of the headers it declares.
#[test]
fn the_session_state_producer_counts_each_sessions_turns_through_the_lifecycle() {
    let text = "apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: session-state-producer
  parameters: {sessionHeaders: [x-agent]}
- type: queue-scorer
";
    let (d, _ds) = director(&[1, 2], text);
    let runtime = d.config.load_full();
    assert_eq!(
        runtime
            .scheduler
            .request_headers()
            .iter()
            .map(|h| &**h)
            .collect::<Vec<_>>(),
        ["x-agent"],
        "the adapter captures the header the producer reads"
    );
    let mut rng = SmallRng::seed_from_u64(21);
    let body = chat("hello");
    for (session, turns) in [("a", 3), ("b", 1)] {
        let headers = crate::scheduling::lifecycle::Headers::of(&[("x-agent", session)]);
        for _ in 0..turns {
            let inc = Incoming {
                body: chat_body(&d, &body),
                headers: &headers,
                ..Default::default()
            };
            let routed = d.route(&inc, &mut rng).unwrap();
            let summary = ResponseSummary {
                status: Some(200),
                ..Default::default()
            };
            d.finish(&routed, End::Response(summary));
        }
    }
    let state = runtime.scheduler.plugin_state();
    assert_eq!(state.len(), 1);
    assert_eq!(state[0]["sessions"], 2);
    let a = state[0]["recent"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["session"] == "a")
        .unwrap();
    assert_eq!(
        (a["turns"].as_u64(), a["in_flight"].as_u64()),
        (Some(3), Some(0))
    );
}

/// Time is an input: a director on a virtual clock expires a session binding when the clock
/// is advanced past the plugin's TTL, without sleeping.
#[test]
fn a_session_binding_expires_in_virtual_time() {
    let text = "apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: session-affinity-filter
  parameters: {strategy: session_id, sessionIdConfig: {evictionTtlSeconds: 5, evictionSweepSeconds: 1}}
- type: queue-scorer
";
    let clock = Arc::new(crate::clock::VirtualClock::default());
    let on = Arc::clone(&clock);
    let (d, _) = graph(&[1, 2, 3], text, move |g| g.clock(on));
    let mut rng = SmallRng::seed_from_u64(31);
    let body = chat("hello");
    let headers = crate::scheduling::lifecycle::Headers::of(&[("x-session-id", "s1")]);
    let mut send = || {
        let inc = Incoming {
            body: chat_body(&d, &body),
            headers: &headers,
            ..Default::default()
        };
        d.route(&inc, &mut rng).unwrap()
    };
    // Queue scoring counts each dispatch as queued: only the binding keeps s1 on its pod.
    let held: Vec<Routed> = (0..3).map(|_| send()).collect();
    let home = held[0].destinations[0];
    assert!(held.iter().all(|r| r.destinations[0] == home));
    clock.advance(Duration::from_secs(4));
    assert_eq!(send().destinations[0], home, "within the TTL");
    clock.advance(Duration::from_secs(6));
    assert_ne!(
        send().destinations[0],
        home,
        "idle past the TTL: placed by load"
    );
}

/// `disaggregatedset-rollout-screener` before every profile: revision B has no prefill pod, so
/// no request reaches its decode pod; a strict header naming it fails with 503, naming A keeps
/// A, and the response says which revision served.
#[test]
fn the_rollout_screener_keeps_requests_off_an_incomplete_revision() {
    const REV: &str = "disaggregatedset.x-k8s.io/revision";
    let config = r#"
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: disaggregatedset-rollout-screener
  parameters:
    scope: {labelSelector: "disaggregatedset.x-k8s.io/name=s"}
    headerSelectors:
    - {name: revision, headerName: X-Disagg-Revision, labelKey: disaggregatedset.x-k8s.io/revision, mode: strict}
    revisionGating: {mode: sum, requireRoles: {values: [prefill, decode]}}
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
"#;
    let pods = [(1, "A", "decode"), (2, "A", "prefill"), (3, "B", "decode")];
    let endpoints = pods
        .iter()
        .map(|(p, rev, role)| crate::endpoint::Endpoint {
            labels: [
                ("disaggregatedset.x-k8s.io/name", "s"),
                (REV, rev),
                ("disaggregatedset.x-k8s.io/role", role),
            ]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
            ..crate::endpoint::Endpoint::from_id(format!("127.0.0.1:{p}").parse().unwrap())
        })
        .collect();
    let (d, _ds) = graph(&[], config, |g| g.endpoints(endpoints));
    let mut rng = SmallRng::seed_from_u64(3);
    let body = chat("hello");
    let b_decode: crate::endpoint::EndpointId = "127.0.0.1:3".parse().unwrap();
    for _ in 0..20 {
        let routed = route(&d, &body, &mut rng);
        assert_ne!(routed.destinations[0], b_decode);
        let revision = ("x-disagg-revision".to_owned(), "A".to_owned());
        assert!(
            routed.client_headers.contains(&revision),
            "{:?}",
            routed.client_headers
        );
    }
    let with = |rev: &str| crate::scheduling::lifecycle::Headers::of(&[("x-disagg-revision", rev)]);
    let (a, b) = (with("A"), with("B"));
    let inc = |headers| Incoming {
        body: chat_body(&d, &body),
        headers,
        ..Default::default()
    };
    assert!(d.route(&inc(&a), &mut rng).is_ok());
    let err = d.route(&inc(&b), &mut rng).unwrap_err();
    assert!(matches!(err, DirectorError::Screened), "{err}");
}

#[test]
fn a_window_of_identical_requests_is_routed_to_one_pod_and_the_others_by_load() {
    let text = std::fs::read_to_string(format!("{EXAMPLES}/llm-d-burst-prefix.yaml")).unwrap();
    let (d, ds) = director(&[1, 2, 3], &text);
    // The first pod runs requests: the window prefers the idle ones, by name.
    for s in ds.snapshot().iter().take(1) {
        s.store_metrics(crate::fixtures::metrics().running(4.0).build());
    }
    assert!(d.gathers());
    assert_eq!(d.early_prompt_bytes(ApiKind::ChatCompletions), None);
    let mut rng = SmallRng::seed_from_u64(5);
    let same = chat("sample this prompt four times");
    let bodies: Vec<Body<'_>> = (0..4).map(|_| chat_body(&d, &same)).collect();
    let seated: Vec<Vec<crate::scheduling::gather::Seat>> = bodies
        .iter()
        .map(|b| {
            d.gather(&Incoming {
                body: *b,
                ..Default::default()
            })
        })
        .collect();
    assert!(seated.iter().all(|s| s.len() == 1));
    let pods: HashSet<crate::endpoint::EndpointId> = bodies
        .iter()
        .zip(&seated)
        .map(|(b, seats)| {
            let inc = Incoming {
                body: *b,
                seats,
                ..Default::default()
            };
            d.route(&inc, &mut rng).unwrap().destinations[0]
        })
        .collect();
    assert_eq!(pods.len(), 1, "one pod for the whole group: {pods:?}");
    let first = ds.snapshot().iter().next().unwrap().id();
    assert!(!pods.contains(&first), "not the busy pod");
    // Without a body there is nothing to gather.
    assert!(d.gather(&Incoming::default()).is_empty());
}

//! Saturation per stage with llm-d's P/D guide configuration: a pool saturated in prefill but
//! not in decode serves decode-only (and is not saturated for admission or flow control); a
//! pool saturated in decode is saturated whatever its prefill pods.

use super::*;
use crate::datastore::Datastore;
use crate::endpoint::{Endpoint, EndpointId};
use crate::metrics::disagg::SkipLabels;
use crate::scheduling::disagg::PREFILLER_HEADER;
use crate::scheduling::filter::ROLE_LABEL;
use crate::scheduling::lifecycle::Headers;
use crate::scheduling::scorer::{decode_token, encode_token, SESSION_HEADER};
use rand::{rngs::SmallRng, SeedableRng};

const PD: &str = include_str!("../../config/examples/llm-d-pd.yaml");

/// Ports 1 and 2 decode, 3 and 4 prefill; every pod idle.
fn director() -> (Arc<Director>, Arc<Datastore>) {
    director_with(PD)
}

fn director_with(config: &str) -> (Arc<Director>, Arc<Datastore>) {
    let graph = graph_of(config);
    (graph.director, graph.datastore)
}

/// [`director_with`]'s whole graph (its metrics' registry too).
fn graph_of(config: &str) -> crate::fixtures::Graph {
    let roles = [(1, "decode"), (2, "decode"), (3, "prefill"), (4, "prefill")];
    let endpoints = roles
        .iter()
        .map(|(p, role)| Endpoint {
            labels: [(ROLE_LABEL.to_owned(), (*role).to_owned())].into(),
            ..Endpoint::from_id(id(*p))
        })
        .collect();
    let graph = crate::fixtures::graph(config)
        .endpoints(endpoints)
        .staleness(Duration::from_secs(60))
        .experimental()
        .build();
    for p in 1..=4 {
        set_waiting(&graph.datastore, p, 0.0);
    }
    graph
}

fn id(port: u16) -> EndpointId {
    format!("127.0.0.1:{port}").parse().unwrap()
}

/// Queue `waiting` on pod `port` (the detector's default `queueDepthThreshold` is 5).
fn set_waiting(ds: &Datastore, port: u16, waiting: f64) {
    let m = crate::fixtures::metrics()
        .waiting(waiting)
        .kv_usage(0.1)
        .build();
    ds.snapshot().get(&id(port)).unwrap().store_metrics(m);
}

/// A chat request of about 2,000 tokens no pod holds yet (the guide's decider disaggregates
/// it); `k` makes it unique.
fn long_chat(k: usize) -> Vec<u8> {
    let words: Vec<String> = (0..2_000).map(|i| format!("w{k}x{i}")).collect();
    serde_json::json!({"model": "m", "messages": [{"role": "user", "content": words.join(" ")}]})
        .to_string()
        .into_bytes()
}

fn incoming<'a>(d: &Director, body: &'a [u8], objective: Option<&'a str>) -> Incoming<'a> {
    let request = crate::request::parse(ApiKind::ChatCompletions, body, d.prompt_cap()).unwrap();
    let request = Box::leak(Box::new(request));
    Incoming {
        body: Body::Parsed {
            request,
            bytes: body,
        },
        objective,
        ..Default::default()
    }
}

fn prefiller(r: &Routed) -> Option<String> {
    r.headers
        .iter()
        .find(|(k, _)| *k == PREFILLER_HEADER)
        .and_then(|(_, v)| v.clone())
}

/// The prefill pod's session token header of llm-d's P/D session-affinity guide.
const PREFILL_TOKEN: &str = "x-session-token-prefill";

/// The header and pod name of the prefill session token the response carries.
fn prefill_session(r: &Routed) -> Option<(String, String)> {
    let (h, v) = r.client_headers.iter().find(|(h, _)| h == PREFILL_TOKEN)?;
    Some((h.clone(), decode_token(v)?))
}

/// The pod name of the primary's session token the response carries.
fn session_endpoint(r: &Routed) -> Option<String> {
    let (_, v) = r.client_headers.iter().find(|(h, _)| h == SESSION_HEADER)?;
    decode_token(v)
}

fn skipped(d: &Director, reason: &str) -> u64 {
    let labels = SkipLabels {
        plugin_name: "disagg-profile-handler".into(),
        reason: reason.into(),
    };
    d.metrics
        .disagg
        .prefill_skipped
        .get_or_create(&labels)
        .get()
}

#[test]
fn a_pool_saturated_in_prefill_serves_decode_only_and_is_not_saturated() {
    let (d, ds) = director();
    let mut rng = SmallRng::seed_from_u64(1);
    let bodies: Vec<Vec<u8>> = (0..13).map(long_chat).collect();
    let r = d.route(&incoming(&d, &bodies[0], None), &mut rng).unwrap();
    assert!(
        prefiller(&r).is_some(),
        "idle prefill pods take the prefill"
    );
    drop(r);
    // One prefill pod saturated: the other takes every prefill.
    set_waiting(&ds, 3, 20.0);
    for body in &bodies[1..11] {
        let r = d.route(&incoming(&d, body, None), &mut rng).unwrap();
        assert_eq!(prefiller(&r).as_deref(), Some("127.0.0.1:4"));
    }
    // Both saturated: decode-only, counted and not a failure.
    set_waiting(&ds, 4, 20.0);
    let r = d.route(&incoming(&d, &bodies[11], None), &mut rng).unwrap();
    assert_eq!(prefiller(&r), None);
    assert!([id(1), id(2)].contains(&r.destinations[0]));
    assert_eq!(skipped(&d, "prefill_endpoints_saturated"), 1);
    // The destinations (decode pods) scrape idle: the pool is not saturated for flow
    // control, and a sheddable request is admitted.
    set_waiting(&ds, 1, 0.0);
    set_waiting(&ds, 2, 0.0);
    // Over all four pods it would be (2 · 0.1/0.8 + 2 · 20/5) / 4 ≈ 2.06.
    assert_eq!(
        d.pool_saturation(),
        0.125,
        "kv 0.1 / 0.8 on the decode pods"
    );
    let mut o = crate::datastore::objectives::Objectives::default();
    o.objectives.insert("batch".into(), -1);
    ds.set_objectives(o);
    let r = d.route(&incoming(&d, &bodies[12], Some("batch")), &mut rng);
    assert!(r.is_ok());
}

#[test]
fn a_pool_saturated_in_decode_is_saturated_whatever_its_prefill_pods() {
    let (d, ds) = director();
    let mut o = crate::datastore::objectives::Objectives::default();
    o.objectives.insert("batch".into(), -1);
    ds.set_objectives(o);
    set_waiting(&ds, 1, 8.0);
    set_waiting(&ds, 2, 8.0);
    // Averaged over all four pods this pool would be at 0.8, not saturated.
    assert!(d.pool_saturation() >= 1.0, "{}", d.pool_saturation());
    let mut rng = SmallRng::seed_from_u64(2);
    let body = long_chat(0);
    let err = d
        .route(&incoming(&d, &body, Some("batch")), &mut rng)
        .unwrap_err();
    assert!(matches!(err, DirectorError::Shed(_)), "{err}");
    // Non-sheddable requests still go to a decode pod, prefilled on an idle prefill pod.
    let r = d.route(&incoming(&d, &body, None), &mut rng).unwrap();
    assert!([id(1), id(2)].contains(&r.destinations[0]));
    assert!(prefiller(&r).is_some());
}

#[test]
fn a_sessions_prefill_token_brings_it_back_to_its_prefill_pod() {
    let config = include_str!("../../config/examples/llm-d-pd-session-affinity.yaml");
    let (d, _ds) = director_with(config);
    let mut rng = SmallRng::seed_from_u64(3);
    let body = long_chat(0);
    let first = d.route(&incoming(&d, &body, None), &mut rng).unwrap();
    let (header, prefill) = prefill_session(&first).expect("prefilled remotely");
    assert_eq!(header, "x-session-token-prefill");
    assert_eq!(Some(prefill.clone()), prefiller(&first));
    let decode = session_endpoint(&first).unwrap();
    drop(first);
    // Each later turn of the session (new text, so the prefix scorer has no say) goes back to
    // both pods while their tokens name them.
    for k in 1..8 {
        let body = long_chat(k);
        let headers = Headers::of(&[(PREFILL_TOKEN, &encode_token(&prefill))]);
        let inc = Incoming {
            session_endpoint: Some(&decode),
            headers: &headers,
            ..incoming(&d, &body, None)
        };
        let r = d.route(&inc, &mut rng).unwrap();
        assert_eq!(r.destinations[0].to_string(), decode);
        assert_eq!(prefiller(&r).as_deref(), Some(prefill.as_str()));
        assert_eq!(prefill_session(&r).map(|p| p.1), Some(prefill.clone()));
    }
    // A decode-only request carries no prefill token.
    let r = d
        .route(&incoming(&d, &long_chat(0), None), &mut rng)
        .unwrap();
    assert_eq!((prefiller(&r), prefill_session(&r)), (None, None));
}

#[test]
fn a_session_id_brings_the_session_back_to_its_prefill_pod() {
    let example = include_str!("../../config/examples/llm-d-pd-session-affinity.yaml");
    let config = crate::scheduling::disagg::session::by_session_id(example);
    let (d, ds) = director_with(&config);
    let mut rng = SmallRng::seed_from_u64(3);
    let bodies: Vec<_> = (0..10).map(long_chat).collect();
    let sessions = [
        ("s1", Headers::of(&[("x-session-id", "s1")])),
        ("s2", Headers::of(&[("x-session-id", "s2")])),
    ];
    let with_id = |body, id: &str| Incoming {
        headers: &sessions.iter().find(|(k, _)| *k == id).unwrap().1,
        ..incoming(&d, body, None)
    };
    let first = d.route(&with_id(&bodies[0], "s1"), &mut rng).unwrap();
    let prefill = prefiller(&first).expect("prefilled remotely");
    assert_eq!(
        prefill_session(&first),
        None,
        "no token is written with session ids"
    );
    let decode = first.destinations[0];
    drop(first);
    // Both pods now report a queue, so the queue scorer alone would move the session; its
    // later turns (new text: the prefix scorer has no say) go back to both pods.
    let port = |e: &str| e.parse::<EndpointId>().unwrap().0.port();
    set_waiting(&ds, port(&prefill), 3.0);
    set_waiting(&ds, decode.0.port(), 3.0);
    for (k, body) in bodies.iter().enumerate().take(6).skip(1) {
        let r = d.route(&with_id(body, "s1"), &mut rng).unwrap();
        assert_eq!(r.destinations[0], decode, "turn {k}");
        assert_eq!(prefiller(&r).as_deref(), Some(prefill.as_str()), "turn {k}");
    }
    // Another session is placed by load: away from the busy pods.
    let other = d.route(&with_id(&bodies[9], "s2"), &mut rng).unwrap();
    assert_ne!(
        prefiller(&other),
        Some(prefill),
        "s2 is not bound to s1's prefill pod"
    );
    assert_ne!(other.destinations[0], decode);
}

#[test]
fn responses_to_remotely_prefilled_requests_are_counted_by_outcome() {
    let (d, _ds) = director();
    let mut rng = SmallRng::seed_from_u64(4);
    let count = |outcome: &str| {
        let labels = crate::metrics::disagg::RemotePrefillLabels {
            plugin_name: "disagg-profile-handler".into(),
            outcome: outcome.into(),
        };
        d.metrics
            .disagg
            .remote_prefill_responses
            .get_or_create(&labels)
            .get()
    };
    for (k, status) in [(0, 200), (1, 502)] {
        let body = long_chat(k);
        let r = d.route(&incoming(&d, &body, None), &mut rng).unwrap();
        assert!(prefiller(&r).is_some());
        let summary = ResponseSummary {
            status: Some(status),
            ..Default::default()
        };
        d.finish(&r, End::Response(summary));
    }
    let body = long_chat(2);
    let r = d.route(&incoming(&d, &body, None), &mut rng).unwrap();
    d.finish(&r, End::Abandoned);
    // A decode-only request (the first prompt again: its decode pod holds it) is not counted.
    let body = long_chat(0);
    let r = d.route(&incoming(&d, &body, None), &mut rng).unwrap();
    assert_eq!(prefiller(&r), None);
    d.finish(&r, End::Response(ResponseSummary::default()));
    assert_eq!(
        (count("success"), count("error"), count("abandoned")),
        (1, 1, 1)
    );
}

/// A client choosing a fresh model name per request cannot grow the disaggregation decision
/// counters (or any family) past the capped set of model-name label values: the names beyond
/// the cap are counted under `other`.
#[test]
fn thousands_of_client_model_names_stay_within_the_label_cap() {
    let graph = graph_of(PD);
    let (d, registry) = (graph.director, graph.registry);
    let mut rng = SmallRng::seed_from_u64(7);
    let names = crate::metrics::model::MODEL_LABEL_CAP + 1_500;
    for k in 0..names {
        let body = serde_json::json!({"model": format!("m-{k}"), "messages": [{"role": "user", "content": "hi"}]})
            .to_string()
            .into_bytes();
        d.route(&incoming(&d, &body, None), &mut rng).unwrap();
    }
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let decisions: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with("llm_d_epp_disagg_decision_total{")
                || l.starts_with("llm_d_epp_pd_decision_total{")
        })
        .collect();
    assert!(!decisions.is_empty(), "the handler counts its decisions");
    let mut values = std::collections::HashSet::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        for part in line.split("model_name=\"").skip(1) {
            values.insert(part.split('"').next().unwrap_or_default().to_owned());
        }
    }
    assert!(
        values.len() <= crate::metrics::model::MODEL_LABEL_CAP + 2,
        "{} distinct model-name label values",
        values.len()
    );
    assert!(
        decisions.iter().any(|l| l.contains("model_name=\"other\"")),
        "names beyond the cap are counted as other"
    );
}

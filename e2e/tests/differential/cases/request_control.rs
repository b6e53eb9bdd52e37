//! Cases for types that act around scheduling rather than in a profile's filter/score/pick: the
//! cold-request LRU scorer (it learns from the picks, in `PreRequest`), the conformance
//! verifier (it reads what Envoy reports at the response), the probabilistic admitter, and the
//! multimodal decider (it reads the request's content), the attribute reporter (it reads the
//! response's usage).

use harness::envoy::Template;

use super::{case, completion, prompt, req, times, waiting, Case, PodState, Req};

/// Three rounds of three cold requests: each request's prompt starts with its round and its
/// number, so no pod holds a block of it. llm-d ranks never-used pods in its endpoint order,
/// which changes from run to run, so a round's outcome is the set of pods it reached.
fn cold_rounds() -> Vec<Req> {
    (0..3)
        .map(|round| {
            let text = format!("r{round}q{{n}} {}", prompt(40 + round, 64));
            times(3, req(completion(&text)))
        })
        .collect()
}

/// Saturated pods: each has more waiting than `queueDepthThreshold` and its KV cache fuller
/// than `kvCacheUtilThreshold`; pod 1's queue is the shortest.
fn saturated() -> Vec<PodState> {
    let mut pods = waiting(&[6, 4, 6]);
    for p in &mut pods {
        p.kv = Some(0.9);
    }
    pods
}

/// A chat completion whose user turn is `content` (a string, or a list of parts).
fn chat(content: serde_json::Value) -> Req {
    let body = serde_json::json!({"model": harness::sim_pod::TEST_MODEL, "max_tokens": 1,
        "messages": [{"role": "user", "content": content}]});
    Req {
        path: "/v1/chat/completions",
        ..req(body.to_string())
    }
}

/// Requests whose cost the reporter reports: a long prompt, answered whole and streamed (the
/// usage in the stream's last event), and a prompt too short for its condition (no report).
fn costed() -> Vec<Req> {
    let long = prompt(60, 24);
    let streamed = serde_json::json!({"model": harness::sim_pod::TEST_MODEL, "prompt": long,
        "max_tokens": 1, "stream": true, "stream_options": {"include_usage": true}});
    [completion(&long), streamed.to_string(), completion("hi")]
        .into_iter()
        .map(|body| Req {
            cost: true,
            ..req(body)
        })
        .collect()
}

/// Pod 0 encodes, pods 1 and 2 decode (pod 2 has the shorter queue).
fn encode_decode() -> Vec<PodState> {
    let mut pods = waiting(&[0, 3, 1]);
    pods[0].labels = vec![(super::ROLE, "encode")];
    pods[1].labels = vec![(super::ROLE, "decode")];
    pods[2].labels = vec![(super::ROLE, "decode")];
    pods
}

/// A long prompt lands on pod 1 (shortest queue); pod 1's queue grows and the same prompt goes
/// to pod 0 by load, pod 1 named as its KV source; another prompt has no source.
fn p2p_turns() -> Vec<Req> {
    super::repeat_after_load(50, vec![0, 6, 4])
}

/// A chat turn showing the pictures at `urls`.
fn pictures(urls: &[&str]) -> Req {
    let mut parts = vec![serde_json::json!({"type": "text", "text": "what changed?"})];
    parts.extend(
        urls.iter()
            .map(|u| serde_json::json!({"type": "image_url", "image_url": {"url": u}})),
    );
    chat(serde_json::Value::Array(parts))
}

/// Picture A lands on pod 1 by load; with pod 0 now the least loaded, A again goes where its
/// embeddings are (pod 1), a new picture B by load (pod 0), and A with B to either holder
/// (a tie on the cache), where load decides (pod 0).
fn picture_turns() -> Vec<Req> {
    let (a, b) = ("https://example.com/a.png", "https://example.com/b.png");
    let relieved = |r: Req| Req {
        set_waiting: Some(vec![0, 2, 4]),
        ..r
    };
    vec![
        pictures(&[a]),
        relieved(pictures(&[a])),
        pictures(&[b]),
        pictures(&[a, b]),
    ]
}

pub fn all() -> Vec<Case> {
    vec![
        // Every request is cold, so each pick goes to a pod that has not served yet, then to
        // the least recently used: each round of three reaches all three pods (a random pick
        // would in 2 of 9 rounds).
        case(
            "no-hit-lru-scorer",
            super::SCORER_NO_HIT_LRU,
            waiting(&[0, 0, 0]),
            cold_rounds(),
        ),
        // Envoy's override_host reports the endpoint that served (`envoy.lb` /
        // `x-gateway-destination-endpoint-served`); the verifier echoes it in a response header.
        Case {
            envoy: Template::DuplexOverrideHost,
            ..case(
                "destination-endpoint-served-verifier",
                super::VERIFIER_SERVED,
                waiting(&[3, 0, 3]),
                vec![req(completion("hello"))],
            )
        },
        // The response's usage, reported as dynamic metadata at its end (Envoy logs it).
        case(
            "request-attribute-reporter",
            super::ATTRIBUTE_REPORTER,
            waiting(&[3, 0, 3]),
            costed(),
        ),
        // Saturated pods (saturation ≥ 1: rejection probability 1 for a sheddable request), but
        // a request without an InferenceObjective has priority 0, which the admitter always
        // admits (file discovery has no objectives to make one sheddable).
        case(
            "probabilistic-admitter",
            super::ADMITTER_PROBABILISTIC,
            saturated(),
            vec![req(completion("hello"))],
        ),
        case(
            "p2p-source-producer",
            super::PRODUCER_P2P_SOURCE,
            waiting(&[2, 0, 4]),
            p2p_turns(),
        ),
        case(
            "mm-embeddings-cache-scorer",
            super::MM_EMBEDDINGS,
            waiting(&[2, 0, 4]),
            picture_turns(),
        ),
        case(
            "mm-embeddings-cache-producer",
            super::MM_EMBEDDINGS,
            waiting(&[2, 0, 4]),
            picture_turns(),
        ),
        // An image in the user turn runs the encode stage (pod 0, named in the encoder
        // header); text alone does not.
        case(
            "always-disagg-multimodal-decider",
            super::DECIDER_MULTIMODAL,
            encode_decode(),
            vec![
                chat(serde_json::json!([
                    {"type": "text", "text": "what is in this picture?"},
                    {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
                ])),
                chat(serde_json::json!("no picture here")),
            ],
        ),
    ]
}

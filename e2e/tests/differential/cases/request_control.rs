//! Cases for types that act around scheduling rather than in a profile's filter/score/pick: the
//! cold-request LRU scorer (it learns from the picks, in `PreRequest`), the conformance
//! verifier (it reads what Envoy reports at the response) and the probabilistic admitter.

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
        // Saturated pods (saturation ≥ 1: rejection probability 1 for a sheddable request), but
        // a request without an InferenceObjective has priority 0, which the admitter always
        // admits (file discovery has no objectives to make one sheddable).
        case(
            "probabilistic-admitter",
            super::ADMITTER_PROBABILISTIC,
            saturated(),
            vec![req(completion("hello"))],
        ),
    ]
}

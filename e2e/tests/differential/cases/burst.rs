//! `burst-prefix-cache-producer`: bursts of requests sent at once, inside one window, through
//! `prefix-cache-scorer` naming the producer. Both EPPs hold each burst for the window and
//! place it jointly: the samples of one prompt on one pod (at most `maxPerReplica` = 2 a pod,
//! then the next least-loaded pod), two prompts' groups on two pods, and distinct prompts that
//! share `minColocateBlocks` leading blocks together up to their fair share. Ties between pods go to
//! fewer running requests, then the lower name (the pods run none: forced to 0), so the pods
//! each burst reaches are the same for both.

use super::{case, completion, req, times, Case, PodState, Req};

/// The producer (a window wide enough for a burst sent through Envoy to fall in one), scored
/// alone so the placement decides.
const BURST: &str = "
plugins:
- type: burst-prefix-cache-producer
  parameters: {windowDurationMs: 400, maxPerReplica: 2, minColocateBlocks: 2}
- type: prefix-cache-scorer
  parameters: {prefixMatchInfoProducerName: burst-prefix-cache-producer}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: prefix-cache-scorer}, {pluginRef: max-score-picker}]
";

/// `n` copies of `prompt` sent at once.
fn burst(n: usize, prompt: &str) -> Req {
    Req {
        concurrent: true,
        ..times(n, req(completion(prompt)))
    }
}

/// About 900 bytes every prompt of the last burst starts with.
fn shared_preamble() -> String {
    (0..90)
        .map(|i| format!("p{i:03}-line"))
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn burst_prefix() -> Case {
    let idle = PodState {
        waiting: Some(0),
        running: Some(0),
        ..PodState::default()
    };
    case(
        "burst-prefix-cache-producer",
        BURST,
        vec![idle.clone(), idle.clone(), idle],
        vec![
            // Two samples of one prompt: one pod.
            burst(2, "the rollout prompt of step one"),
            // Four samples: two a pod.
            burst(4, "the rollout prompt of step two"),
            // Two prompts, two samples each: a pod each.
            burst(4, "prompt {n%2} of step three"),
            // Four distinct prompts sharing a long preamble (more than two 64-token blocks of
            // 4-byte pseudo-tokens), one sample each: singles that share `minColocateBlocks`
            // leading blocks are units, co-located up to their fair share of the window.
            burst(4, &format!("{} question {{n}}", shared_preamble())),
        ],
    )
}

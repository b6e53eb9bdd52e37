//! `lora-affinity-scorer`: prefer pods where the requested adapter is already loaded.
//! 1.0 if the adapter is running; 0.8 if the pod has a free adapter slot; 0.6 if the adapter is
//! waiting to load; else 0 (upstream's values). Pods without LoRA metrics score 0.

use crate::scheduling::{Candidate, SchedulingRequest};

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraAffinityScorer {}

impl LoraAffinityScorer {
    pub(crate) fn score(&self, req: &SchedulingRequest<'_>, pool: &[&Candidate], out: &mut [f64]) {
        for (o, c) in out.iter_mut().zip(pool) {
            let lora = c.metrics.as_ref().and_then(|m| m.lora.as_ref());
            *o = match lora {
                Some(l) if l.is_active(req.target_model) => 1.0,
                Some(l) if ((l.running.len() + l.waiting.len()) as u32) < l.max_loras => 0.8,
                Some(l) if l.is_waiting(req.target_model) => 0.6,
                _ => 0.0,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::LoraState;
    use crate::scheduling::testing::cand;

    fn with_lora(port: u16, running: &[&str], waiting: &[&str], max: u32) -> Candidate {
        let mut c = cand(port, 0.0, 0.0, 0);
        let lora = LoraState {
            running: running.iter().map(|s| s.to_string()).collect(),
            waiting: waiting.iter().map(|s| s.to_string()).collect(),
            max_loras: max,
        };
        c.metrics = Some(crate::fixtures::metrics().lora(lora).arc());
        c
    }

    #[test]
    fn prefers_loaded_then_free_slot_then_waiting() {
        let cands = [
            with_lora(1, &["a"], &[], 1),
            with_lora(2, &["b"], &[], 2),
            with_lora(3, &["b"], &["a"], 2),
            with_lora(4, &["b"], &[], 1),
            cand(5, 0.0, 0.0, 0),
        ];
        let mut out = [0.0; 5];
        let req = SchedulingRequest {
            target_model: "a",
            ..Default::default()
        };
        LoraAffinityScorer {}.score(&req, &cands.iter().collect::<Vec<_>>(), &mut out);
        assert_eq!(out, [1.0, 0.8, 0.6, 0.0, 0.0]);
    }
}

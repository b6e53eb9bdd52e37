//! What the simulated clients send: the real-time bench's workloads (`loadgen::workload`), their
//! seeded arrivals (`loadgen::schedule`), and the request bodies built as `loadgen::run` builds
//! them, so epp parses in the simulator exactly the bytes it parses behind Envoy.

use inference_sim::tokenizer::{render_chat, ChatTurn, TokenId};
use inference_sim::{Tokenizer, TokenizerKind};
use loadgen::schedule::{arrivals, Stage};
use loadgen::workload::{Body, Generator, RequestSpec, Workload};
use serde_json::{json, Value};
use std::time::Duration;

/// The served model name, as the bench's pods serve it.
pub const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// One planned request: when it is due (seconds from the start) and what it asks.
#[derive(Clone, Debug)]
pub struct Planned {
    pub at: f64,
    pub spec: RequestSpec,
}

/// A run's requests, in arrival order, and the chat sessions' system prompts.
#[derive(Clone, Debug)]
pub struct Traffic {
    pub requests: Vec<Planned>,
    pub systems: Vec<String>,
    /// Turns after which a chat session starts over (the bench's `--turns`).
    pub turns: usize,
}

impl Traffic {
    /// `workload` at `rate` requests/s (Poisson) for `secs`, at most `max` requests; a trace
    /// replays its own send times instead.
    pub fn plan(workload: &Workload, rate: f64, secs: f64, max: usize, seed: u64) -> Self {
        let mut generator = Generator::new(workload.clone(), seed);
        let times: Vec<f64> = match generator.trace_times() {
            Some(times) => times.into_iter().filter(|t| *t < secs).take(max).collect(),
            None => {
                let stage = Stage {
                    rate,
                    duration: Duration::from_secs_f64(secs),
                };
                arrivals(&[stage], true, max, seed)
                    .iter()
                    .map(|a| a.at.as_secs_f64())
                    .collect()
            }
        };
        let requests = times
            .into_iter()
            .map(|at| Planned {
                at,
                spec: generator.next_request(),
            })
            .collect();
        let (sessions, turns) = match workload {
            Workload::MultiTurn {
                sessions, turns, ..
            } => (*sessions, *turns),
            _ => (0, usize::MAX),
        };
        let systems = (0..sessions)
            .map(|s| generator.system_prompt(s).to_owned())
            .collect();
        Self {
            requests,
            systems,
            turns,
        }
    }
}

/// One request as sent: the API path's kind, the JSON body, and the prompt tokens the pod
/// computes (its tokenizer and chat template, as `inference-sim`'s HTTP layer tokenizes).
#[derive(Clone, Debug)]
pub struct Wire {
    pub chat: bool,
    pub body: Vec<u8>,
    pub tokens: Vec<TokenId>,
}

/// Builds request bodies and the pod-side token ids.
#[derive(Clone, Copy, Debug)]
pub struct Encoder {
    tokenizer: Tokenizer,
}

impl Default for Encoder {
    fn default() -> Self {
        Self {
            tokenizer: Tokenizer::new(TokenizerKind::Cl100kBase),
        }
    }
}

impl Encoder {
    /// The token ids generated text is drawn from.
    pub fn vocabulary(&self) -> Vec<TokenId> {
        self.tokenizer.output_vocabulary()
    }

    /// The text of generated tokens (a chat answer the next turn resends).
    pub fn text(&self, tokens: &[TokenId]) -> String {
        self.tokenizer.decode(tokens).unwrap_or_default()
    }

    /// A `/v1/completions` request for `prompt`.
    pub fn completion(&self, spec: &RequestSpec, prompt: &str) -> Wire {
        let mut body = common(spec);
        body["prompt"] = Value::String(prompt.to_owned());
        Wire {
            chat: false,
            body: body.to_string().into_bytes(),
            tokens: self.tokenizer.encode(prompt),
        }
    }

    /// A `/v1/chat/completions` turn: the system prompt, the session's earlier turns and the
    /// new question.
    pub fn chat(&self, spec: &RequestSpec, system: &str, history: &[(String, String)]) -> Wire {
        let question = match &spec.body {
            Body::ChatTurn { question, .. } => question.as_str(),
            Body::Prompt(p) => p.as_str(),
        };
        let mut turns = vec![turn("system", system)];
        for (q, a) in history {
            turns.push(turn("user", q));
            turns.push(turn("assistant", a));
        }
        turns.push(turn("user", question));
        let messages: Vec<Value> = turns
            .iter()
            .map(|t| json!({"role": t.role, "content": t.content}))
            .collect();
        let mut body = common(spec);
        body["messages"] = Value::Array(messages);
        Wire {
            chat: true,
            body: body.to_string().into_bytes(),
            tokens: self.tokenizer.encode(&render_chat(&turns, true)),
        }
    }
}

fn turn(role: &str, content: &str) -> ChatTurn {
    ChatTurn {
        role: role.to_owned(),
        content: content.to_owned(),
    }
}

/// The fields `loadgen::run` sends with every request.
fn common(spec: &RequestSpec) -> Value {
    let model = spec.adapter.clone().unwrap_or_else(|| MODEL.to_owned());
    json!({"model": model, "max_tokens": spec.max_tokens, "stream": true,
        "stream_options": {"include_usage": true}, "ignore_eos": true})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_is_the_same_for_a_seed_and_differs_between_seeds() {
        let w = Workload::Random {
            input_len: 10,
            output_len: 2,
        };
        let a = Traffic::plan(&w, 20.0, 5.0, 1000, 1);
        let b = Traffic::plan(&w, 20.0, 5.0, 1000, 1);
        let c = Traffic::plan(&w, 20.0, 5.0, 1000, 2);
        let times = |t: &Traffic| t.requests.iter().map(|r| r.at).collect::<Vec<_>>();
        assert_eq!(times(&a), times(&b));
        assert_ne!(times(&a), times(&c));
        assert!(
            (60..=140).contains(&a.requests.len()),
            "{}",
            a.requests.len()
        );
    }

    #[test]
    fn a_completion_body_is_what_loadgen_sends_and_tokens_are_the_pods() {
        let e = Encoder::default();
        let spec = RequestSpec {
            body: Body::Prompt(" the of and".into()),
            adapter: None,
            max_tokens: 5,
            group: None,
        };
        let w = e.completion(&spec, " the of and");
        let v: Value = serde_json::from_slice(&w.body).expect("json");
        assert_eq!(v["model"], MODEL);
        assert_eq!(v["max_tokens"], 5);
        assert_eq!(w.tokens.len(), 3);
    }
}

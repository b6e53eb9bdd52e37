//! What the load generator sends: seeded, reproducible request contents for the five workload
//! shapes of the benchmark issue (shared prefix, multi-turn chat, long/short mix, LoRA mix, no
//! sharing).
//!
//! Text is built from a fixed list of common English words, each one `cl100k_base` token when
//! preceded by a space, so a prompt of `n` words is `n` tokens for the simulator and for epp
//! (a test checks this against the real tokenizer). The same seed gives the same prompts in
//! the same order, whatever the router.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// Words that are each exactly one `cl100k_base` token with their leading space.
const WORDS: &[&str] = &[
    " the", " of", " and", " to", " in", " is", " that", " for", " it", " as", " with", " was",
    " on", " be", " at", " by", " this", " had", " not", " are", " but", " from", " or", " have",
    " an", " they", " which", " one", " you", " were", " all", " we", " her", " she", " there",
    " would", " their", " will", " when", " who", " him", " been", " has", " more", " if", " no",
    " out", " so", " said", " what", " up", " its", " about", " into", " than", " them", " can",
    " only", " other", " time", " new", " some", " could", " these", " two", " may", " first",
    " then", " do", " any", " like", " my", " now", " over", " such", " our", " man", " me",
    " even", " most", " made", " after", " also", " did", " many", " off", " before", " must",
    " well", " back", " through", " years", " much", " where", " your", " way", " down", " should",
    " because", " long", " each", " just", " state", " people", " those", " too", " how",
    " little", " good", " world", " very", " make", " between", " still", " own", " see", " work",
    " men", " day", " life", " here", " part", " both", " city", " house", " water", " light",
];

/// A workload shape and its sizes (token counts).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Workload {
    /// inference-perf `shared_prefix`: `groups` system prompts, each followed by one of
    /// `prompts_per_group` questions; each request picks a group and a question uniformly.
    SharedPrefix {
        groups: usize,
        prompts_per_group: usize,
        system_len: usize,
        question_len: usize,
        output_len: usize,
    },
    /// Chat sessions: every turn resends the whole conversation (system prompt, earlier questions
    /// and the answers the server gave) plus a new question.
    MultiTurn {
        sessions: usize,
        turns: usize,
        system_len: usize,
        question_len: usize,
        output_len: usize,
    },
    /// Mostly short prompts with a heavy (Pareto, α = 1.2) tail of long ones, no sharing.
    LongShortMix {
        short_len: usize,
        long_fraction: f64,
        long_min: usize,
        long_max: usize,
        output_len: usize,
    },
    /// Random prompts addressed to `adapters` LoRA adapters with Zipf-like popularity.
    LoraMix {
        adapters: usize,
        input_len: usize,
        output_len: usize,
    },
    /// Random prompts: nothing shared between requests.
    Random { input_len: usize, output_len: usize },
    /// A replayed JSONL trace ([`super::trace`]): contents and send times from the file.
    Trace {
        path: String,
        replay: super::trace::Replay,
    },
}

/// What one request asks for, before it is sent.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestSpec {
    pub body: Body,
    /// Model name; `None` means the served base model.
    pub adapter: Option<String>,
    pub max_tokens: usize,
    /// Shared-prefix group (or chat session), for the oracle bound and per-group analysis.
    pub group: Option<usize>,
}

/// A prompt for `/v1/completions`, or the next turn of a chat session for `/v1/chat/completions`.
#[derive(Clone, Debug, PartialEq)]
pub enum Body {
    Prompt(String),
    ChatTurn { session: usize, question: String },
}

/// Generates request contents in order from a seed.
pub struct Generator {
    workload: Workload,
    rng: SmallRng,
    /// Shared texts built once: system prompts (per group or session) and questions.
    systems: Vec<String>,
    questions: Vec<Vec<String>>,
    next_session: usize,
    /// The entries of a [`Workload::Trace`], in send order.
    trace: Vec<super::trace::TraceEntry>,
}

/// `n` random words from the one-token list.
pub fn words(rng: &mut impl Rng, n: usize) -> String {
    let mut s = String::with_capacity(n * 6);
    for _ in 0..n {
        s.push_str(WORDS[rng.random_range(0..WORDS.len())]);
    }
    s
}

impl Generator {
    pub fn new(workload: Workload, seed: u64) -> Self {
        let mut rng = SmallRng::seed_from_u64(seed);
        let (systems, questions) = match &workload {
            Workload::SharedPrefix {
                groups,
                prompts_per_group,
                system_len,
                question_len,
                ..
            } => {
                let systems: Vec<String> =
                    (0..*groups).map(|_| words(&mut rng, *system_len)).collect();
                let questions = (0..*groups)
                    .map(|_| {
                        (0..*prompts_per_group)
                            .map(|_| words(&mut rng, *question_len))
                            .collect()
                    })
                    .collect();
                (systems, questions)
            }
            Workload::MultiTurn {
                sessions,
                system_len,
                ..
            } => (
                (0..*sessions)
                    .map(|_| words(&mut rng, *system_len))
                    .collect(),
                Vec::new(),
            ),
            _ => (Vec::new(), Vec::new()),
        };
        let trace = match &workload {
            Workload::Trace { path, .. } => {
                super::trace::read(std::path::Path::new(path)).unwrap_or_default()
            }
            _ => Vec::new(),
        };
        Self {
            workload,
            rng,
            systems,
            questions,
            next_session: 0,
            trace,
        }
    }

    /// Send offsets of a trace's requests (seconds), `None` for other workloads.
    pub fn trace_times(&self) -> Option<Vec<f64>> {
        match &self.workload {
            Workload::Trace { replay, .. } => {
                Some(self.trace.iter().map(|e| replay.at_secs(e)).collect())
            }
            _ => None,
        }
    }

    /// The system prompt of a chat session.
    pub fn system_prompt(&self, session: usize) -> &str {
        self.systems.get(session).map_or("", String::as_str)
    }

    /// The next request.
    pub fn next_request(&mut self) -> RequestSpec {
        match self.workload.clone() {
            Workload::SharedPrefix {
                groups,
                prompts_per_group,
                output_len,
                ..
            } => {
                let g = self.rng.random_range(0..groups.max(1));
                let q = self.rng.random_range(0..prompts_per_group.max(1));
                let prompt = format!("{}{}", self.systems[g], self.questions[g][q]);
                RequestSpec {
                    body: Body::Prompt(prompt),
                    adapter: None,
                    max_tokens: output_len,
                    group: Some(g),
                }
            }
            Workload::MultiTurn {
                sessions,
                question_len,
                output_len,
                ..
            } => {
                let session = self.next_session % sessions.max(1);
                self.next_session += 1;
                let question = words(&mut self.rng, question_len);
                RequestSpec {
                    body: Body::ChatTurn { session, question },
                    adapter: None,
                    max_tokens: output_len,
                    group: Some(session),
                }
            }
            Workload::LongShortMix {
                short_len,
                long_fraction,
                long_min,
                long_max,
                output_len,
            } => {
                let len = if self.rng.random_bool(long_fraction.clamp(0.0, 1.0)) {
                    pareto(&mut self.rng, long_min as f64, 1.2).min(long_max as f64) as usize
                } else {
                    short_len
                };
                self.random_prompt(len.max(1), output_len, None)
            }
            Workload::LoraMix {
                adapters,
                input_len,
                output_len,
            } => {
                let adapter = zipf_index(&mut self.rng, adapters.max(1));
                self.random_prompt(input_len, output_len, Some(lora_name(adapter)))
            }
            Workload::Random {
                input_len,
                output_len,
            } => self.random_prompt(input_len, output_len, None),
            Workload::Trace { replay, .. } => {
                let i = self.next_session;
                self.next_session += 1;
                match self.trace.get(i % self.trace.len().max(1)) {
                    Some(e) => RequestSpec {
                        body: Body::Prompt(replay.prompt(e)),
                        adapter: None,
                        max_tokens: e.output_length.max(1),
                        group: None,
                    },
                    None => self.random_prompt(1, 1, None),
                }
            }
        }
    }

    fn random_prompt(
        &mut self,
        len: usize,
        output_len: usize,
        adapter: Option<String>,
    ) -> RequestSpec {
        let prompt = words(&mut self.rng, len);
        RequestSpec {
            body: Body::Prompt(prompt),
            adapter,
            max_tokens: output_len,
            group: None,
        }
    }
}

/// The name of LoRA adapter `i` (the harness starts the pods with the same names).
pub fn lora_name(i: usize) -> String {
    format!("lora-{i}")
}

/// A Pareto sample with scale `xm` and shape `alpha`.
fn pareto(rng: &mut impl Rng, xm: f64, alpha: f64) -> f64 {
    let u: f64 = rng.random_range(f64::EPSILON..1.0);
    xm / u.powf(1.0 / alpha)
}

/// Index in `0..n` with probability ∝ 1/(i+1).
fn zipf_index(rng: &mut impl Rng, n: usize) -> usize {
    let total: f64 = (1..=n).map(|k| 1.0 / k as f64).sum();
    let mut x = rng.random_range(0.0..total);
    for k in 1..=n {
        x -= 1.0 / k as f64;
        if x <= 0.0 {
            return k - 1;
        }
    }
    n - 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use inference_sim::{Tokenizer, TokenizerKind};

    #[test]
    fn every_word_is_one_cl100k_token_so_lengths_are_exact() {
        let tok = Tokenizer::new(TokenizerKind::Cl100kBase);
        let mut rng = SmallRng::seed_from_u64(7);
        let text = words(&mut rng, 2000);
        assert_eq!(tok.encode(&text).len(), 2000);
    }

    #[test]
    fn the_same_seed_gives_the_same_requests() {
        let w = Workload::SharedPrefix {
            groups: 4,
            prompts_per_group: 3,
            system_len: 50,
            question_len: 10,
            output_len: 5,
        };
        let mut a = Generator::new(w.clone(), 42);
        let mut b = Generator::new(w, 42);
        for _ in 0..20 {
            assert_eq!(a.next_request(), b.next_request());
        }
    }

    #[test]
    fn shared_prefix_requests_of_a_group_start_with_its_system_prompt() {
        let w = Workload::SharedPrefix {
            groups: 2,
            prompts_per_group: 5,
            system_len: 30,
            question_len: 4,
            output_len: 5,
        };
        let mut g = Generator::new(w, 1);
        let systems = g.systems.clone();
        for _ in 0..10 {
            let r = g.next_request();
            let Body::Prompt(p) = r.body else {
                panic!("prompt expected")
            };
            assert!(p.starts_with(&systems[r.group.expect("group")]));
        }
    }

    #[test]
    fn lora_mix_favours_the_first_adapter() {
        let mut g = Generator::new(
            Workload::LoraMix {
                adapters: 4,
                input_len: 3,
                output_len: 1,
            },
            3,
        );
        let first = (0..400)
            .filter(|_| g.next_request().adapter.as_deref() == Some("lora-0"))
            .count();
        assert!(first > 120, "lora-0 chosen {first} times of 400");
    }

    #[test]
    fn long_short_mix_has_a_tail_longer_than_the_short_prompts() {
        let w = Workload::LongShortMix {
            short_len: 10,
            long_fraction: 0.2,
            long_min: 100,
            long_max: 1000,
            output_len: 1,
        };
        let mut g = Generator::new(w, 9);
        let long = (0..200)
            .filter(|_| matches!(g.next_request().body, Body::Prompt(p) if p.len() > 300))
            .count();
        assert!((20..=70).contains(&long), "{long} long prompts of 200");
    }
}

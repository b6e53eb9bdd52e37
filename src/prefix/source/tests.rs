//! One table of cases, run over both implementations of the prefix contract: what a lookup
//! matches after a sequence of recorded decisions must not depend on the index.

use super::*;
use crate::request::Prompt;

const APPROXIMATE: Config = Config::Approximate(ApproximateParams {
    block_size: 4,
    max_blocks: 100,
    max_tokens: 0,
    capacity: 1000,
    auto_tune: false,
});

const PRECISE_PARAMS: PreciseParams = PreciseParams {
    block_size: 4,
    max_blocks: 100,
    speculative_ttl: Some(Duration::from_secs(60)),
    credit_home: true,
};

const PRECISE: Config = Config::Precise(PRECISE_PARAMS);

const IMPLEMENTATIONS: [(&str, Config); 2] = [("approximate", APPROXIMATE), ("precise", PRECISE)];

fn ep(n: u16) -> EndpointId {
    format!("10.0.0.1:{n}").parse().unwrap()
}

fn pods() -> Vec<Pod> {
    (1..=3)
        .map(|n| Pod {
            id: ep(n),
            load: 0.0,
            cache: None,
        })
        .collect()
}

fn request(tokens: &[u32]) -> LlmRequest {
    LlmRequest {
        api: ApiKind::Completions,
        model: "m".into(),
        model_span: 0..0,
        stream: false,
        prompt: Prompt::Tokens(tokens.to_vec()),
        cache_salt: None,
    }
}

fn lookup(source: &Source<'_>, model: &str, tokens: &[u32], now: Instant) -> Lookup {
    let (req, pods) = (request(tokens), pods());
    let query = Query {
        request: &req,
        body: b"",
        model,
        tokenizer: None,
        pods: &pods,
    };
    source
        .lookup(&query, now)
        .expect("token prompts need no tokenizer")
}

fn record(source: &Source<'_>, endpoint: u16, tokens: &[u32], now: Instant) {
    let found = lookup(source, "m", tokens, now);
    let primary = Pod {
        id: ep(endpoint),
        load: 0.0,
        cache: None,
    };
    source.record(&found, &primary, now);
}

fn range(a: u32, b: u32) -> Vec<u32> {
    (a..b).collect()
}

struct Case {
    name: &'static str,
    /// Decisions recorded, in order: (endpoint, prompt tokens).
    records: Vec<(u16, Vec<u32>)>,
    model: &'static str,
    query: Vec<u32>,
    /// Blocks held per endpoint, sorted.
    want: Vec<(u16, usize)>,
}

fn cases() -> Vec<Case> {
    let case = |name, records, query, want| Case {
        name,
        records,
        model: "m",
        query,
        want,
    };
    vec![
        case(
            "an empty index matches nothing",
            vec![],
            range(0, 16),
            vec![],
        ),
        case(
            "a routed prompt is held whole by its endpoint",
            vec![(1, range(0, 16))],
            range(0, 16),
            vec![(1, 4)],
        ),
        case(
            "a shared beginning matches up to the first different block",
            vec![(1, range(0, 16))],
            [range(0, 8), range(100, 108)].concat(),
            vec![(1, 2)],
        ),
        case(
            "a different first block matches nothing",
            vec![(1, range(0, 16))],
            [vec![99], range(1, 16)].concat(),
            vec![],
        ),
        case(
            "each endpoint matches its own prefix",
            vec![(1, range(0, 16)), (2, range(0, 8))],
            range(0, 16),
            vec![(1, 4), (2, 2)],
        ),
        case(
            "a longer prompt matches the recorded part",
            vec![(1, range(0, 8))],
            range(0, 16),
            vec![(1, 2)],
        ),
        case(
            "a trailing partial block is neither recorded nor matched",
            vec![(1, range(0, 6))],
            range(0, 7),
            vec![(1, 1)],
        ),
        case(
            "a prompt shorter than a block records nothing",
            vec![(1, range(0, 3))],
            range(0, 16),
            vec![],
        ),
        case(
            "a gap in the recorded chain ends the match",
            vec![
                (1, range(0, 4)),
                (1, [range(0, 4), range(50, 54), range(8, 12)].concat()),
            ],
            range(0, 12),
            vec![(1, 1)],
        ),
        Case {
            model: "other",
            ..case(
                "blocks of another model do not match",
                vec![(1, range(0, 16))],
                range(0, 16),
                vec![],
            )
        },
    ]
}

#[test]
fn both_indexes_answer_every_case_alike() {
    for (kind, config) in &IMPLEMENTATIONS {
        for case in cases() {
            let indexes = Indexes::default();
            let source = config.bind(&indexes, None);
            let now = Instant::now();
            for (endpoint, tokens) in &case.records {
                record(&source, *endpoint, tokens, now);
            }
            let found = lookup(&source, case.model, &case.query, now);
            let mut got: Vec<(u16, usize)> = found
                .matches
                .iter()
                .map(|(e, n)| (e.0.port(), *n))
                .collect();
            got.sort_unstable();
            assert_eq!(got, case.want, "{kind}: {}", case.name);
        }
    }
}

#[test]
fn a_lookup_reports_its_blocks_and_tokens() {
    for (kind, config) in &IMPLEMENTATIONS {
        let indexes = Indexes::default();
        let source = config.bind(&indexes, None);
        let found = lookup(&source, "m", &range(0, 18), Instant::now());
        assert_eq!(found.hashes.len(), 4, "{kind}");
        assert_eq!(found.block_size, 4, "{kind}");
        assert_eq!(found.prompt_tokens, 18, "{kind}");
        assert_eq!(found.token_cap, 400, "{kind}");
        assert_eq!(source.prompt_text_cap(), 400 * 8, "{kind}");
    }
}

#[test]
fn credit_never_lowers_what_an_endpoint_holds_and_goes_to_a_candidate() {
    for (kind, config) in &IMPLEMENTATIONS {
        let indexes = Indexes::default();
        let source = config.bind(&indexes, None);
        let now = Instant::now();
        record(&source, 2, &range(0, 8), now);
        let found = lookup(&source, "m", &range(0, 16), now);
        for pod in pods() {
            assert!(found.scored(pod.id) >= found.held(pod.id), "{kind}");
        }
        if let Some((id, blocks)) = found.credited {
            assert!(pods().iter().any(|p| p.id == id), "{kind}");
            assert!(blocks <= found.hashes.len(), "{kind}");
        }
    }
}

#[test]
fn forgotten_endpoints_match_nothing() {
    for (kind, config) in &IMPLEMENTATIONS {
        let indexes = Indexes::default();
        let source = config.bind(&indexes, None);
        let now = Instant::now();
        record(&source, 1, &range(0, 16), now);
        record(&source, 2, &range(0, 16), now);
        indexes.retain(&[ep(2)].into_iter().collect());
        let found = lookup(&source, "m", &range(0, 16), now);
        assert_eq!(found.matches, vec![(ep(2), 4)], "{kind}");
    }
}

#[test]
fn recording_twice_holds_the_prompt_once() {
    for (kind, config) in &IMPLEMENTATIONS {
        let indexes = Indexes::default();
        let source = config.bind(&indexes, None);
        let now = Instant::now();
        record(&source, 1, &range(0, 16), now);
        record(&source, 1, &range(0, 16), now);
        let found = lookup(&source, "m", &range(0, 16), now);
        assert_eq!(found.matches, vec![(ep(1), 4)], "{kind}");
    }
}

/// Where the indexes differ by design, each side is pinned here.
#[test]
fn precise_entries_expire_and_reach_the_sink() {
    struct Sink(std::sync::Mutex<Vec<(EndpointId, usize)>>);
    impl PlacementSink for Sink {
        fn placed(&self, endpoint: EndpointId, keys: &[u64], _ttl: Duration) {
            self.0.lock().unwrap().push((endpoint, keys.len()));
        }
    }
    let sink = Sink(Default::default());
    let indexes = Indexes::default();
    let source = PRECISE.bind(&indexes, Some(&sink));
    let now = Instant::now();
    record(&source, 1, &range(0, 16), now);
    assert_eq!(*sink.0.lock().unwrap(), vec![(ep(1), 4)]);
    let later = now + Duration::from_secs(61);
    assert!(lookup(&source, "m", &range(0, 16), later)
        .matches
        .is_empty());
    let off = Config::Precise(PreciseParams {
        speculative_ttl: None,
        ..PRECISE_PARAMS
    });
    let indexes = Indexes::default();
    let source = off.bind(&indexes, None);
    record(&source, 1, &range(0, 16), now);
    assert!(lookup(&source, "m", &range(0, 16), now).matches.is_empty());
}

#[test]
fn only_epps_precise_scorer_credits_a_cold_prompts_home() {
    let indexes = Indexes::default();
    let now = Instant::now();
    let epp = PRECISE.bind(&indexes, None);
    assert!(
        lookup(&epp, "m", &range(0, 16), now).credited.is_some(),
        "the part nobody holds goes to its rendezvous home"
    );
    let split = Config::Precise(PreciseParams {
        credit_home: false,
        ..PRECISE_PARAMS
    });
    let llmd = split.bind(&indexes, None);
    assert_eq!(lookup(&llmd, "m", &range(0, 16), now).credited, None);
}

/// The approximate index past its match cap (4 blocks of 4 tokens here): the tail a prompt
/// carried past the cap is credited to the endpoint holding every hashed block, up to the new
/// prompt's own tail; the precise index hashes no further than its cap and credits nothing.
#[test]
fn a_prompt_past_the_cap_is_held_to_the_tail_last_sent_after_the_same_blocks() {
    let capped = |max_blocks| {
        Config::Approximate(ApproximateParams {
            max_blocks,
            ..match APPROXIMATE {
                Config::Approximate(p) => p,
                Config::Precise(_) => unreachable!(),
            }
        })
    };
    let config = capped(4);
    let indexes = Indexes::default();
    let source = config.bind(&indexes, None);
    let now = Instant::now();
    let short = lookup(&source, "m", &range(0, 16), now);
    assert_eq!((short.past_cap, short.tails.clone()), (0, vec![]));
    record(&source, 1, &range(0, 40), now);
    record(&source, 2, &range(0, 12), now);
    let found = lookup(&source, "m", &range(0, 30), now);
    assert_eq!(found.past_cap, 14);
    assert_eq!(
        found.tails,
        vec![(ep(1), 24)],
        "endpoint 2 does not hold the 4th block"
    );
    assert_eq!(
        found.held_past_cap(ep(1)),
        14,
        "no more than this prompt's own tail"
    );
    assert_eq!(found.held_past_cap(ep(2)), 0);
    // Room left: 1,000 blocks less 4 hashed and a 6-block tail (endpoint 1), 3 (endpoint 2).
    // In the order of the pods (endpoints 1, 2, 3).
    let room = source.room(&pods(), found.block_size);
    assert_eq!(room[0], Some((1000 - 10) * 4));
    assert_eq!(room[1], Some((1000 - 3) * 4));
    assert_eq!(room[2], None, "never recorded");
    let longer = lookup(&source, "m", &range(0, 100), now);
    assert_eq!(
        longer.held_past_cap(ep(1)),
        24,
        "no more than the tail recorded"
    );
    let other = lookup(&source, "m", &[range(0, 12), range(50, 90)].concat(), now);
    assert_eq!(
        other.held_past_cap(ep(1)),
        0,
        "it leaves the chain before the cap"
    );
    // The precise index credits no tail.
    let indexes = Indexes::default();
    let source = PRECISE.bind(&indexes, None);
    record(&source, 1, &range(0, 400), now);
    let found = lookup(&source, "m", &range(0, 420), now);
    assert_eq!((found.past_cap, found.held_past_cap(ep(1))), (0, 0));
    assert!(
        source.room(&pods(), 4).is_empty(),
        "nor does it size itself to the caches"
    );
}

use super::*;
use crate::config::plugin::params;
use crate::scheduling::lifecycle::Addresses;
use crate::scheduling::testing::{cand, metrics};
use crate::scheduling::Candidate;

fn producer(yaml: &str) -> Result<BurstPrefixProducer, String> {
    let v: serde_norway::Value = serde_norway::from_str(yaml).map_err(|e| e.to_string())?;
    params::<BurstPrefixProducer>(&v)
        .map_err(|e| e.to_string())?
        .validate()
        .map_err(|e| {
            e.iter()
                .map(|i| i.message.clone())
                .collect::<Vec<_>>()
                .join("; ")
        })
}

fn pods() -> Vec<Candidate> {
    (1..=3).map(|p| cand(p, 0.0, 0.0, 0)).collect()
}

/// `prompt` (text) joining `p`'s window at `now`.
fn join(p: &BurstPrefixProducer, prompt: &str, pods: &[Candidate], now: Instant) -> Seat {
    let prompt = Prompt::Text(prompt.into());
    let g = Gathering {
        model: "m",
        cache_salt: None,
        prompt: &prompt,
        candidates: pods,
        names: &Addresses,
        now,
    };
    p.gather(&g).unwrap().expect("a seat")
}

#[test]
fn parameters_default_as_upstream_and_every_problem_is_reported_at_once() {
    let p = producer("~").unwrap();
    assert_eq!(p.window(), Duration::from_millis(100));
    assert_eq!((p.block_size(), p.max_blocks()), (64, 2048));
    assert_eq!(p.rules().per_replica, None);
    assert_eq!(p.prompt_bytes(), 2048 * 64 * 4);
    let capped = producer("{maxPrefixTokensToMatch: 640, maxPerReplica: 2, balanceBy: tokens}");
    let capped = capped.unwrap();
    assert_eq!(capped.max_blocks(), 10);
    assert_eq!(capped.rules().per_replica, Some(2));
    assert!(capped.rules().by_tokens);
    assert_eq!(producer("{balanceBy: ''}").unwrap().balance_by, "requests");
    let all = producer(
        "{windowDurationMs: 0, maxPerReplica: 0, blockSizeTokens: 0, maxPrefixTokensToMatch: -1, \
         minColocateBlocks: -1, maxBatchSize: 0, balanceBy: bytes}",
    )
    .unwrap_err();
    for parameter in [
        "windowDurationMs must be > 0",
        "maxPerReplica must be -1 (unlimited) or >= 1",
        "blockSizeTokens must be > 0",
        "maxPrefixTokensToMatch must be >= 0",
        "minColocateBlocks must be >= 0",
        "maxBatchSize must be -1 (unlimited) or >= 1",
        "balanceBy must be \"requests\" or \"tokens\"",
    ] {
        assert!(all.contains(parameter), "{parameter} in {all}");
    }
    for bad in [
        "{windowDurationMs: 10001}",
        "{maxPrefixTokensToMatch: 32}",
        "{windowDuration: 5}",
    ] {
        assert!(producer(bad).is_err(), "{bad}");
    }
    assert!(producer("{windowDurationMs: 10000, maxBatchSize: -1}").is_ok());
}

#[test]
fn prompts_are_cut_into_chained_blocks_of_pseudo_tokens_the_last_one_partial() {
    let p = producer("{blockSizeTokens: 2}").unwrap();
    let hashes = |text: &str| {
        let prompt = Prompt::Text(text.into());
        p.hashes(&Gathering {
            model: "m",
            cache_salt: None,
            prompt: &prompt,
            candidates: &[],
            names: &Addresses,
            now: Instant::now(),
        })
    };
    // 8 bytes per block of two 4-byte pseudo-tokens.
    assert_eq!(hashes("Hi").len(), 1, "a short prompt is one partial block");
    assert_eq!(hashes("0123456789abcdefXY").len(), 3);
    assert_eq!(
        hashes("0123456789abcdef")[..2],
        hashes("0123456789abcdefXY")[..2]
    );
    assert!(hashes("").is_empty());
    let capped = producer("{blockSizeTokens: 2, maxPrefixTokensToMatch: 4}").unwrap();
    let prompt = Prompt::Tokens((0..100).collect());
    let g = Gathering {
        model: "m",
        cache_salt: None,
        prompt: &prompt,
        candidates: &[],
        names: &Addresses,
        now: Instant::now(),
    };
    assert_eq!(capped.hashes(&g).len(), 2);
}

#[test]
fn a_window_places_its_identical_requests_together_once_it_closes() {
    let p = producer("{windowDurationMs: 50}").unwrap();
    let mut pods = pods();
    // The first pod is busier: the burst goes to the second.
    pods[0].metrics = Some(metrics(0.0, 3.0, 0.0));
    let t0 = Instant::now();
    let seats: Vec<Seat> = (0..4)
        .map(|i| {
            join(
                &p,
                "the same prompt",
                &pods,
                t0 + Duration::from_millis(i * 10),
            )
        })
        .collect();
    let lone = join(&p, "another prompt", &pods, t0 + Duration::from_millis(40));
    assert!(seats
        .iter()
        .all(|s| s.until == t0 + Duration::from_millis(50)));
    let placed: Vec<Placement> = seats.iter().filter_map(Seat::placement).collect();
    assert_eq!(placed.len(), 4);
    assert!(placed
        .iter()
        .all(|pl| pl.endpoint == pods[1].id && pl.blocks == 1));
    assert_eq!(placed[0].instance, p.instance());
    assert_eq!(
        lone.placement(),
        None,
        "a request sharing nothing gets no affinity"
    );
    // The window closed: a later request opens a new one.
    let next = join(&p, "the same prompt", &pods, t0 + Duration::from_millis(60));
    assert_eq!(next.until, t0 + Duration::from_millis(110));
    assert_eq!(next.placement(), None, "alone in its window");
}

#[test]
fn a_full_window_refuses_and_a_placed_one_takes_no_more() {
    let p = producer("{maxBatchSize: 2}").unwrap();
    let pods = pods();
    let t0 = Instant::now();
    let a = join(&p, "x", &pods, t0);
    let _b = join(&p, "x", &pods, t0);
    let prompt = Prompt::Text("x".into());
    let g = Gathering {
        model: "m",
        cache_salt: None,
        prompt: &prompt,
        candidates: &pods,
        names: &Addresses,
        now: t0,
    };
    let err = p.gather(&g).unwrap_err();
    assert_eq!(
        err.to_string(),
        "burst prefix batch full: maxBatchSize 2 reached"
    );
    // Placed (early, by an abandoned request's neighbour): the next request opens a window.
    assert!(a.placement().is_some());
    let c = join(&p, "x", &pods, t0);
    assert_eq!(c.placement(), None);
}

#[test]
fn an_abandoned_seat_neither_leaks_nor_holds_the_window() {
    let p = producer("~").unwrap();
    let pods = pods();
    let t0 = Instant::now();
    let gone = join(&p, "x", &pods, t0);
    let kept = join(&p, "x", &pods, t0);
    drop(gone);
    assert_eq!(kept.placement().map(|pl| pl.endpoint), Some(pods[0].id));
    drop(kept);
    // The producer keeps only the last window, which the next request replaces.
    let later = join(&p, "y", &pods, t0 + Duration::from_secs(1));
    drop(later);
    let open = p.windows.lock();
    assert_eq!(Arc::strong_count(open.as_ref().unwrap()), 1);
}

#[test]
fn the_sample_configuration_loads_and_binds_the_prefix_scorer_to_the_producer() {
    let text = include_str!("../../../../config/examples/llm-d-burst-prefix.yaml");
    let load = crate::config::LoadOptions {
        allow_experimental: true,
    };
    let build = |text: &str| crate::director::Runtime::build_with(text, None, load);
    let r = build(text).unwrap_or_else(|e| panic!("{e}"));
    assert!(r.scheduler.gathers());
    let (index, floor) = r.scheduler.prefix_index();
    assert!(
        index.is_none(),
        "the scorer reads the producer, not a prefix index"
    );
    assert_eq!(floor, 2048 * 64 * 4);
    let unknown = text.replace(
        "prefixMatchInfoProducerName: burst-prefix-cache-producer",
        "prefixMatchInfoProducerName: nobody",
    );
    let Err(err) = build(&unknown) else {
        panic!("a producer name no plugin has loads");
    };
    assert!(
        err.to_string().contains("burst-prefix-cache-producer"),
        "{err}"
    );
}

//! Fuzz target bodies: each takes arbitrary bytes, drives one parser or state machine of epp,
//! and panics only when an invariant breaks (a crash is a finding).
//!
//! Why here and not in the fuzz crate: the CI machine has stable Rust only, so the normal test
//! suite runs these same bodies over the committed seed corpus plus seeded mutations
//! (`e2e/tests/fuzz_smoke.rs`), while `hack/fuzz` (cargo-fuzz, nightly) runs them under
//! libFuzzer for millions of executions. Not an API: hidden from the docs.

use crate::datastore::Datastore;
use crate::endpoint::{Endpoint, EndpointId, EngineType};
use crate::extproc::stream::{Limits, Services, StreamMachine};
use crate::kvevents::decode::{decode_batch, KvEvent};
use crate::prefix::precise::{PreciseIndex, Stored};
use crate::request::tokenize::{Tokenizer, Vocabulary};
use crate::request::{self, scan::Scanner, ApiKind};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

pub(crate) mod extproc_input;

/// A target: the name of its cargo-fuzz binary and corpus directory, and its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target.
pub const TARGETS: &[Target] = &[
    ("request_parser", request_parser),
    ("prefix_hasher", prefix_hasher),
    ("prometheus_text", prometheus_text),
    ("kv_events", kv_events),
    ("picker_config", picker_config),
    ("extproc_stream", extproc_stream),
];

const APIS: [ApiKind; 5] = [
    ApiKind::Completions,
    ApiKind::ChatCompletions,
    ApiKind::Responses,
    ApiKind::Embeddings,
    ApiKind::Conversations,
];

/// The model span holds the model, and rewriting it changes nothing else the parser reads.
fn rewrite_changes_the_model_only(
    api: ApiKind,
    body: &[u8],
    cap: usize,
    req: &request::LlmRequest,
) {
    let quoted = body
        .get(req.model_span.clone())
        .unwrap_or_else(|| panic!("model span {:?} outside the body", req.model_span));
    let model: String = serde_json::from_slice(quoted)
        .unwrap_or_else(|e| panic!("model span is not a JSON string: {e}"));
    assert_eq!(model, req.model, "the model span holds the model");
    let rewritten = request::rewrite_model(body, &req.model_span, "fuzz/model\"é");
    let again = request::parse(api, &rewritten, cap)
        .unwrap_or_else(|e| panic!("a rewritten body no longer parses: {e}"));
    assert_eq!(
        (again.model.as_str(), again.stream, &again.prompt),
        ("fuzz/model\"é", req.stream, &req.prompt),
        "the rewrite changes the model only"
    );
}

/// Request bodies: the whole-body parser, the model rewrite, and the incremental scanner fed
/// in two chunks. Byte 0 picks the API, the prompt cap and the chunk boundary.
pub fn request_parser(data: &[u8]) {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    let api = APIS[usize::from(sel % 5)];
    let cap = usize::from(sel >> 3) * 32;
    let whole = request::parse(api, body, cap);
    if let Ok(req) = &whole {
        rewrite_changes_the_model_only(api, body, cap, req);
    }
    // llm-d-router v0.10's other parsers read the same bytes (no early scan for them).
    for native in [
        ApiKind::Messages,
        ApiKind::VllmGenerate,
        ApiKind::SglangGenerate,
        ApiKind::VertexChatCompletions,
        ApiKind::VertexRawPredict,
        ApiKind::VllmGrpcGenerate,
        ApiKind::VllmGrpcEmbed,
    ] {
        match request::parse(native, body, cap) {
            Ok(req) if native.rewrites_model() => {
                rewrite_changes_the_model_only(native, body, cap, &req);
            }
            Ok(req) => assert!(
                req.model_span.is_empty(),
                "SGLang's and the gRPC parsers' models are never rewritten"
            ),
            Err(_) => {}
        }
    }
    let cut = usize::from(sel).wrapping_mul(7) % (body.len() + 1);
    let mut scanner = Scanner::new();
    scanner.feed(&body[..cut]);
    let early_half = scanner.early_request(api, &body[..cut], cap);
    scanner.feed(&body[cut..]);
    let early = early_half.or_else(|| scanner.early_request(api, body, cap));
    if let (Some(e), Ok(w)) = (early, whole) {
        assert_eq!(
            (&e.model, &e.model_span),
            (&w.model, &w.model_span),
            "an early decision uses the whole body's model"
        );
        // Documented exceptions (README, "Early decision"): `cache_salt`, chat `tools` and
        // responses `instructions` count only if they arrive before the decision point.
        if e.cache_salt.is_some() {
            assert_eq!(
                e.cache_salt, w.cache_salt,
                "an early cache_salt is the whole body's"
            );
        }
        let late_fields = [&b"\"tools\""[..], b"\"instructions\"", b"\\"]
            .iter()
            .any(|f| body.windows(f.len()).any(|w| w == *f));
        // A cap of 0 is what epp asks of the scan when no scorer reads the prompt (the
        // director's `early_prompt_bytes`), and the scan then skips it; the whole-body parse is
        // never asked for 0 (its cap is at least 4 KiB), so there is nothing to compare.
        if !late_fields && cap > 0 {
            assert_eq!(
                e.prompt, w.prompt,
                "an early decision sees the whole body's prompt prefix"
            );
        }
    }
}

fn tokenizer() -> Option<&'static Tokenizer> {
    static TOKENIZER: OnceLock<Option<Tokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| Tokenizer::new(Vocabulary::Cl100kBase).ok())
        .as_ref()
}

/// Prompt text → tokens → chained block hashes. Byte 0 picks the token cap, block size and
/// block cap; the rest is the prompt (lossy UTF-8, as a JSON string could carry it). The rest,
/// folded to ASCII, must also be cut by the hand-written cl100k pre-tokenizer exactly where
/// the regex pre-tokenizer cuts it.
pub fn prefix_hasher(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let ascii: String = rest.iter().map(|&b| char::from(b & 0x7F)).collect();
    let mut pieces: Vec<&[u8]> = Vec::new();
    crate::request::bpe::pretokenize::cl100k_ascii_pieces(ascii.as_bytes(), |p| pieces.push(p));
    let mut regex: Vec<&[u8]> = Vec::new();
    let Some(pre) = crate::request::bpe::Encoder::cl100k()
        .ok()
        .and_then(|e| e.pretokenizer())
    else {
        panic!("the cl100k vocabulary or its pre-tokenizer failed to load")
    };
    pre.split(&ascii, |p| regex.push(p));
    assert_eq!(
        pieces, regex,
        "ASCII pre-tokenizer and regex disagree on {ascii:?}"
    );
    let text = String::from_utf8_lossy(rest);
    let max_tokens = 1 + usize::from(sel) * 2;
    let Some(tok) = tokenizer() else {
        panic!("the cl100k vocabulary failed to load")
    };
    let tokens = tok.encode_prefix(&text, max_tokens);
    assert!(
        tokens.len() <= max_tokens,
        "{} tokens for a cap of {max_tokens}",
        tokens.len()
    );
    let block = 1 + usize::from(sel % 16);
    let max_blocks = 1 + usize::from(sel / 16);
    let hashes = crate::prefix::block_hashes("m", Some("salt"), &tokens, block, max_blocks);
    assert_eq!(hashes.len(), (tokens.len() / block).min(max_blocks));
    let mut parent = crate::prefix::chain_seed("m", Some("salt"));
    for (chunk, h) in tokens.chunks_exact(block).zip(&hashes) {
        parent = crate::prefix::chain_block(parent, chunk);
        assert_eq!(parent, *h, "block hashes chain");
    }
    let raw: Vec<u32> = rest
        .chunks(4)
        .map(|c| c.iter().fold(0u32, |a, &b| a << 8 | u32::from(b)))
        .collect();
    let raw_hashes = crate::prefix::block_hashes("", None, &raw, usize::from(sel), usize::MAX);
    assert_eq!(raw_hashes.len(), raw.len() / usize::from(sel).max(1));
}

/// A model server's `/metrics` text: the sample parser and the per-engine extraction.
pub fn prometheus_text(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    // A line with labels but no name (`{a="b"} 1`) yields a sample named "" that no lookup
    // matches: lenient, not wrong, so names are not checked here.
    let mut count = 0;
    for s in crate::scrape::parse::samples(&text) {
        let _ = (s.name, s.label("model_name"));
        count += 1;
    }
    assert!(count <= text.lines().count(), "at most one sample per line");
    let now = Instant::now();
    for engine in [
        EngineType::Vllm,
        EngineType::Sglang,
        EngineType::TrtllmServe,
        EngineType::TritonTrtllm,
    ] {
        let _ = crate::scrape::parse::extract(&text, engine, now);
    }
}

/// A KV-event payload (msgpack), decoded and applied to a fresh precise index as the
/// subscriber does.
pub fn kv_events(data: &[u8]) {
    let Ok(batch) = decode_batch(data) else {
        return;
    };
    let index = PreciseIndex::new();
    let endpoint = EndpointId("10.0.0.1:8000".parse().unwrap_or_else(|e| panic!("{e}")));
    let mut stored_keys = Vec::new();
    {
        let mut w = index.writer(endpoint);
        for event in &batch.events {
            match event {
                KvEvent::BlockStored {
                    block_hashes,
                    parent_block_hash,
                    token_ids,
                    block_size,
                    lora_name,
                    ..
                } => {
                    let model = lora_name.as_deref().unwrap_or("m");
                    w.store(&Stored {
                        model,
                        parent: *parent_block_hash,
                        hashes: block_hashes,
                        tokens: token_ids,
                        block_size: *block_size,
                    });
                    stored_keys.extend(
                        token_ids
                            .chunks_exact((*block_size).max(1))
                            .map(|b| crate::prefix::chain_block(0, b)),
                    );
                }
                KvEvent::BlockRemoved { block_hashes, .. } => w.remove(block_hashes),
                KvEvent::AllBlocksCleared => w.clear(),
                KvEvent::Unknown => {}
            }
        }
    }
    let _ = index.longest_prefix(&stored_keys, Instant::now());
    let _ = index.heap_bytes();
    if matches!(batch.events.last(), Some(KvEvent::AllBlocksCleared)) {
        assert_eq!(index.entries(), 0, "a clear empties the endpoint's entries");
    }
}

/// An EndpointPickerConfig document: parse, check and decode every plugin and build the
/// scheduler (what a reload does, minus loading a tokenizer vocabulary).
pub fn picker_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(doc) = crate::config::parse_document(text) else {
        return;
    };
    if let Ok(c) = crate::config::Config::decode(&doc, Default::default()) {
        let _ = (c.scheduler.prefix_params(), c.scheduler.precise_params());
    }
}

/// The pool every `extproc_stream` input routes to.
pub const FUZZ_ENDPOINTS: [&str; 3] = ["10.0.0.1:8000", "10.0.0.2:8000", "[fd00::3]:8000"];

fn director() -> &'static (Arc<Services>, Arc<Datastore>) {
    static DIRECTOR: OnceLock<(Arc<Services>, Arc<Datastore>)> = OnceLock::new();
    DIRECTOR.get_or_init(|| {
        let endpoints = FUZZ_ENDPOINTS
            .iter()
            .filter_map(|e| e.parse().ok())
            .map(|a| Endpoint::from_id(EndpointId(a)))
            .collect();
        let graph = crate::fixtures::graph(crate::config::DEFAULT_CONFIG)
            .endpoints(endpoints)
            .build();
        (graph.services(), graph.datastore)
    })
}

/// One ext_proc stream: an arbitrary sequence of Envoy messages (see [`extproc_input`] for the
/// encoding) through the real per-stream state machine and director. Invariants: the
/// destination epp sets is always a pool endpoint (a client cannot choose its own, whatever
/// headers it sends), and no in-flight count outlives the stream.
pub fn extproc_stream(data: &[u8]) {
    for dest in stream_destinations(data) {
        assert!(
            dest.split(',').all(|d| FUZZ_ENDPOINTS.contains(&d.trim())),
            "epp set destination {dest:?}, not a pool endpoint"
        );
    }
}

/// Runs one `extproc_stream` input; returns every destination epp's responses named.
///
/// Streams run one at a time: the leak check below reads every endpoint's in-flight count of
/// the shared director, which a stream running concurrently (another test of the same binary)
/// would hold.
pub fn stream_destinations(data: &[u8]) -> Vec<String> {
    static EXCLUSIVE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = EXCLUSIVE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let (services, datastore) = director();
    let limits = Limits {
        max_body_bytes: 8192,
        body_timeout: Duration::from_secs(60),
        ..Limits::default()
    };
    let mut machine = StreamMachine::new(Arc::clone(services), limits);
    let mut out = Vec::new();
    let mut seen = Vec::new();
    for step in extproc_input::decode(data) {
        match step {
            extproc_input::Step::Message(msg) => machine.handle(*msg, &mut out),
            extproc_input::Step::BodyTimeout if machine.awaiting_decision() => {
                machine.on_body_timeout(&mut out)
            }
            extproc_input::Step::BodyTimeout => {}
        }
        seen.extend(out.drain(..).flat_map(|r| extproc_input::destinations(&r)));
    }
    let _ = machine.interrupted();
    drop(machine);
    for s in datastore.snapshot().iter() {
        assert_eq!(
            s.inflight(),
            0,
            "in-flight count of {} leaked by a finished stream",
            s.endpoint.name
        );
    }
    seen
}

//! A hand-written `tokenizer.json`: merge order, added tokens, NFC, ignore_merges, refusals.
//! (Agreement with the real `tokenizers` library on a trained vocabulary: e2e/tests/hf_tokenizer.rs.)

use super::*;
use serde_json::json;

/// Ids: a=0 b=1 c=2 Ġ=3 ab=4 bc=5 abc=6 Ġa=7 <s>=8 Ã=9 ©=10 Ã©=11 1=12 2=13 12=14.
fn tiny(merges: &[&str], extra: serde_json::Value) -> serde_json::Value {
    let mut file = json!({
        "version": "1.0",
        "added_tokens": [{"id": 8, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": {"a": 0, "b": 1, "c": 2, "Ġ": 3, "ab": 4, "bc": 5, "abc": 6, "Ġa": 7, "<s>": 8, "Ã": 9, "©": 10, "Ã©": 11, "1": 12, "2": 13, "12": 14},
            "merges": merges,
        }
    });
    if let (Some(f), Some(e)) = (file.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            if k == "model" {
                for (mk, mv) in v.as_object().unwrap() {
                    f["model"][mk] = mv.clone();
                }
            } else {
                f.insert(k.clone(), v.clone());
            }
        }
    }
    file
}

fn encode(file: &serde_json::Value, text: &str) -> Vec<u32> {
    HfTokenizer::from_json(file).unwrap().encode(text)
}

#[test]
fn merges_follow_rank_not_token_id() {
    let bc_first = tiny(&["b c", "a b", "a bc", "Ġ a"], json!({}));
    assert_eq!(encode(&bc_first, "abc"), [6], "b+c (rank 0), then a+bc");
    let ab_first = tiny(&["a b", "b c", "a bc", "Ġ a"], json!({}));
    assert_eq!(
        encode(&ab_first, "abc"),
        [4, 2],
        "a+b first leaves c: there is no ab+c merge"
    );
    // GPT-2 regex pieces: " abc" / " ab" / "<s>" (added) / "a"; x is in no token and dropped.
    assert_eq!(encode(&bc_first, " abc ab<s>ax"), [3, 6, 3, 4, 8, 0]);
    assert_eq!(encode(&bc_first, " a"), [7]);
    assert!(encode(&bc_first, "").is_empty());
}

#[test]
fn array_merges_json_form_is_read_too() {
    let file = tiny(&[], json!({"model": {"merges": [["b", "c"], ["a", "bc"]]}}));
    assert_eq!(encode(&file, "abc"), [6]);
}

#[test]
fn added_tokens_are_cut_out_longest_first_and_prefix_space_applies_per_piece() {
    let file = tiny(
        &["a b"],
        json!({
            "added_tokens": [
                {"id": 8, "content": "<s>", "special": true},
                {"id": 6, "content": "<s>abc", "special": true},
            ],
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": true, "use_regex": false},
        }),
    );
    assert_eq!(
        encode(&file, "<s>abc<s>ab"),
        [6, 8, 3, 4],
        "longest added token wins; ' ab' gets Ġ"
    );
}

#[test]
fn nfc_normalizer_composes_before_byte_mapping() {
    let merges = ["Ã ©"];
    let nfc = tiny(
        &merges,
        json!({"normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}]}}),
    );
    assert_eq!(
        encode(&nfc, "e\u{301}"),
        [11],
        "e + combining acute → é = C3 A9 = Ã©"
    );
    assert_eq!(encode(&tiny(&merges, json!({})), "é"), [11]);
    assert!(
        encode(&tiny(&merges, json!({})), "e\u{301}").is_empty(),
        "without NFC no token covers these bytes"
    );
}

#[test]
fn ignore_merges_takes_whole_words_from_the_vocabulary() {
    let merges = ["a b", "b c"];
    assert_eq!(encode(&tiny(&merges, json!({})), "abc"), [4, 2]);
    assert_eq!(
        encode(
            &tiny(&merges, json!({"model": {"ignore_merges": true}})),
            "abc"
        ),
        [6]
    );
}

#[test]
fn split_steps_run_before_byte_level() {
    let file = tiny(
        &["1 2", "a b"],
        json!({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\p{N}{1,1}"}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
        ]}}),
    );
    assert_eq!(
        encode(&file, "12ab"),
        [12, 13, 4],
        "digits isolated one by one, so 1+2 never merge"
    );
}

#[test]
fn long_runs_merge_in_n_log_n() {
    let file = tiny(
        &["a b", "ab ab"],
        json!({"model": {"vocab": {"a": 0, "b": 1, "ab": 2, "abab": 3}}}),
    );
    let t = HfTokenizer::from_json(&file).unwrap();
    let started = std::time::Instant::now();
    let ids = t.encode(&"ab".repeat(100_000));
    assert_eq!(ids.len(), 50_000);
    assert!(ids.iter().all(|&i| i == 3));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn unsupported_shapes_are_refused_by_name() {
    let cases = [
        (
            json!({"model": {"type": "WordPiece"}}),
            "model type WordPiece",
        ),
        (json!({"model": {"byte_fallback": true}}), "byte_fallback"),
        (
            json!({"model": {"continuing_subword_prefix": "##"}}),
            "continuing_subword_prefix",
        ),
        (
            json!({"normalizer": {"type": "Lowercase"}}),
            "normalizer Lowercase",
        ),
        (
            json!({"pre_tokenizer": {"type": "Metaspace"}}),
            "pre_tokenizer Metaspace",
        ),
        (json!({"pre_tokenizer": null}), "without a final ByteLevel"),
        (
            json!({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Removed"}}),
            "behavior Removed",
        ),
        (
            json!({"added_tokens": [{"id": 8, "content": "<s>", "lstrip": true}]}),
            "lstrip",
        ),
        (
            json!({"model": {"merges": ["a q"]}}),
            "\"q\" is not in the vocabulary",
        ),
    ];
    for (extra, expected) in cases {
        let err = HfTokenizer::from_json(&tiny(&[], extra))
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "{err:?} should name {expected:?}");
    }
    let missing = HfTokenizer::from_file(Path::new("/nonexistent/tokenizer.json")).unwrap_err();
    assert!(missing.to_string().contains("/nonexistent/tokenizer.json"));
}

#[test]
fn byte_map_is_gpt2s() {
    let chars = model::byte_chars();
    assert_eq!(
        (
            chars[b' ' as usize],
            chars[b'\n' as usize],
            chars[b'!' as usize],
            chars[0xad]
        ),
        ('Ġ', 'Ċ', '!', 'Ń')
    );
    let distinct: std::collections::HashSet<char> = chars.iter().copied().collect();
    assert_eq!(distinct.len(), 256);
}

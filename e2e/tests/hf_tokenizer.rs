#![allow(clippy::unwrap_used)]
//! epp's `tokenizer.json` loader (src/request/hf.rs) against Hugging Face's `tokenizers`, the
//! library vLLM tokenizes with: a byte-level BPE tokenizer is trained in Python on a generated
//! corpus (tests/hf_py/tok.py, venv under target/ created once by tests/hf_py/venv.sh), loaded
//! by epp through an EndpointPickerConfig's llm-d keys, and both give token ids for the same
//! texts (ASCII, code, CJK, emoji, whitespace runs, CRLF, added special tokens, long texts that
//! cross the segment cache's boundaries). Every id must be equal.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use epp::director::Runtime;
use epp::request::hf::HfTokenizer;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

fn py_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/hf_py")
}

fn target() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target")
}

async fn python() -> String {
    let out = Command::new("bash")
        .arg(py_dir().join("venv.sh"))
        .arg(target())
        .stderr(Stdio::inherit())
        .output()
        .await
        .expect("venv.sh runs");
    assert!(out.status.success(), "venv.sh failed");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

async fn run_py(args: &[&str], stdin: &[u8]) -> Vec<u8> {
    let mut child = Command::new(python().await)
        .arg(py_dir().join("tok.py"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin).await.unwrap();
    drop(input);
    let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("tok.py finishes")
        .unwrap();
    assert!(out.status.success(), "tok.py {args:?} failed");
    out.stdout
}

/// Trains a tokenizer of `style` into `dir/file`.
async fn train(style: &str, file: &Path) {
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    run_py(&["train", file.to_str().unwrap(), style], b"").await;
}

const ATOMS: [&str; 44] = [
    "a",
    "Hello",
    " world",
    " ",
    "  ",
    "   ",
    "\n",
    "\n\n",
    "\r\n",
    "\t",
    " \n ",
    "'s",
    "'LL",
    "DON'T",
    "12",
    "1234567",
    "?!",
    "...",
    "->",
    "fn main() {",
    "}",
    "==",
    "__init__",
    "中文",
    "日本語の",
    "한국어",
    "你好，世界！",
    "e\u{301}",
    "ß",
    "😀",
    "👍🏽",
    "👨\u{200d}👩\u{200d}👧",
    "🇫🇷",
    "\u{a0}",
    "\u{3000}",
    "—",
    "’s",
    "camelCase",
    "x/y",
    "<|eot_id|>",
    "<|eot_id",
    "<|im_start|>user\n",
    "model server",
    " routing",
];

fn texts() -> Vec<String> {
    let code = include_str!("../../src/request/hf.rs");
    let mut texts: Vec<String> = vec![
        String::new(),
        " ".into(),
        "Hello world".into(),
        "  leading and trailing  ".into(),
        " ".repeat(300),
        "\n".repeat(50),
        "x".repeat(3000),
        "1234567890".repeat(40),
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>"
            .into(),
        code.to_owned(),
        "机器学习模型，中文分词测试。".repeat(400),
        "the quick brown fox jumps over the lazy dog, again and again. ".repeat(300),
        format!(
            "{}\n\n{}",
            "A paragraph of prose. ".repeat(100),
            "fn main() {\n    println!(\"{}\", x);\n}\n".repeat(100)
        ),
        ["😀"; 300].concat(),
    ];
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    for round in 0..400 {
        let mut s = String::new();
        let len = 1 + (state % if round % 10 == 0 { 6000 } else { 300 }) as usize;
        while s.len() < len {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            match state % 7 {
                // Any character of the BMP's first 12K (controls, odd spaces, marks) or astral.
                0 => s.extend(char::from_u32((state >> 40) as u32 % 0x3000)),
                1 => s.extend(char::from_u32(0x1_0000 + (state >> 40) as u32 % 0x2_0000)),
                _ => s.push_str(ATOMS[(state >> 32) as usize % ATOMS.len()]),
            }
        }
        texts.push(s);
    }
    texts
}

fn config(indexer: &str) -> String {
    format!(
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: precise-prefix-cache-scorer\n  parameters:\n    indexerConfig:\n      tokenizersPoolConfig: {indexer}\n- type: max-score-picker\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: precise-prefix-cache-scorer\n  - pluginRef: max-score-picker\n"
    )
}

/// Ids from Python, from the loader directly, and from the runtime the config builds (which
/// goes through the segment cache, twice: cold and warm).
async fn compare(file: &Path, config_text: &str) {
    let texts = texts();
    let started = std::time::Instant::now();
    let expected: Vec<Vec<u32>> = serde_json::from_slice(
        &run_py(
            &["encode", file.to_str().unwrap()],
            &serde_json::to_vec(&texts).unwrap(),
        )
        .await,
    )
    .unwrap();
    let python = started.elapsed();
    let direct = HfTokenizer::from_file(file).unwrap();
    let runtime = Runtime::build(config_text, None).unwrap();
    let tokenizer = runtime
        .tokenizer
        .as_ref()
        .expect("the precise scorer's tokenizer");
    let mut tokens = 0;
    for (text, want) in texts.iter().zip(&expected) {
        assert_eq!(
            &direct.encode(text),
            want,
            "loader vs tokenizers on {text:?}"
        );
        for pass in ["cold", "warm"] {
            assert_eq!(
                &tokenizer.encode_prefix(text, usize::MAX / 16),
                want,
                "{pass} segment cache vs tokenizers on {text:?}"
            );
        }
        tokens += want.len();
    }
    assert!(tokens > 100_000, "the texts cover enough tokens ({tokens})");
    eprintln!(
        "{} texts, {tokens} tokens equal (python {python:?})",
        texts.len()
    );
    let again = Runtime::build(config_text, Some(&runtime)).unwrap();
    assert!(again.tokenizer.unwrap().is_built_from(
        &runtime
            .scheduler
            .precise_params()
            .unwrap()
            .tokenizer_source()
    ));
}

#[tokio::test]
async fn llama3_style_tokenizer_json_gives_the_libraries_ids() {
    let file = target().join("tmp/hf-tokenizer-test/llama3/tokenizer.json");
    train("llama3", &file).await;
    let indexer = format!(
        "{{modelName: my-llama, local: {{modelTokenizerMap: {{my-llama: {}}}}}}}",
        file.display()
    );
    compare(&file, &config(&indexer)).await;
}

#[tokio::test]
async fn gpt2_style_tokenizer_json_found_by_auto_discovery_gives_the_libraries_ids() {
    let root = target().join("tmp/hf-tokenizer-test/gpt2-models");
    let file = root.join("hub/models--acme--tiny-gpt/snapshots/0123abc/tokenizer.json");
    train("gpt2", &file).await;
    let indexer = format!(
        "{{modelName: acme/tiny-gpt, local: {{autoDiscoveryDir: {}}}}}",
        root.display()
    );
    compare(&file, &config(&indexer)).await;
}

#[tokio::test]
async fn a_missing_or_unsupported_tokenizer_is_a_config_error() {
    let dir = target().join("tmp/hf-tokenizer-test/bad");
    std::fs::create_dir_all(&dir).unwrap();
    let wordpiece = dir.join("tokenizer.json");
    std::fs::write(
        &wordpiece,
        r#"{"model": {"type": "WordPiece", "vocab": {}}, "pre_tokenizer": null}"#,
    )
    .unwrap();
    let cases = [
        (
            format!(
                "{{local: {{modelTokenizerMap: {{m: {}}}}}}}",
                wordpiece.display()
            ),
            "model type WordPiece",
        ),
        (
            format!(
                "{{local: {{modelTokenizerMap: {{m: {}/absent.json}}}}}}",
                dir.display()
            ),
            "absent.json",
        ),
        (
            format!(
                "{{modelName: other, local: {{modelTokenizerMap: {{m: {}}}}}}}",
                wordpiece.display()
            ),
            "no tokenizer for modelName \"other\"",
        ),
    ];
    for (indexer, expected) in cases {
        let err = Runtime::build(&config(&indexer), None)
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains(expected), "{err} should mention {expected}");
    }
}

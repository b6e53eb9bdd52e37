//! Writes the compact cl100k_base and o200k_base vocabularies that `src/request/bpe.rs` embeds
//! with `include_bytes!` and reads in place (layout: `src/request/bpe/table.rs`). The tokens come
//! from tiktoken-rs's own copies of OpenAI's files (token id = rank), so nothing is fetched and no
//! vocabulary file is committed. A few MB, against the ~50 MiB of automata and maps that
//! bpe-openai built from the same vocabularies at start-up.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

#[allow(dead_code)]
#[path = "src/request/bpe/table.rs"]
mod table;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=src/request/bpe/table.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let cl100k = tiktoken_rs::cl100k_base().expect("tiktoken-rs builds cl100k_base");
    write(&out.join("cl100k_base.bpe"), &tokens(&cl100k, 100_256));
    let o200k = tiktoken_rs::o200k_base().expect("tiktoken-rs builds o200k_base");
    write(&out.join("o200k_base.bpe"), &tokens(&o200k, 199_998));
}

/// The ordinary tokens, by rank: ranks 0.. up to the first one the vocabulary lacks (the special
/// tokens come after a gap). `expected` guards against a tiktoken-rs whose files changed.
fn tokens(bpe: &tiktoken_rs::CoreBPE, expected: usize) -> Vec<Vec<u8>> {
    let mut tokens = Vec::with_capacity(expected);
    while let Ok(bytes) = bpe.decode_bytes(&[u32::try_from(tokens.len()).expect("few tokens")]) {
        tokens.push(bytes);
    }
    assert_eq!(tokens.len(), expected, "unexpected vocabulary size");
    let distinct: HashSet<&[u8]> = tokens.iter().map(Vec::as_slice).collect();
    assert_eq!(distinct.len(), tokens.len(), "a token's bytes appear twice");
    for byte in 0..=255u8 {
        assert!(distinct.contains(&[byte][..]), "byte {byte} is no token");
    }
    tokens
}

fn write(path: &Path, tokens: &[Vec<u8>]) {
    let n = u32::try_from(tokens.len()).expect("few tokens");
    assert!(n < 1 << 24, "ids are 24 bits in a record");
    let bits = (2 * tokens.len()).next_power_of_two().trailing_zeros();
    let mask = (1usize << bits) - 1;
    let mut slots = vec![table::EMPTY; 1 << bits];
    let mut records = Vec::new();
    for (id, token) in (0u32..).zip(tokens) {
        assert!(records.len() < (1 << 24) - 1, "records too long for a slot");
        let h = table::hash(token);
        let mut i = table::home(h, bits);
        while slots[i] != table::EMPTY {
            i = (i + 1) & mask;
        }
        slots[i] = table::slot(records.len(), h);
        records.push(u8::try_from(token.len()).expect("tokens under 256 bytes"));
        records.extend_from_slice(token);
        records.extend_from_slice(&id.to_le_bytes()[..3]);
    }
    let mut file = Vec::new();
    file.extend_from_slice(table::MAGIC);
    file.extend_from_slice(&n.to_le_bytes());
    file.extend_from_slice(&bits.to_le_bytes());
    for slot in &slots {
        file.extend_from_slice(&slot.to_le_bytes());
    }
    file.extend_from_slice(&records);
    std::fs::write(path, file).expect("OUT_DIR is writable");
}

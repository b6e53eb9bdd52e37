//! Exactness against tiktoken-rs (the reference: OpenAI's own merge loop and regex) and bpe-openai.

use super::*;
use tiktoken_rs::CoreBPE;

fn encoders() -> [(&'static Encoder, &'static CoreBPE); 2] {
    [
        (
            Encoder::cl100k().unwrap(),
            tiktoken_rs::cl100k_base_singleton(),
        ),
        (
            Encoder::o200k().unwrap(),
            tiktoken_rs::o200k_base_singleton(),
        ),
    ]
}

/// xorshift64: seeded, so a failure is reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() >> 33) as usize % n
    }
}

const WORDS: [&str; 40] = [
    "the",
    " model",
    "Hello",
    " world",
    "DON'T",
    "'ll",
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "\n\n  ",
    "0",
    "42",
    "1234567",
    "3.14159",
    "½",
    "٣",
    "?!",
    "...",
    "->",
    "::",
    "{",
    "}",
    "fn main()",
    "// TODO",
    "__init__",
    "中文",
    "日本語のテキスト",
    "한국어",
    "e\u{301}",
    "Straße",
    "Σίσυφος",
    "العربية",
    "\u{a0}",
    "\u{3000}",
    "😀",
    "👨‍👩‍👧",
    "🇫🇷",
    "’s",
];

/// Varied texts: word salads over `WORDS`, random code points, random bytes made valid UTF-8,
/// long runs of one class, and source code.
fn texts() -> Vec<String> {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut texts: Vec<String> = vec![
        String::new(),
        " ".repeat(3000),
        "\n".repeat(700),
        " \t".repeat(900) + "x",
        "!".repeat(4000),
        "-=".repeat(2500) + "\n",
        "x".repeat(3000),
        "😀".repeat(300),
        "1234567890".repeat(60),
        "a\u{301}".repeat(200),
        "中文字符".repeat(400),
        include_str!("../tokenize.rs").to_owned(),
        include_str!("../bpe.rs").to_owned(),
    ];
    for _ in 0..400 {
        let mut s = String::new();
        let len = 1 + rng.below(300);
        while s.len() < len {
            match rng.below(5) {
                0 => s.extend(char::from_u32(rng.below(0x3_0000) as u32)),
                _ => s.push_str(WORDS[rng.below(WORDS.len())]),
            }
        }
        texts.push(s);
    }
    for _ in 0..200 {
        let bytes: Vec<u8> = (0..rng.below(200)).map(|_| rng.next() as u8).collect();
        texts.push(String::from_utf8_lossy(&bytes).into_owned());
    }
    texts
}

#[test]
fn ids_equal_tiktokens_on_varied_text() {
    let texts = texts();
    for (ours, reference) in encoders() {
        for text in &texts {
            assert_eq!(
                ours.encode(text),
                reference.encode_ordinary(text),
                "{:?} on {text:?}",
                ours.pattern
            );
        }
    }
}

#[test]
fn ids_equal_bpe_openais() {
    let texts = texts();
    let pairs = [
        (Encoder::cl100k().unwrap(), bpe_openai::cl100k_base()),
        (Encoder::o200k().unwrap(), bpe_openai::o200k_base()),
    ];
    for (ours, reference) in pairs {
        for text in texts.iter().step_by(3) {
            assert_eq!(ours.encode(text), reference.encode(text.as_str()));
        }
    }
}

/// 100 KB pieces: all spaces, all punctuation, all of one letter. tiktoken-rs merges pieces of
/// 100 bytes or more with a heap too, so it is a fair reference at this size.
#[test]
fn pathological_pieces_equal_tiktokens() {
    let long = [
        " ".repeat(100_000),
        "x ".repeat(50_000).replace(' ', ""),
        ".,;:!?".repeat(17_000),
        "é".repeat(50_000),
    ];
    for (ours, reference) in encoders() {
        for text in &long {
            assert_eq!(ours.encode(text), reference.encode_ordinary(text));
        }
    }
}

/// The heap and the scan merge alike on every piece both accept, including the pieces whose
/// merges tie on rank.
#[test]
fn heap_merges_equal_scan_merges() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    const ALPHABET: &[u8] = b"  \n\taaabbe.,!-=0123 \xe4\xb8\xad";
    for (ours, reference) in encoders() {
        for _ in 0..3000 {
            let len = 2 + rng.below(SHORT - 1);
            let piece: Vec<u8> = (0..len)
                .map(|_| ALPHABET[rng.below(ALPHABET.len())])
                .collect();
            let (mut scan, mut heap) = (Vec::new(), Vec::new());
            ours.merge_short(&piece, &mut scan);
            ours.merge_long(&piece, &mut heap);
            assert_eq!(scan, heap, "on {piece:?}");
            let bytes = reference.decode_bytes(&scan).unwrap();
            assert_eq!(bytes, piece, "the tokens spell the piece");
        }
    }
}

#[test]
fn every_token_is_found_by_its_bytes() {
    for (ours, reference) in encoders() {
        let n = ours.vocab.len();
        assert!(n == 100_256 || n == 199_998, "{n} tokens");
        for id in (0..n as u32).step_by(7) {
            let bytes = reference.decode_bytes(&[id]).unwrap();
            assert_eq!(ours.vocab.rank(&bytes), Some(id));
        }
        assert_eq!(ours.vocab.rank(b"no such token: 0123456789"), None);
    }
}

#[test]
fn pretokenizers_build() {
    for (ours, _) in encoders() {
        assert!(ours.pretokenizer().is_some());
    }
}

//! Pre-tokenization: cutting text into the pieces BPE encodes one by one, exactly where
//! tiktoken's regex cuts them.
//!
//! tiktoken's patterns end in `\s+(?!\S)|\s+`, a negative look-ahead that `regex-automata` does
//! not have. As in bpe-openai, the pattern is split into three, searched together with
//! leftmost-first priority (`meta::Regex::new_many`), anchored at the end of the previous piece:
//! the first is the pattern's head plus `\s+$` (a whitespace run that ends the text), the second
//! `\s+\s` stands for `\s+(?!\S)` — it matches one whitespace character too many, and that
//! character is given back — and the third is the plain `\s+`. A lazy DFA without look-around
//! is several times faster than a backtracking engine with it.
//!
//! cl100k_base's ASCII text skips the regex engine altogether ([`cl100k_ascii_pieces`]).

use regex_automata::meta::{BuildError, Regex};
use regex_automata::{Anchored, Input};

/// The pre-tokenizer of a vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pattern {
    Cl100k,
    O200k,
}

/// The head of each pattern, before tiktoken's `\s+(?!\S)|\s+`.
const CL100K_HEAD: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+";
const O200K_HEAD: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+",
);

/// A compiled pre-tokenizer (a few hundred KiB of automata: built only when first needed).
#[derive(Debug)]
pub(crate) struct Pretokenizer {
    regex: Regex,
}

/// Which of the three patterns matched one character of look-ahead.
const LOOKAHEAD: [bool; 3] = [false, true, false];

impl Pretokenizer {
    #[allow(clippy::result_large_err)] // built once per process
    pub(crate) fn new(pattern: Pattern) -> Result<Self, BuildError> {
        let head = match pattern {
            Pattern::Cl100k => CL100K_HEAD,
            Pattern::O200k => O200K_HEAD,
        };
        let first = format!(r"{head}|\s+$");
        let regex = Regex::new_many(&[first.as_str(), r"\s+\s", r"\s+"])?;
        Ok(Self { regex })
    }

    /// Calls `emit` with each piece of `text`, in order; the pieces concatenate to `text`.
    pub(crate) fn split<'a>(&self, text: &'a str, mut emit: impl FnMut(&'a [u8])) {
        let mut last = 0;
        while last < text.len() {
            let input = Input::new(text).range(last..).anchored(Anchored::Yes);
            let end = match self.regex.find(input) {
                Some(m) if LOOKAHEAD.get(m.pattern().as_usize()) == Some(&true) => {
                    let back = text[last..m.end()]
                        .chars()
                        .next_back()
                        .map_or(0, char::len_utf8);
                    m.end() - back
                }
                Some(m) => m.end(),
                None => last,
            };
            // The patterns match every character; should one not, it is a piece of its own
            // rather than a loop that never ends.
            let end = if end > last {
                end
            } else {
                last + text[last..].chars().next().map_or(1, char::len_utf8)
            };
            emit(&text.as_bytes()[last..end]);
            last = end;
        }
    }
}

/// cl100k_base's pre-tokenizer on ASCII text, without a regex engine. The pattern is
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
/// tried in that order at each position; in ASCII, `\p{L}` is `[A-Za-z]`, `\p{N}` is `[0-9]`
/// and `\s` is `[\t\n\x0B\x0C\r ]`. The lazy DFA behind the regex took about 60% of the
/// tokenizer's time (perf, `cold_text` in `e2e/benches/decision.rs`); this loop gives the same
/// pieces (`ascii_pieces_equal_the_regex`) in a fraction of it.
pub(crate) fn cl100k_ascii_pieces<'a>(s: &'a [u8], mut emit: impl FnMut(&'a [u8])) {
    let letter = |b: u8| b.is_ascii_alphabetic();
    let digit = |b: u8| b.is_ascii_digit();
    let space = |b: u8| matches!(b, b'\t' | b'\n' | 0x0B | 0x0C | b'\r' | b' ');
    let newline = |b: u8| b == b'\r' || b == b'\n';
    let other = |b: u8| !letter(b) && !digit(b) && !space(b);
    let at = |i: usize| s.get(i).copied().unwrap_or(0);
    let run = |mut i: usize, class: &dyn Fn(u8) -> bool| {
        while i < s.len() && class(s[i]) {
            i += 1;
        }
        i
    };
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        let end =
            if c == b'\'' && matches!(at(i + 1).to_ascii_lowercase(), b's' | b't' | b'm' | b'd') {
                i + 2
            } else if c == b'\''
                && matches!(
                    (
                        at(i + 1).to_ascii_lowercase(),
                        at(i + 2).to_ascii_lowercase()
                    ),
                    (b'r', b'e') | (b'v', b'e') | (b'l', b'l')
                )
            {
                i + 3
            } else if letter(c) {
                run(i + 1, &letter)
            } else if !newline(c) && !digit(c) && letter(at(i + 1)) {
                run(i + 2, &letter)
            } else if digit(c) {
                let mut j = i + 1;
                while j < s.len() && j < i + 3 && digit(s[j]) {
                    j += 1;
                }
                j
            } else if other(c) || (c == b' ' && i + 1 < s.len() && other(s[i + 1])) {
                let j = run(if c == b' ' { i + 2 } else { i + 1 }, &other);
                run(j, &newline)
            } else {
                // A whitespace run: up to its last newline if it has one; else all of it at the end
                // of the text, all but its last byte before a non-space, or the one byte.
                let j = run(i + 1, &space);
                match s[i..j].iter().rposition(|&b| newline(b)) {
                    Some(k) => i + k + 1,
                    None if j == s.len() => j,
                    None if j - i >= 2 => j - 1,
                    None => i + 1,
                }
            };
        emit(&s[i..end]);
        i = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(pattern: Pattern, text: &str) -> Vec<&str> {
        let pre = Pretokenizer::new(pattern).unwrap();
        let mut out = Vec::new();
        pre.split(text, |p| out.push(std::str::from_utf8(p).unwrap()));
        out
    }

    #[test]
    fn a_whitespace_run_gives_its_last_character_to_the_next_word() {
        for pattern in [Pattern::Cl100k, Pattern::O200k] {
            assert_eq!(pieces(pattern, "a   b"), ["a", "  ", " b"]);
            assert_eq!(
                pieces(pattern, "a\u{3000}\u{3000}b"),
                ["a", "\u{3000}", "\u{3000}b"]
            );
            assert_eq!(
                pieces(pattern, "a  "),
                ["a", "  "],
                "a run at the end is whole"
            );
            assert_eq!(pieces(pattern, "a \n\n b"), ["a", " \n\n", " b"]);
        }
    }

    #[test]
    fn the_two_patterns_differ_where_tiktokens_do() {
        assert_eq!(
            pieces(Pattern::Cl100k, "HelloWorld's"),
            ["HelloWorld", "'s"]
        );
        assert_eq!(pieces(Pattern::O200k, "HelloWorld's"), ["Hello", "World's"]);
        assert_eq!(pieces(Pattern::Cl100k, "日本語です"), ["日本語です"]);
        assert_eq!(pieces(Pattern::O200k, "12345"), ["123", "45"]);
    }
}

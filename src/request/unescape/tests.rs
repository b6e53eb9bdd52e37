use super::*;
use proptest::prelude::*;

use crate::request::truncate as cut;

/// What the parse did before: the whole string decoded, then cut at a character boundary.
fn whole(raw: &str, cap: usize) -> Option<String> {
    serde_json::from_str(raw).ok().map(|s| cut(s, cap))
}

/// A JSON string literal of `text`, each character written plainly or as an escape.
fn literal(text: &str, escaped: &[bool]) -> String {
    let mut out = String::from("\"");
    for (i, c) in text.chars().enumerate() {
        let force = escaped
            .get(i % escaped.len().max(1))
            .copied()
            .unwrap_or(false);
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '/' if force => out.push_str("\\/"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 || force => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[test]
fn plain_escaped_and_astral_text_decode_as_serde_does() {
    let raw = literal("a\"b\\c/d\ne\u{1}é€😀x", &[false, true, false]);
    for cap in 0..40 {
        let got = literal_prefix(&raw, cap).map(|t| cut(t, cap));
        assert_eq!(got, whole(&raw, cap), "cap {cap}");
    }
}

#[test]
fn invalid_strings_are_left_to_the_full_parse() {
    for raw in [
        r#""ab\x""#,
        r#""\ud83d""#,
        r#""\ude00""#,
        r#""\ud83dabcdef""#,
        r#""\u12g4""#,
        "\"a\u{1}b\"",
        "no quote",
    ] {
        assert_eq!(literal_prefix(raw, 1_000), None, "{raw}");
    }
    // A fault past the cap is still found (the full decode refuses the string).
    assert_eq!(literal_prefix(r#""abcdef\ud800x""#, 2), None);
    assert_eq!(whole(r#""abcdef\ud800x""#, 2), None);
}

#[test]
fn a_string_still_arriving_stops_before_a_cut_escape_or_character() {
    assert_eq!(string_prefix(br#""abc\"#, 100).as_deref(), Some("abc"));
    assert_eq!(string_prefix(br#""abc\u00e"#, 100).as_deref(), Some("abc"));
    assert_eq!(
        string_prefix(br#""abc\ud83d\ude"#, 100).as_deref(),
        Some("abc")
    );
    assert_eq!(
        string_prefix("\"abé".as_bytes().split_last().unwrap().1, 100).as_deref(),
        Some("ab")
    );
    assert_eq!(string_prefix(br#""abc\ud83dxy"#, 100), None);
    assert_eq!(
        string_prefix(br#""abcdef"#, 3).as_deref(),
        Some("abcdef"),
        "may run past the cap"
    );
}

#[test]
fn only_the_capped_part_is_decoded() {
    let long = format!("\"{}\"", "x".repeat(400_000));
    let text = literal_prefix(&long, 1_000).unwrap();
    assert!(text.len() >= 1_000 && text.len() <= 1_004, "{}", text.len());
    assert!(text.capacity() < 2_000, "{}", text.capacity());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any string, any mix of escapes, any cap: the same text as decoding all of it and cutting.
    #[test]
    fn the_prefix_is_the_whole_decode_cut(
        text in "\\PC{0,40}|[a\"\\\\/\\x00-\\x1fé😀]{0,40}",
        escaped in proptest::collection::vec(any::<bool>(), 1..5),
        cap in 0usize..60,
    ) {
        let raw = literal(&text, &escaped);
        let got = literal_prefix(&raw, cap).map(|t| cut(t, cap));
        prop_assert_eq!(got, whole(&raw, cap));
    }

    /// A literal cut anywhere decodes to a prefix of its text.
    #[test]
    fn a_cut_literal_decodes_to_a_prefix(
        text in "\\PC{0,30}",
        escaped in proptest::collection::vec(any::<bool>(), 1..5),
        at in 0usize..200,
    ) {
        let raw = literal(&text, &escaped);
        let at = at.min(raw.len());
        if let Some(p) = string_prefix(&raw.as_bytes()[..at], 1_000) {
            prop_assert!(text.starts_with(&p), "{:?} is not a prefix of {:?}", p, text);
        }
    }
}

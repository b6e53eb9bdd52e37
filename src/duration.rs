//! One duration grammar for the command line and the configuration: Go's `time.ParseDuration`
//! (`500ms`, `1m30s`, `2h`, `1.5s`, `300us`, `0`), as upstream's flags and its configuration
//! files write durations. Negative durations are refused (no epp setting means one).
//!
//! [`parse`] is Go's grammar; [`parse_or_seconds`] also takes a bare number as seconds, for the
//! places where epp (and upstream's YAML number fields) already accepted one.

use std::fmt;
use std::time::Duration;

/// Why a duration text was refused; shown with the text itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurationError {
    pub(crate) text: String,
    pub(crate) kind: DurationErrorKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DurationErrorKind {
    Empty,
    Negative,
    /// A number without a unit (Go accepts a bare `0` only).
    MissingUnit,
    UnknownUnit(String),
    BadNumber,
    /// Beyond what a `Duration` holds.
    TooLarge,
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match &self.kind {
            DurationErrorKind::Empty => "empty".to_owned(),
            DurationErrorKind::Negative => "negative".to_owned(),
            DurationErrorKind::MissingUnit => "a number needs a unit".to_owned(),
            DurationErrorKind::UnknownUnit(u) => format!("unknown unit {u:?}"),
            DurationErrorKind::BadNumber => "not a number".to_owned(),
            DurationErrorKind::TooLarge => "too large".to_owned(),
        };
        write!(
            f,
            "invalid duration {:?} (expected e.g. 200ms, 2s, 1m30s): {why}",
            self.text
        )
    }
}

impl std::error::Error for DurationError {}

/// Parses a Go duration: a sequence of decimal numbers each with a unit among `ns`,
/// `us`/`µs`, `ms`, `s`, `m`, `h` (`1h2m3.5s`), or a bare `0`. A leading `+` is allowed.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let fail = |kind| DurationError {
        text: text.to_owned(),
        kind,
    };
    let trimmed = text.trim();
    let mut rest = trimmed.strip_prefix('+').unwrap_or(trimmed);
    if rest.starts_with('-') {
        return Err(fail(DurationErrorKind::Negative));
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(fail(DurationErrorKind::Empty));
    }
    let mut total = 0.0f64;
    while !rest.is_empty() {
        let (seconds, tail) = term(rest).map_err(fail)?;
        total += seconds;
        rest = tail;
    }
    Duration::try_from_secs_f64(total).map_err(|_| fail(DurationErrorKind::TooLarge))
}

/// One `<number><unit>` term at the start of `text`: its seconds and what follows it.
fn term(text: &str) -> Result<(f64, &str), DurationErrorKind> {
    let num_len = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or(DurationErrorKind::MissingUnit)?;
    let (num, tail) = text.split_at(num_len);
    let unit_len = tail
        .find(|c: char| c.is_ascii_digit() || c == '.')
        .unwrap_or(tail.len());
    let (unit, tail) = tail.split_at(unit_len);
    // Go requires a digit on at least one side of the point ("1.", ".5" are valid, "." is not).
    if !num.bytes().any(|b| b.is_ascii_digit()) || num.matches('.').count() > 1 {
        return Err(DurationErrorKind::BadNumber);
    }
    let n: f64 = num.parse().map_err(|_| DurationErrorKind::BadNumber)?;
    let scale = match unit {
        "ns" => 1e-9,
        "us" | "µs" | "μs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        other => return Err(DurationErrorKind::UnknownUnit(other.to_owned())),
    };
    Ok((n * scale, tail))
}

/// [`parse`], and a bare number (`5`, `0.25`) is seconds.
pub(crate) fn parse_or_seconds(text: &str) -> Result<Duration, DurationError> {
    let t = text.trim();
    match t.parse::<f64>() {
        Ok(secs) if t.bytes().all(|b| b.is_ascii_digit() || b == b'.') => {
            Duration::try_from_secs_f64(secs).map_err(|_| DurationError {
                text: text.to_owned(),
                kind: DurationErrorKind::TooLarge,
            })
        }
        _ => parse(text),
    }
}

/// Seconds given as a YAML/JSON number (upstream's number fields), refused when negative or not
/// finite.
pub(crate) fn from_seconds(secs: f64) -> Result<Duration, DurationError> {
    Duration::try_from_secs_f64(secs).map_err(|_| DurationError {
        text: secs.to_string(),
        kind: if secs < 0.0 {
            DurationErrorKind::Negative
        } else {
            DurationErrorKind::TooLarge
        },
    })
}

/// A serde field holding a Go duration text or a number of seconds.
pub(crate) fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Secs(f64),
        Text(String),
    }
    match <Raw as serde::Deserialize>::deserialize(d)? {
        Raw::Secs(n) => from_seconds(n),
        Raw::Text(s) => parse_or_seconds(&s),
    }
    .map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn go_grammar() {
        for (text, want) in [
            ("1m30s", ms(90_000)),
            ("500ms", ms(500)),
            ("2h", ms(7_200_000)),
            ("1.5s", ms(1500)),
            ("300us", Duration::from_micros(300)),
            ("300µs", Duration::from_micros(300)),
            ("7ns", Duration::from_nanos(7)),
            ("1h2m3.5s", ms(3_723_500)),
            ("+2s", ms(2000)),
            (".5s", ms(500)),
            ("0", Duration::ZERO),
            (" 10s ", ms(10_000)),
        ] {
            assert_eq!(parse(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn refusals_say_why() {
        for (text, kind) in [
            ("", DurationErrorKind::Empty),
            ("-1s", DurationErrorKind::Negative),
            ("5", DurationErrorKind::MissingUnit),
            ("1m30", DurationErrorKind::MissingUnit),
            (
                "5 parsecs",
                DurationErrorKind::UnknownUnit(" parsecs".to_owned()),
            ),
            ("3d", DurationErrorKind::UnknownUnit("d".to_owned())),
            (".s", DurationErrorKind::BadNumber),
            ("1.2.3s", DurationErrorKind::BadNumber),
            ("soon", DurationErrorKind::BadNumber),
        ] {
            assert_eq!(parse(text).map_err(|e| e.kind), Err(kind), "{text:?}");
        }
        let e = parse("3d").unwrap_err().to_string();
        assert_eq!(
            e,
            "invalid duration \"3d\" (expected e.g. 200ms, 2s, 1m30s): unknown unit \"d\""
        );
    }

    #[test]
    fn bare_seconds_where_accepted() {
        assert_eq!(parse_or_seconds("5"), Ok(ms(5000)));
        assert_eq!(parse_or_seconds("0.25"), Ok(ms(250)));
        assert_eq!(parse_or_seconds("1m30s"), Ok(ms(90_000)));
        assert!(parse_or_seconds("-5").is_err());
        assert_eq!(from_seconds(1.5), Ok(ms(1500)));
        assert_eq!(
            from_seconds(-1.0).map_err(|e| e.kind),
            Err(DurationErrorKind::Negative)
        );
        assert!(from_seconds(f64::NAN).is_err());
    }
}

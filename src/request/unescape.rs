//! The start of a JSON string, decoded without the rest.
//!
//! The prefix index hashes at most the prompt cap's bytes of a prompt, so a 100K-token
//! completions prompt (400 KB) need not be decoded whole: decoding it and then cutting it was
//! one of the largest allocations of a long request (heaptrack, BENCHMARKS.md
//! "Peak RSS: the poller's connections, tonic's buffer, the allocator's delay"). The early decision reads a string that is still
//! arriving the same way.

/// The text of the JSON string whose opening quote is `raw[0]`, decoded until it holds at least
/// `cap` bytes or the string (or `raw`) ends; a character or escape cut off at the end of `raw`
/// is left out. It may run past `cap` by up to one character or escape: callers truncate.
/// `None` when an escape is invalid, a surrogate is unpaired or a control character appears
/// (then the full parse names the fault).
pub(crate) fn string_prefix(raw: &[u8], cap: usize) -> Option<String> {
    decode(raw, cap).map(|(text, _)| text)
}

/// [`string_prefix`] of a complete string literal `raw`, with the escapes of the part left
/// undecoded checked too, so that a string the full decode refuses is refused here as well.
pub(crate) fn literal_prefix(raw: &str, cap: usize) -> Option<String> {
    let (text, used) = decode(raw.as_bytes(), cap)?;
    escapes_valid(&raw.as_bytes()[used..]).then_some(text)
}

/// The decoded prefix and the bytes of `raw` it used (the opening quote included).
fn decode(raw: &[u8], cap: usize) -> Option<(String, usize)> {
    let body = raw.strip_prefix(b"\"")?;
    let mut out: Vec<u8> = Vec::with_capacity(cap.min(body.len()) + 4);
    let mut i = 0;
    while out.len() < cap && i < body.len() {
        let rest = &body[i..];
        let plain = memchr::memchr2(b'"', b'\\', rest).unwrap_or(rest.len());
        // Three bytes past the cap complete any character that starts before it.
        let take = plain.min(cap - out.len() + 3);
        if rest[..take].iter().any(|&b| b < 0x20) {
            return None;
        }
        out.extend_from_slice(&rest[..take]);
        i += take;
        if take < plain || i == body.len() || body[i] == b'"' {
            break;
        }
        match escape(&body[i..]) {
            Escape::Char(c, len) => {
                out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                i += len;
            }
            Escape::Cut => break,
            Escape::Invalid => return None,
        }
    }
    let text = match String::from_utf8(out) {
        Ok(text) => text,
        Err(e) => {
            let valid = e.utf8_error().valid_up_to();
            if e.utf8_error().error_len().is_some() {
                return None;
            }
            let mut bytes = e.into_bytes();
            bytes.truncate(valid);
            String::from_utf8(bytes).ok()?
        }
    };
    Some((text, 1 + i))
}

enum Escape {
    /// The character and the escape's length in bytes.
    Char(char, usize),
    /// `raw` ends inside the escape.
    Cut,
    Invalid,
}

/// The escape at the start of `s` (its backslash).
fn escape(s: &[u8]) -> Escape {
    let Some(&kind) = s.get(1) else {
        return Escape::Cut;
    };
    let c = match kind {
        b'"' => '"',
        b'\\' => '\\',
        b'/' => '/',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'n' => '\n',
        b'r' => '\r',
        b't' => '\t',
        b'u' => return unicode(s),
        _ => return Escape::Invalid,
    };
    Escape::Char(c, 2)
}

/// A `\uXXXX` escape, or a surrogate pair of two.
fn unicode(s: &[u8]) -> Escape {
    let Some(hi) = s.get(2..6) else {
        return Escape::Cut;
    };
    let Some(hi) = hex4(hi) else {
        return Escape::Invalid;
    };
    match hi {
        0xD800..=0xDBFF => {
            let Some(next) = s.get(6..12) else {
                // A pair cut short, unless what follows already cannot start `\u`.
                let rest = &s[6..];
                let could_pair = b"\\u".starts_with(&rest[..rest.len().min(2)]);
                return if could_pair {
                    Escape::Cut
                } else {
                    Escape::Invalid
                };
            };
            let lo = match (next.starts_with(b"\\u"), hex4(&next[2..])) {
                (true, Some(lo @ 0xDC00..=0xDFFF)) => lo,
                _ => return Escape::Invalid,
            };
            let c = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
            char::from_u32(c).map_or(Escape::Invalid, |c| Escape::Char(c, 12))
        }
        0xDC00..=0xDFFF => Escape::Invalid,
        _ => char::from_u32(hi).map_or(Escape::Invalid, |c| Escape::Char(c, 6)),
    }
}

fn hex4(s: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(s).ok()?;
    if s.len() != 4 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(s, 16).ok()
}

/// Whether every escape in `s` (the undecoded rest of a complete literal) decodes.
fn escapes_valid(s: &[u8]) -> bool {
    let mut i = 0;
    while let Some(p) = memchr::memchr(b'\\', &s[i..]) {
        match escape(&s[i + p..]) {
            Escape::Char(_, len) => i += p + len,
            Escape::Cut | Escape::Invalid => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests;

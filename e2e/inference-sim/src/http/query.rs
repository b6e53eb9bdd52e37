//! A request's query string as Python's `parse_qs` and Kubernetes' API server read it.

/// The `key=value` pairs of a query, percent-decoded (pairs without `=` are skipped).
pub fn pairs(query: Option<&str>) -> impl Iterator<Item = (String, String)> + '_ {
    query
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (decode(k), decode(v)))
}

/// `%XX` escapes and `+` as a space; a `%` not followed by two hex digits stays as it is.
pub fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                out.push(hex.unwrap_or(b'%'));
                i += if hex.is_some() { 3 } else { 1 };
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_plus_are_decoded_and_a_bad_escape_is_kept() {
        assert_eq!(decode("name%5B%5D"), "name[]");
        assert_eq!(decode("a+b%3Ac"), "a b:c");
        assert_eq!(decode("a%2"), "a%2");
        assert_eq!(decode("%zz"), "%zz");
        let got: Vec<_> = pairs(Some("a=1&b&c=%41")).collect();
        assert_eq!(got, [("a".into(), "1".into()), ("c".into(), "A".into())]);
    }
}

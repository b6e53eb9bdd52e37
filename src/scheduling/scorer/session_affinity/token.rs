//! The session token's codec: the endpoint name in standard base64 with padding (Go's
//! `base64.StdEncoding`), as upstream's `encoded_endpoint_header` strategy writes it.

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// The token for an endpoint name: standard base64 with padding (Go's `base64.StdEncoding`).
pub fn encode_token(name: &str) -> String {
    let mut out = String::with_capacity(name.len().div_ceil(3) * 4);
    for chunk in name.as_bytes().chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The endpoint name in a token; `None` when it is not padded standard base64 of UTF-8.
pub fn decode_token(token: &str) -> Option<String> {
    let t = token.trim().as_bytes();
    if t.is_empty() || !t.len().is_multiple_of(4) {
        return None;
    }
    let value = |c: u8| ALPHABET.iter().position(|a| *a == c).map(|v| v as u32);
    let mut out = Vec::with_capacity(t.len() / 4 * 3);
    for (k, quad) in t.chunks(4).enumerate() {
        let last = k == t.len() / 4 - 1;
        let pad = quad.iter().rev().take_while(|c| **c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for &c in &quad[..4 - pad] {
            n = (n << 6) | value(c)?;
        }
        n <<= 6 * pad as u32;
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    String::from_utf8(out).ok()
}

//! `session-affinity-scorer`, as llm-d's: a request carrying `x-session-token` scores 1 on the
//! endpoint that served its session before and 0 elsewhere; without a token (or when that
//! endpoint is gone) every candidate scores 0 and the other scorers decide.
//!
//! The token is the standard base64 of the endpoint's name (the pod name, with `-rank-N` for
//! data-parallel ranks; the address for static endpoints). epp returns it in the
//! `x-session-token` response header of every routed request when this scorer is configured,
//! and the client echoes it on the next turn. The director resolves the token to an endpoint
//! against the snapshot (`SchedulingRequest::session_endpoint`), so scoring is one comparison.
//! With its usual weight the affinity yields to a stronger load signal: a session moves when
//! its pod is much busier than the rest, and the next response carries the new token.

use crate::scheduling::{Candidate, SchedulingRequest};

/// Header carrying the token in both directions.
pub const SESSION_HEADER: &str = "x-session-token";

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionAffinityScorer {}

impl SessionAffinityScorer {
    pub const TYPE: &'static str = "session-affinity-scorer";

    pub fn score(&self, req: &SchedulingRequest<'_>, pool: &[&Candidate], out: &mut [f64]) {
        for (o, c) in out.iter_mut().zip(pool) {
            *o = if req.session_endpoint == Some(c.id) {
                1.0
            } else {
                0.0
            };
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::cand;
    use proptest::prelude::*;

    #[test]
    fn only_the_session_endpoint_scores() {
        let cands = [cand(1, 0.0, 0.0, 0), cand(2, 0.0, 0.0, 0)];
        let pool: Vec<&Candidate> = cands.iter().collect();
        let mut out = [9.0; 2];
        let req = SchedulingRequest {
            session_endpoint: Some(cands[1].id),
            ..Default::default()
        };
        SessionAffinityScorer {}.score(&req, &pool, &mut out);
        assert_eq!(out, [0.0, 1.0]);
        SessionAffinityScorer {}.score(&SchedulingRequest::default(), &pool, &mut out);
        assert_eq!(out, [0.0, 0.0]);
    }

    #[test]
    fn tokens_match_go_std_encoding() {
        // Values from Go: base64.StdEncoding.EncodeToString([]byte(s)).
        assert_eq!(encode_token("default/vllm-0"), "ZGVmYXVsdC92bGxtLTA=");
        assert_eq!(encode_token("ab"), "YWI=");
        assert_eq!(encode_token("abc"), "YWJj");
        assert_eq!(
            decode_token("ZGVmYXVsdC92bGxtLTA=").as_deref(),
            Some("default/vllm-0")
        );
        for bad in ["", "YWJ", "Y=Jj", "YW==YWJj", "YWJ*", "Y==="] {
            assert_eq!(decode_token(bad), None, "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn decode_inverts_encode(s in "\\PC{0,40}") {
            prop_assert_eq!(decode_token(&encode_token(&s)), (!s.is_empty()).then(|| s.clone()));
        }

        #[test]
        fn decode_never_panics(s in "\\PC{0,40}") {
            let _ = decode_token(&s);
        }
    }
}

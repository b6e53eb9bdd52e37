//! `requestHandler.propagatePriority` (llm-d v1.0): the resolved priority written into the
//! forwarded body's top-level `priority`, for the engine's own scheduler. The body is spliced,
//! not re-serialised: every byte but the `priority` member's value (or the member inserted after
//! the opening brace) is the client's.

use serde_json::value::RawValue;
use std::collections::HashMap;

/// `body` with its top-level `priority` set to `priority`: the existing value replaced, or the
/// member inserted first. `None` when the body is not a JSON object (nothing to write into).
pub(crate) fn with_priority(body: &[u8], priority: i32) -> Option<Vec<u8>> {
    let members: HashMap<std::borrow::Cow<'_, str>, &RawValue> =
        serde_json::from_slice(body).ok()?;
    let number = priority.to_string();
    if let Some(raw) = members.get("priority") {
        let span = super::span_of(body, raw.get())?;
        let mut out = Vec::with_capacity(body.len() + number.len());
        out.extend_from_slice(&body[..span.start]);
        out.extend_from_slice(number.as_bytes());
        out.extend_from_slice(&body[span.end..]);
        return Some(out);
    }
    let brace = body.iter().position(|&b| b == b'{')?;
    let after = &body[brace + 1..];
    let empty = after
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|&b| b == b'}');
    let member = format!("\"priority\":{number}{}", if empty { "" } else { "," });
    let mut out = Vec::with_capacity(body.len() + member.len());
    out.extend_from_slice(&body[..=brace]);
    out.extend_from_slice(member.as_bytes());
    out.extend_from_slice(after);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(body: &str, p: i32) -> Option<String> {
        with_priority(body.as_bytes(), p).map(|b| String::from_utf8(b).unwrap())
    }

    #[test]
    fn an_existing_priority_is_replaced_in_place() {
        assert_eq!(
            set(r#"{"model":"m", "priority" : 7 ,"x":{"priority":1}}"#, -2).as_deref(),
            Some(r#"{"model":"m", "priority" : -2 ,"x":{"priority":1}}"#)
        );
        assert_eq!(
            set(r#"{"priority":"high","model":"m"}"#, 3).as_deref(),
            Some(r#"{"priority":3,"model":"m"}"#)
        );
    }

    #[test]
    fn a_missing_priority_is_inserted_first_and_the_rest_kept() {
        let body = "  {\n  \"model\": \"m\",\t\"messages\": [{\"role\":\"user\",\"content\":\"h\\u00e9\"}]\n}";
        let out = set(body, 5).unwrap();
        assert_eq!(out, body.replacen('{', "{\"priority\":5,", 1));
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["priority"], 5);
        assert_eq!(set("{ }", 0).as_deref(), Some("{\"priority\":0 }"));
        assert!(serde_json::from_str::<serde_json::Value>("{\"priority\":0 }").is_ok());
    }

    #[test]
    fn a_body_that_is_not_an_object_is_left_alone() {
        assert_eq!(set("[1,2]", 1), None);
        assert_eq!(set("not json", 1), None);
        assert_eq!(set("", 1), None);
    }
}

//! A Kubernetes label selector in its string form (`k8s.io/apimachinery/pkg/labels.Parse`):
//! comma-separated requirements, each `key`, `!key`, `key=value` (or `==`), `key!=value`,
//! `key in (a,b)`, `key notin (a,b)`, `key>n` or `key<n`. All must hold.

use crate::scheduling::filter::{check_key, check_value};
use std::collections::BTreeMap;

/// What one requirement asks of a label.
#[derive(Clone, Debug, PartialEq)]
enum Op {
    Exists,
    Absent,
    /// The label is present with one of these values (`=`, `==`, `in`).
    In(Vec<String>),
    /// The label is absent or has none of these values (`!=`, `notin`).
    NotIn(Vec<String>),
    /// The label is an integer greater (`>`) or less (`<`) than this one.
    Gt(i64),
    Lt(i64),
}

#[derive(Clone, Debug, PartialEq)]
struct Requirement {
    key: String,
    op: Op,
}

/// A parsed selector: every requirement must hold.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Selector(Vec<Requirement>);

/// Why a selector string does not parse; the message says what and where.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct SelectorError(String);

impl Selector {
    pub(crate) fn parse(text: &str) -> Result<Self, SelectorError> {
        let mut out = Vec::new();
        for term in split_terms(text)? {
            let r = requirement(term.trim())?;
            check_key(&r.key).map_err(|e| SelectorError(e.message))?;
            if let Op::In(values) | Op::NotIn(values) = &r.op {
                for v in values {
                    check_value(v).map_err(|e| SelectorError(e.message))?;
                }
            }
            out.push(r);
        }
        Ok(Self(out))
    }

    pub(crate) fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| {
            let value = labels.get(&r.key);
            let int = || value.and_then(|v| v.parse::<i64>().ok());
            match &r.op {
                Op::Exists => value.is_some(),
                Op::Absent => value.is_none(),
                Op::In(vs) => value.is_some_and(|v| vs.contains(v)),
                Op::NotIn(vs) => !value.is_some_and(|v| vs.contains(v)),
                Op::Gt(n) => int().is_some_and(|v| v > *n),
                Op::Lt(n) => int().is_some_and(|v| v < *n),
            }
        })
    }
}

/// The terms between top-level commas (a comma inside `( )` separates values).
fn split_terms(text: &str) -> Result<Vec<&str>, SelectorError> {
    let (mut terms, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(SelectorError(format!("unbalanced parentheses in {text:?}")));
        }
    }
    if depth != 0 {
        return Err(SelectorError(format!("unbalanced parentheses in {text:?}")));
    }
    terms.push(&text[start..]);
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    match terms.iter().find(|t| t.trim().is_empty()) {
        Some(_) => Err(SelectorError(format!("empty requirement in {text:?}"))),
        None => Ok(terms),
    }
}

fn requirement(term: &str) -> Result<Requirement, SelectorError> {
    let bad = || SelectorError(format!("invalid requirement {term:?}"));
    if let Some(key) = term.strip_prefix('!') {
        return Ok(Requirement {
            key: key.trim().into(),
            op: Op::Absent,
        });
    }
    if let Some(i) = term.find(['=', '!', '>', '<']) {
        let (key, rest) = (term[..i].trim().to_owned(), &term[i..]);
        let op = if let Some(v) = rest.strip_prefix("!=") {
            Op::NotIn(vec![v.trim().into()])
        } else if let Some(v) = rest.strip_prefix("==").or_else(|| rest.strip_prefix('=')) {
            Op::In(vec![v.trim().into()])
        } else if let Some(v) = rest.strip_prefix('>') {
            Op::Gt(v.trim().parse().map_err(|_| bad())?)
        } else if let Some(v) = rest.strip_prefix('<') {
            Op::Lt(v.trim().parse().map_err(|_| bad())?)
        } else {
            return Err(bad());
        };
        return Ok(Requirement { key, op });
    }
    let Some(open) = term.find('(') else {
        return Ok(Requirement {
            key: term.into(),
            op: Op::Exists,
        });
    };
    let head: Vec<&str> = term[..open].split_whitespace().collect();
    let values = term[open + 1..].strip_suffix(')').ok_or_else(bad)?;
    if values.trim().is_empty() {
        return Err(SelectorError(format!(
            "{term:?}: for 'in', 'notin' operators, values set can't be empty"
        )));
    }
    let values: Vec<String> = values.split(',').map(|v| v.trim().to_owned()).collect();
    let op = match head.as_slice() {
        [_, "in"] => Op::In(values),
        [_, "notin"] => Op::NotIn(values),
        _ => return Err(bad()),
    };
    Ok(Requirement {
        key: head[0].into(),
        op,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    #[test]
    fn each_operator_matches_as_kubernetes_does() {
        let l = labels(&[("app", "vllm"), ("tier", "gpu"), ("gen", "3")]);
        let cases = [
            ("app=vllm", true),
            ("app==vllm", true),
            ("app=sglang", false),
            ("app!=sglang", true),
            ("missing!=x", true),
            ("app in (sglang, vllm)", true),
            ("app notin (vllm)", false),
            ("missing notin (vllm)", true),
            ("tier", true),
            ("!tier", false),
            ("!missing", true),
            ("gen>2", true),
            ("gen<3", false),
            ("app=vllm, tier in (gpu), !missing", true),
            ("app=vllm,tier=cpu", false),
            ("disaggregatedset.x-k8s.io/name=my-set", false),
        ];
        for (text, want) in cases {
            let s = Selector::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(s.matches(&l), want, "{text}");
        }
    }

    #[test]
    fn malformed_selectors_are_refused() {
        for text in [
            "app in (a",
            "app in a)",
            "a,,b",
            "gen>x",
            "bad key=v",
            "a=b c",
            "k in ()",
        ] {
            assert!(Selector::parse(text).is_err(), "{text} parsed");
        }
    }
}

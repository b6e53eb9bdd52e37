//! `request-attribute-reporter` (llm-d, beta): at the response's end, a CEL expression over the
//! response's usage, reported to the gateway as dynamic metadata (a request's cost in tokens,
//! for rate limiting or billing in the gateway).
//!
//! As upstream: exactly one attribute; `usage` is the usage object as upstream marshals it
//! (`prompt_tokens`, `completion_tokens`, `total_tokens`, always present, 0 when the model
//! server did not say; `prompt_tokens_details.cached_tokens` when it did), every number a
//! double (a `google.protobuf.Struct`), so `usage.prompt_tokens + 1` fails at evaluation and
//! `int(usage.prompt_tokens) + 1` does not. An optional `condition` must be true; the value (a
//! double or an integer, truncated) is written under `key.namespace` (default `envoy.lb`) /
//! `key.name`, and not at all when it is 0. An evaluation error is logged and reports nothing.

use crate::plugin::Invalid;
use crate::scheduling::lifecycle::{Lifecycle, Metadata, Owned, Usage};
use cel::{Context, Program, Value};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// Upstream's default namespace: the one Envoy's load balancers read.
const DEFAULT_NAMESPACE: &str = "envoy.lb";

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub(crate) struct AttributeReporterParams {
    attributes: Vec<Attribute>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Attribute {
    key: Key,
    expression: String,
    condition: String,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Key {
    namespace: String,
    name: String,
}

/// One configured reporter: where its value goes, and the compiled expressions.
#[derive(Clone)]
pub(crate) struct AttributeReporter {
    namespace: String,
    name: String,
    expression: Arc<Program>,
    condition: Option<Arc<Program>>,
    /// Identifies the configured instance (its clones share it).
    me: Owned<()>,
}

impl fmt::Debug for AttributeReporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttributeReporter")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl AttributeReporterParams {
    /// Upstream's checks (in its order) and the expressions compiled.
    pub(crate) fn validate(self) -> Result<AttributeReporter, Invalid> {
        let [a] = <[Attribute; 1]>::try_from(self.attributes)
            .map_err(|_| Invalid::new("attributes", "attributes must contain exactly one entry"))?;
        if a.key.name.is_empty() {
            return Err(Invalid::new(
                "attributes",
                "attributeKey.name cannot be empty",
            ));
        }
        if a.expression.is_empty() {
            return Err(Invalid::new(
                "attributes",
                "attributes[0].expression cannot be empty",
            ));
        }
        let compile = |what: &str, text: &str| {
            Program::compile(text)
                .map(Arc::new)
                .map_err(|e| Invalid::new("attributes", format!("failed to compile {what}: {e}")))
        };
        let expression = compile("expression", &a.expression)?;
        let condition = (!a.condition.is_empty())
            .then(|| compile("condition", &a.condition))
            .transpose()?;
        let namespace = if a.key.namespace.is_empty() {
            DEFAULT_NAMESPACE.to_owned()
        } else {
            a.key.namespace
        };
        Ok(AttributeReporter {
            namespace,
            name: a.key.name,
            expression,
            condition,
            me: Owned::new(()),
        })
    }
}

impl AttributeReporter {
    /// The value to report for `usage`: `None` when the condition is not met, the evaluation
    /// fails (logged) or the value is 0.
    fn value(&self, usage: &Usage) -> Option<i64> {
        let mut ctx = Context::default();
        ctx.add_variable_from_value("usage", usage_value(usage));
        if let Some(cond) = &self.condition {
            match cond.execute(&ctx) {
                Ok(Value::Bool(true)) => {}
                Ok(_) => return None,
                Err(e) => return self.failed("condition", &e),
            }
        }
        let n = match self.expression.execute(&ctx) {
            Ok(Value::Float(f)) => f as i64,
            Ok(Value::Int(i)) => i,
            Ok(Value::UInt(u)) => i64::try_from(u).unwrap_or(i64::MAX),
            Ok(other) => {
                tracing::warn!(name = %self.name, result = ?other, "request-attribute-reporter: expression result could not be converted to float64 or int64");
                return None;
            }
            Err(e) => return self.failed("expression", &e),
        };
        (n != 0).then_some(n)
    }

    fn failed(&self, what: &str, e: &dyn fmt::Display) -> Option<i64> {
        tracing::warn!(name = %self.name, error = %e, "request-attribute-reporter: failed to evaluate {what}");
        None
    }
}

/// `usage` as upstream hands it to CEL: its JSON as a `Struct`, every number a double.
fn usage_value(u: &Usage) -> Value {
    let num = |n: u64| Value::Float(n as f64);
    let mut m: HashMap<String, Value> = HashMap::from([
        ("prompt_tokens".to_owned(), num(u.prompt_tokens)),
        ("completion_tokens".to_owned(), num(u.completion_tokens)),
        ("total_tokens".to_owned(), num(u.total_tokens)),
    ]);
    if let Some(c) = u.cached_tokens {
        let details = HashMap::from([("cached_tokens".to_owned(), num(c))]);
        m.insert(
            "prompt_tokens_details".to_owned(),
            Value::Map(details.into()),
        );
    }
    Value::Map(m.into())
}

impl Lifecycle for AttributeReporter {
    fn response_metadata(&self, usage: &Usage, out: &mut Metadata) {
        if let Some(n) = self.value(usage) {
            out.entry(self.namespace.clone())
                .or_default()
                .insert(self.name.clone(), n as f64);
        }
    }

    fn instance(&self) -> usize {
        self.me.instance()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::plugin::params;

    fn reporter(yaml: &str) -> Result<AttributeReporter, String> {
        let v: serde_norway::Value = serde_norway::from_str(yaml).unwrap();
        params::<AttributeReporterParams>(&v)
            .map_err(|e| e.to_string())?
            .validate()
            .map_err(|e| e.to_string())
    }

    fn one(expression: &str, condition: &str) -> AttributeReporter {
        reporter(&format!(
            "attributes: [{{key: {{name: cost}}, expression: '{expression}', condition: '{condition}'}}]"
        ))
        .unwrap()
    }

    fn usage(prompt: u64, completion: u64) -> Usage {
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            cached_tokens: None,
        }
    }

    #[test]
    fn refuses_what_upstream_refuses() {
        let table = [
            ("{}", "exactly one entry"),
            ("attributes: [{key: {name: a}, expression: '1'}, {key: {name: b}, expression: '2'}]", "exactly one entry"),
            ("attributes: [{expression: '1'}]", "attributeKey.name cannot be empty"),
            ("attributes: [{key: {name: a}}]", "expression cannot be empty"),
            ("attributes: [{key: {name: a}, expression: 'usage.prompt_tokens +'}]", "failed to compile expression"),
            ("attributes: [{key: {name: a}, expression: '1', condition: '(('}]", "failed to compile condition"),
        ];
        for (yaml, want) in table {
            let e = reporter(yaml).unwrap_err();
            assert!(e.contains(want), "{yaml}: {e}");
        }
    }

    #[test]
    fn reports_the_expression_under_its_key() {
        let r = one("usage.prompt_tokens + usage.completion_tokens", "");
        let mut out = Metadata::new();
        r.response_metadata(&usage(5, 10), &mut out);
        assert_eq!(out["envoy.lb"]["cost"], 15.0);
        let custom = reporter(
            "attributes: [{key: {namespace: billing, name: n}, expression: 'usage.total_tokens'}]",
        )
        .unwrap();
        custom.response_metadata(&usage(2, 3), &mut out);
        assert_eq!(out["billing"]["n"], 5.0);
    }

    #[test]
    fn numbers_are_doubles_as_in_a_struct() {
        // double + int has no overload in CEL: nothing is reported.
        assert_eq!(one("usage.prompt_tokens + 1", "").value(&usage(5, 0)), None);
        assert_eq!(
            one("int(usage.prompt_tokens) + 1", "").value(&usage(5, 0)),
            Some(6)
        );
        assert_eq!(
            one("usage.prompt_tokens / 2.0", "").value(&usage(5, 0)),
            Some(2)
        );
    }

    #[test]
    fn condition_zero_and_errors_report_nothing() {
        let r = one("usage.completion_tokens", "usage.completion_tokens > 3.0");
        assert_eq!(r.value(&usage(9, 2)), None);
        assert_eq!(r.value(&usage(9, 4)), Some(4));
        assert_eq!(one("usage.completion_tokens", "").value(&usage(9, 0)), None);
        assert_eq!(one("usage.nope", "").value(&usage(1, 1)), None);
        assert_eq!(one("\"text\"", "").value(&usage(1, 1)), None);
        let cached = one(
            "usage.prompt_tokens_details.cached_tokens",
            "has(usage.prompt_tokens_details)",
        );
        assert_eq!(cached.value(&usage(4, 1)), None);
        let with = Usage {
            cached_tokens: Some(3),
            ..usage(4, 1)
        };
        assert_eq!(cached.value(&with), Some(3));
    }
}

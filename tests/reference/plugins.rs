//! docs/reference/plugins.md: every plugin type of the registry (`epp::plugin::PluginKind`), and
//! for each plugin epp builds, its parameters as the configuration decoder takes them.
//!
//! The parameters are asked of the decoder itself (`NamedPlugin::decode`), not written here:
//! - the names: a parameter no plugin has is refused with serde's list of those it has;
//! - each one's type: the parameter set to `true` is refused with what serde expected instead
//!   (a parameter that takes it is a boolean);
//! - the defaults: the plugin decoded with no parameters, read from its `Debug` form.

use super::{cell, GENERATED};
use epp::config::plugin::NamedPlugin;
use epp::config::{LoadOptions, PluginSpec, Problem};
use epp::plugin::{PluginKind, Stability, Support};
use serde_norway::{Mapping, Value};
use std::fmt::Write;

const PROBE: &str = "__reference_probe__";

pub fn page() -> String {
    let mut out = String::new();
    writeln!(out, "{GENERATED}\n").unwrap();
    writeln!(out, "# Plugin types\n").unwrap();
    writeln!(out, "{}", intro()).unwrap();
    writeln!(out, "| type | category | stability | in epp |").unwrap();
    writeln!(out, "|---|---|---|---|").unwrap();
    for &kind in PluginKind::ALL {
        writeln!(
            out,
            "| `{}` | {:?} | {:?} | {} |",
            kind.name(),
            kind.category(),
            kind.stability(),
            support(kind)
        )
        .unwrap();
    }
    writeln!(out, "\n## Parameters of the plugins epp builds\n").unwrap();
    for &kind in PluginKind::ALL {
        if kind.support() == Support::Plugin {
            out.push_str(&parameters(kind));
        }
    }
    out
}

fn intro() -> String {
    let count = |s: fn(Support) -> bool| PluginKind::ALL.iter().filter(|k| s(k.support())).count();
    format!(
        "Every `type:` an `EndpointPickerConfig` may name: the union of GIE v1.5.0's and \
         llm-d-router v0.10.0's in-tree plugins, v0.11's traffic-learned hub plugins, under \
         upstream's names, plus epp's own. {} types: \
         {} built by epp (\"plugin\"), {} accepted because epp does the same without a plugin \
         (\"built in\"), {} refused at load with the reason shown (\"unsupported\"). Alpha types \
         need `--allow-experimental-plugins`, as upstream. A `type:` not listed here is an \
         unknown plugin type.\n",
        PluginKind::ALL.len(),
        count(|s| s == Support::Plugin),
        count(|s| matches!(s, Support::BuiltIn(_))),
        count(|s| matches!(s, Support::Unsupported(_))),
    )
}

fn support(kind: PluginKind) -> String {
    match kind.support() {
        Support::Plugin => format!("plugin ([parameters](#{}))", kind.name()),
        Support::BuiltIn(why) => format!("built in: {}", cell(why)),
        Support::Unsupported(why) => format!("unsupported: {}", cell(why)),
    }
}

/// The decoder's answer for `kind` with `parameters` (`None`: no `parameters:` key).
fn decode(kind: PluginKind, parameters: Option<Value>) -> Result<NamedPlugin, String> {
    let spec = PluginSpec {
        name: None,
        plugin_type: kind.name().to_owned(),
        parameters,
    };
    let load = LoadOptions {
        allow_experimental: true,
    };
    NamedPlugin::decode(&spec, load).map_err(|problems| {
        let text: Vec<String> = problems
            .iter()
            .map(|p| match p {
                Problem::Parameters { message, .. } => message.clone(),
                other => other.to_string(),
            })
            .collect();
        text.join("; ")
    })
}

fn map(key: &str, value: Value) -> Value {
    let mut m = Mapping::new();
    m.insert(Value::String(key.to_owned()), value);
    Value::Mapping(m)
}

/// The parameter names serde lists when `parameters` names one the plugin does not have (every
/// list, when the decoder tries more than one shape); an error when the plugin takes no map or
/// ignores unknown names.
fn names(kind: PluginKind) -> Result<Vec<String>, String> {
    let err = match decode(kind, Some(map(PROBE, Value::Bool(true)))) {
        Ok(_) => return Err("accepted without a check of the names".into()),
        Err(e) => e,
    };
    let unknown = format!("unknown field `{PROBE}`, ");
    if !err.contains(&unknown) {
        return Err(err);
    }
    let mut out: Vec<String> = Vec::new();
    for part in err.split(&unknown).skip(1) {
        let listed = part
            .strip_prefix("expected ")
            .map(listed)
            .unwrap_or_default();
        for name in listed {
            if !out.contains(&name) {
                out.push(name);
            }
        }
    }
    Ok(out)
}

/// The names of serde's `one of `a`, `b`` or `` `a` `` at the start of `text`.
pub fn listed(text: &str) -> Vec<String> {
    let mut rest = text.strip_prefix("one of ").unwrap_or(text);
    let mut out = Vec::new();
    while let Some(item) = rest.strip_prefix('`') {
        let Some(end) = item.find('`') else { break };
        out.push(item[..end].to_owned());
        rest = &item[end + 1..];
        match rest
            .strip_prefix(", ")
            .or_else(|| rest.strip_prefix(" or "))
        {
            Some(next) => rest = next,
            None => break,
        }
    }
    out
}

/// What the decoder expects for parameter `name`; for a name out of a fixed set, the names it
/// takes.
fn kind_of(kind: PluginKind, name: &str) -> String {
    let expected = expected(
        kind,
        name,
        Value::Bool(true),
        "invalid type: boolean `true`, expected ",
    );
    if !expected.contains("enum") {
        return expected;
    }
    let variants = expected_after(kind, name, &format!("unknown variant `{PROBE}`, expected "));
    match variants.map(|v| listed(&v)) {
        Some(names) if !names.is_empty() => {
            let names: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
            format!("one of {}", names.join(", "))
        }
        _ => expected,
    }
}

/// serde's expectation for parameter `name` given `value`, read after `marker` in the
/// decoder's error; a parameter that takes `true` is a boolean.
fn expected(kind: PluginKind, name: &str, value: Value, marker: &str) -> String {
    match decode(kind, Some(map(name, value))) {
        Err(e) if e.contains(marker) => clause(&e[e.find(marker).unwrap_or(0) + marker.len()..]),
        _ => match decode(kind, Some(map(name, Value::Mapping(Mapping::new())))) {
            Err(e) if e.contains("invalid type: map") => "boolean".into(),
            _ => "any value (checked after decoding)".into(),
        },
    }
}

/// The text after `marker` in the error for parameter `name` set to a string no plugin takes.
fn expected_after(kind: PluginKind, name: &str, marker: &str) -> Option<String> {
    let e = decode(kind, Some(map(name, Value::String(PROBE.into())))).err()?;
    let at = e.find(marker)?;
    Some(e[at + marker.len()..].to_owned())
}

/// One clause of an error message: up to `;`, ` (` or serde_yaml's ` at line`.
pub fn clause(text: &str) -> String {
    let end = [";", " (", " at line"]
        .iter()
        .filter_map(|m| text.find(m))
        .min()
        .unwrap_or(text.len());
    text[..end].trim_end_matches('.').to_owned()
}

fn parameters(kind: PluginKind) -> String {
    let mut out = format!("### `{}`\n\n", kind.name());
    let defaults = decode(kind, None).map(|p| format!("{:?}", p.plugin));
    match names(kind) {
        Ok(names) if names.is_empty() => out.push_str("No parameters.\n\n"),
        Ok(names) => {
            out.push_str("| parameter | type | default |\n|---|---|---|\n");
            for name in names {
                let default = match &defaults {
                    Ok(debug) => default_of(debug, &name),
                    Err(_) => "—".into(),
                };
                let ty = kind_of(kind, &name);
                writeln!(out, "| `{name}` | {} | {} |", cell(&ty), default).unwrap();
            }
            out.push('\n');
        }
        Err(why) => writeln!(
            out,
            "Parameters not listed by the decoder: {}\n",
            cell(&why)
        )
        .unwrap(),
    }
    if let Err(why) = defaults {
        writeln!(out, "Without parameters: {}\n", cell(&why)).unwrap();
    }
    out
}

/// A name without case or underscores: `minFreeMiB` and `min_free_mib` meet.
fn folded(name: &str) -> String {
    name.chars()
        .filter(|c| *c != '_')
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// The value of the first field named like `name` (case and underscores aside) in a compact
/// `Debug` form, up to the comma or brace that closes it (`—` when no field is so named).
fn default_of(debug: &str, name: &str) -> String {
    let want = folded(name);
    let mut rest = debug;
    while let Some(at) = rest.find(": ") {
        let before = &rest[..at];
        let ident_start = before
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
            .map_or(0, |i| i + 1);
        let opener = before[..ident_start].trim_end().ends_with(['{', ',']);
        if opener && folded(&before[ident_start..]) == want {
            let value = value_at(&rest[at + 2..]);
            if value.len() > 80 {
                return "(long; see the plugin's guide)".into();
            }
            return format!("`{}`", cell(value));
        }
        rest = &rest[at + 2..];
    }
    "—".into()
}

/// The leading value of `text`: up to a `,` or closing bracket at depth 0, outside quotes.
fn value_at(text: &str) -> &str {
    let (mut depth, mut quoted, mut escaped) = (0i32, false, false);
    for (i, c) in text.char_indices() {
        if quoted {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => quoted = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => quoted = true,
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' if depth == 0 => return text[..i].trim(),
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => return text[..i].trim(),
            _ => {}
        }
    }
    text.trim()
}

#[test]
fn debug_values_are_read_to_their_end() {
    let debug =
        r#"Queue { block_size: 64, names: ["a, b"], inner: Some(X { y: 1 }), min_free_mib: 2 }"#;
    assert_eq!(default_of(debug, "blockSize"), "`64`");
    assert_eq!(default_of(debug, "names"), r#"`["a, b"]`"#);
    assert_eq!(default_of(debug, "inner"), "`Some(X { y: 1 })`");
    assert_eq!(default_of(debug, "missing"), "—");
    assert_eq!(default_of(debug, "minFreeMiB"), "`2`");
}

#[test]
fn serde_lists_are_read_to_their_end() {
    assert_eq!(
        listed("one of `a`, `b`, `c`; legacy `d`"),
        vec!["a", "b", "c"]
    );
    assert_eq!(listed("`only` at line 1"), vec!["only"]);
    assert!(listed("nothing").is_empty());
    assert_eq!(clause("a string; legacy schema error"), "a string");
    assert_eq!(clause("u64 at line 2 column 3"), "u64");
}

#[test]
fn stability_is_upstreams() {
    // Alpha types are refused without --allow-experimental-plugins; the page says which.
    let page = page();
    let alpha = PluginKind::ALL
        .iter()
        .find(|k| k.stability() == Stability::Alpha)
        .unwrap();
    assert!(page.contains(&format!(
        "| `{}` | {:?} | Alpha |",
        alpha.name(),
        alpha.category()
    )));
}

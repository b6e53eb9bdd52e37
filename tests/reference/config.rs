//! docs/reference/config.md: every field of an `EndpointPickerConfig` document, asked of the
//! document's own decoder (`epp::config::EndpointPickerConfig` and the types it nests), the way
//! plugins.rs asks the plugins: a field no type has is refused with serde's list of the fields
//! it has, and a field set to `true` with what serde expected instead.

use super::{cell, GENERATED};
use epp::config::{
    CrossReplica, DataLayer, DataSourceSpec, Discovery, EndpointPickerConfig, FlowControlSpec,
    PluginRef, PluginSpec, PriorityBandSpec, ProfilePluginRef, ProfileSpec, RequestHandler,
};
use serde::de::DeserializeOwned;
use serde_norway::{Mapping, Value};
use std::fmt::Write;

const PROBE: &str = "__reference_probe__";
/// A field serde takes whatever its value (its check comes later, or it is a plugin's).
const ANY: &str = "any value (checked after decoding)";

/// One type of the document: its name as serde reports it, where it sits, and its decoder.
struct Section {
    name: &'static str,
    at: &'static str,
    decode: fn(Value) -> Result<(), String>,
}

fn decoder<T: DeserializeOwned>(value: Value) -> Result<(), String> {
    serde_norway::from_value::<T>(value)
        .map(drop)
        .map_err(|e| e.to_string())
}

fn sections() -> Vec<Section> {
    let s = |name, at, decode| Section { name, at, decode };
    vec![
        s("EndpointPickerConfig", "the document", decoder::<EndpointPickerConfig>),
        s("PluginSpec", "`plugins[]`", decoder::<PluginSpec>),
        s("ProfileSpec", "`schedulingProfiles[]`", decoder::<ProfileSpec>),
        s("ProfilePluginRef", "`schedulingProfiles[].plugins[]`", decoder::<ProfilePluginRef>),
        s("PluginRef", "`saturationDetector`, `parser`, `requestHandler.parsers[]`, `flowControl.saturationDetector`, …", decoder::<PluginRef>),
        s("DataLayer", "`dataLayer`", decoder::<DataLayer>),
        s("DataSourceSpec", "`dataLayer.sources[]`", decoder::<DataSourceSpec>),
        s("Discovery", "`dataLayer.discovery`", decoder::<Discovery>),
        s("CrossReplica", "`dataLayer.crossReplica` (llm-d.ai/v1)", decoder::<CrossReplica>),
        s("FlowControlSpec", "`flowControl`", decoder::<FlowControlSpec>),
        s("PriorityBandSpec", "`flowControl.priorityBands[]`, `flowControl.defaultPriorityBand`", decoder::<PriorityBandSpec>),
        s("RequestHandler", "`requestHandler`", decoder::<RequestHandler>),
    ]
}

fn map(key: &str, value: Value) -> Value {
    let mut m = Mapping::new();
    m.insert(Value::String(key.to_owned()), value);
    Value::Mapping(m)
}

/// The fields serde lists for an unknown one.
fn fields(section: &Section) -> Vec<String> {
    let err =
        (section.decode)(map(PROBE, Value::Bool(true))).expect_err("an unknown field is refused");
    let marker = format!("unknown field `{PROBE}`, expected ");
    let at = err
        .find(&marker)
        .unwrap_or_else(|| panic!("{}: {err}", section.name));
    super::plugins::listed(&err[at + marker.len()..])
}

/// What serde expects for `field`, and inside a list, what each element is.
fn type_of(section: &Section, field: &str) -> String {
    let refused = |value: Value, what: &str| {
        let err = (section.decode)(map(field, value)).err()?;
        let marker = format!("invalid type: {what}, expected ");
        let at = err.find(&marker)?;
        Some(super::plugins::clause(&err[at + marker.len()..]))
    };
    let Some(outer) = refused(Value::Bool(true), "boolean `true`") else {
        // `true` taken: a boolean, unless a map is taken too.
        let map_refused = refused(Value::Mapping(Mapping::new()), "map").is_some();
        return if map_refused {
            "boolean".into()
        } else {
            ANY.into()
        };
    };
    if outer != "a sequence" {
        return outer;
    }
    let inner = refused(Value::Sequence(vec![Value::Bool(true)]), "boolean `true`");
    format!("list of {}", inner.unwrap_or_else(|| "boolean".into()))
}

pub fn page() -> String {
    let mut out = String::new();
    writeln!(out, "{GENERATED}\n").unwrap();
    writeln!(out, "# `EndpointPickerConfig` fields\n").unwrap();
    writeln!(
        out,
        "Every field of the configuration document (`--config-file`, `--config-text`), by the \
         type that holds it. The document is decoded strictly: an unknown field is an error \
         naming it, and every problem is reported at once. A plugin's `parameters` are listed \
         per plugin type in [plugins.md](plugins.md); the concepts in \
         [../configuration.md](../configuration.md).\n"
    )
    .unwrap();
    let all = sections();
    for section in &all {
        writeln!(out, "## {}\n\nAt {}.\n", section.name, section.at).unwrap();
        writeln!(out, "| field | type |\n|---|---|").unwrap();
        for field in fields(section) {
            let ty = type_of(section, &field);
            if let Some(inner) = ty.split("struct ").nth(1) {
                let name = inner.split_whitespace().next().unwrap_or(inner);
                assert!(
                    all.iter().any(|s| s.name == name),
                    "{}.{field} holds struct {name}, which config.rs's sections() does not list",
                    section.name
                );
            }
            writeln!(out, "| `{field}` | {} |", cell(&ty)).unwrap();
        }
        out.push('\n');
    }
    out
}

//! What `epp-config` does (`src/bin/epp-config.rs`): a configuration checked before it is
//! deployed (which upstream shape it is, every problem at once, every plugin as epp decodes it
//! with its defaults filled in) and migrated to llm-d v1.0's `llm-d.ai/v1` (moved fields moved,
//! removed plugins replaced by what upstream replaced them with).

use super::{parse_document, Config, LoadOptions, API_VERSION, API_VERSION_GIE, API_VERSION_V1};
use serde_norway::{Mapping, Value};

/// What a check found.
#[derive(Debug)]
pub struct Checked {
    /// Which upstream version's shape the document is.
    pub shape: &'static str,
    /// Deprecations: the document loads, but upstream has moved on.
    pub notes: Vec<String>,
    /// Every problem; empty when epp would load it.
    pub problems: Vec<String>,
    /// Each plugin as epp decodes it (name, type, typed parameters with defaults).
    pub plugins: Vec<String>,
}

/// The upstream shape an `apiVersion` names.
pub(crate) fn shape(api_version: &str) -> &'static str {
    match api_version {
        API_VERSION_V1 => "llm-d.ai/v1 (llm-d v1.0)",
        API_VERSION => "llm-d.ai/v1alpha1 (llm-d-router v0.10 and v0.11)",
        API_VERSION_GIE => "inference.networking.x-k8s.io/v1alpha1 (GIE v1.x)",
        _ => "an apiVersion epp does not read",
    }
}

/// Checks `text` as epp would load it.
pub fn check(text: &str, load: LoadOptions) -> Checked {
    let doc = match parse_document(text) {
        Ok(doc) => doc,
        Err(e) => {
            return Checked {
                shape: "not an EndpointPickerConfig document",
                notes: Vec::new(),
                problems: e.problems.iter().map(ToString::to_string).collect(),
                plugins: Vec::new(),
            }
        }
    };
    let (problems, plugins) = match Config::decode(&doc, load) {
        Ok(c) => (Vec::new(), c.plugins.iter().map(plugin_line).collect()),
        Err(e) => (
            e.problems.iter().map(ToString::to_string).collect(),
            Vec::new(),
        ),
    };
    Checked {
        shape: shape(&doc.api_version),
        notes: doc.deprecations(),
        problems,
        plugins,
    }
}

fn plugin_line(p: &super::plugin::NamedPlugin) -> String {
    format!("{} ({}): {:?}", p.name, p.kind, p.plugin)
}

/// Why a document could not be migrated.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("not a YAML document: {0}")]
    Syntax(String),
    #[error("not a mapping at the top level")]
    NotAMapping,
}

/// `text` in llm-d v1.0's shape: `apiVersion: llm-d.ai/v1`; `saturationDetector` under
/// `flowControl`, `parser` under `requestHandler.parsers`; `dataLayer.discovery.pluginRef` under
/// `endpoints`; the cross-replica fields under `dataLayer.crossReplica`; each
/// `precise-prefix-cache-scorer` (removed in llm-d-router v0.11) as a
/// `precise-prefix-cache-producer` plus a `prefix-cache-scorer` reading it. Comments are not kept.
pub fn migrate(text: &str) -> Result<String, MigrateError> {
    let mut doc: Value =
        serde_norway::from_str(text).map_err(|e| MigrateError::Syntax(e.to_string()))?;
    let top = doc.as_mapping_mut().ok_or(MigrateError::NotAMapping)?;
    top.insert("apiVersion".into(), API_VERSION_V1.into());
    top.insert("kind".into(), "EndpointPickerConfig".into());
    if let Some(detector) = top.remove("saturationDetector") {
        section(top, "flowControl").insert("saturationDetector".into(), detector);
    }
    if let Some(parser) = top.remove("parser") {
        let handler = section(top, "requestHandler");
        let parsers = handler
            .entry("parsers".into())
            .or_insert(Value::Sequence(Vec::new()));
        if let Value::Sequence(list) = parsers {
            list.push(parser);
        }
    }
    move_data_layer(top);
    replace_precise_scorers(top);
    serde_norway::to_string(&doc).map_err(|e| MigrateError::Syntax(e.to_string()))
}

/// The mapping under `key`, made when absent (or not a mapping).
fn section<'m>(m: &'m mut Mapping, key: &str) -> &'m mut Mapping {
    let v = m
        .entry(key.into())
        .or_insert(Value::Mapping(Mapping::new()));
    if !v.is_mapping() {
        *v = Value::Mapping(Mapping::new());
    }
    match v {
        Value::Mapping(inner) => inner,
        _ => unreachable!("made a mapping above"),
    }
}

/// v1alpha1's data-layer fields where v1 put them.
fn move_data_layer(top: &mut Mapping) {
    let Some(Value::Mapping(dl)) = top.get_mut("dataLayer") else {
        return;
    };
    if let Some(Value::Mapping(d)) = dl.get_mut("discovery") {
        if let Some(r) = d.remove("pluginRef") {
            section(d, "endpoints").insert("pluginRef".into(), r);
        }
    }
    for (old, new) in [
        ("crossReplicaSyncerPluginRef", "syncerPluginRef"),
        ("crossReplicaSyncInterval", "syncInterval"),
    ] {
        if let Some(v) = dl.remove(old) {
            section(dl, "crossReplica").insert(new.into(), v);
        }
    }
}

/// Each `precise-prefix-cache-scorer` becomes a producer (`<name>-producer`, the scorer's
/// parameters) and a `prefix-cache-scorer` of the scorer's name reading it, so the profiles'
/// references stay valid.
fn replace_precise_scorers(top: &mut Mapping) {
    let Some(Value::Sequence(plugins)) = top.get_mut("plugins") else {
        return;
    };
    let mut out = Vec::with_capacity(plugins.len());
    for p in plugins.drain(..) {
        let is_precise =
            p.get("type").and_then(Value::as_str) == Some("precise-prefix-cache-scorer");
        if !is_precise {
            out.push(p);
            continue;
        }
        let name = p
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("precise-prefix-cache-scorer")
            .to_owned();
        let producer = format!("{name}-producer");
        let mut made = Mapping::new();
        made.insert("name".into(), producer.clone().into());
        made.insert("type".into(), "precise-prefix-cache-producer".into());
        if let Some(params) = p.get("parameters") {
            made.insert("parameters".into(), params.clone());
        }
        out.push(Value::Mapping(made));
        let mut scorer = Mapping::new();
        scorer.insert("name".into(), name.into());
        scorer.insert("type".into(), "prefix-cache-scorer".into());
        let mut params = Mapping::new();
        params.insert("prefixMatchInfoProducerName".into(), producer.into());
        scorer.insert("parameters".into(), Value::Mapping(params));
        out.push(Value::Mapping(scorer));
    }
    *plugins = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOAD: LoadOptions = LoadOptions {
        allow_experimental: true,
    };

    const OLD: &str = "apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: utilization-detector
- type: openai-parser
- name: precise
  type: precise-prefix-cache-scorer
  parameters: {tokenProcessorConfig: {blockSize: 64}, indexerConfig: {tokenizersPoolConfig: {modelName: m}}}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: precise
    weight: 2
  - pluginRef: max-score-picker
saturationDetector: {pluginRef: utilization-detector}
parser: {pluginRef: openai-parser}
";

    #[test]
    fn a_check_names_the_shape_every_problem_and_each_plugin_as_decoded() {
        let ok = check(OLD, LOAD);
        assert_eq!(
            ok.shape,
            "inference.networking.x-k8s.io/v1alpha1 (GIE v1.x)"
        );
        assert!(ok.problems.is_empty(), "{:?}", ok.problems);
        assert!(
            ok.notes
                .iter()
                .any(|n| n.contains("precise-prefix-cache-producer")),
            "{:?}",
            ok.notes
        );
        assert!(ok
            .plugins
            .iter()
            .any(|p| p.starts_with("precise (precise-prefix-cache-scorer): ")));
        let bad = "apiVersion: llm-d.ai/v1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n  parameters: {bogus: 1}\n- type: no-such-plugin\nsaturationDetector: {pluginRef: x}\n";
        let c = check(bad, LOAD);
        assert_eq!(c.shape, "llm-d.ai/v1 (llm-d v1.0)");
        let all = c.problems.join("\n");
        for want in ["bogus", "no-such-plugin", "saturationDetector"] {
            assert!(all.contains(want), "{want} missing from {all}");
        }
    }

    #[test]
    fn a_migrated_document_is_v1_and_loads_with_the_same_meaning() {
        let v1 = migrate(OLD).unwrap();
        let c = check(&v1, LOAD);
        assert_eq!(c.shape, "llm-d.ai/v1 (llm-d v1.0)");
        assert!(c.problems.is_empty(), "{:?}\n{v1}", c.problems);
        assert!(
            c.notes.is_empty(),
            "nothing deprecated is left: {:?}",
            c.notes
        );
        let doc: Value = serde_norway::from_str(&v1).unwrap();
        assert_eq!(
            doc["flowControl"]["saturationDetector"]["pluginRef"],
            "utilization-detector"
        );
        assert_eq!(
            doc["requestHandler"]["parsers"][0]["pluginRef"],
            "openai-parser"
        );
        let names: Vec<(&str, &str)> = doc["plugins"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["name"].as_str().unwrap_or(""),
                    p["type"].as_str().unwrap(),
                )
            })
            .collect();
        assert!(names.contains(&("precise-producer", "precise-prefix-cache-producer")));
        assert!(names.contains(&("precise", "prefix-cache-scorer")));
        assert_eq!(migrate(&v1).unwrap(), v1, "migrating twice changes nothing");
    }

    #[test]
    fn data_layer_fields_move_where_v1_put_them() {
        let text = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: file-discovery\n  parameters: {path: /e.yaml}\ndataLayer:\n  discovery: {pluginRef: file-discovery}\n";
        let doc: Value = serde_norway::from_str(&migrate(text).unwrap()).unwrap();
        assert_eq!(
            doc["dataLayer"]["discovery"]["endpoints"]["pluginRef"],
            "file-discovery"
        );
        assert!(doc["dataLayer"]["discovery"].get("pluginRef").is_none());
        assert!(matches!(
            migrate("- a\n- b\n"),
            Err(MigrateError::NotAMapping)
        ));
        assert!(matches!(migrate("a: [\n"), Err(MigrateError::Syntax(_))));
    }
}

//! docs/reference/metrics.md: every metric family `/metrics` serves.
//!
//! Names, types and help come from a freshly registered `epp::metrics::Metrics`, encoded as
//! `/metrics` encodes it. A family shows its label names only once it has a sample, so the
//! labels are read from the source that declares them (src/metrics.rs and src/metrics/*.rs):
//! the field each `register("name", help, ….field.clone())` call registers, the label-set type
//! of that field (`Family<Labels, _>`), and that type's fields. A family the scan cannot place
//! fails the test, so the page cannot show a family without its labels.

use super::{cell, read, root, GENERATED};
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::fmt::Write;

pub struct Family {
    pub name: String,
    pub help: String,
}

/// Every family of a fresh registry, in registration order: name and help from the registry's
/// descriptors (its `Debug` form, which lists every family, sampled or not; the text encoding
/// leaves out a labelled family until it has a sample).
pub fn families() -> Vec<Family> {
    let mut registry = Registry::default();
    let _metrics = epp::metrics::Metrics::register(&mut registry);
    let debug = format!("{registry:?}");
    let mut out = Vec::new();
    for part in debug.split("Descriptor { name: \"").skip(1) {
        let (name, rest) = quoted(part);
        let rest = rest
            .strip_prefix(", help: \"")
            .expect("Descriptor's help follows its name");
        let (help, _) = quoted(rest);
        out.push(Family { name, help });
    }
    assert!(
        !out.is_empty(),
        "no Descriptor in the registry's Debug form: its format changed"
    );
    out
}

/// A Debug-escaped string up to its closing quote, unescaped, and what follows the quote.
fn quoted(text: &str) -> (String, &str) {
    let mut out = String::new();
    let mut chars = text.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return (out, &text[i + 1..]),
            '\\' => match chars.next() {
                Some((_, 'n')) => out.push(' '),
                Some((_, e)) => out.push(e),
                None => break,
            },
            c => out.push(c),
        }
    }
    panic!("unterminated string in the registry's Debug form")
}

/// The types the text encoding names for the families it shows (those with a sample).
fn encoded_types() -> BTreeMap<String, String> {
    let mut registry = Registry::default();
    let _metrics = epp::metrics::Metrics::register(&mut registry);
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, k)| (n.to_owned(), k.to_owned()))
        .collect()
}

pub fn page() -> String {
    let labels = Labels::scan();
    let families = families();
    let mut out = String::new();
    writeln!(out, "{GENERATED}\n").unwrap();
    writeln!(out, "# Metric families\n").unwrap();
    writeln!(
        out,
        "Every family epp serves on `/metrics` ({} in all, `--metrics-port`, 9090), as the \
         OpenMetrics text encoding names it: a counter `x` is sampled as `x_total`, a histogram as \
         `x_bucket`, `x_sum` and `x_count`. GIE's `inference_*` names and llm-d-router v0.10's \
         `llm_d_epp_*` names of one family share its values; families named `epp_*` are epp's \
         own. A `model_name` label holds at most a capped number of distinct models.\n",
        families.len()
    )
    .unwrap();
    writeln!(out, "| family | type | labels | help |").unwrap();
    writeln!(out, "|---|---|---|---|").unwrap();
    let encoded = encoded_types();
    for f in &families {
        let (kind, names) = labels.of(&f.name);
        if let Some(shown) = encoded.get(&f.name) {
            assert_eq!(
                shown.as_str(),
                kind,
                "{}: the scan's type differs from the encoding's",
                f.name
            );
        }
        let shown = if names.is_empty() {
            "—".to_owned()
        } else {
            names
                .iter()
                .map(|l| format!("`{l}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        writeln!(
            out,
            "| `{}` | {kind} | {} | {} |",
            f.name,
            shown,
            cell(&f.help)
        )
        .unwrap();
    }
    out
}

/// What the metrics source declares: the field each family name registers, each field's
/// label-set type (`None`: no labels), each label-set type's label names.
struct Labels {
    registered: BTreeMap<String, String>,
    field_labels: BTreeMap<String, (&'static str, Option<String>)>,
    sets: BTreeMap<String, Vec<String>>,
}

impl Labels {
    fn scan() -> Self {
        let dir = root().join("src/metrics");
        let mut files = vec![root().join("src/metrics.rs")];
        let mut more: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "rs"))
            .filter(|p| p.file_name().is_none_or(|n| n != "tests.rs"))
            .collect();
        more.sort();
        files.extend(more);
        let mut scan = Labels {
            registered: BTreeMap::new(),
            field_labels: BTreeMap::new(),
            sets: BTreeMap::new(),
        };
        for file in files {
            let code = without_comments(&read(&file));
            scan.structs(&code);
            scan.registrations(&code);
        }
        scan
    }

    /// The type and label names of family `name`; panics naming the family if the scan cannot
    /// place it.
    fn of(&self, name: &str) -> (&'static str, Vec<String>) {
        let field = self.registered.get(name).unwrap_or_else(|| {
            panic!("no `register(\"{name}\", …)` call found in src/metrics*: the scan reads those")
        });
        let (kind, set) = self.field_labels.get(field).unwrap_or_else(|| {
            panic!("family {name}: field `{field}` is declared in no metrics struct")
        });
        let Some(set) = set else {
            return (*kind, Vec::new());
        };
        let labels = self.sets.get(set);
        let labels = labels.unwrap_or_else(|| panic!("family {name}: label set `{set}` not found"));
        (*kind, labels.clone())
    }

    /// Every `struct Name { pub field: Type, ... }`: metric fields and label sets.
    fn structs(&mut self, code: &str) {
        for part in code.split("struct ").skip(1) {
            let Some((head, body)) = part.split_once('{') else {
                continue;
            };
            let name = head.trim().to_owned();
            if name.contains(['(', ';', '<']) {
                continue;
            }
            let body = &body[..body.find('}').unwrap_or(body.len())];
            let mut label_names = Vec::new();
            for field in split_top(body) {
                let field = field.trim();
                let field = field.strip_prefix("pub(crate) ").unwrap_or(field);
                let field = field.trim_start_matches("pub ");
                let Some((fname, ty)) = field.split_once(':') else {
                    continue;
                };
                let (fname, ty) = (fname.trim().to_owned(), ty.trim());
                label_names.push(fname.clone());
                if let Some(set) = label_set_of(ty) {
                    self.field_labels.insert(fname, set);
                }
            }
            self.sets.insert(name, label_names);
        }
    }

    /// Every `register("name", help, expr.field.clone())`.
    fn registrations(&mut self, code: &str) {
        for part in code.split(".register(").skip(1) {
            let Some(name) = part.trim_start().strip_prefix('"') else {
                continue;
            };
            let Some(end) = name.find('"') else { continue };
            let family = name[..end].to_owned();
            let Some(at) = part.find(".clone()") else {
                continue;
            };
            let expr = &part[..at];
            let field = expr.rsplit('.').next().unwrap_or(expr).trim().to_owned();
            self.registered.insert(family, field);
        }
    }
}

/// A field type's metric type and label set (`None`: unlabelled); `None` for anything that is
/// no metric.
fn label_set_of(ty: &str) -> Option<(&'static str, Option<String>)> {
    let kind = if ty.starts_with("HistFamily<") || ty.contains("Histogram") {
        "histogram"
    } else if ty.contains("Counter") {
        "counter"
    } else if ty.contains("Gauge") {
        "gauge"
    } else {
        return None;
    };
    let set = ["HistFamily<", "Family<"].iter().find_map(|family| {
        let rest = ty.strip_prefix(family)?;
        let end = rest.find([',', '>']).unwrap_or(rest.len());
        Some(rest[..end].trim().to_owned())
    });
    Some((kind, set))
}

/// `text` split at the commas outside `<...>` (a field's generic type keeps its commas).
fn split_top(text: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&text[start..]);
    out
}

/// The code without `//` comments (none of the scanned files has `//` inside a string).
fn without_comments(code: &str) -> String {
    code.lines()
        .map(|l| l.split_once("//").map_or(l, |(code, _)| code))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_scan_reads_families_labels_and_unlabelled_metrics() {
    let code = "pub struct M { pub a: Family<L, Counter>, pub b: Histogram }\n\
                pub struct L { pub x: String, pub y: Outcome }\n\
                fn r(&self, r: &mut Registry) { r.register(\"fa\", HELP, self.a.clone());\n\
                r.register(\n \"fb\",\n \"help, with a comma\",\n f.b.clone(),\n); }";
    let mut scan = Labels {
        registered: BTreeMap::new(),
        field_labels: BTreeMap::new(),
        sets: BTreeMap::new(),
    };
    scan.structs(code);
    scan.registrations(code);
    assert_eq!(
        scan.of("fa"),
        ("counter", vec!["x".to_owned(), "y".to_owned()])
    );
    assert_eq!(scan.of("fb"), ("histogram", Vec::new()));
}

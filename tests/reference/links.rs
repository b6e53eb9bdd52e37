//! Every relative link of README.md, BENCHMARKS.md, ARCHITECTURE.md and docs/**/*.md resolves:
//! the file (or directory) exists, and a `#fragment` names a heading of the target page.

use super::{read, root};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn documents() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = ["README.md", "BENCHMARKS.md", "ARCHITECTURE.md"]
        .iter()
        .map(|p| root().join(p))
        .collect();
    markdown_under(&root().join("docs"), &mut out);
    out
}

fn markdown_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
    paths.sort();
    for p in paths {
        if p.is_dir() {
            markdown_under(&p, out);
        } else if p.extension().is_some_and(|e| e == "md") {
            out.push(p);
        }
    }
}

/// The targets of inline links `[text](target)` and reference definitions `[x]: target`,
/// outside fenced code blocks and code spans.
pub fn targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let line = without_code_spans(line);
        if let Some(rest) = line.trim_start().strip_prefix('[') {
            if let Some((_, target)) = rest.split_once("]: ") {
                out.push(target.split_whitespace().next().unwrap_or("").to_owned());
                continue;
            }
        }
        for part in line.split("](").skip(1) {
            let end = part.find([')', ' ']).unwrap_or(part.len());
            out.push(part[..end].trim_matches(['<', '>']).to_owned());
        }
    }
    out
}

fn without_code_spans(line: &str) -> String {
    line.split('`').step_by(2).collect::<Vec<_>>().join("")
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens, and a
/// `-n` suffix for the n-th repeat.
pub fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        let slug: String = title
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut candidate = slug.clone();
        let mut n = 0;
        while seen.contains(&candidate) {
            n += 1;
            candidate = format!("{slug}-{n}");
        }
        seen.insert(candidate);
    }
    seen
}

/// Link targets another branch adds (a generated page), each with the reason: a link to one
/// is accepted while the file is missing. Remove an entry once its file is in the tree.
const PENDING: &[(&str, &str)] = &[];

fn is_external(target: &str) -> bool {
    target.is_empty() || target.contains("://") || target.starts_with("mailto:")
}

/// What is wrong with `target` as linked from `doc`, if anything.
fn broken(doc: &Path, target: &str) -> Option<String> {
    let (path, fragment) = target.split_once('#').unwrap_or((target, ""));
    let file = if path.is_empty() {
        doc.to_path_buf()
    } else {
        doc.parent().unwrap().join(path)
    };
    if !file.exists() {
        let pending = PENDING
            .iter()
            .any(|(p, _)| root().join(p) == normalize(&file));
        if pending {
            return None;
        }
        return Some(format!("{target}: no such file {}", file.display()));
    }
    let markdown = file.extension().is_some_and(|e| e == "md");
    if fragment.is_empty() || !markdown {
        return None;
    }
    let found = anchors(&read(&file));
    (!found.contains(fragment))
        .then(|| format!("{target}: no heading #{fragment} in {}", file.display()))
}

/// `path` with `.` and `..` segments resolved lexically.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
fn every_relative_link_resolves() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        for target in targets(&read(&doc)) {
            if is_external(&target) {
                continue;
            }
            checked += 1;
            if let Some(p) = broken(&doc, &target) {
                let name = doc
                    .strip_prefix(root())
                    .unwrap_or(&doc)
                    .display()
                    .to_string();
                problems.push(format!("  {name}: {p}"));
            }
        }
    }
    assert!(
        checked > 0,
        "no relative link found: the link scan is broken"
    );
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_scan_finds_links_and_anchors() {
    let text = "# Top `x`\n## Two words, here\n## Two words, here\n[a](b.md#two-words-here) \
                `[no](code.md)`\n```\n[no](fenced.md)\n```\n[ref]: other.md#top-x\n";
    assert_eq!(targets(text), vec!["b.md#two-words-here", "other.md#top-x"]);
    let a = anchors(text);
    assert!(a.contains("top-x") && a.contains("two-words-here") && a.contains("two-words-here-1"));
}

#!/usr/bin/env python3
"""Fails when an import in src/ breaks the layer table of ARCHITECTURE.md (repo root).

Rows name module paths: every top-level module of the epp crate, and a nested module that sits
in another layer than its parent (none today; a module nested under its owner but imported by a
layer below it would be one). A file belongs to the longest row its module path starts with, and
so does an import: were `director::x` a row, `crate::director::x::Y` would be an import of
`director::x`, not of `director`. Imports are read from every `crate::` and `super::` path, `use` groups
(`use crate::{a, b::{c, d}}`) included.

A module may import a lower layer, or an earlier row of its own layer when that layer is
ordered (the pure core, orchestration). Adapters never import each other. Pure modules name no
runtime, transport or Kubernetes client. Comment lines and test files (`tests.rs`,
`tests_<topic>.rs`, `tests/`, and everything after a `#[cfg(test)]`) are not checked: tests
may reach anywhere.

A top-level module missing from the table, or a row naming a module that does not exist, is an
error too, so the map cannot drift from the tree. KNOWN lists the imports that break the table
today, each with the reason it is left; an entry that no longer occurs is an error, so the list
only shrinks.

`--self-test` breaks a copy of src/ in each of those ways, one at a time, and fails unless the
check reports every break (hack/test.sh runs both).
"""
import os
import re
import shutil
import sys
import tempfile

LAYERS = [
    # 0 vocabulary: identities (the plugin registry among them), typed metric families, spans.
    ("vocabulary", ["endpoint", "metrics", "telemetry", "plugin", "duration", "clock"], False),
    # 1 pure core (each may use the ones before it in this list): admission is the saturation
    # detectors, the admitter and the shed decision, plugins the configuration decodes.
    ("core", ["request", "prefix", "scheduling", "admission"], True),
    # 2 state (datastore::objectives, the objectives snapshot, is the datastore's), and the two
    # I/O helpers adapters and the root share: following a file, handshaking TLS for tonic.
    ("state", ["datastore", "watch", "handshake"], False),
    # 3 orchestration (each may use the ones before it): the configuration decoder sits above
    # every module whose typed parameters it decodes, and below the director that reads it
    # (flow control included).
    ("orchestration", ["config", "director"], True),
    # 4 adapters: the outside world (discovery::k8s holds the CRD types and leader election;
    # scrape, the endpoint poller, holds the health probes; replicas is replica sharing).
    ("adapters", ["extproc", "discovery", "scrape", "kvevents", "replicas", "admin",
                  "health", "reload"], False),
    # 5 root: the test fixtures, the fuzz harness (its director built through the fixtures) and
    # the wiring; each may use the ones before it, and all reach the whole crate.
    ("root", ["fixtures", "fuzzing", "app"], True),
]

# Modules that know no runtime, transport or Kubernetes client: the pure core.
PURE = {"request", "prefix", "scheduling", "admission"}
PURE_FORBIDDEN = re.compile(r"\b(tokio|tonic|kube|hyper|hyper_util)::")

KNOWN = {
    # (module, imported module): "why it is left". Empty: the tree follows the table.
}

ROWS = {m: (i, pos, ordered) for i, (_, ms, ordered) in enumerate(LAYERS) for pos, m in enumerate(ms)}

PATH_START = re.compile(r"(?<![A-Za-z0-9_])(crate|super)::")
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def row_of(segments):
    """The longest row that `segments` (a module path) starts with, or None."""
    for n in range(len(segments), 0, -1):
        name = "::".join(segments[:n])
        if name in ROWS:
            return name
    return None


def is_test_file(name):
    """`tests.rs` and `tests_<topic>.rs`: test modules, declared under `#[cfg(test)]`."""
    return name == "tests.rs" or (name.startswith("tests_") and name.endswith(".rs"))


def module_path(src, path):
    """src/director/flowcontrol/queues.rs → ["director", "flowcontrol", "queues"]."""
    rel = os.path.relpath(path, src)[:-3]
    return rel.split(os.sep)


def rust_files(src):
    for root, dirs, files in os.walk(src):
        # src/bin/ holds binaries, thin mains over the library like main.rs.
        dirs[:] = sorted(d for d in dirs if d != "tests" and not (root == src and d == "bin"))
        for f in sorted(files):
            if f.endswith(".rs") and not is_test_file(f) and not (
                    root == src and f in ("lib.rs", "main.rs")):
                yield os.path.join(root, f)


def code_of(path):
    """The file's non-test code, comments removed, as (line number, text) pairs."""
    lines = []
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        code = line.split("//")[0]
        if "#[cfg(test)]" in code:
            break  # everything after a test module is test code in this tree
        lines.append((n, code))
    return lines


def parse_tree(text, i, prefix, out):
    """Reads one path (with `{...}` groups) from text[i:]; appends every full path to out."""
    segments = list(prefix)
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i < len(text) and text[i] == "{":
            i += 1
            while True:
                i = parse_tree(text, i, segments, out)
                while i < len(text) and text[i] in " \t\r\n,":
                    i += 1
                if i >= len(text) or text[i] == "}":
                    return i + 1
        m = IDENT.match(text, i)
        if not m:
            out.append(segments)
            return i
        if m.group() != "self":
            segments.append(m.group())
        i = m.end()
        while i < len(text) and text[i] in " \t":
            i += 1
        if not text.startswith("::", i):
            out.append(segments)
            return i
        i += 2


def imports(src, path):
    """Every (line, module path) a file's code names through `crate::` or `super::`."""
    here = module_path(src, path)
    lines = code_of(path)
    text = "\n".join(code for _, code in lines)
    starts = [0]
    for _, code in lines:
        starts.append(starts[-1] + len(code) + 1)
    found = []
    for m in PATH_START.finditer(text):
        if m.start() > 0 and text[m.start() - 2:m.start()] == "::":
            continue  # `super::super::x`: read from the first `super`
        base, i = [], m.end()
        if m.group(1) == "super":
            base = here[:-1]
            while text.startswith("super::", i):
                base, i = base[:-1], i + len("super::")
        paths = []
        parse_tree(text, i, base, paths)
        line = lines[sum(1 for s in starts[1:] if s <= m.start())][0]
        found += [(line, p) for p in paths if p]
    return found


def check(src):
    problems = []
    top = sorted(f[:-3] for f in os.listdir(src)
                 if f.endswith(".rs") and f not in ("lib.rs", "main.rs"))
    for module in top:
        if module not in ROWS:
            problems.append(f"src/{module}.rs: module {module!r} is not in the layer table")
    for row in ROWS:
        if not os.path.exists(os.path.join(src, *row.split("::")) + ".rs"):
            problems.append(f"layer table row {row!r} names no module (src/{row.replace('::', '/')}.rs)")
    seen_known = set()
    for path in rust_files(src):
        rel = os.path.relpath(path, os.path.dirname(src))
        module = row_of(module_path(src, path))
        if module is None:
            continue
        mine = ROWS[module]
        if module in PURE:
            for n, code in code_of(path):
                hit = PURE_FORBIDDEN.search(code)
                if hit:
                    problems.append(f"{rel}:{n}: the pure module {module} uses {hit.group(1)}")
        for n, other in sorted({(n, row_of(segments)) for n, segments in imports(src, path)},
                               key=lambda pair: (pair[0], pair[1] or "")):
            if other is None or other == module:
                continue
            theirs = ROWS[other]
            if theirs[0] < mine[0] or (theirs[0] == mine[0] and mine[2] and theirs[1] < mine[1]):
                continue
            if (module, other) in KNOWN:
                seen_known.add((module, other))
                continue
            problems.append(f"{rel}:{n}: {module} ({LAYERS[mine[0]][0]}) imports {other} "
                            f"({LAYERS[theirs[0]][0]})")
    for pair in sorted(set(KNOWN) - seen_known):
        problems.append(f"KNOWN entry {pair} no longer occurs: remove it from hack/check-layers.py")
    return problems


# `--self-test`: breaks a copy of src/ one way at a time and expects the check to say so.
# (file, line inserted after its first line, what the report must contain)
BREAKS = [
    ("config/flow.rs", "use crate::director::Runtime;", "config (orchestration) imports director"),
    ("admission.rs", "use crate::director::Shared;", "admission (core) imports director"),
    ("admission/params.rs", "use super::super::datastore::Datastore;", "admission (core) imports datastore"),
    ("datastore/ttft.rs", "use crate::config::Config;", "datastore (state) imports config"),
    ("extproc/wire.rs", "use crate::{endpoint,\n    admin::{self, x}};", "extproc (adapters) imports admin"),
    ("discovery/k8s/leader.rs", "use super::super::super::app::Options;", "discovery (adapters) imports app"),
    ("scheduling/profile.rs", "use tokio::sync::Mutex;", "the pure module scheduling uses tokio"),
    ("admission/concurrency.rs", "use kube::Api;", "the pure module admission uses kube"),
    ("scrape.rs", "use crate::kvevents::Sink;", "scrape (adapters) imports kvevents"),
]


def self_test(src):
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "src")
        shutil.copytree(src, copy)
        if check(copy):
            return [f"the unbroken tree fails: {check(copy)}"]
        for rel, line, expected in BREAKS:
            path = os.path.join(copy, rel)
            if not os.path.exists(path):
                failures.append(f"src/{rel} is gone: give its BREAKS case another file")
                continue
            original = open(path, encoding="utf-8").read()
            first, rest = original.split("\n", 1)
            open(path, "w", encoding="utf-8").write(f"{first}\n{line}\n{rest}")
            found = check(copy)
            if not any(expected in p for p in found):
                failures.append(f"{rel} + {line!r}: expected {expected!r}, got {found}")
            open(path, "w", encoding="utf-8").write(original)
        open(os.path.join(copy, "newmodule.rs"), "w").close()
        if not any("'newmodule' is not in the layer table" in p for p in check(copy)):
            failures.append("a module without a row passes")
        os.remove(os.path.join(copy, "newmodule.rs"))
        os.rename(os.path.join(copy, "admission.rs"), os.path.join(tmp, "a.rs"))
        if not any("row 'admission' names no module" in p for p in check(copy)):
            failures.append("a row without a module passes")
    return failures


def main():
    src = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
    if sys.argv[1:] == ["--self-test"]:
        failures = self_test(src)
        for f in failures:
            print(f, file=sys.stderr)
        print(f"self-test: {len(BREAKS) + 2 - len(failures)} of {len(BREAKS) + 2} breaks caught",
              file=sys.stderr)
        return 1 if failures else 0
    problems = check(src)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"{len(problems)} layer problem(s); see ARCHITECTURE.md", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

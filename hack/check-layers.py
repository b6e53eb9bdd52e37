#!/usr/bin/env python3
"""Fails when an import in src/ breaks the layer table of ARCHITECTURE.md (repo root).

Every top-level module of the epp crate has a layer; a module may use `crate::<other>` only for
an `other` in a lower layer, or in its own layer when that layer allows it (the pure core, in
table order). Adapters never import each other. Comment lines and test files (`tests.rs`,
`tests_<topic>.rs`, `tests/`) are not checked: tests may reach anywhere.

A module missing from the table is an error too, so the map cannot drift from the tree.
KNOWN lists the imports that break the table today, each with the reason it is left; an entry
that no longer occurs is an error, so the list only shrinks.
"""
import os
import re
import sys

LAYERS = [
    # 0 vocabulary: identities (the plugin registry among them), typed metric families, CRD
    # types, objective priorities.
    ("vocabulary", ["endpoint", "metrics", "objectives", "crd", "telemetry", "plugin"], False),
    # 1 pure core (each may use the ones before it in this list).
    ("core", ["request", "prefix", "scheduling", "admission"], True),
    # 2 state.
    ("state", ["datastore", "watch"], False),
    # 3 orchestration (each may use the ones before it): the configuration decoder sits above
    # every module whose typed parameters it decodes, and below the director that reads it.
    ("orchestration", ["config", "flowcontrol", "director"], True),
    # 4 adapters: the outside world.
    ("adapters", ["extproc", "discovery", "scrape", "kvevents", "admin", "health",
                  "reload", "probe", "leader"], False),
    # 5 root: wiring (and the fuzz harness and the test fixtures, which reach the whole crate).
    ("root", ["app", "fuzzing", "fixtures"], False),
]

KNOWN = {
    # (module, imported module): "why it is left". Empty: the tree follows the table.
}

# The pure core knows no runtime, transport or Kubernetes client.
CORE_FORBIDDEN = re.compile(r"\b(tokio|tonic|kube|hyper|hyper_util)::")

USE = re.compile(r"crate::([a-z_]+)")


def layer_of(module):
    for index, (_, modules, ordered) in enumerate(LAYERS):
        if module in modules:
            return index, modules.index(module), ordered
    return None


def is_test_file(name):
    """`tests.rs` and `tests_<topic>.rs`: test modules, declared under `#[cfg(test)]`."""
    return name == "tests.rs" or (name.startswith("tests_") and name.endswith(".rs"))


def files_of(src, module):
    paths = [os.path.join(src, module + ".rs")]
    for root, dirs, files in os.walk(os.path.join(src, module)):
        dirs[:] = [d for d in dirs if d != "tests"]
        paths += [os.path.join(root, f) for f in files if f.endswith(".rs") and not is_test_file(f)]
    return [p for p in paths if os.path.exists(p)]


def imports(path):
    found = set()
    in_tests = False
    for line in open(path, encoding="utf-8"):
        stripped = line.strip()
        if stripped.startswith("#[cfg(test)]"):
            in_tests = True  # everything after a test module is test code in this tree
        if in_tests or stripped.startswith("//"):
            continue
        found.update(USE.findall(line.split("//")[0]))
    return found


def main():
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    modules = sorted(f[:-3] for f in os.listdir(src)
                     if f.endswith(".rs") and f not in ("lib.rs", "main.rs"))
    problems = []
    seen_known = set()
    for module in modules:
        if layer_of(module) is None:
            problems.append(f"src/{module}.rs: module {module!r} is not in the layer table")
    for module in modules:
        mine = layer_of(module)
        if mine is None:
            continue
        for path in files_of(src, module):
            if LAYERS[mine[0]][0] == "core":
                for n, line in enumerate(open(path, encoding="utf-8"), 1):
                    code = line.split("//")[0]
                    if "#[cfg(test)]" in code:
                        break
                    if CORE_FORBIDDEN.search(code):
                        problems.append(f"{os.path.relpath(path, os.path.dirname(src))}:{n}: "
                                        f"the pure core ({module}) uses {CORE_FORBIDDEN.search(code).group(1)}")
            for other in sorted(imports(path)):
                theirs = layer_of(other)
                if other == module or theirs is None:
                    continue
                allowed = theirs[0] < mine[0] or (
                    theirs[0] == mine[0] and mine[2] and theirs[1] < mine[1])
                if allowed:
                    continue
                if (module, other) in KNOWN:
                    seen_known.add((module, other))
                    continue
                problems.append(
                    f"{os.path.relpath(path, os.path.dirname(src))}: {module} "
                    f"({LAYERS[mine[0]][0]}) imports {other} ({LAYERS[theirs[0]][0]})")
    for pair in sorted(set(KNOWN) - seen_known):
        problems.append(f"KNOWN entry {pair} no longer occurs: remove it from hack/check-layers.py")
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"{len(problems)} layer problem(s); see ARCHITECTURE.md", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

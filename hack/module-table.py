#!/usr/bin/env python3
"""Prints the module table of the epp crate: per top-level module of src/, its files, lines and
largest function (non-test code: test files and everything after a `#[cfg(test)]` are left
out, as in check-layers.py).

    hack/module-table.py [SRC_DIR]    # default: this repository's src/

A function's length is the lines from its `fn` line to its closing brace (a signature split
over lines counts). Braces inside string and char literals and comments are skipped, roughly:
good enough to compare trees, not a Rust parser.
"""
import os
import re
import sys

FN = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?fn\s+([A-Za-z_][A-Za-z0-9_]*)")


def is_test_file(name):
    return name == "tests.rs" or (name.startswith("tests_") and name.endswith(".rs"))


def code_lines(path):
    out = []
    for line in open(path, encoding="utf-8"):
        if line.strip().startswith("#[cfg(test)]"):
            break
        out.append(line.rstrip("\n"))
    return out


def strip(line):
    """The line without comments and string/char literal contents (for counting braces)."""
    line = re.sub(r'"(?:\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(?:\\.|[^'\\])'", "''", line)
    return line.split("//")[0]


def functions(lines):
    """(name, length) of every function whose body is found."""
    found = []
    for i, line in enumerate(lines):
        m = FN.match(line)
        if not m:
            continue
        depth, opened = 0, False
        for j in range(i, len(lines)):
            code = strip(lines[j])
            if not opened and ";" in code and "{" not in code:
                break  # a declaration without a body (trait method)
            for ch in code:
                if ch == "{":
                    depth, opened = depth + 1, True
                elif ch == "}":
                    depth -= 1
            if opened and depth <= 0:
                found.append((m.group(1), j - i + 1))
                break
    return found


def module_files(src, module):
    paths = [os.path.join(src, module + ".rs")]
    for root, dirs, files in os.walk(os.path.join(src, module)):
        dirs[:] = [d for d in dirs if d != "tests"]
        paths += [os.path.join(root, f) for f in files if f.endswith(".rs") and not is_test_file(f)]
    return sorted(p for p in paths if os.path.exists(p))


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "src")
    modules = sorted(f[:-3] for f in os.listdir(src)
                     if f.endswith(".rs") and f not in ("lib.rs", "main.rs"))
    print("| module | files | lines (non-test) | largest function |")
    print("|---|---:|---:|---|")
    total_files = total_lines = 0
    for module in modules:
        files = module_files(src, module)
        lines = 0
        biggest = ("-", 0, "")
        for path in files:
            code = code_lines(path)
            lines += len(code)
            for name, length in functions(code):
                if length > biggest[1]:
                    biggest = (name, length, os.path.relpath(path, src))
        total_files += len(files)
        total_lines += lines
        where = f"`{biggest[0]}` ({biggest[1]} lines, {biggest[2]})" if biggest[1] else "-"
        print(f"| `{module}` | {len(files)} | {lines} | {where} |")
    print(f"| {len(modules)} modules | {total_files} | {total_lines} | |")


if __name__ == "__main__":
    main()

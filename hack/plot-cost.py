#!/usr/bin/env python3
"""Draws the cost bars (docs/plots/cost.svg) from docs/plots/cost.csv, as plain SVG (no
dependencies). Each CSV row is `metric,router,value,source`; `#` lines are comments. One panel
per metric, one bar per router, bars scaled to the panel's largest value, each labelled with its
value. Usage: hack/plot-cost.py [CSV] [SVG] (defaults: docs/plots/cost.csv, docs/plots/cost.svg).
"""
import csv
import html
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BAR_H, GAP, LABEL_W, BAR_W, WIDTH = 22, 8, 300, 420, 820
COLOURS = {"epp": "#2b7bba"}
OTHER = "#9a9a9a"


def read(path):
    """The rows of `path` grouped by metric, in file order; errors name the line."""
    panels = {}
    with open(path, newline="") as f:
        lines = [l for l in f if l.strip() and not l.startswith("#")]
    for n, row in enumerate(csv.reader(lines), 1):
        if len(row) < 3:
            sys.exit(f"{path}: data row {n}: expected metric,router,value[,source], got {row}")
        try:
            value = float(row[2])
        except ValueError:
            sys.exit(f"{path}: data row {n}: value {row[2]!r} is not a number")
        panels.setdefault(row[0], []).append((row[1], value))
    if not panels:
        sys.exit(f"{path}: no data rows")
    return panels


def panel(metric, bars, y):
    """SVG elements for one metric's bars starting at height `y`, and the next free height."""
    out = [f'<text x="10" y="{y + 16}" font-size="15" font-weight="bold">{html.escape(metric)}</text>']
    y += 28
    top = max(v for _, v in bars) or 1.0
    for router, value in bars:
        w = max(1, round(BAR_W * value / top))
        colour = COLOURS["epp"] if router.startswith("epp") else OTHER
        out.append(f'<text x="{LABEL_W - 8}" y="{y + 16}" text-anchor="end" font-size="13">{html.escape(router)}</text>')
        out.append(f'<rect x="{LABEL_W}" y="{y}" width="{w}" height="{BAR_H}" fill="{colour}"/>')
        out.append(f'<text x="{LABEL_W + w + 6}" y="{y + 16}" font-size="13">{value:g}</text>')
        y += BAR_H + GAP
    return out, y + 12


def main():
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs/plots/cost.csv"
    dst = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "docs/plots/cost.svg"
    body, y = [], 10
    for metric, bars in read(src).items():
        elements, y = panel(metric, bars, y)
        body.extend(elements)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{y}" viewBox="0 0 {WIDTH} {y}" font-family="sans-serif">',
           f'<rect width="{WIDTH}" height="{y}" fill="#ffffff"/>', *body, "</svg>"]
    dst.write_text("\n".join(svg) + "\n")
    print(dst)


if __name__ == "__main__":
    main()

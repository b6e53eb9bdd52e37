"""Lints and renders a chart with Helm's own Go code (helm-python-sdk); prints JSON.

usage: render.py CHART RELEASE NAMESPACE VALUES_JSON
output: {"lint": {...}, "manifests": {"template path": "rendered YAML"}}
"""
import json
import sys

import helm_python as helm


def main() -> None:
    chart_path, release, namespace, values_json = sys.argv[1:5]
    values = json.loads(values_json)
    report = helm.lint(chart_path, values, strict=True, namespace=namespace)
    with helm.Chart.load(chart_path) as chart:
        manifests = chart.render(values, name=release, namespace=namespace, is_install=True)
    json.dump({"lint": report, "manifests": manifests}, sys.stdout)


if __name__ == "__main__":
    main()

"""Parses inference-sim's /metrics text (stdin) with prometheus_client's parser
and prints a JSON summary: {family: {"type": t, "samples": [[name, labels, value], ...]}}.
Fails (exit 1) on any parse error."""
import json
import sys

from prometheus_client.parser import text_string_to_metric_families

text = sys.stdin.read()
out = {}
for fam in text_string_to_metric_families(text):
    out[fam.name] = {
        "type": fam.type,
        "samples": [[s.name, dict(s.labels), s.value] for s in fam.samples],
    }
json.dump(out, sys.stdout)

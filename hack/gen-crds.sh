#!/usr/bin/env bash
# Regenerates config/crd/*.yaml from the Rust types in src/discovery/k8s/crd/.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --quiet -p epp-e2e --bin gen-crds -- config/crd

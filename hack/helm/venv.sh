#!/usr/bin/env bash
# Creates .venv-helm with helm-python-sdk (Helm v4's Go SDK, no helm binary needed) and prints
# the venv's python. Idempotent; safe to run from concurrent tests (a lock serialises creation).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="$root/.venv-helm"
exec 9>"$root/.venv-helm.lock"
flock 9
if ! "$venv/bin/python" -c 'import helm_python' 2>/dev/null; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet 'helm-python-sdk==0.2.2' >&2
fi
echo "$venv/bin/python"

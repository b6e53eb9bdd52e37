#!/usr/bin/env bash
# Creates (once) the Python venv the inference-sim tests use to check the
# simulator with independent decoders: prometheus_client's text parser, and
# pyzmq + msgpack for KV events. Prints the venv's python path.
# Usage: venv.sh <target-dir>
set -euo pipefail
target="${1:?target dir}"
venv="$target/sim-pyenv"
mkdir -p "$target"
exec 9>"$target/sim-pyenv.lock"
flock 9
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import prometheus_client, zmq, msgpack' 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check prometheus_client pyzmq msgpack >&2
fi
echo "$venv/bin/python"

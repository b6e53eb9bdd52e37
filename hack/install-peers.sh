#!/usr/bin/env bash
# Installs the upstream peers the side-by-side benchmark (issue 18) runs next to epp, with
# `go install` at pinned versions from the Go module proxy, into <repo>/.peers/<name>/bin:
#
#   gie-epp              sigs.k8s.io/gateway-api-inference-extension/cmd/epp       v1.5.0
#   llm-d-epp            github.com/llm-d/llm-d-router/cmd/epp                     v0.10.0
#   llm-d-inference-sim  github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim v0.10.2
#
# Prints one line per binary, `name path`. Idempotent: a binary already built from the pinned
# module version (checked with `go version -m`) is not rebuilt. A version the proxy does not
# serve is an error naming it. CGO_ENABLED=0; each binary gets its own GOBIN.
#
# Usage: hack/install-peers.sh [name...]   (default: all three)
# Env:   PEERS_DIR (default <repo>/.peers), GO (default: go on PATH).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PEERS_DIR="${PEERS_DIR:-${REPO_ROOT}/.peers}"
GO="${GO:-go}"

log() { echo "install-peers: $*" >&2; }

# name|module|package|version
PEERS=(
  "gie-epp|sigs.k8s.io/gateway-api-inference-extension|sigs.k8s.io/gateway-api-inference-extension/cmd/epp|v1.5.0"
  "llm-d-epp|github.com/llm-d/llm-d-router|github.com/llm-d/llm-d-router/cmd/epp|v0.10.0"
  "llm-d-inference-sim|github.com/llm-d/llm-d-inference-sim|github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim|v0.10.2"
)

# The binary `go install` writes: the last element of the package path.
built_name() { basename "$1"; }

# True if $1 is a Go binary whose main module is $2 at version $3.
is_current() {
  local bin="$1" module="$2" version="$3" info
  [[ -x "${bin}" ]] || return 1
  local stamp="${bin%/*}/.source"
  if [[ -f "${stamp}" ]]; then
    [[ "$(cat "${stamp}")" == "${module} ${version} "* ]]
    return
  fi
  info="$("${GO}" version -m "${bin}" 2>/dev/null)" || return 1
  grep -Eq "^[[:space:]]+mod[[:space:]]+${module//./\\.}[[:space:]]+${version//./\\.}([[:space:]]|$)" <<<"${info}"
}

# Fails with a message naming module@version if the proxy does not serve it.
check_served() {
  local module="$1" version="$2" out
  if ! out="$("${GO}" mod download -json "${module}@${version}" 2>&1)"; then
    log "the Go module proxy does not serve ${module}@${version}:"
    echo "${out}" | sed 's/^/  /' >&2
    return 1
  fi
  if grep -q '"Error"' <<<"${out}"; then
    log "the Go module proxy does not serve ${module}@${version}:"
    echo "${out}" | sed 's/^/  /' >&2
    return 1
  fi
}

# The module's source directory in the module cache (after check_served).
module_dir() {
  "${GO}" mod download -json "$1@$2" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p'
}

install_one() {
  local name="$1" module="$2" pkg="$3" version="$4"
  local gobin="${PEERS_DIR}/${name}/bin"
  local target="${gobin}/${name}"
  if is_current "${target}" "${module}" "${version}"; then
    echo "${name} ${target}"
    return 0
  fi
  command -v "${GO}" >/dev/null || { log "go not found (set GO=/path/to/go)"; return 1; }
  if ! check_served "${module}" "${version}"; then
    log "${name}: ${module}@${version} is not served by the Go module proxy (GOPROXY=$("${GO}" env GOPROXY)); this script installs published module versions only"
    return 1
  fi
  rm -f "${gobin}/.source"
  mkdir -p "${gobin}"
  log "building ${pkg}@${version} (this can take several minutes)"
  local out
  if ! out="$(cd "${PEERS_DIR}" && CGO_ENABLED=0 GOBIN="${gobin}" \
      "${GO}" install "${pkg}@${version}" 2>&1)"; then
    if grep -Eq 'replace directives|loading deprecation|loading retractions' <<<"${out}"; then
      # `go install pkg@version` refuses modules whose go.mod has replace directives, and it
      # asks the proxy for the module's version list (to report deprecation), which the proxy
      # may refuse while serving the version itself. Build the same version from its module
      # source in the module cache instead, with its own go.mod and go.sum (read-only).
      log "go install refused (${out%%$'\n'*}); building ${module}@${version} from its module source"
      local src
      src="$(module_dir "${module}" "${version}")"
      [[ -d "${src}" ]] || { log "no module source for ${module}@${version}"; return 1; }
      (cd "${src}" && CGO_ENABLED=0 GOWORK=off GOFLAGS=-mod=readonly "${GO}" build -trimpath \
        -o "${gobin}/$(built_name "${pkg}")" "./${pkg#"${module}"/}") ||
        { log "build of ${pkg}@${version} failed"; return 1; }
      # A build inside the module reports its main module as (devel): record what it was.
      echo "${module} ${version} module-cache ${src}" >"${gobin}/.source"
    else
      echo "${out}" >&2
      log "go install ${pkg}@${version} failed"
      return 1
    fi
  fi
  local built="${gobin}/$(built_name "${pkg}")"
  if [[ "${built}" != "${target}" ]]; then
    mv -f "${built}" "${target}"
  fi
  is_current "${target}" "${module}" "${version}" || {
    log "${target} is not ${module}@${version} after the build"
    return 1
  }
  echo "${name} ${target}"
}

main() {
  mkdir -p "${PEERS_DIR}"
  local wanted=("$@") entry name module pkg version found
  for want in "${wanted[@]}"; do
    found=0
    for entry in "${PEERS[@]}"; do
      [[ "${entry%%|*}" == "${want}" ]] && found=1
    done
    ((found)) || { log "unknown peer ${want} (known: gie-epp llm-d-epp llm-d-inference-sim)"; return 2; }
  done
  for entry in "${PEERS[@]}"; do
    IFS='|' read -r name module pkg version <<<"${entry}"
    if ((${#wanted[@]})); then
      found=0
      for want in "${wanted[@]}"; do [[ "${want}" == "${name}" ]] && found=1; done
      ((found)) || continue
    fi
    install_one "${name}" "${module}" "${pkg}" "${version}"
  done
}

main "$@"

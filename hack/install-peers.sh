#!/usr/bin/env bash
# Installs the upstream peers epp is run next to (the side-by-side benchmark, the real P/D
# sidecar in the P/D tests, the differential suite) into <PEERS_DIR>/<name>/bin/<name>:
#
#   gie-epp              go install sigs.k8s.io/gateway-api-inference-extension/cmd/epp@v1.5.0
#   llm-d-inference-sim  go install github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim@v0.10.2
#   llm-d-epp            cmd/epp        of llm-d-router v0.10.0, built from the source archive
#   pd-sidecar           cmd/pd-sidecar of llm-d-router v0.10.0, built from the source archive
#
# The Go module proxy refuses every version of github.com/llm-d/llm-d-router (403), so the two
# llm-d-router binaries are built from a tarball of the v0.10.0 tree (LLMD_ROUTER_ARCHIVE,
# default <repo>/../shared/peers/llm-d-router-v0.10.0.tar.gz): its sha256 is checked, it is
# unpacked into a scratch directory and both commands are built with one
# `CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath` (dependencies from the module proxy,
# pinned by the tree's go.sum). A stamp next to each binary records the archive's checksum, so
# a re-run returns at once. The Go build cache of that build (~1.5 GB) lives in a temporary
# GOCACHE removed when the script ends, as hack/install-kube.sh does: CI machines are short of
# disk. A cold build takes ~13 min on 2 busy cores (README).
#
# Prints one line per binary, `name path`. Idempotent: a `go install` binary already built from
# the pinned module version (checked with `go version -m`) is not rebuilt. A version the proxy
# does not serve is an error naming it. CGO_ENABLED=0; each binary gets its own directory.
#
# Usage: hack/install-peers.sh [name...]   (default: all four)
# Env:   PEERS_DIR (default <repo>/.peers), GO (default: go on PATH), LLMD_ROUTER_ARCHIVE.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PEERS_DIR="${PEERS_DIR:-${REPO_ROOT}/.peers}"
GO="${GO:-go}"
LLMD_ROUTER_ARCHIVE="${LLMD_ROUTER_ARCHIVE:-${REPO_ROOT}/../shared/peers/llm-d-router-v0.10.0.tar.gz}"
LLMD_ROUTER_SHA256="9c8b57486adb02d10f60a11c9a7f9bb4763a4b8fb324235fd65b57d9582da2d4"
LLMD_ROUTER_VERSION="v0.10.0"
# name|package inside the archive, for the peers built from it.
ARCHIVE_PEERS=("llm-d-epp|./cmd/epp" "pd-sidecar|./cmd/pd-sidecar")

log() { echo "install-peers: $*" >&2; }

# name|module|package|version, for the peers `go install` builds.
PEERS=(
  "gie-epp|sigs.k8s.io/gateway-api-inference-extension|sigs.k8s.io/gateway-api-inference-extension/cmd/epp|v1.5.0"
  "llm-d-inference-sim|github.com/llm-d/llm-d-inference-sim|github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim|v0.10.2"
)
ALL_NAMES="gie-epp llm-d-epp llm-d-inference-sim pd-sidecar"

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

# What an archive-built binary records in its stamp: the version, the archive's checksum, the
# Go toolchain and the build command (a change to any of them rebuilds).
BUILD_COMMAND="CGO_ENABLED=0 GOFLAGS=-mod=readonly GOWORK=off go build -trimpath"
archive_stamp() {
  echo "github.com/llm-d/llm-d-router ${LLMD_ROUTER_VERSION} archive-sha256 ${LLMD_ROUTER_SHA256} $("${GO}" env GOVERSION) ${BUILD_COMMAND}"
}

archive_current() {
  local name="$1" bin="${PEERS_DIR}/$1/bin/$1"
  [[ -x "${bin}" && -f "${bin%/*}/.stamp" ]] && [[ "$(cat "${bin%/*}/.stamp")" == "$(archive_stamp)" ]]
}

verify_archive() {
  [[ -f "${LLMD_ROUTER_ARCHIVE}" ]] || {
    log "the llm-d-router source archive ${LLMD_ROUTER_ARCHIVE} does not exist (set LLMD_ROUTER_ARCHIVE)"
    return 1
  }
  local sum
  sum="$(sha256sum "${LLMD_ROUTER_ARCHIVE}" | cut -d' ' -f1)"
  [[ "${sum}" == "${LLMD_ROUTER_SHA256}" ]] || {
    log "${LLMD_ROUTER_ARCHIVE} has sha256 ${sum}, not ${LLMD_ROUTER_SHA256} (llm-d-router ${LLMD_ROUTER_VERSION})"
    return 1
  }
}

# Builds the archive peers named in $@ (all of them with one `go build`, sharing its work).
install_from_archive() {
  local names=() name pkgs=() entry pkg
  for entry in "${ARCHIVE_PEERS[@]}"; do
    IFS='|' read -r name pkg <<<"${entry}"
    [[ " $* " == *" ${name} "* ]] || continue
    archive_current "${name}" || { names+=("${name}"); pkgs+=("${pkg}"); }
  done
  if ((${#names[@]})); then
    command -v "${GO}" >/dev/null || { log "go not found (set GO=/path/to/go)"; return 1; }
    verify_archive
    build_archive names pkgs
  fi
  for name in "$@"; do echo "${name} ${PEERS_DIR}/${name}/bin/${name}"; done
}

# Unpacks the archive into a scratch directory and builds the packages of array $2 into the
# binaries named in array $1, with a Go build cache of their own, both removed afterwards.
build_archive() {
  local -n _names="$1" _pkgs="$2"
  local scratch out i
  scratch="$(mktemp -d "${TMPDIR:-/tmp}/epp-peers-build.XXXXXX")"
  # shellcheck disable=SC2064 # expand now: the trap outlives the locals.
  trap "chmod -R u+w '${scratch}' 2>/dev/null; rm -rf '${scratch}'" EXIT
  mkdir -p "${scratch}/src" "${scratch}/out" "${scratch}/gocache"
  tar -xzf "${LLMD_ROUTER_ARCHIVE}" -C "${scratch}/src"
  log "building ${_names[*]} from llm-d-router ${LLMD_ROUTER_VERSION} (~13 min on a cold Go cache)"
  (cd "${scratch}/src" && CGO_ENABLED=0 GOFLAGS=-mod=readonly GOWORK=off GOCACHE="${scratch}/gocache" \
    "${GO}" build -trimpath -o "${scratch}/out/" "${_pkgs[@]}") ||
    { log "go build of ${_pkgs[*]} (llm-d-router ${LLMD_ROUTER_VERSION}) failed"; return 1; }
  for i in "${!_names[@]}"; do
    out="${PEERS_DIR}/${_names[i]}/bin"
    mkdir -p "${out}"
    rm -f "${out}/.stamp"
    mv -f "${scratch}/out/$(basename "${_pkgs[i]}")" "${out}/${_names[i]}"
    archive_stamp >"${out}/.stamp"
  done
}

main() {
  mkdir -p "${PEERS_DIR}"
  local wanted=("$@") want entry name module pkg version
  ((${#wanted[@]})) || read -r -a wanted <<<"${ALL_NAMES}"
  for want in "${wanted[@]}"; do
    [[ " ${ALL_NAMES} " == *" ${want} "* ]] || { log "unknown peer ${want} (known: ${ALL_NAMES})"; return 2; }
  done
  for entry in "${PEERS[@]}"; do
    IFS='|' read -r name module pkg version <<<"${entry}"
    [[ " ${wanted[*]} " == *" ${name} "* ]] || continue
    install_one "${name}" "${module}" "${pkg}" "${version}"
  done
  local from_archive=()
  for entry in "${ARCHIVE_PEERS[@]}"; do
    name="${entry%%|*}"
    [[ " ${wanted[*]} " == *" ${name} "* ]] && from_archive+=("${name}")
  done
  ((${#from_archive[@]} == 0)) || install_from_archive "${from_archive[@]}"
}

main "$@"

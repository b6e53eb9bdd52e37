#!/usr/bin/env bash
# Builds a real kube-apiserver (Kubernetes 1.36.3) and etcd (3.6.16) from the Go module proxy into
# <repo>/.kube-bin and prints that directory. Idempotent: a second run checks a stamp and returns
# at once. The e2e fixture (e2e/harness/src/kube_apiserver.rs) reads the directory from EPP_KUBE_BIN and
# falls back to <repo>/.kube-bin.
#
# The wrapper modules hack/kube/apiserver and hack/kube/etcd hold only a go.mod (with a `tool`
# line naming the upstream command) and a go.sum, so the build is reproducible; see
# ../shared/reference/kube-apiserver-build.md (beside the repository) for why `go install` alone cannot do it.
# Needs Go >= 1.26 and the module proxy (GOPROXY); offline once the module cache is warm.
# A cold build takes ~20 min on 2 cores (README, "Kubernetes tests").
set -euo pipefail

KUBE_VERSION="v1.36.3"
ETCD_VERSION="v3.6.16"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN_DIR="${EPP_KUBE_BIN:-${REPO_ROOT}/.kube-bin}"
WRAPPERS="${REPO_ROOT}/hack/kube"

log() { echo "install-kube: $*" >&2; }

# What the binaries were built from: the versions, the wrapper modules and this script.
stamp() {
  cat "${WRAPPERS}"/apiserver/go.mod "${WRAPPERS}"/apiserver/go.sum \
    "${WRAPPERS}"/etcd/go.mod "${WRAPPERS}"/etcd/go.sum "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1
}

up_to_date() {
  [[ -x "${BIN_DIR}/kube-apiserver" && -x "${BIN_DIR}/etcd" && -f "${BIN_DIR}/.stamp" ]] &&
    [[ "$(cat "${BIN_DIR}/.stamp")" == "$(stamp)" ]]
}

build_apiserver() {
  local minor="${KUBE_VERSION#v1.}"
  minor="${minor%%.*}"
  local pkg="k8s.io/component-base/version"
  log "building kube-apiserver ${KUBE_VERSION} (long on a cold cache)"
  (cd "${WRAPPERS}/apiserver" && CGO_ENABLED=0 go build -mod=readonly -trimpath -buildvcs=false \
    -ldflags "-s -w -X ${pkg}.gitVersion=${KUBE_VERSION} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${minor} -X ${pkg}.gitTreeState=clean" \
    -o "${BIN_DIR}/kube-apiserver.new" k8s.io/kubernetes/cmd/kube-apiserver)
  mv "${BIN_DIR}/kube-apiserver.new" "${BIN_DIR}/kube-apiserver"
}

build_etcd() {
  log "building etcd ${ETCD_VERSION}"
  (cd "${WRAPPERS}/etcd" && CGO_ENABLED=0 go build -mod=readonly -trimpath -buildvcs=false -ldflags "-s -w" \
    -o "${BIN_DIR}/etcd.new" go.etcd.io/etcd/server/v3)
  mv "${BIN_DIR}/etcd.new" "${BIN_DIR}/etcd"
}

main() {
  if up_to_date; then
    echo "${BIN_DIR}"
    return 0
  fi
  command -v go >/dev/null || { log "go not found (needs Go >= 1.26)"; return 1; }
  mkdir -p "${BIN_DIR}"
  rm -f "${BIN_DIR}/.stamp"
  # The two builds fill a Go build cache of ~2.4 GB that is no use once the binaries exist (the
  # stamp skips the build from then on), so it lives in a directory of its own, removed when the
  # script ends: CI machines are short of disk. The module cache (the sources) stays shared.
  GOCACHE="$(mktemp -d "${TMPDIR:-/tmp}/epp-kube-gocache.XXXXXX")"
  export GOCACHE
  trap 'chmod -R u+w "${GOCACHE}" 2>/dev/null; rm -rf "${GOCACHE}"' EXIT
  build_etcd
  build_apiserver
  stamp >"${BIN_DIR}/.stamp"
  log "kube-apiserver ${KUBE_VERSION} and etcd ${ETCD_VERSION} are in ${BIN_DIR}"
  echo "${BIN_DIR}"
}

main "$@"

#!/usr/bin/env bash
# Builds the real Kubernetes control plane (kube-apiserver, kube-scheduler,
# kube-controller-manager), etcd, KWOK and helm from their Go modules and caches them under
# ~/.cache/kubeseer/bin/<versions>/. Idempotent: a second run returns in seconds.
#
# `go install <module>@<version>` refuses modules whose go.mod has replace directives
# (Kubernetes, etcd), so those are built through throw-away wrapper modules outside the repo.
# Kubernetes requires its staging modules at v0.0.0; the wrapper replaces each one with the
# matching published v0.Y.Z, and that list is read from the release's own go.mod.
#
# Usage: build-control-plane.sh [--skip-without-go]
#   --skip-without-go  where Go is not installed, say so and exit 0 instead of failing, so that
#                      `make test` can go on and the e2e tests skip themselves with the reason.
set -euo pipefail

skip_without_go=false
case "${1:-}" in
  --skip-without-go) skip_without_go=true ;;
  "") ;;
  *) echo "usage: $0 [--skip-without-go]" >&2; exit 2 ;;
esac

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

cache_root=${KUBESEER_CACHE:-$HOME/.cache/kubeseer}
bin_dir="$cache_root/bin/k8s-$KUBERNETES_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION"
work_dir="$cache_root/build"
export GOTOOLCHAIN=local CGO_ENABLED=0
mkdir -p "$bin_dir" "$work_dir"

# One build at a time per cache: a second caller (a test session, `make e2e`) waits for the
# first and then finds the binaries cached.
exec 9>"$cache_root/build.lock"
if ! flock -n 9; then
  echo "control plane: another build holds $cache_root/build.lock; waiting for it"
  flock 9
fi

all=(kube-apiserver kube-scheduler kube-controller-manager etcd kwok helm)
# KWOK from v0.8 has no built-in stages: the controller needs them as configuration. They are
# taken from the same release's module (its kustomize/stage directory), never written here.
kwok_stages="$bin_dir/kwok-stages.yaml"
missing=()
for b in "${all[@]}"; do [[ -x "$bin_dir/$b" ]] || missing+=("$b"); done
# A stage file of the old selection (Job pods completing at once) is taken again.
grep -qs "pod-complete.stage.kwok.x-k8s.io/delay" "$kwok_stages" || missing+=(kwok-stages)
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "control plane: all binaries cached in $bin_dir"
  exit 0
fi

if ! command -v go >/dev/null; then
  if $skip_without_go; then
    echo "control plane: Go is not installed, so it cannot be built; e2e tests will be skipped"
    exit 0
  fi
  echo "error: go is not installed; cannot build the control plane" >&2
  exit 3
fi
echo "control plane: building ${missing[*]} into $bin_dir"
free_kib=$(df -Pk "$cache_root" | awk 'NR==2 {print $4}')
if (( free_kib < 8 * 1024 * 1024 )); then
  echo "error: the build needs about 8 GiB free under $cache_root (go caches and binaries); only $((free_kib / 1024)) MiB free" >&2
  exit 4
fi

step() { echo "[$(date +%H:%M:%S)] $*"; }
started=$SECONDS
want() { [[ " ${missing[*]} " == *" $1 "* ]]; }

if want kube-apiserver || want kube-scheduler || want kube-controller-manager; then
  step "kubernetes $KUBERNETES_VERSION: preparing wrapper module"
  k8s_dir="$work_dir/k8s-$KUBERNETES_VERSION"
  rm -rf "$k8s_dir" && mkdir -p "$k8s_dir" && cd "$k8s_dir"
  go mod init kubeseer.invalid/k8sbins >/dev/null 2>&1
  release_mod=$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" \
    | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  go_directive=$(awk '$1 == "go" {print $2; exit}' "$release_mod")
  godebug=$(awk '$1 == "godebug" {print $2; exit}' "$release_mod")
  staging_version="v0.${KUBERNETES_VERSION#v1.}"
  mapfile -t staging < <(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$release_mod" | sort -u)
  step "kubernetes: ${#staging[@]} staging modules -> $staging_version (go $go_directive${godebug:+, godebug $godebug})"
  go mod edit -go="$go_directive"
  [[ -n "$godebug" ]] && go mod edit -godebug="$godebug"
  for m in "${staging[@]}"; do go mod edit -replace="$m=$m@$staging_version"; done
  go mod edit -require="k8s.io/kubernetes@$KUBERNETES_VERSION"
  cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO
  step "kubernetes: go mod tidy"
  go mod tidy
  minor=${KUBERNETES_VERSION#v1.}; minor=${minor%%.*}
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  step "kubernetes: go build (the slow part)"
  go build -trimpath -tags grpcnotrace -ldflags "$ldflags" -o "$bin_dir/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kube-controller-manager
  step "kubernetes: done ($((SECONDS - started)) s so far)"
fi

if want etcd; then
  step "etcd $ETCD_VERSION: wrapper module"
  etcd_dir="$work_dir/etcd-$ETCD_VERSION"
  rm -rf "$etcd_dir" && mkdir -p "$etcd_dir" && cd "$etcd_dir"
  go mod init kubeseer.invalid/etcdbin >/dev/null 2>&1
  go mod edit -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > tools.go
  go mod tidy
  go build -trimpath -ldflags "-s -w" -o "$bin_dir/etcd" go.etcd.io/etcd/server/v3
  step "etcd: done ($((SECONDS - started)) s so far)"
fi

if want kwok; then
  step "kwok $KWOK_VERSION: go install"
  GOBIN="$bin_dir" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  step "kwok: done ($((SECONDS - started)) s so far)"
fi

if want kwok-stages; then
  # What kwokctl configures by default: node initialisation, the heartbeat that leaves liveness
  # to node leases (the controller renews them, 40 s by default), pods that become ready, Job
  # pods that complete, and deletion. Job pods complete by the general stage, after 1-6 s or
  # the delay a pod's pod-complete.stage.kwok.x-k8s.io/delay and .../jitter-delay annotations
  # give: kubeseer's workloads are Jobs, and tests need some to keep running.
  step "kwok $KWOK_VERSION: default stages"
  kwok_dir=$(cd "$work_dir" && go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  stage_dir="$kwok_dir/kustomize/stage"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
    pod/fast/pod-ready.yaml pod/general/pod-complete.yaml pod/fast/pod-delete.yaml; do
    echo "---"
    cat "$stage_dir/$f"
  done > "$kwok_stages.tmp"
  mv "$kwok_stages.tmp" "$kwok_stages"
fi

if want helm; then
  # The module path carries the major version (helm.sh/helm/v4 for Helm 4).
  helm_module="helm.sh/helm/${HELM_VERSION%%.*}"
  step "helm $HELM_VERSION: go install"
  GOBIN="$bin_dir" go install -trimpath \
    -ldflags "-s -w -X $helm_module/internal/version.version=$HELM_VERSION" \
    "$helm_module/cmd/helm@$HELM_VERSION"
  step "helm: done ($((SECONDS - started)) s so far)"
fi

for b in "${all[@]}"; do [[ -x "$bin_dir/$b" ]] || { echo "error: $b missing after build" >&2; exit 5; }; done
[[ -s "$kwok_stages" ]] || { echo "error: $kwok_stages missing after build" >&2; exit 5; }
echo "control plane: built ${missing[*]} in $((SECONDS - started)) s into $bin_dir"

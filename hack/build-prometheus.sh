#!/usr/bin/env bash
# Builds Prometheus (the server and promtool) and hack/promql-names (a PromQL parser CLI on
# Prometheus' own parser) from their Go modules, cached under
# ~/.cache/kubeseer/bin/prometheus-<version>/, with the Prometheus Operator's ServiceMonitor and
# PrometheusRule CRDs taken from its own module (crds/). The chart's observability tests use
# them: promtool checks and unit-tests the alert rules, the server scrapes the real components,
# promql-names says which metrics every dashboard and rule expression selects, the CRDs let the
# API server dry-run the chart's monitoring objects. Idempotent: a second run returns in seconds.
#
# Usage: build-prometheus.sh [--skip-without-go]
#   --skip-without-go  where Go is not installed, say so and exit 0 (the tests then skip).
set -euo pipefail

skip_without_go=false
case "${1:-}" in
  --skip-without-go) skip_without_go=true ;;
  "") ;;
  *) echo "usage: $0 [--skip-without-go]" >&2; exit 2 ;;
esac

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=prometheus.env
source "$here/prometheus.env"

cache_root=${KUBESEER_CACHE:-$HOME/.cache/kubeseer}
bin_dir="$cache_root/bin/prometheus-$PROMETHEUS_VERSION"
work_dir="$cache_root/build"
export GOTOOLCHAIN=local CGO_ENABLED=0
mkdir -p "$bin_dir" "$work_dir"

exec 9>"$cache_root/build-prometheus.lock"
if ! flock -n 9; then
  echo "prometheus: another build holds $cache_root/build-prometheus.lock; waiting for it"
  flock 9
fi

# The helper's source is part of its cache key: an edited main.go is rebuilt.
helper_sum=$(sha256sum "$here/promql-names/main.go" | cut -c1-16)
missing=()
for b in prometheus promtool; do [[ -x "$bin_dir/$b" ]] || missing+=("$b"); done
[[ -x "$bin_dir/promql-names-$helper_sum" ]] || missing+=(promql-names)
operator_crds=(monitoring.coreos.com_servicemonitors.yaml monitoring.coreos.com_prometheusrules.yaml)
for c in "${operator_crds[@]}"; do
  [[ -s "$bin_dir/crds/$PROMETHEUS_OPERATOR_VERSION/$c" ]] || { missing+=(operator-crds); break; }
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "prometheus: all binaries cached in $bin_dir"
  exit 0
fi
if ! command -v go >/dev/null; then
  if $skip_without_go; then
    echo "prometheus: Go is not installed, so it cannot be built; the chart's Prometheus tests will be skipped"
    exit 0
  fi
  echo "error: go is not installed; cannot build Prometheus" >&2
  exit 3
fi
free_kib=$(df -Pk "$cache_root" | awk 'NR==2 {print $4}')
if (( free_kib < 3 * 1024 * 1024 )); then
  echo "error: the build needs about 3 GiB free under $cache_root; only $((free_kib / 1024)) MiB free" >&2
  exit 4
fi

step() { echo "[$(date +%H:%M:%S)] $*"; }
started=$SECONDS
module=github.com/prometheus/prometheus
ldflags="-s -w -X github.com/prometheus/common/version.Version=$PROMETHEUS_VERSION"
ldflags+=" -X github.com/prometheus/common/version.Branch=release"
ldflags+=" -X github.com/prometheus/common/version.Revision=$PROMETHEUS_MODULE_VERSION"

if [[ " ${missing[*]} " == *" prometheus "* || " ${missing[*]} " == *" promtool "* ]]; then
  step "prometheus $PROMETHEUS_VERSION ($module@$PROMETHEUS_MODULE_VERSION): go install"
  GOBIN="$bin_dir" go install -trimpath -ldflags "$ldflags" \
    "$module/cmd/prometheus@$PROMETHEUS_MODULE_VERSION" \
    "$module/cmd/promtool@$PROMETHEUS_MODULE_VERSION"
  step "prometheus: done ($((SECONDS - started)) s so far)"
fi

if [[ " ${missing[*]} " == *" promql-names "* ]]; then
  step "promql-names: wrapper module on $module@$PROMETHEUS_MODULE_VERSION"
  helper_dir="$work_dir/promql-names"
  rm -rf "$helper_dir" && mkdir -p "$helper_dir" && cd "$helper_dir"
  cp "$here/promql-names/main.go" .
  go mod init kubeseer.invalid/promql-names >/dev/null 2>&1
  go mod edit -require="$module@$PROMETHEUS_MODULE_VERSION"
  go mod tidy
  rm -f "$bin_dir"/promql-names-*
  go build -trimpath -ldflags "-s -w" -o "$bin_dir/promql-names-$helper_sum" .
  step "promql-names: done ($((SECONDS - started)) s so far)"
fi
if [[ " ${missing[*]} " == *" operator-crds "* ]]; then
  step "prometheus-operator $PROMETHEUS_OPERATOR_VERSION: CRDs from its module"
  operator_dir=$(cd "$work_dir" && go mod download -json \
    "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  mkdir -p "$bin_dir/crds/$PROMETHEUS_OPERATOR_VERSION"
  for c in "${operator_crds[@]}"; do
    cp "$operator_dir/example/prometheus-operator-crd/$c" "$bin_dir/crds/$PROMETHEUS_OPERATOR_VERSION/$c"
  done
fi
echo "prometheus: built ${missing[*]} in $((SECONDS - started)) s into $bin_dir"

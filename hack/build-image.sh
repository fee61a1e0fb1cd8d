#!/usr/bin/env bash
# Builds the kubeseer image from deploy/Dockerfile without a Docker engine, runs its entrypoints,
# and writes it as an OCI archive. Daemonless: buildah (Debian's package) builds the Dockerfile
# with chroot isolation; the base is Debian bookworm made here by debootstrap from Debian's
# archive (no container registry is needed, or reachable here), with python3 and its venv.
#
# Usage: build-image.sh [TAG]        (default localhost/kubeseer:<version from pyproject.toml>)
# Environment:
#   TORCH_INDEX    pip index for torch (default PyTorch's CPU-only index; where that cannot be
#                  reached, PyPI, whose Linux wheel brings the CUDA libraries)
#   DEBIAN_MIRROR  default http://deb.debian.org/debian
#   BUILD_CA       CA bundle pip trusts during the build (default: this machine's, for networks
#                  whose TLS is inspected); mounted into the build only, never into a layer
# Needs: root, buildah and debootstrap (apt-get install buildah debootstrap).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/pyproject.toml" | head -1)
tag=${1:-localhost/kubeseer:$version}
suite=bookworm
base=localhost/kubeseer-base:$suite
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
cache=${KUBESEER_CACHE:-$HOME/.cache/kubeseer}/image
mkdir -p "$cache"

for tool in buildah debootstrap; do
  command -v "$tool" >/dev/null || { echo "error: $tool is not installed (apt-get install buildah debootstrap)" >&2; exit 3; }
done
[[ $(id -u) -eq 0 ]] || { echo "error: debootstrap and chroot isolation need root" >&2; exit 3; }

step() { echo "[$(date +%H:%M:%S)] $*"; }
started=$SECONDS

if ! buildah inspect --type image "$base" >/dev/null 2>&1; then
  rootfs="$cache/rootfs-$suite"
  if [[ ! -x "$rootfs/usr/bin/python3" ]]; then
    step "base: debootstrap $suite (minbase, python3, python3-venv, ca-certificates)"
    rm -rf "$rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
      "$suite" "$rootfs" "$mirror"
  fi
  step "base: $base from $rootfs"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
  tar -C "$rootfs" --exclude=./dev/* --exclude=./proc/* --exclude=./sys/* -cf "$cache/rootfs-$suite.tar" .
  ctr=$(buildah from scratch)
  buildah add "$ctr" "$cache/rootfs-$suite.tar" / >/dev/null
  buildah config --env LANG=C.UTF-8 --cmd /bin/bash "$ctr"
  buildah commit --rm "$ctr" "$base" >/dev/null
  rm -f "$cache/rootfs-$suite.tar"
fi
base_s=$((SECONDS - started))

torch_index=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
if ! python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/torch/', timeout=15)" \
    "$torch_index" 2>/dev/null; then
  echo "note: $torch_index cannot be reached; torch comes from PyPI (with its CUDA libraries)"
  torch_index=https://pypi.org/simple
fi

step "image: buildah bud -f deploy/Dockerfile (BASE=$base, TORCH_INDEX=$torch_index)"
build_started=$SECONDS
build_ca=${BUILD_CA:-/etc/ssl/certs/ca-certificates.crt}
buildah bud --isolation chroot --layers \
  --volume "$build_ca:/run/kubeseer-build-ca.crt:ro" --build-arg PIP_CERT=/run/kubeseer-build-ca.crt \
  --build-arg "BASE=$base" --build-arg "TORCH_INDEX=$torch_index" \
  -f "$repo/deploy/Dockerfile" -t "$tag" "$repo"
build_s=$((SECONDS - build_started))

step "image: running its entrypoints"
ctr=$(buildah from "$tag")
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
run() { buildah run --isolation chroot "$ctr" -- "$@"; }
[[ $(run id -u) == 10001 ]] || { echo "error: the image does not run as user 10001" >&2; exit 1; }
for command in "operator run" "extender" "profiler" "dataset pull" "train"; do
  # shellcheck disable=SC2086
  run kubeseer $command --help >/dev/null
done
model=$(run python -c "import onnx, pathlib; print(pathlib.Path(onnx.__file__).parent / 'backend/test/data/light/light_resnet50.onnx')")
run kubeseer predict "$model" --batch 8 --mode infer
run test -r /opt/kubeseer/checkpoints/default.pt

archive="$cache/kubeseer-$version.oci.tar"
step "image: $archive"
rm -f "$archive"
buildah push "$tag" "oci-archive:$archive:$tag" >/dev/null
size=$(buildah images --format '{{.Size}}' "$tag" | head -1)
echo "image $tag: $size unpacked, $(du -h "$archive" | cut -f1) as an OCI archive"
echo "times: base ${base_s} s, build ${build_s} s, total $((SECONDS - started)) s"

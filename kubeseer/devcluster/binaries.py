"""Where the control-plane binaries live: `hack/versions.env` pins the versions, and
`hack/build-control-plane.sh` caches the binaries under `~/.cache/kubeseer/bin/<versions>/`.

The launcher reads the same file as the build script so the two can never disagree about which
directory holds the binaries of the pinned release. Both files are found where
`kubeseer.resources` says: the checkout's `hack/`, or the installed wheel's copy of it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kubeseer import resources
from kubeseer.devcluster import errors

VERSIONS_FILE = resources.path("hack", "versions.env")
BUILD_SCRIPT = resources.path("hack", "build-control-plane.sh")
COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "helm",
)
KWOK_STAGES = "kwok-stages.yaml"
"""KWOK's stage configuration, taken by the build script from the pinned KWOK release: from
v0.8 the controller has no built-in stages and refuses to start without them."""
_ASSIGNMENT = re.compile(r"^([A-Z_][A-Z0-9_]*)=(\S+)$")
_REQUIRED = ("KUBERNETES_VERSION", "ETCD_VERSION", "KWOK_VERSION", "HELM_VERSION")


@dataclass(frozen=True)
class Versions:
    """The pinned component versions, as written in `hack/versions.env`."""

    kubernetes: str
    etcd: str
    kwok: str
    helm: str

    @property
    def cache_key(self) -> str:
        """The cache directory name; must match `bin_dir` in the build script."""
        return f"k8s-{self.kubernetes}-etcd-{self.etcd}-kwok-{self.kwok}-helm-{self.helm}"


@dataclass(frozen=True)
class Binaries:
    """Absolute paths of the cached executables of one pinned version set."""

    directory: Path
    versions: Versions

    def path(self, component: str) -> Path:
        """The executable of one of `COMPONENTS`."""
        if component not in COMPONENTS:
            raise ValueError(f"unknown component {component!r}; known: {COMPONENTS}")
        return self.directory / component

    @property
    def kwok_stages(self) -> Path:
        """KWOK's stage configuration file, cached beside the binaries."""
        return self.directory / KWOK_STAGES


def parse_versions(text: str, *, source: str = str(VERSIONS_FILE)) -> Versions:
    """Read `KEY=value` lines (comments and blanks allowed), as the shell script sources them."""
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _ASSIGNMENT.match(stripped)
        if match is None:
            raise errors.DevClusterError(f"{source}:{number}: expected KEY=value, got {line!r}")
        values[match.group(1)] = match.group(2)
    missing = [key for key in _REQUIRED if key not in values]
    if missing:
        raise errors.DevClusterError(f"{source}: missing {missing}")
    return Versions(
        kubernetes=values["KUBERNETES_VERSION"],
        etcd=values["ETCD_VERSION"],
        kwok=values["KWOK_VERSION"],
        helm=values["HELM_VERSION"],
    )


def cache_root(environ: Mapping[str, str] = os.environ) -> Path:
    """`$KUBESEER_CACHE`, else `~/.cache/kubeseer` (the build script's rule)."""
    configured = environ.get("KUBESEER_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "kubeseer"


def expected(
    versions_file: Path = VERSIONS_FILE, environ: Mapping[str, str] = os.environ
) -> Binaries:
    """The binaries the pinned versions call for, whether or not they are built yet."""
    try:
        text = versions_file.read_text(encoding="utf-8")
    except OSError as e:
        raise errors.DevClusterError(
            f"cannot read {versions_file}, which pins the control-plane versions: a kubeseer "
            f"checkout has it in hack/, an installed kubeseer in its package data ({e})"
        ) from e
    versions = parse_versions(text, source=str(versions_file))
    return Binaries(directory=cache_root(environ) / "bin" / versions.cache_key, versions=versions)


def missing(binaries: Binaries) -> list[str]:
    """Components whose executable (or, for KWOK, stage configuration) is absent."""
    absent = [c for c in COMPONENTS if not os.access(binaries.path(c), os.X_OK)]
    if not binaries.kwok_stages.is_file():
        absent.append(KWOK_STAGES)
    return absent


def locate(
    versions_file: Path = VERSIONS_FILE, environ: Mapping[str, str] = os.environ
) -> Binaries:
    """The cached binaries, or `BinariesMissingError` telling the user to run the build."""
    binaries = expected(versions_file, environ)
    absent = missing(binaries)
    if absent:
        raise errors.BinariesMissingError(
            f"control-plane binaries {absent} are not in {binaries.directory}; "
            "build them with `make control-plane` (hack/build-control-plane.sh; about 30 min "
            "cold on 2 cores, seconds once cached)"
        )
    return binaries


def go_available() -> bool:
    """Whether a Go toolchain is on PATH, i.e. whether the binaries can be built here."""
    return shutil.which("go") is not None


def build(script: Path = BUILD_SCRIPT) -> Binaries:
    """Run the idempotent build script (seconds when cached) and return the binaries."""
    result = subprocess.run(["bash", str(script)], check=False)
    if result.returncode != 0:
        raise errors.BinariesMissingError(
            f"{script} failed with exit status {result.returncode}; see its output above"
        )
    return locate()

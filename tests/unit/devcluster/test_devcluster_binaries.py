"""Finding the cached binaries: the launcher and the build script agree on the directory, and a
missing build fails with an error that names the make target."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kubeseer.devcluster import binaries, errors


def test_pinned_versions_are_kubernetes_1_37_etcd_3_7_kwok_0_8_helm_4():
    versions = binaries.parse_versions(binaries.VERSIONS_FILE.read_text())
    assert re.fullmatch(r"v1\.37\.\d+", versions.kubernetes)
    assert re.fullmatch(r"v3\.7\.\d+", versions.etcd)
    assert re.fullmatch(r"v0\.8\.\d+", versions.kwok)
    assert re.fullmatch(r"v4\.\d+\.\d+", versions.helm)


def test_cache_directory_name_matches_the_build_script():
    script = binaries.BUILD_SCRIPT.read_text()
    pattern = re.search(r'bin_dir="\$cache_root/bin/([^"]+)"', script)
    assert pattern is not None
    versions = binaries.parse_versions(binaries.VERSIONS_FILE.read_text())
    rendered = (
        pattern.group(1)
        .replace("$KUBERNETES_VERSION", versions.kubernetes)
        .replace("$ETCD_VERSION", versions.etcd)
        .replace("$KWOK_VERSION", versions.kwok)
        .replace("$HELM_VERSION", versions.helm)
    )
    assert rendered == versions.cache_key


def test_cache_root_follows_kubeseer_cache_like_the_build_script(tmp_path: Path):
    assert binaries.cache_root({"KUBESEER_CACHE": str(tmp_path)}) == tmp_path
    assert binaries.cache_root({}) == Path.home() / ".cache" / "kubeseer"


def test_missing_binaries_error_names_make_control_plane(tmp_path: Path):
    with pytest.raises(errors.BinariesMissingError, match="make control-plane") as info:
        binaries.locate(environ={"KUBESEER_CACHE": str(tmp_path)})
    assert "kube-apiserver" in str(info.value)


def test_locate_returns_paths_when_every_binary_is_executable(tmp_path: Path):
    expected = binaries.expected(environ={"KUBESEER_CACHE": str(tmp_path)})
    expected.directory.mkdir(parents=True)
    for component in binaries.COMPONENTS:
        path = expected.path(component)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    expected.kwok_stages.write_text("kind: Stage\n")
    found = binaries.locate(environ={"KUBESEER_CACHE": str(tmp_path)})
    assert found.path("kwok") == tmp_path / "bin" / found.versions.cache_key / "kwok"


def test_binaries_without_kwok_stages_are_missing_and_the_build_script_writes_them(tmp_path: Path):
    expected = binaries.expected(environ={"KUBESEER_CACHE": str(tmp_path)})
    expected.directory.mkdir(parents=True)
    for component in binaries.COMPONENTS:
        path = expected.path(component)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    assert binaries.missing(expected) == [binaries.KWOK_STAGES]
    assert binaries.KWOK_STAGES in binaries.BUILD_SCRIPT.read_text()


def test_unknown_component_is_a_value_error():
    bins = binaries.expected()
    with pytest.raises(ValueError, match="unknown component 'kubelet'"):
        bins.path("kubelet")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("KUBERNETES_VERSION v1.34.4\n", "expected KEY=value"),
        ("KUBERNETES_VERSION=v1.34.4\nETCD_VERSION=v3.6.16\n", "missing"),
    ],
)
def test_malformed_versions_file_is_rejected(text, message):
    with pytest.raises(errors.DevClusterError, match=message):
        binaries.parse_versions(text, source="versions.env")

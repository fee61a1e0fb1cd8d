"""When a component dies or never gets ready, `start()` fails with its log in the message,
stops whatever it had started and keeps the logs. Stand-in executables (shell scripts) take the
place of the real binaries, so this runs without a build."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kubeseer.devcluster import binaries, cluster, errors


def fake_binaries(tmp_path: Path, scripts: dict[str, str]) -> binaries.Binaries:
    versions = binaries.Versions("v1.34.4", "v3.6.16", "v0.7.0", "v3.19.5")
    directory = tmp_path / "bin"
    directory.mkdir()
    for component in binaries.COMPONENTS:
        path = directory / component
        path.write_text("#!/bin/sh\n" + scripts.get(component, "exec sleep 30\n"))
        path.chmod(0o755)
    return binaries.Binaries(directory=directory, versions=versions)


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_component_that_exits_fails_start_with_its_log_and_stops_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    tmpfs = tmp_path / "shm"
    tmpfs.mkdir()
    monkeypatch.setattr(cluster, "TMPFS", tmpfs)
    bins = fake_binaries(tmp_path, {"etcd": "echo 'etcdmain: bad flag --frobnicate' >&2\nexit 1\n"})
    local = cluster.LocalCluster(run_dir=tmp_path / "run", bins=bins, ready_timeout_s=20)
    with pytest.raises(errors.ClusterStartError, match="etcd exited with status 1") as info:
        local.start()
    assert "bad flag --frobnicate" in str(info.value)
    apiserver_log = tmp_path / "run" / "logs" / "kube-apiserver.log"
    assert apiserver_log.exists()
    assert "bad flag" in (tmp_path / "run" / "logs" / "etcd.log").read_text()
    assert not (tmp_path / "run" / "state.json").exists()
    assert list(tmpfs.iterdir()) == []


def test_a_component_that_never_gets_ready_times_out_with_every_log(tmp_path: Path):
    bins = fake_binaries(tmp_path, {"kube-apiserver": "echo 'waiting for etcd'\nexec sleep 30\n"})
    local = cluster.LocalCluster(run_dir=tmp_path / "run", bins=bins, ready_timeout_s=1)
    with pytest.raises(
        errors.ClusterStartError, match="kube-apiserver not ready within 1 s"
    ) as info:
        local.start()
    message = str(info.value)
    assert "--- etcd" in message and "--- kube-apiserver" in message
    assert "waiting for etcd" in message
    with pytest.raises(errors.ClusterStateError):
        _ = local.state


def test_teardown_after_a_failed_start_leaves_no_process(tmp_path: Path):
    bins = fake_binaries(tmp_path, {"kube-apiserver": 'echo $$ > "$0.pid"\nexec sleep 30\n'})
    local = cluster.LocalCluster(run_dir=tmp_path / "run", bins=bins, ready_timeout_s=1)
    with pytest.raises(errors.ClusterStartError):
        local.start()
    pid = int((bins.directory / "kube-apiserver.pid").read_text())
    assert pid_gone(pid)

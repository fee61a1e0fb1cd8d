"""`kubeseer devcluster up|status|down` as a user runs them: the cluster outlives `up`, `status`
finds it, and `down` leaves no process or port behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kubeseer.devcluster import cluster, process

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def kubeseer(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubeseer.cli", "devcluster", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def port_free(port: int) -> bool:
    """Whether a server could listen on the port again. SO_REUSEADDR, as every server sets it,
    because the clients' closed connections linger in TIME_WAIT for a minute."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError:
            return False
    return True


def test_up_status_down_leaves_no_process_or_port_behind(tmp_path: Path, control_plane):
    run_dir = tmp_path / "run"
    up = kubeseer("up", "--dir", str(run_dir), "--crd", os.devnull, "--rbac", os.devnull)
    assert up.returncode == 0, up.stderr
    assert f"export KUBECONFIG={run_dir / 'admin.kubeconfig'}" in up.stdout
    state = cluster.read_state(run_dir)
    try:
        # `up` has exited; its components keep running in their own process groups.
        assert all(process.runs(p) for p in state.processes)
        status = kubeseer("status", "--dir", str(run_dir))
        assert status.returncode == 0, status.stdout + status.stderr
        assert status.stdout.count(" ok") == len(state.processes)
    finally:
        down = kubeseer("down", "--dir", str(run_dir))
    assert down.returncode == 0, down.stderr
    assert not any(process.runs(p) for p in state.processes)
    assert all(port_free(p) for p in state.ports.all())
    assert not Path(state.etcd_data).exists()
    assert (run_dir / "logs" / "kube-apiserver.log").stat().st_size > 0
    after = kubeseer("status", "--dir", str(run_dir))
    assert after.returncode == 1
    assert "no cluster state" in after.stderr

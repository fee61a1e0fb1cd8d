"""Component processes: own process group, log capture, teardown of the whole group, and never
signalling a pid that has been reused by another program."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kubeseer.devcluster import cluster, config, errors, process


def _gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return True
        time.sleep(0.02)
    return False


def test_spawn_runs_in_its_own_process_group_and_logs_output(tmp_path: Path):
    log = tmp_path / "logs" / "echo.log"
    child, record = process.spawn(
        "echo", ["/bin/sh", "-c", "echo started; exec sleep 30"], log, die_with_parent=True
    )
    try:
        assert os.getpgid(child.pid) == child.pid != os.getpgid(0)
        deadline = time.monotonic() + 5
        while "started" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "started" in process.log_tail(log)
        assert record.pid == child.pid and record.log == str(log)
    finally:
        child.kill()
        child.wait()


def test_stop_terminates_the_whole_group_including_grandchildren(tmp_path: Path):
    log = tmp_path / "sh.log"
    child, record = process.spawn(
        "sh", ["/bin/sh", "-c", "sleep 30 & echo $!; wait"], log, die_with_parent=True
    )
    deadline = time.monotonic() + 5
    while not log.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.02)
    grandchild = int(log.read_text().split()[0])
    assert process.runs(record)
    killed = process.stop([record], [child])
    assert killed == []
    assert child.returncode is not None
    assert _gone(grandchild)
    assert not process.runs(record)


def test_runs_is_false_for_a_pid_now_running_another_program():
    me = process.ProcessRecord(name="x", pid=os.getpid(), executable="/bin/sleep", log="/dev/null")
    assert not process.runs(me)
    # signal_group must leave this test process alone.
    process.signal_group(me, process.signal.SIGTERM)


def test_component_dies_with_the_process_that_started_it(tmp_path: Path):
    launcher = (
        "import sys; from pathlib import Path; from kubeseer.devcluster import process\n"
        "child, _ = process.spawn(\n"
        "    's', ['/bin/sleep', '30'], Path(sys.argv[1]), die_with_parent=True\n"
        ")\n"
        "print(child.pid, flush=True)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", launcher, str(tmp_path / "s.log")],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert _gone(int(out.stdout.split()[0]))


def test_state_round_trips_through_json():
    state = cluster.ClusterState(
        run_dir="/r",
        server="https://127.0.0.1:1",
        admin_kubeconfig="/r/admin.kubeconfig",
        operator_kubeconfig="/r/operator.kubeconfig",
        ca_file="/r/pki/ca.crt",
        etcd_data="/dev/shm/e",
        ports=config.Ports(1, 2, 3, 4, 5, 6),
        processes=(process.ProcessRecord("etcd", 10, "/b/etcd", "/r/logs/etcd.log"),),
        startup_s=12.5,
    )
    assert cluster.ClusterState.from_json(state.to_json(), source="s") == state


def test_read_state_of_a_directory_without_cluster_says_so(tmp_path: Path):
    with pytest.raises(errors.ClusterStateError, match="no cluster state"):
        cluster.read_state(tmp_path)


def test_read_state_rejects_a_foreign_state_file(tmp_path: Path):
    (tmp_path / "state.json").write_text('{"version": 99}')
    with pytest.raises(errors.ClusterStateError, match="not a devcluster state file"):
        cluster.read_state(tmp_path)


def test_stopping_one_wave_neither_waits_for_nor_touches_other_components(tmp_path: Path):
    first, first_record = process.spawn(
        "a", ["/bin/sleep", "30"], tmp_path / "a.log", die_with_parent=True
    )
    other, _ = process.spawn("b", ["/bin/sleep", "30"], tmp_path / "b.log", die_with_parent=True)
    try:
        began = time.monotonic()
        process.stop([first_record], [first, other])
        assert time.monotonic() - began < process.TERM_GRACE_S / 2
        assert first.returncode is not None
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()

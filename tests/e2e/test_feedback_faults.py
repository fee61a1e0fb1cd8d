"""The observation store under an operator crash, on the local control plane (issue 21).

Every finished attempt of a DLJob becomes an observation record (docs/feedback.md). A record is
written whole or not at all, and writing it again replaces it, so an operator killed while it
writes loses nothing: the next operator records what the killed one had not. Here the real
operator process is SIGKILLed the moment one of its records is being written (its hidden
temporary file exists), during a burst of jobs finishing, and a second operator takes over.
"""

from __future__ import annotations

import collections
import os
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_support import (
    SMALL,
    configmap,
    dljob,
    finish,
    free_port,
    get,
    oom_kill,
    phase_is,
    pods_of,
    submit,
)

from kubeseer.devcluster import cluster
from kubeseer.observations import record, store
from kubeseer.operator import local
from kubeseer.operator import status as st

pytestmark = pytest.mark.e2e

QUICK = 32
"""DLJobs whose one attempt KWOK ends after 1-6 s: the burst of records the kill lands in."""
ESCALATED = 3
"""DLJobs whose first attempt runs out of memory (a censored record) and whose second one the
test ends after the restart."""
ENDED = (st.OUTCOME_SUCCEEDED, st.OUTCOME_OOM, st.OUTCOME_FAILED)


def operator_process(
    devcluster: cluster.LocalCluster, tmp_path: Path, name: str
) -> local.OperatorProcess:
    env = {
        "KUBESEER_HEALTH_PORT": str(free_port()),
        "KUBESEER_METRICS_PORT": "0",
        "KUBESEER_FETCH_CACHE_DIR": str(tmp_path / "models"),
        "KUBESEER_OBSERVATION_STORE": str(tmp_path / "store"),
        # The killed operator's Lease is taken over once it has not been renewed for this long.
        "KUBESEER_LEASE_DURATION_S": "5",
    }
    return local.OperatorProcess(devcluster.operator_kubeconfig, env, tmp_path / f"{name}.log")


def kill_while_writing(
    operator: local.OperatorProcess, records: Path, after: int, timeout_s: float
) -> tuple[bool, int]:
    """SIGKILL the operator once `after` records are whole, as soon as its next record file is
    half-written (its hidden temporary file exists), or at twice `after` if no write was caught
    in flight. Returns (a write was in flight, whole records before the kill)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            names = os.listdir(records)
        except FileNotFoundError:
            names = []
        in_flight = any(n.startswith(".") and n.endswith(".tmp") for n in names)
        whole = sum(1 for n in names if n.startswith("obs-"))
        if (in_flight and whole >= after) or whole >= 2 * after:
            operator.kill()
            return in_flight, whole
        time.sleep(0.0005)
    operator.kill()
    pytest.fail(f"{after} observation records were not written within {timeout_s:g} s")


def test_an_operator_killed_while_writing_records_loses_none_and_writes_none_twice(
    devcluster: cluster.LocalCluster,
    admin_api: client.ApiClient,
    namespace: str,
    tmp_path: Path,
    wait_for: Any,
) -> None:
    ref = configmap(admin_api, namespace, "small", SMALL)
    escalated = [f"oom-{i}" for i in range(ESCALATED)]
    quick = [f"quick-{i}" for i in range(QUICK)]
    records = tmp_path / "store" / "observations"
    first = operator_process(devcluster, tmp_path, "first")
    first.start()
    try:
        for name in escalated:
            submit(admin_api, namespace, dljob(name, {"configMapRef": ref}))
        for name in escalated:
            wait_for(f"{name} Running", phase_is(admin_api, namespace, name, "Running"), 90)
            (pod,) = pods_of(admin_api, namespace, name, attempt=0)
            oom_kill(admin_api, namespace, pod.metadata.name)
        for name in escalated:
            wait_for(
                f"{name}'s second attempt",
                lambda name=name: pods_of(admin_api, namespace, name, attempt=1),
                60,
            )
        for name in quick:
            submit(admin_api, namespace, dljob(name, {"configMapRef": ref}, runs_for=None))
        in_flight, before = kill_while_writing(first, records, ESCALATED + QUICK // 4, 120)
    finally:
        first.kill()
    # Killed half-way through: records were written and more remained to be.
    assert 0 < before < ESCALATED + QUICK, (in_flight, before)
    # What the kill left is whole records and at most a temporary file, which readers ignore.
    killed = store.open_store(str(tmp_path / "store")).read()
    assert killed.damaged == []
    assert len(killed.observations) == sum(1 for n in os.listdir(records) if n.startswith("obs-"))

    second = operator_process(devcluster, tmp_path, "second")
    second.start()
    try:
        for name in escalated:
            (pod,) = pods_of(admin_api, namespace, name, attempt=1)
            finish(admin_api, namespace, pod.metadata.name)
        for name in escalated + quick:
            wait_for(f"{name} Succeeded", phase_is(admin_api, namespace, name, "Succeeded"), 120)
        ended: dict[tuple[str, int], str] = {}
        for name in escalated + quick:
            body = get(admin_api, namespace, name)
            for attempt in st.read_attempts(body["status"]):
                if attempt["outcome"] in ENDED:
                    ended[(body["metadata"]["uid"], attempt["attempt"])] = attempt["outcome"]
        assert len(ended) == 2 * ESCALATED + QUICK

        def all_recorded() -> list[record.Observation] | None:
            found = store.open_store(str(tmp_path / "store")).read().observations
            return found if len(found) >= len(ended) else None

        wait_for("a record of every finished attempt", all_recorded, 60)
    finally:
        second.stop()

    after = store.open_store(str(tmp_path / "store")).read()
    assert after.damaged == []
    recorded = collections.Counter((o.dljob_uid, o.attempt) for o in after.observations)
    assert set(recorded) == set(ended)
    assert set(recorded.values()) == {1}
    files = sorted(n for n in os.listdir(records) if not n.startswith("."))
    assert len(files) == len(ended)
    assert all(n.startswith("obs-") and n.endswith(".parquet") for n in files)
    outcomes = {(o.dljob_uid, o.attempt): o.outcome for o in after.observations}
    for key, outcome in ended.items():
        expected = record.Outcome.OOM if outcome == st.OUTCOME_OOM else record.Outcome.SUCCEEDED
        assert outcomes[key] is expected, key
    censored = [o for o in after.observations if o.outcome is record.Outcome.OOM]
    assert len(censored) == ESCALATED
    assert all(o.memory_at_least_bytes for o in censored)

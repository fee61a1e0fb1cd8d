"""Killing the operator half-way and starting it again creates no duplicate pods.

Its own module, so that no other operator (the in-process one of test_operator.py) serves the
cluster at the same time: the operator here is a child process, killed with SIGKILL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from test_operator import SMALL, configmap, dljob, free_port, get, submit

from kubeseer.devcluster import cluster
from kubeseer.operator import local

pytestmark = pytest.mark.e2e


def test_a_killed_and_restarted_operator_creates_no_duplicate_pods(
    devcluster: cluster.LocalCluster,
    admin_api: client.ApiClient,
    namespace: str,
    tmp_path: Path,
    wait_for: Any,
) -> None:
    ref = configmap(admin_api, namespace, "many", SMALL)
    names = [f"job-{i}" for i in range(30)]
    env = {
        "KUBESEER_HEALTH_PORT": str(free_port()),
        "KUBESEER_METRICS_PORT": "0",
        "KUBESEER_FETCH_CACHE_DIR": str(tmp_path / "models"),
    }
    core = client.CoreV1Api(admin_api)
    proc = local.OperatorProcess(devcluster.operator_kubeconfig, env, tmp_path / "operator.log")
    proc.start()
    try:
        for name in names:
            submit(admin_api, namespace, dljob(name, {"configMapRef": ref}))
        wait_for(
            "the first pods", lambda: core.list_namespaced_pod(namespace).items, 60, interval=0.01
        )
        proc.kill()
        created_before_the_kill = len(core.list_namespaced_pod(namespace).items)
        proc.start()

        def all_placed() -> bool:
            phases = [get(admin_api, namespace, n).get("status", {}).get("phase") for n in names]
            return all(p in ("Placed", "Running") for p in phases)

        wait_for("every DLJob placed after the restart", all_placed, 90)
    finally:
        proc.stop()
    # The kill really came half-way: some DLJobs were left for the restarted operator.
    assert 0 < created_before_the_kill < len(names)
    pods = client.CoreV1Api(admin_api).list_namespaced_pod(namespace).items
    assert sorted(p.metadata.name for p in pods) == sorted(f"{n}-0" for n in names)

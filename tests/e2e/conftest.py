"""End-to-end fixtures: one real local control plane per test session.

The binaries come from `hack/build-control-plane.sh` (seconds when cached, ~10-30 min cold);
the tests are skipped only where Go itself is missing, because then the control plane cannot
be built. The cluster never reuses `KUBECONFIG`: e2e tests only touch a cluster they started.
When a test fails, the tail of every component log is attached to its report.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from kubeseer import resources
from kubeseer.devcluster import binaries, cluster, errors, process

DEPLOY = resources.path("deploy")
# The session's cluster, for the report hook (tests reach it through fixtures).
_running: list[cluster.LocalCluster] = []


@pytest.fixture(scope="session")
def control_plane() -> binaries.Binaries:
    """The cached binaries, built first if needed; skips only where Go is absent."""
    if binaries.go_available():
        return binaries.build()
    try:
        return binaries.locate()
    except errors.BinariesMissingError as e:
        pytest.skip(f"Go is not installed, so the control plane cannot be built here ({e})")


@pytest.fixture(scope="session")
def devcluster(
    tmp_path_factory: pytest.TempPathFactory, control_plane: binaries.Binaries
) -> Iterator[cluster.LocalCluster]:
    """A running cluster with the inventory's fake GPU nodes, the DLJob CRD and operator RBAC."""
    local = cluster.LocalCluster(
        run_dir=tmp_path_factory.mktemp("devcluster"),
        crd_files=sorted((DEPLOY / "crds").glob("*.yaml")),
        rbac_files=sorted((DEPLOY / "rbac").glob("*.yaml")),
        bins=control_plane,
    )
    with local:
        _running.append(local)
        yield local
        _running.remove(local)


@pytest.fixture(scope="session")
def admin_api(devcluster: cluster.LocalCluster) -> client.ApiClient:
    """An API client with `system:masters` rights."""
    return config.new_client_from_config(config_file=str(devcluster.admin_kubeconfig))


@pytest.fixture(scope="session")
def operator_api(devcluster: cluster.LocalCluster) -> client.ApiClient:
    """An API client with the operator service account's identity and nothing more."""
    return config.new_client_from_config(config_file=str(devcluster.operator_kubeconfig))


@pytest.fixture
def namespace(admin_api: client.ApiClient) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (the controller manager empties it)."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(admin_api)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


Waiter = Callable[[str, Callable[[], Any]], Any]


@pytest.fixture
def wait_for() -> Waiter:
    """`wait_for(what, probe)`: poll until `probe()` is truthy and return it; fail naming `what`."""
    return _wait_for


def _wait_for(
    what: str, probe: Callable[[], Any], timeout: float = 30.0, interval: float = 0.2
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Attach the component logs to the report of a failed test that used the cluster."""
    report = yield
    if report.failed and _running and item.get_closest_marker("e2e"):
        for record in _running[0].state.processes:
            report.sections.append(
                (f"devcluster {record.name} log ({record.log})", process.log_tail(Path(record.log)))
            )
    return report

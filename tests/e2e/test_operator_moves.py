"""An attempt queued on a busy kind of device moves to a kind that frees first (issue 17), on the
real control plane: kube-scheduler, the Job controller and the operator with extended resources
and no scheduler extender, so each pod is pinned to one kind.

One cluster for the module, with a single mixed-strategy A100 offering one `1g.10gb` and one
`2g.20gb` slice (two extended resources of one product). Pods bound by name hold both; a DLJob
that either holds is then queued on one of them; the other is freed. Without the move the pod
waits for its own kind for as long as the holder runs, here for ever.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes import config as kube_config
from operator_support import (
    SMALL,
    condition,
    configmap,
    dljob,
    events_of,
    get,
    jobs_of,
    operator_config,
    operator_thread,
    phase_is,
    pods_of,
    submit,
)

from kubeseer import resources
from kubeseer.devcluster import binaries, cluster
from kubeseer.operator import main

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DEPLOY = resources.path("deploy")
NODE = "a100-mixed"
SLICES = ("nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb")
A100 = "A100-SXM4-80GB"
MODELS = Path(__file__).parents[1] / "unit" / "extender" / "fixtures" / "nodes.yaml"
"""The A100's and its MIG profiles' figures, as the extender's tests declare them."""
INVENTORY = {
    "gpuModels": {A100: yaml.safe_load(MODELS.read_text())["gpuModels"][A100]},
    "nodes": [
        {
            "name": NODE,
            "gpuModel": A100,
            "gpus": 1,
            "migStrategy": "mixed",
            "migLayouts": [{"1g.10gb": 1, "2g.20gb": 1}],
            "cpu": "32",
            "memory": "256Gi",
        },
        {"name": "cpu-0", "cpu": "16", "memory": "64Gi"},
    ],
}


@pytest.fixture(scope="module")
def two_slices(
    control_plane: binaries.Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[cluster.LocalCluster]:
    run_dir = tmp_path_factory.mktemp("moves")
    inventory = run_dir / "nodes.yaml"
    inventory.write_text(yaml.safe_dump(INVENTORY))
    with cluster.LocalCluster(
        run_dir=run_dir,
        inventory_file=inventory,
        crd_files=sorted((DEPLOY / "crds").glob("*.yaml")),
        rbac_files=sorted((DEPLOY / "rbac").glob("*.yaml")),
        bins=control_plane,
    ) as local_cluster:
        yield local_cluster


def hold(core: client.CoreV1Api, namespace: str, resource: str) -> str:
    """A pod bound to the node holding one unit of `resource`; its name."""
    name = "hold-" + resource.rsplit("-", 1)[-1].replace(".", "-")
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {
                "nodeName": NODE,
                "containers": [
                    {"name": "main", "image": "busybox", "resources": {"limits": {resource: "1"}}}
                ],
            },
        },
    )
    return name


def test_a_pod_waiting_on_a_busy_kind_moves_to_the_kind_that_frees(
    two_slices: cluster.LocalCluster, tmp_path: Path, wait_for: Any
) -> None:
    api = kube_config.new_client_from_config(config_file=str(two_slices.admin_kubeconfig))
    core = client.CoreV1Api(api)
    namespace = "moves"
    core.create_namespace({"metadata": {"name": namespace}})
    holders = {resource: hold(core, namespace, resource) for resource in SLICES}
    wait_for(
        "the holders Running",
        lambda: all(
            core.read_namespaced_pod(name, namespace).status.phase == "Running"
            for name in holders.values()
        ),
        60,
    )
    config = operator_config(tmp_path, move_after_s=3.0)
    built = main.build(config, kubeconfig=str(two_slices.operator_kubeconfig))
    with operator_thread(built):
        ref = configmap(api, namespace, "small", SMALL)
        body = dljob("small", {"configMapRef": ref}, placement={"maxSlowdown": 8.0})
        submit(api, namespace, body)
        placed = wait_for("small Placed", phase_is(api, namespace, "small", "Placed"), 90)
        queued_on = placed["status"]["placement"]["resource"]
        assert "none is free now" in placed["status"]["placement"]["reason"]
        (other,) = [r for r in SLICES if r != queued_on]
        wait_for(
            "the pod unschedulable",
            lambda: any(
                c.reason == "Unschedulable"
                for p in pods_of(api, namespace, "small")
                for c in p.status.conditions or []
            ),
            60,
        )
        core.delete_namespaced_pod(holders[other], namespace, grace_period_seconds=0)

        running = wait_for("small Running", phase_is(api, namespace, "small", "Running"), 120)

    placement = running["status"]["placement"]
    assert placement["resource"] == other and placement["attempt"] == 0
    moved = condition(running, "Placed")
    assert moved["reason"] == "Moved" and f"{other}" in moved["message"]
    assert "Moved" in {e.reason for e in events_of(api, namespace, "small")}
    (job,) = jobs_of(api, namespace)
    assert job.spec.suspend is False
    (pod,) = [p for p in pods_of(api, namespace, "small") if p.status.phase == "Running"]
    assert pod.spec.node_name == NODE
    assert pod.spec.containers[0].resources.limits[other] == "1"
    assert queued_on not in pod.spec.containers[0].resources.limits
    # The holder of the kind it left still runs: nothing bound was stopped.
    assert core.read_namespaced_pod(holders[queued_on], namespace).status.phase == "Running"
    assert get(api, namespace, "small")["status"].get("reason") is None

"""The operator with kubeseer's scheduler extender installed, end to end: a DLJob's pod is
admitted to every device kind of its plan that holds it, and the extender's best fit picks one.

One cluster for the module with the fake nodes of tests/unit/extender/fixtures/nodes.yaml (a
single-strategy 1g.10gb node and a 3g.40gb node, a node of whole H100s, all `nvidia.com/gpu`; two
mixed-strategy A100s), the DLJob CRD and the operator's RBAC; the real operator, configured as
the chart configures it with the scheduler enabled (`KUBESEER_SCHEDULER_NAME=kubeseer-scheduler`,
`KUBESEER_SCHEDULER_EXTENDER=true`); `kubeseer extender` as a child process.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes import config as kube_config
from operator_support import (
    SMALL,
    configmap,
    dljob,
    operator_config,
    operator_thread,
    phase_is,
    pods_of,
    submit,
)

from kubeseer import resources
from kubeseer.devcluster import binaries, cluster
from kubeseer.extender import local, stanza
from kubeseer.operator import main

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

INVENTORY = Path(__file__).parents[1] / "unit" / "extender" / "fixtures" / "nodes.yaml"
DEPLOY = resources.path("deploy")
SLICE_1G = "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"
SLICE_3G = "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb"
H100 = "NVIDIA-H100-80GB-HBM3"


@pytest.fixture(scope="module")
def with_extender(
    control_plane: binaries.Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[cluster.LocalCluster]:
    run_dir = tmp_path_factory.mktemp("extender-operator")
    port = local.free_port()
    with cluster.LocalCluster(
        run_dir=run_dir,
        inventory_file=INVENTORY,
        extender_url=local.url_for(port),
        crd_files=sorted((DEPLOY / "crds").glob("*.yaml")),
        rbac_files=sorted((DEPLOY / "rbac").glob("*.yaml")),
        bins=control_plane,
    ) as local_cluster:
        extender = local.ExtenderProcess(
            local_cluster.admin_kubeconfig, port, run_dir / "logs" / "extender.log"
        )
        with extender:
            yield local_cluster


def hold_mixed_slices(core: client.CoreV1Api, namespace: str) -> None:
    """Bind pods holding every 1g.10gb slice of the mixed-strategy A100s, so that the cheapest
    free kind is the single-strategy slice, requested as `nvidia.com/gpu`."""
    node_list = core.list_node().items
    for node in node_list:
        units = int((node.status.allocatable or {}).get("nvidia.com/mig-1g.10gb", "0"))
        for unit in range(units):
            core.create_namespaced_pod(
                namespace,
                {
                    "metadata": {"name": f"hold-{node.metadata.name}-{unit}"},
                    "spec": {
                        "nodeName": node.metadata.name,
                        "containers": [
                            {
                                "name": "main",
                                "image": "busybox",
                                "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}},
                            }
                        ],
                    },
                },
            )


def test_a_dljob_pod_admits_every_kind_that_holds_it_and_the_extender_picks_the_tightest(
    with_extender: cluster.LocalCluster,
    tmp_path_factory: pytest.TempPathFactory,
    wait_for: Any,
) -> None:
    api = kube_config.new_client_from_config(config_file=str(with_extender.admin_kubeconfig))
    core = client.CoreV1Api(api)
    namespace = "open-kinds"
    core.create_namespace({"metadata": {"name": namespace}})
    hold_mixed_slices(core, namespace)
    config = operator_config(
        tmp_path_factory.mktemp("operator"),
        scheduler_name=stanza.SCHEDULER_NAME,
        scheduler_extender=True,
    )
    built = main.build(config, kubeconfig=str(with_extender.operator_kubeconfig))
    with operator_thread(built):
        ref = configmap(api, namespace, "small", SMALL)
        body = dljob("small", {"configMapRef": ref}, placement={"maxSlowdown": 8.0})
        submit(api, namespace, body)
        status = wait_for("DLJob small Running", phase_is(api, namespace, "small", "Running"), 90)
    placement = status["status"]["placement"]
    assert placement["resource"] == "nvidia.com/gpu"
    (pod,) = pods_of(api, namespace, "small")
    assert pod.spec.scheduler_name == stanza.SCHEDULER_NAME
    assert pod.spec.node_selector is None
    required = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
    (term,) = required.node_selector_terms
    (products,) = [e.values for e in term.match_expressions if e.key == "nvidia.com/gpu.product"]
    assert sorted(products) == sorted([SLICE_1G, SLICE_3G, H100])
    # Of the three, the extender's best fit: the smallest slice that holds the job.
    assert pod.spec.node_name == "a100-1g"
    core.delete_namespace(namespace)

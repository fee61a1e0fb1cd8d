"""The extender with the real kube-scheduler: the node it prefers is the node the pod is bound
to, its reasons reach the pod's events, and with the extender gone pods still schedule.

One cluster for the module, with the fake nodes of tests/unit/extender/fixtures/nodes.yaml: on
`nvidia.com/gpu` the scheduler can choose among a 1g.10gb slice node (single strategy), a
3g.40gb slice node and a node of whole H100s, which default scoring (least allocated CPU and
memory) prefers because it has the most CPUs. The extender runs as `kubeseer extender`, a child
process, exactly as deployed. Tests run in file order; the last one stops the extender.
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes import config as kube_config

from kubeseer.devcluster import binaries, cluster
from kubeseer.extender import local, stanza
from kubeseer.operator import workload

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

INVENTORY = Path(__file__).parents[1] / "unit" / "extender" / "fixtures" / "nodes.yaml"
GIB = 1 << 30


class Setup:
    def __init__(self, local_cluster: cluster.LocalCluster, extender: local.ExtenderProcess):
        self.cluster = local_cluster
        self.extender = extender
        self.api = kube_config.new_client_from_config(
            config_file=str(local_cluster.admin_kubeconfig)
        )
        self.core = client.CoreV1Api(self.api)


@pytest.fixture(scope="module")
def setup(
    control_plane: binaries.Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    run_dir = tmp_path_factory.mktemp("extender")
    port = local.free_port()
    with cluster.LocalCluster(
        run_dir=run_dir,
        inventory_file=INVENTORY,
        extender_url=local.url_for(port),
        bins=control_plane,
    ) as local_cluster:
        extender = local.ExtenderProcess(
            local_cluster.admin_kubeconfig, port, run_dir / "logs" / "extender.log"
        )
        extender.start()
        try:
            yield Setup(local_cluster, extender)
        finally:
            extender.stop()


@pytest.fixture
def namespace(setup: Setup) -> Iterator[str]:
    name = f"ext-{uuid.uuid4().hex[:8]}"
    setup.core.create_namespace({"metadata": {"name": name}})
    yield name
    setup.core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    setup.core.delete_namespace(name)


def pod(
    name: str,
    *,
    predicted: int | None,
    resource: str = "nvidia.com/gpu",
    scheduler: str = stanza.SCHEDULER_NAME,
    node: str | None = None,
) -> dict[str, Any]:
    annotations = {workload.ANNOTATION_PREDICTED_MEMORY: str(predicted)} if predicted else {}
    # 8 CPUs and 32 GiB: enough that least-allocated scoring clearly prefers the 96-CPU node.
    resources = {"requests": {"cpu": "8", "memory": "32Gi"}, "limits": {resource: "1"}}
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "restartPolicy": "Never",
        "containers": [
            {"name": "main", "image": "registry.example/train:1", "resources": resources}
        ],
    }
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "annotations": annotations}, "spec": spec}


def bound_node(setup: Setup, namespace: str, name: str, wait_for) -> str:
    return wait_for(
        f"{name} to be bound",
        lambda: setup.core.read_namespaced_pod(name, namespace).spec.node_name,
    )


def preferred(setup: Setup, body: dict[str, Any], names: list[str]) -> str:
    """The node the running extender scores highest for `body` among `names`."""
    request = json.dumps({"Pod": body, "Nodes": None, "NodeNames": names}).encode()
    with urllib.request.urlopen(f"{setup.extender.url}/prioritize", request, timeout=5) as answer:
        scores = json.loads(answer.read())
    return max(scores, key=lambda s: s["Score"])["Host"]


@pytest.mark.parametrize(
    ("predicted", "expected"),
    [(8 * GIB, "a100-1g"), (30 * GIB, "a100-3g"), (60 * GIB, "h100-whole")],
    ids=["8GiB", "30GiB", "60GiB"],
)
def test_the_node_the_extender_prefers_is_the_node_the_scheduler_binds(
    setup: Setup, namespace: str, wait_for, predicted: int, expected: str
):
    body = pod("job", predicted=predicted)
    created = setup.core.create_namespaced_pod(namespace, body)
    node = bound_node(setup, namespace, "job", wait_for)
    as_sent = setup.api.sanitize_for_serialization(created)
    candidates = ["a100-1g", "a100-3g", "h100-whole"]
    assert preferred(setup, as_sent, candidates) == expected == node


def test_default_scoring_alone_puts_the_same_small_job_elsewhere(
    setup: Setup, namespace: str, wait_for
):
    setup.core.create_namespaced_pod(
        namespace, pod("job", predicted=8 * GIB, scheduler="default-scheduler")
    )
    assert bound_node(setup, namespace, "job", wait_for) == "h100-whole"


def test_identical_mixed_strategy_nodes_fill_one_before_the_other(
    setup: Setup, namespace: str, wait_for
):
    setup.core.create_namespaced_pod(
        namespace,
        pod("holder", predicted=None, resource="nvidia.com/mig-2g.20gb", node="a100-mixed-b"),
    )
    body = pod("job", predicted=8 * GIB, resource="nvidia.com/mig-1g.10gb")
    # The probe has no uid, so the extender does not assume it anywhere.
    wait_for(
        "the extender to see the holder",
        lambda: preferred(setup, body, ["a100-mixed-a", "a100-mixed-b"]) == "a100-mixed-b",
    )
    setup.core.create_namespaced_pod(namespace, body)
    assert bound_node(setup, namespace, "job", wait_for) == "a100-mixed-b"


def test_a_pod_no_node_can_hold_waits_with_the_extenders_reason(
    setup: Setup, namespace: str, wait_for
):
    setup.core.create_namespaced_pod(namespace, pod("huge", predicted=100 * GIB))

    def reason() -> str:
        events = setup.core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=huge,reason=FailedScheduling"
        ).items
        return events[0].message if events else ""

    message = wait_for("a FailedScheduling event", reason)
    assert "less than the predicted peak 100.00 GiB" in message
    assert "kubeseer: one nvidia.com/gpu (whole GPU on H100-80GB-SXM) holds 79.65 GiB" in message
    assert setup.core.read_namespaced_pod("huge", namespace).spec.node_name is None


def test_pods_of_other_schedulers_and_without_annotations_are_untouched(
    setup: Setup, namespace: str, wait_for
):
    setup.core.create_namespaced_pod(namespace, pod("plain", predicted=None))
    assert bound_node(setup, namespace, "plain", wait_for) in {"a100-1g", "a100-3g", "h100-whole"}
    passed = setup.extender.metric(
        "kubeseer_extender_decisions_total", verb="filter", decision="not_kubeseer"
    )
    other = setup.extender.metric(
        "kubeseer_extender_decisions_total", verb="filter", decision="other_scheduler"
    )
    assert passed is not None and passed >= 1
    assert other is not None and other >= 1, "the default-scheduler pod above"


def test_with_the_extender_stopped_pods_still_schedule(setup: Setup, namespace: str, wait_for):
    setup.extender.stop()
    setup.core.create_namespaced_pod(namespace, pod("job", predicted=8 * GIB))
    assert bound_node(setup, namespace, "job", wait_for)

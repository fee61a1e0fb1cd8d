"""The operator's inventory cache: seeding, watch events and assumed pods."""

from __future__ import annotations

from typing import Any

from kubeseer.operator.inventory import InventoryCache, node_record, pod_record

A100_80 = "NVIDIA-A100-SXM4-80GB"


def free(cache: InventoryCache, resource: str, product: str = A100_80) -> int:
    return cache.snapshot().free_units(product, resource)


def seeded(nodes: list[dict[str, Any]]) -> InventoryCache:
    cache = InventoryCache()
    cache.replace_all(nodes, [])
    return cache


def test_node_record_reads_readiness_and_cordons(node: Any) -> None:
    assert node_record(node("n", A100_80, {}))["schedulable"]
    assert not node_record(node("n", A100_80, {}, ready=False))["schedulable"]
    cordoned = node("n", A100_80, {})
    cordoned["spec"]["unschedulable"] = True
    assert not node_record(cordoned)["schedulable"]


def test_pod_record_keeps_binding_phase_and_resources(pod: Any) -> None:
    record = pod_record(pod("p", "nvidia.com/gpu", node_name="h100", phase="Running"))
    assert record["node_name"] == "h100"
    assert record["phase"] == "Running"
    assert record["containers"] == [{"limits": {"nvidia.com/gpu": "1"}}]


def test_bound_pods_take_capacity_and_finished_pods_give_it_back(
    cluster_nodes: Any, pod: Any
) -> None:
    cache = seeded(cluster_nodes)
    p = pod("p", "nvidia.com/mig-1g.10gb", node_name="a100")
    cache.observe_pod("ADDED", p)
    assert free(cache, "nvidia.com/mig-1g.10gb") == 1
    cache.observe_pod("MODIFIED", {**p, "status": {"phase": "Succeeded"}})
    assert free(cache, "nvidia.com/mig-1g.10gb") == 2
    cache.observe_pod("ADDED", p)
    cache.observe_pod("DELETED", p)
    assert free(cache, "nvidia.com/mig-1g.10gb") == 2


def test_pods_without_gpus_are_not_kept(cluster_nodes: Any, pod: Any) -> None:
    cache = seeded(cluster_nodes)
    cache.observe_pod("ADDED", pod("cpu", "cpu", node_name="a100"))
    assert cache.snapshot() == seeded(cluster_nodes).snapshot()


def test_an_assumed_pod_counts_until_its_own_watch_event_replaces_it(
    cluster_nodes: Any, pod: Any
) -> None:
    cache = seeded(cluster_nodes)
    created = pod("resnet-0", "nvidia.com/mig-1g.10gb", phase="Pending")
    created["kind"] = "Pod"
    cache.assume(created)
    assert free(cache, "nvidia.com/mig-1g.10gb") == 1
    cache.observe_pod("ADDED", {**created, "spec": {**created["spec"], "nodeName": "a100"}})
    assert free(cache, "nvidia.com/mig-1g.10gb") == 1
    cache.observe_pod("DELETED", created)
    assert free(cache, "nvidia.com/mig-1g.10gb") == 2


def test_assumed_job_pods_end_one_by_one_as_the_jobs_pods_arrive(
    cluster_nodes: Any, pod: Any
) -> None:
    cache = seeded(cluster_nodes)
    job = {
        "kind": "Job",
        "metadata": {"name": "train-0", "namespace": "default"},
        "spec": {"parallelism": 2, "template": pod("x", "nvidia.com/mig-1g.10gb")},
    }
    cache.assume(job)
    assert free(cache, "nvidia.com/mig-1g.10gb") == 0
    arrived = pod(
        "train-0-abcde",
        "nvidia.com/mig-1g.10gb",
        node_name="a100",
        labels={"batch.kubernetes.io/job-name": "train-0"},
    )
    cache.observe_pod("ADDED", arrived)
    cache.observe_pod("MODIFIED", {**arrived, "status": {"phase": "Succeeded"}})
    assert free(cache, "nvidia.com/mig-1g.10gb") == 1


def test_assumptions_expire_when_no_watch_event_comes(cluster_nodes: Any, pod: Any) -> None:
    now = [0.0]
    cache = InventoryCache(clock=lambda: now[0])
    cache.replace_all(cluster_nodes, [])
    created = {**pod("lost-0", "nvidia.com/mig-1g.10gb", phase="Pending"), "kind": "Pod"}
    cache.assume(created)
    assert free(cache, "nvidia.com/mig-1g.10gb") == 1
    now[0] = 61.0
    assert free(cache, "nvidia.com/mig-1g.10gb") == 2


def test_forget_drops_an_assumption(cluster_nodes: Any, pod: Any) -> None:
    cache = seeded(cluster_nodes)
    created = {**pod("p-0", "nvidia.com/mig-1g.10gb", phase="Pending"), "kind": "Pod"}
    cache.assume(created)
    cache.forget(created)
    assert free(cache, "nvidia.com/mig-1g.10gb") == 2


def test_an_unbound_pod_is_charged_to_the_product_its_node_selector_names(
    node: Any, pod: Any
) -> None:
    h100, a100 = "NVIDIA-H100-80GB-HBM3", A100_80
    cache = seeded(
        [node("h", h100, {"nvidia.com/gpu": "1"}), node("a", a100, {"nvidia.com/gpu": "1"})]
    )
    waiting = pod("p", "nvidia.com/gpu", phase="Pending")
    waiting["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": h100}
    cache.observe_pod("ADDED", waiting)
    assert free(cache, "nvidia.com/gpu", h100) == 0
    assert free(cache, "nvidia.com/gpu", a100) == 1


def test_deleted_nodes_leave_the_inventory(cluster_nodes: Any, node: Any) -> None:
    cache = seeded(cluster_nodes)
    cache.observe_node("DELETED", node("a100", A100_80, {}))
    assert {o.node for o in cache.snapshot().offers} == {"h100"}

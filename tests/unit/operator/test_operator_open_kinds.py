"""With kubeseer's scheduler extender installed the operator admits a pod to every device kind of
its plan's ladder that shares the chosen resource, instead of pinning the kind it picked; an
out-of-memory failure then escalates from the kind the pod really ran on."""

from __future__ import annotations

from typing import Any

from kubeseer.operator import pods, workload
from kubeseer.placement import policy

NS = "ml"
GIB = 1 << 30
A100_1G = "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"
A100_3G = "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb"
A100_80 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"


def single_strategy_nodes(node: Any) -> list[dict[str, Any]]:
    """Single-strategy A100 nodes of 1g.10gb and 3g.40gb slices, and whole H100s: every kind is
    `nvidia.com/gpu`."""
    return [
        node("a100-1g", A100_1G, {"nvidia.com/gpu": "7"}),
        node("a100-3g", A100_3G, {"nvidia.com/gpu": "2"}),
        node("h100", H100, {"nvidia.com/gpu": "2"}),
    ]


def mixed_strategy_nodes(node: Any) -> list[dict[str, Any]]:
    """An A100 and an H100 under the mixed strategy, both cut into 1g.10gb slices, and a
    single-strategy 3g.40gb A100."""
    return [
        node("a100-mixed", A100_80, {"nvidia.com/mig-1g.10gb": "7"}),
        node("h100-mixed", H100, {"nvidia.com/mig-1g.10gb": "7"}),
        node("a100-3g", A100_3G, {"nvidia.com/gpu": "2"}),
    ]


def world_on(make_world: Any, node: Any, nodes: Any = single_strategy_nodes, **config: Any) -> Any:
    world = make_world(**config)
    world.inventory.replace_all(nodes(node), [])
    return world


def template_spec(world: Any, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = world.cluster.workloads[name]["spec"]["template"]["spec"]
    return spec


def product_expressions(spec: dict[str, Any]) -> list[list[str]]:
    """The `nvidia.com/gpu.product In` values of each required node-affinity term."""
    required = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return [
        e["values"]
        for term in required["nodeSelectorTerms"]
        for e in term.get("matchExpressions", [])
        if e["key"] == "nvidia.com/gpu.product"
    ]


def test_with_the_extender_the_pod_admits_every_gpu_kind_that_holds_the_job(
    make_world: Any, node: Any
) -> None:
    world = world_on(make_world, node, scheduler_extender=True)
    world.reconcile(world.submit())
    assert world.cluster.status("resnet")["placement"]["resource"] == "nvidia.com/gpu"
    spec = template_spec(world, "resnet-0")
    assert "nodeSelector" not in spec
    assert product_expressions(spec) == [sorted([A100_1G, A100_3G, H100])]
    assert spec["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}


def test_under_the_mixed_strategy_the_kinds_are_the_products_of_the_chosen_profile(
    make_world: Any, node: Any
) -> None:
    """The pod can request one resource only: nvidia.com/mig-1g.10gb, offered by two products;
    the 3g.40gb slices are nvidia.com/gpu, which it does not request."""
    world = world_on(make_world, node, mixed_strategy_nodes, scheduler_extender=True)
    world.reconcile(world.submit())
    spec = template_spec(world, "resnet-0")
    assert spec["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
    assert product_expressions(spec) == [sorted([A100_80, H100])]


def test_without_the_extender_the_pod_is_pinned_to_the_kind_placed(
    make_world: Any, node: Any
) -> None:
    world = world_on(make_world, node)
    world.reconcile(world.submit())
    spec = template_spec(world, "resnet-0")
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": A100_1G}
    assert "affinity" not in spec
    # A single-strategy slice is offered as nvidia.com/gpu, never as nvidia.com/mig-1g.10gb.
    assert spec["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}


def test_kinds_too_small_for_the_job_are_not_admitted(make_world: Any, node: Any) -> None:
    world = world_on(make_world, node, scheduler_extender=True)
    world.predict_fn.table[b"resnet-bytes"] = (20.0, 30.0)
    world.reconcile(world.submit())
    assert product_expressions(template_spec(world, "resnet-0")) == [sorted([A100_3G, H100])]


def test_allowed_products_travel_to_the_extender_and_bound_the_kinds(
    make_world: Any, node: Any
) -> None:
    world = world_on(make_world, node, scheduler_extender=True)
    world.reconcile(
        world.submit(placement={"policy": "auto", "gpuProducts": ["NVIDIA-H100-80GB-HBM3"]})
    )
    job = world.cluster.workloads["resnet-0"]
    annotations = job["spec"]["template"]["metadata"]["annotations"]
    assert annotations[workload.ANNOTATION_GPU_PRODUCTS] == "H100-80GB-SXM"
    assert product_expressions(template_spec(world, "resnet-0")) == [[H100]]


def test_a_fixed_profile_and_several_replicas_keep_their_one_kind(
    make_world: Any, node: Any
) -> None:
    world = world_on(make_world, node, scheduler_extender=True)
    world.reconcile(world.submit("fixed", placement={"policy": "fixed", "profile": "3g.40gb"}))
    world.reconcile(world.submit("pair", replicas=2))
    assert template_spec(world, "fixed-0")["nodeSelector"] == {"nvidia.com/gpu.product": A100_3G}
    assert template_spec(world, "pair-0")["nodeSelector"] == {"nvidia.com/gpu.product": A100_1G}


def test_the_users_own_node_affinity_terms_each_gain_the_kinds() -> None:
    pod_spec: dict[str, Any] = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": ["n"]}
                            ]
                        },
                    ]
                }
            }
        }
    }
    workload.admit_products(pod_spec, [A100_1G, H100])
    terms = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    wanted = {"key": "nvidia.com/gpu.product", "operator": "In", "values": [A100_1G, H100]}
    assert [t["matchExpressions"][-1] for t in terms["nodeSelectorTerms"]] == [wanted, wanted]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["key"] == "zone"
    assert "matchFields" in terms["nodeSelectorTerms"][1]


def test_a_restarted_operator_builds_the_same_job_from_the_recorded_plan(
    make_world: Any, node: Any
) -> None:
    first = world_on(make_world, node, scheduler_extender=True)
    ref = first.submit()
    first.reconcile(ref)
    restarted = world_on(make_world, node, scheduler_extender=True)
    restarted.cluster.dljobs = first.cluster.dljobs
    assert restarted.reconcile(ref) is not None
    assert restarted.predict_fn.calls == 0
    assert restarted.cluster.workloads == first.cluster.workloads


def test_an_oom_on_a_larger_kind_than_placed_escalates_from_the_memory_that_failed(
    make_world: Any, node: Any
) -> None:
    """Placed on a 1g.10gb slice, the pod ran on the 3g.40gb node the extender preferred and ran
    out of memory: the next attempt needs 1.5 x 39.25 GiB (a whole GPU), not 1.5 x 9.5 GiB (the
    3g.40gb slice that just failed)."""
    world = world_on(make_world, node, scheduler_extender=True)
    world.reconcile(world.submit())
    assert world.cluster.status("resnet")["placement"]["profile"] == "A100-80GB/1g.10gb"
    verdict = pods.Verdict(pods.PodOutcome.OOM, "OOMKilled", node="a100-3g")
    world.reconciler.observe_workload(NS, "resnet", 0, verdict)
    status = world.cluster.status("resnet")
    assert status["attempts"][0]["profile"] == "A100-80GB/3g.40gb"
    assert status["attempts"][0]["observation"]["memoryBytesAtLeast"] == 39.25 * GIB
    assert status["placement"]["attempt"] == 1
    assert status["placement"]["profile"] == "H100-80GB-SXM/whole"
    assert product_expressions(template_spec(world, "resnet-1")) == [[H100]]


def test_an_oom_verdict_names_the_node_the_pod_ran_on() -> None:
    pod = {
        "spec": {"nodeName": "a100-3g"},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {"name": "main", "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}
            ],
        },
    }
    job = {"metadata": {"name": "resnet-0"}, "status": {}}
    assert pods.classify_job(job, [pod]).node == "a100-3g"
    assert pods.classify_pod(pod).node == "a100-3g"


def test_ladder_kinds_are_the_fitting_rows_of_the_placements_resource(
    mig_placement: policy.Placement,
) -> None:
    rows = [
        {"productLabel": A100_80, "resource": "nvidia.com/mig-1g.10gb", "fits": True},
        {"productLabel": H100, "resource": "nvidia.com/mig-1g.10gb", "fits": True},
        {
            "productLabel": "NVIDIA-A100-SXM4-40GB",
            "resource": "nvidia.com/mig-1g.10gb",
            "fits": False,
        },
        {"productLabel": H100, "resource": "nvidia.com/gpu", "fits": True},
    ]
    assert workload.ladder_kinds({"rows": rows}, mig_placement) == (A100_80, H100)
    assert workload.ladder_kinds({"rows": []}, mig_placement) == (A100_80,)

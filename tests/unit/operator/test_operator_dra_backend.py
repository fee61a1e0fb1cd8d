"""The operator on Dynamic Resource Allocation, against the in-memory API server: the ladder as
the attempt's claim template, the allocated device in the status, escalation from it, restarts.
The devices are the dev cluster's DRA nodes (`deploy/devcluster/dra-nodes.yaml`) as NVIDIA's
DRA driver would publish them; the real scheduler's side is in tests/e2e/test_operator_dra.py."""

from __future__ import annotations

import math
import re
from typing import Any

from kubeseer import units
from kubeseer.operator import dljob, pods, workload
from kubeseer.placement import claims

NS = "ml"
A100_DYNAMIC = "gpu-a100-40-dra-dynamic-0"
H100_DYNAMIC = "gpu-h100-dra-dynamic-0"


def rungs(template: dict[str, Any]) -> list[dict[str, Any]]:
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    return list(request["firstAvailable"])


_AT_LEAST = re.compile(r"memory\.compareTo\(quantity\('(\d+)Mi'\)\) >= 0")


def least_memory(rung: dict[str, Any]) -> int:
    """The memory a rung's CEL asks for at least, in bytes."""
    for selector in rung["selectors"]:
        found = _AT_LEAST.search(selector["cel"]["expression"])
        if found:
            return int(found.group(1)) * units.MIB
    raise AssertionError(f"rung {rung['name']} asks for no memory")


def allocated_claim(
    world: Any, job: str, rung_index: int, pool: str, device: str, name: str = "resnet-0-gpu-abc"
) -> dict[str, Any]:
    """A claim made from the Job's template, allocated by the scheduler to `device`."""
    template = world.cluster.claim_templates[job]
    spec = template["spec"]["spec"]
    rung = spec["devices"]["requests"][0]["firstAvailable"][rung_index]["name"]
    result = {"request": f"gpu/{rung}", "driver": claims.DRIVER, "pool": pool, "device": device}
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            **template["spec"]["metadata"],
        },
        "spec": spec,
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def test_on_dra_the_job_is_created_suspended_its_pods_claim_the_plans_ladder_then_it_runs(
    make_world: Any,
) -> None:
    world = make_world(dra=True)
    world.reconcile(world.submit())
    status = world.cluster.status("resnet")
    job = world.cluster.workloads["resnet-0"]
    pod = job["spec"]["template"]["spec"]
    assert pod["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "resnet-0"}]
    assert pod["containers"][0]["resources"] == {"claims": [{"name": "gpu"}]}
    # The claims never change (a Job's resourceClaims cannot): only the resume is patched.
    assert world.cluster.job_patches == [("resnet-0", {"spec": {"suspend": False}}, False)]
    assert job["spec"]["suspend"] is False

    template = world.cluster.claim_templates["resnet-0"]
    assert template["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "resnet-0",
            "uid": "uid-job-resnet-0",
            "controller": True,
        }
    ]
    # Every claim made from it names the DLJob, so its allocation finds the way back.
    assert template["spec"]["metadata"] == {
        "labels": {workload.LABEL_DLJOB: "resnet", workload.LABEL_ATTEMPT: "0"},
        "annotations": {workload.ANNOTATION_DLJOB_NAME: "resnet"},
    }
    ladder = [r for r in status["plan"]["rows"] if r["fits"]]
    assert [r["rank"] for r in ladder] == list(range(1, len(ladder) + 1))
    assert [r["name"] for r in rungs(template)] == [
        f"r{r['rank']}-{r['gpuProduct']}-{r['profile']}".lower().replace(".", "-")
        for r in ladder[: claims.MAX_RUNGS]
    ]
    need = status["plan"]["needMiB"] * units.MIB
    assert all(least_memory(r) == need for r in rungs(template))
    assert need == 4 * units.GIB
    assert world.events.reasons() == ["Placed", "WorkloadCreated"]


def test_the_allocated_device_becomes_the_placement_and_says_whether_it_was_the_first_choice(
    make_world: Any,
) -> None:
    world = make_world(dra=True)
    world.reconcile(world.submit())
    planned = world.cluster.status("resnet")["placement"]
    assert planned["resource"] == "nvidia.com/mig-1g.5gb"  # rung 1: the A100's 1g.5gb
    claim = allocated_claim(world, "resnet-0", 1, H100_DYNAMIC, "gpu-1-mig-1g10gb-19-4")
    world.reconciler.observe_allocation(NS, "resnet", 0, claim)
    status = world.cluster.status("resnet")
    assert status["allocation"] == {
        "attempt": 0,
        "device": f"{H100_DYNAMIC}/gpu-1-mig-1g10gb-19-4",
        "driver": claims.DRIVER,
        "rung": "r2-h100-80gb-sxm-1g-10gb",
        "rank": 2,
        "firstChoice": False,
        "claims": [
            {
                "claim": "resnet-0-gpu-abc",
                "node": H100_DYNAMIC,
                "device": "gpu-1-mig-1g10gb-19-4",
                "rung": "r2-h100-80gb-sxm-1g-10gb",
                "firstChoice": False,
            }
        ],
    }
    placement = status["placement"]
    assert (placement["resource"], placement["profile"], placement["costRank"]) == (
        "nvidia.com/mig-1g.10gb",
        "H100-80GB-SXM/1g.10gb",
        2,
    )
    # The usable memory the driver publishes for that device (what an OOM escalates from).
    assert placement["usableMemoryBytes"] == 9984 * units.MIB
    assert placement["nodeHint"] == H100_DYNAMIC
    assert "no cheaper rung had a free device" in placement["reason"]
    chosen = [r for r in status["plan"]["rows"] if r["chosen"]]
    assert [(r["rank"], r["profile"]) for r in chosen] == [(2, "1g.10gb")]
    assert world.events.reasons()[-1] == "DeviceAllocated"

    patches = world.cluster.patches
    world.reconciler.observe_allocation(NS, "resnet", 0, claim)  # the same claim seen again
    world.reconciler.observe_allocation(NS, "resnet", 3, claim)  # an attempt that is not current
    assert world.cluster.patches == patches

    world.reconciler.observe_workload(NS, "resnet", 0, pods.Verdict(pods.PodOutcome.RUNNING))
    ready = world.condition("resnet", dljob.ConditionType.WORKLOAD_READY)
    assert f"{H100_DYNAMIC}/gpu-1-mig-1g10gb-19-4" in ready["message"]


def test_an_oom_on_dra_escalates_from_the_allocated_device_and_drops_the_rungs_that_failed(
    make_world: Any,
) -> None:
    world = make_world(dra=True)
    world.reconcile(world.submit())
    # Planned on the A100's 1g.5gb (rung 1), allocated the H100's 1g.10gb (rung 2): the
    # escalation grows from what the job really had.
    claim = allocated_claim(world, "resnet-0", 1, H100_DYNAMIC, "gpu-0-mig-1g10gb-19-0")
    world.reconciler.observe_allocation(NS, "resnet", 0, claim)
    failed_bytes = 9984 * units.MIB
    world.reconciler.observe_workload(
        NS, "resnet", 0, pods.Verdict(pods.PodOutcome.OOM, "container main was OOMKilled")
    )
    status = world.cluster.status("resnet")
    assert status["placement"]["attempt"] == 1
    assert status["attempts"][0]["observation"]["memoryBytesAtLeast"] == failed_bytes
    assert "allocation" not in status  # the next attempt has none yet
    need = math.ceil(1.5 * failed_bytes)
    assert status["plan"]["needMiB"] == math.ceil(need / units.MIB)
    template = world.cluster.claim_templates["resnet-1"]
    assert template["spec"]["metadata"]["labels"][workload.LABEL_ATTEMPT] == "1"
    # Every rung holds 1.5x what failed: the rung that failed, and every smaller one, is off.
    assert all(least_memory(r) >= need for r in rungs(template))
    assert not any(("1g-10gb" in r["name"] or "1g-5gb" in r["name"]) for r in rungs(template))
    assert (
        world.cluster.pod_spec("resnet-1")["resourceClaims"][0]["resourceClaimTemplateName"]
        == "resnet-1"
    )


def test_a_restarted_operator_gives_a_job_left_suspended_the_ladder_it_recorded(
    make_world: Any,
) -> None:
    first = make_world(dra=True)
    ref = first.submit()
    first.reconcile(ref)
    template = first.cluster.claim_templates["resnet-0"]
    # The operator stopped after creating the Job, before its template: the Job waits.
    restarted = make_world(dra=True)
    restarted.cluster.dljobs = first.cluster.dljobs
    restarted.cluster.workloads = first.cluster.workloads
    restarted.cluster.workloads["resnet-0"]["spec"]["suspend"] = True
    restarted.models.sources = {}
    restarted.reconcile(ref)
    assert restarted.predict_fn.calls == 0
    assert restarted.cluster.claim_templates["resnet-0"] == template
    assert restarted.cluster.workloads["resnet-0"]["spec"]["suspend"] is False


def test_a_fixed_profile_on_dra_claims_that_one_kind_of_device(make_world: Any) -> None:
    world = make_world(dra=True)
    placement = {"policy": "fixed", "profile": "3g.40gb", "coverage": 0.95, "maxSlowdown": 2.0}
    world.reconcile(world.submit(placement=placement))
    (rung,) = rungs(world.cluster.claim_templates["resnet-0"])
    assert rung["deviceClassName"] == claims.MIG_DEVICE_CLASS
    assert "3g-40gb" in rung["name"]
    assert least_memory(rung) == 4 * units.GIB


def test_plans_on_dra_count_the_devices_claims_hold(make_world: Any) -> None:
    world = make_world(dra=True)
    names = [f"job{i}" for i in range(8)]
    for name in names:
        world.reconcile(world.submit(name))
    # Seven 1g.5gb placements on the A100 are assumed taken one after another; the eighth DLJob
    # expects the next rung.
    planned = [world.cluster.status(n)["placement"]["costRank"] for n in names]
    assert planned == [1] * 7 + [2]
    rows = world.cluster.status("job7")["plan"]["rows"]
    assert next(r for r in rows if r["rank"] == 1)["free"] == 0

"""Attempts whose Job does not start: pods refused at admission say so in the DLJob, pods that
wait unschedulable on a busy kind move to a free one.

The Job controller and the scheduler are played by hand: the Job's status and pods are what
their watch events would carry, the refusals are the FailedCreate events kube-controller-manager
1.37.2 posted on the local control plane (tests/unit/operator/test_operator_refusals.py).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kubeseer.operator import dljob, journal, stalls

Phase = dljob.Phase
Cond = dljob.ConditionType
Reason = dljob.Reason
NS = "ml"
STARTED = "2026-11-25T14:00:00Z"
QUOTA = (
    'Error creating: pods "resnet-0-7gfwp" is forbidden: exceeded quota: gpus, requested: '
    "pods=1, used: pods=4, limited: pods=4"
)
POD_SECURITY = (
    'Error creating: pods "resnet-0-zhg56" is forbidden: violates PodSecurity '
    '"restricted:latest": runAsNonRoot != true (pod or container "main" must set '
    "securityContext.runAsNonRoot=true)"
)
WEBHOOK_DOWN = (
    'Error creating: Internal error occurred: failed calling webhook "validate.example.com": '
    "connect: connection refused"
)


def job_seen(world: Any, name: str = "resnet-0", **status: Any) -> dict[str, Any]:
    """The Job as its watch event carries it, with this status, fed to the stall watch."""
    job = world.cluster.workloads[name]
    job["status"] = status
    world.reconciler.stalls.observe_job("MODIFIED", copy.deepcopy(job))
    return dict(job)


def refused(world: Any, message: str, at: str = "2026-11-25T14:00:03Z") -> None:
    """The Job controller's FailedCreate event on Job resnet-0."""
    world.cluster.events.append(
        {
            "involvedObject": {"kind": "Job", "name": "resnet-0", "uid": "uid-job-resnet-0"},
            "reason": "FailedCreate",
            "type": "Warning",
            "message": message,
            "lastTimestamp": at,
        }
    )


def sweep_after(world: Any, seconds: float) -> None:
    world.now += seconds
    world.reconciler.sweep()


def placed(world: Any) -> Any:
    ref = world.submit()
    assert world.reconcile(ref) is Phase.PLACED
    return ref


def test_a_quota_on_pods_makes_the_dljob_wait_then_clears_once_they_are_created(
    make_world: Any,
) -> None:
    """H9: a quota on pods refuses the Job controller, not the operator, and the DLJob stayed
    Placed with no word of it."""
    world = make_world()
    placed(world)
    job_seen(world, startTime=STARTED)
    refused(world, QUOTA)
    sweep_after(world, stalls.POD_GRACE_S - 1)
    assert "reason" not in world.cluster.status("resnet")

    sweep_after(world, 1)
    status = world.cluster.status("resnet")
    assert (status["phase"], status["reason"]) == ("Placed", "QuotaExceeded")
    assert "exceeded quota: gpus" in status["message"]
    assert 'pods "resnet-0' not in status["message"]  # the generated name changes every try
    ready = world.condition("resnet", Cond.WORKLOAD_READY)
    assert (ready["status"], ready["reason"]) == ("False", "QuotaExceeded")
    assert world.events.reasons().count("QuotaExceeded") == 1

    writes = world.cluster.patches
    refused(world, QUOTA.replace("7gfwp", "q2x8m"), at="2026-11-25T14:00:20Z")
    sweep_after(world, stalls.RECHECK_MAX_S)
    assert world.cluster.patches == writes  # said once, not on every look
    assert world.events.reasons().count("QuotaExceeded") == 1

    job_seen(world, startTime=STARTED, active=1)
    sweep_after(world, 1)
    status = world.cluster.status("resnet")
    assert status["phase"] == "Placed" and "reason" not in status
    ready = world.condition("resnet", Cond.WORKLOAD_READY)
    assert (ready["status"], ready["reason"]) == ("False", "PodsCreated")
    kind, reason, message = world.events.posted[-1]
    assert (kind, reason) == ("Normal", "PodsCreated")
    assert "QuotaExceeded" in message


def test_pods_that_admission_refuses_as_written_fail_the_dljob_and_stop_the_job(
    make_world: Any,
) -> None:
    world = make_world()
    placed(world)
    job_seen(world, startTime=STARTED)
    refused(world, POD_SECURITY)
    sweep_after(world, stalls.POD_GRACE_S)
    status = world.cluster.status("resnet")
    assert (status["phase"], status["reason"]) == ("Failed", "PodsRefused")
    assert 'violates PodSecurity "restricted:latest"' in status["message"]
    assert world.events.posted[-1][:2] == ("Warning", "PodsRefused")
    assert world.cluster.workloads["resnet-0"]["spec"]["suspend"] is True


def test_an_unanswered_admission_webhook_is_waited_for_not_failed(make_world: Any) -> None:
    world = make_world()
    placed(world)
    job_seen(world, startTime=STARTED)
    refused(world, WEBHOOK_DOWN)
    sweep_after(world, stalls.POD_GRACE_S)
    status = world.cluster.status("resnet")
    assert (status["phase"], status["reason"]) == ("Placed", "PodsNotCreated")
    assert "it keeps trying" in status["message"]


def test_a_refusal_from_before_the_job_started_or_a_job_with_its_pods_says_nothing(
    make_world: Any,
) -> None:
    world = make_world()
    placed(world)
    job_seen(world, startTime=STARTED)
    refused(world, QUOTA, at="2026-11-25T13:59:00Z")
    sweep_after(world, stalls.POD_GRACE_S)
    assert "reason" not in world.cluster.status("resnet")

    job_seen(world, startTime=STARTED, active=1)
    refused(world, QUOTA)
    sweep_after(world, stalls.RECHECK_MAX_S)
    assert "reason" not in world.cluster.status("resnet")
    assert world.cluster.patches == 3  # accepted, predicted, placed: nothing since


def test_a_retry_that_created_the_job_clears_its_quota_reason(make_world: Any) -> None:
    """A quota on Jobs (`count/jobs.batch`) refuses the operator's create, retried by kopf: the
    reconcile that creates the Job clears the reason."""
    from kubeseer.operator import errors

    world = make_world()
    ref = world.submit()
    world.cluster.create_error = errors.QuotaExceededError("403 exceeded quota: jobs", status=403)
    with pytest.raises(journal.RetryLaterError):
        world.reconcile(ref)
    assert world.cluster.status("resnet")["reason"] == "QuotaExceeded"
    world.cluster.create_error = None
    assert world.reconcile(ref, retry=1) is Phase.PLACED
    status = world.cluster.status("resnet")
    assert status["phase"] == "Placed" and "reason" not in status


# -- pods unschedulable on a busy kind while another kind is free ----------------------------


def blockers(world: Any, pod: Any) -> list[dict[str, Any]]:
    """Pods of other users holding every GPU of the world's cluster: two 1g.10gb slices and the
    3g.40gb slice of the A100, both H100s."""
    held = [
        pod("a-1g-0", "nvidia.com/mig-1g.10gb", node_name="a100", namespace="other"),
        pod("a-1g-1", "nvidia.com/mig-1g.10gb", node_name="a100", namespace="other"),
        pod("a-3g-0", "nvidia.com/mig-3g.40gb", node_name="a100", namespace="other"),
        pod("h-0", "nvidia.com/gpu", node_name="h100", namespace="other"),
        pod("h-1", "nvidia.com/gpu", node_name="h100", namespace="other"),
    ]
    for p in held:
        world.inventory.observe_pod("ADDED", p)
    return held


def pending_pod(world: Any, job: str = "resnet-0", **status: Any) -> dict[str, Any]:
    """The Job's pod as the scheduler leaves it: unbound, PodScheduled False Unschedulable."""
    template = world.cluster.workloads[job]["spec"]["template"]
    pod = {
        "metadata": {
            "name": f"{job}-x7k2p",
            "namespace": NS,
            "labels": {**template["metadata"]["labels"], stalls.JOB_NAME_LABEL: job},
        },
        "spec": copy.deepcopy(template["spec"]),
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
            **status,
        },
    }
    world.inventory.observe_pod("ADDED", pod)
    world.reconciler.stalls.observe_pod("ADDED", pod)
    return pod


def queued(make_world: Any, pod: Any, **config: Any) -> tuple[Any, list[dict[str, Any]]]:
    """A DLJob placed while every GPU is held: its pod waits unschedulable on 1g.10gb."""
    world = make_world(move_after_s=30.0, **config)
    held = blockers(world, pod)
    placed(world)
    assert world.cluster.status("resnet")["placement"]["resource"] == "nvidia.com/mig-1g.10gb"
    job_seen(world, startTime=STARTED, active=1)
    pending_pod(world)
    return world, held


def test_an_attempt_unschedulable_on_a_busy_kind_moves_to_a_kind_that_freed(
    make_world: Any, pod: Any
) -> None:
    """H9: a DLJob queued on a busy 1g.10gb waited for ever while another kind of its plan
    freed. Now, once its pod has waited `KUBESEER_MOVE_AFTER_S`, the Job is suspended, given the
    free kind, and resumed: the same attempt, another device."""
    world, held = queued(make_world, pod)
    world.inventory.observe_pod("DELETED", held[3])  # an H100 frees
    sweep_after(world, 29)
    assert world.cluster.workloads["resnet-0"]["spec"]["suspend"] is False

    sweep_after(world, 1)
    job = world.cluster.workloads["resnet-0"]
    assert job["spec"]["suspend"] is True  # its controller deletes the pending pod
    status = world.cluster.status("resnet")
    placement = status["placement"]
    assert (placement["resource"], placement["productLabel"], placement["attempt"]) == (
        "nvidia.com/gpu",
        "NVIDIA-H100-80GB-HBM3",
        0,
    )
    assert status["phase"] == "Placed" and "attempts" not in status
    moved = world.condition("resnet", Cond.PLACED)
    assert moved["reason"] == "Moved"
    assert "waited 30 s unschedulable for nvidia.com/mig-1g.10gb" in moved["message"]
    assert world.events.posted[-1][:2] == ("Normal", "Moved")
    assert world.sample(
        "kubeseer_operator_placements_total", profile="H100-80GB-SXM/whole", outcome="moved"
    )

    # The Job controller deletes the pod and resets the Job; then it gets its new device.
    world.reconciler.stalls.observe_pod("DELETED", pending_pod(world))
    sweep_after(world, 1)
    assert world.cluster.workloads["resnet-0"]["spec"]["suspend"] is True  # not reset yet
    job_seen(world)
    sweep_after(world, 1)
    job = world.cluster.workloads["resnet-0"]
    assert job["spec"]["suspend"] is False
    pod_spec = job["spec"]["template"]["spec"]
    assert pod_spec["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert pod_spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert job["spec"]["template"]["metadata"]["annotations"]["kubeseer.io/profile"] == (
        "H100-80GB-SXM/whole"
    )


@pytest.mark.parametrize(
    "freed",
    [
        pytest.param(0, id="its own kind has room: the scheduler binds it there"),
        pytest.param(None, id="nothing else is free"),
    ],
)
def test_an_attempt_stays_where_it_waits_unless_only_another_kind_is_free(
    make_world: Any, pod: Any, freed: int | None
) -> None:
    world, held = queued(make_world, pod)
    if freed is not None:
        world.inventory.observe_pod("DELETED", held[freed])
    sweep_after(world, 100)
    assert world.cluster.workloads["resnet-0"]["spec"]["suspend"] is False
    assert world.cluster.status("resnet")["placement"]["resource"] == "nvidia.com/mig-1g.10gb"


def test_a_pod_bound_meanwhile_is_never_stopped_to_move(make_world: Any, pod: Any) -> None:
    world, held = queued(make_world, pod)
    world.inventory.observe_pod("DELETED", held[3])
    bound = pending_pod(world)
    bound["spec"]["nodeName"] = "a100"
    world.reconciler.stalls.observe_pod("MODIFIED", bound)
    sweep_after(world, 100)
    assert world.cluster.workloads["resnet-0"]["spec"]["suspend"] is False


@pytest.mark.parametrize(
    "config",
    [
        pytest.param({"scheduler_extender": True}, id="the extender admits every kind already"),
        pytest.param({"move_after_s": 0.0}, id="moves turned off"),
    ],
)
def test_no_moves_where_the_pods_are_not_pinned_or_moves_are_off(
    make_world: Any, pod: Any, config: dict[str, Any]
) -> None:
    world = make_world(**{"move_after_s": 30.0, **config})
    held = blockers(world, pod)
    placed(world)
    job_seen(world, startTime=STARTED, active=1)
    pending_pod(world)
    world.inventory.observe_pod("DELETED", held[3])
    sweep_after(world, 100)
    assert world.cluster.workloads["resnet-0"]["spec"]["suspend"] is False


def test_an_operator_restarted_mid_move_finishes_it_from_the_status(
    make_world: Any, pod: Any
) -> None:
    """The placement was written and the Job suspended, then the operator stopped: the next
    one's reconcile waits for the Job controller's reset, then gives the Job its new device."""
    world, held = queued(make_world, pod)
    world.inventory.observe_pod("DELETED", held[3])
    sweep_after(world, 30)
    ref = world.cluster.add_ref("resnet")
    job = world.cluster.workloads["resnet-0"]
    assert job["spec"]["suspend"] is True
    with pytest.raises(journal.RetryLaterError):
        world.reconcile(ref)  # suspended, but its start time is not reset yet
    assert world.cluster.status("resnet")["reason"] == "WorkloadCreateFailed"
    job["status"] = {}
    assert world.reconcile(ref, retry=1) is Phase.PLACED
    job = world.cluster.workloads["resnet-0"]
    assert job["spec"]["suspend"] is False
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": "1"
    }
    assert "reason" not in world.cluster.status("resnet")

"""The DLJob state machine against an in-memory API server, real inventory and real placement."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import threading
import time
from typing import Any

import pytest

from kubeseer.operator import dljob, errors, journal, pods, ports, workload
from kubeseer.operator.fetch import cancel
from kubeseer.operator.fetch import errors as fetch_errors
from kubeseer.predictor import errors as graph_errors

NS = "ml"
GIB = 1 << 30


def test_a_good_dljob_is_predicted_placed_on_the_smallest_fitting_slice_and_gets_a_job(
    make_world: Any,
) -> None:
    world = make_world()
    ref = world.submit()
    assert world.reconcile(ref) is dljob.Phase.PLACED
    status = world.cluster.status("resnet")
    assert status["phase"] == "Placed"
    assert status["model"] == "resnet/model.onnx"
    assert status["prediction"]["memoryMiB"] == "3072/4096"
    assert status["placement"]["resource"] == "nvidia.com/mig-1g.10gb"
    assert status["placement"]["attempt"] == 0
    for kind in (dljob.ConditionType.MODEL_READY, dljob.ConditionType.PLACED):
        assert world.condition("resnet", kind)["status"] == "True"
    assert world.cluster.pod_spec("resnet-0")["containers"][0]["resources"]["limits"] == {
        "nvidia.com/mig-1g.10gb": "1"
    }
    # Created suspended without its GPU, then given it while suspended (KEP-5440) by the one
    # patch that also resumes it.
    job = world.cluster.workloads["resnet-0"]
    assert job["spec"]["suspend"] is False
    ((name, patch, strategic),) = world.cluster.job_patches
    assert (name, strategic, patch["spec"]["suspend"]) == ("resnet-0", True, False)
    assert world.events.reasons() == ["Placed", "WorkloadCreated"]
    assert "predicted peak of 3072 MiB (upper bound 4096 MiB)" in world.events.posted[0][2]
    assert world.cluster.patches == 3  # Fetching, Predicting, then prediction + placement
    # The predictor reads the model from a file of its own (never the bytes in memory), which
    # is released once predicted.
    assert world.predict_fn.given == [type(world.models.root)]
    assert world.models.checked_out() == []
    assert (
        world.sample(
            "kubeseer_operator_placements_total", profile="A100-80GB/1g.10gb", outcome="placed"
        )
        == 1
    )


def test_reconciling_again_repeats_nothing(make_world: Any) -> None:
    world = make_world()
    ref = world.submit()
    world.reconcile(ref)
    patches, events = world.cluster.patches, list(world.events.posted)
    assert world.reconcile(ref) is dljob.Phase.PLACED
    assert world.cluster.patches == patches
    assert world.events.posted == events
    assert world.models.loads == 1
    assert list(world.cluster.workloads) == ["resnet-0"]


def test_a_restart_after_placement_creates_the_recorded_workload_without_predicting(
    make_world: Any,
) -> None:
    first = make_world()
    ref = first.submit()
    first.reconcile(ref)
    restarted = make_world()
    restarted.cluster.dljobs = first.cluster.dljobs
    restarted.models.sources = {}
    assert restarted.reconcile(ref) is dljob.Phase.PLACED
    assert restarted.predict_fn.calls == 0
    assert restarted.cluster.workloads == first.cluster.workloads


def test_a_restart_counts_a_running_jobs_pods_once(
    make_world: Any, pod: Any, cluster_nodes: Any
) -> None:
    """A restarted operator finds the Job of a Placed DLJob running: its pod, listed at start,
    holds the device; counting the Job's pods again would hide a free slice for a minute."""
    first = make_world()
    ref = first.submit()
    first.reconcile(ref)
    running = pod(
        "resnet-0-abcde",
        "nvidia.com/mig-1g.10gb",
        node_name="a100",
        namespace=NS,
        labels={"batch.kubernetes.io/job-name": "resnet-0"},
    )
    restarted = make_world()
    restarted.cluster.dljobs = first.cluster.dljobs
    restarted.cluster.workloads = first.cluster.workloads
    restarted.inventory.replace_all(cluster_nodes, [running])
    assert restarted.reconcile(ref) is dljob.Phase.PLACED
    free = restarted.inventory.snapshot().free_units(
        "NVIDIA-A100-SXM4-80GB", "nvidia.com/mig-1g.10gb"
    )
    assert free == 1


def test_running_and_finished_dljobs_are_left_alone(make_world: Any) -> None:
    world = make_world()
    ref = world.submit()
    world.cluster.dljobs["resnet"]["status"] = {"phase": "Running"}
    assert world.reconcile(ref) is dljob.Phase.RUNNING
    assert world.cluster.patches == 0


def test_an_invalid_spec_fails_with_a_condition_naming_the_field(make_world: Any) -> None:
    world = make_world()
    ref = world.submit(batchSize=0)
    with pytest.raises(journal.DLJobFailedError, match="InvalidSpec"):
        world.reconcile(ref)
    assert world.cluster.status("resnet")["phase"] == "Failed"
    accepted = world.condition("resnet", dljob.ConditionType.ACCEPTED)
    assert (accepted["status"], accepted["reason"]) == ("False", "InvalidSpec")
    assert "spec.batchSize" in accepted["message"]
    assert world.events.posted[-1][:2] == ("Warning", "InvalidSpec")


def test_a_corrupt_model_fails_the_dljob_and_is_not_retried(make_world: Any) -> None:
    world = make_world()
    world.models.sources["resnet"] = b"garbage"
    world.predict_fn.table[b"garbage"] = graph_errors.NotOnnxError("not an ONNX ModelProto")
    with pytest.raises(journal.DLJobFailedError):
        world.reconcile(world.submit())
    predicted = world.condition("resnet", dljob.ConditionType.PREDICTED)
    assert (predicted["status"], predicted["reason"]) == ("False", "CorruptModel")
    assert "not an ONNX ModelProto" in predicted["message"]
    assert world.condition("resnet", dljob.ConditionType.MODEL_READY)["status"] == "True"
    assert world.cluster.workloads == {}
    assert world.sample("kubeseer_operator_predictions_total", mode="infer", outcome="failed") == 1


def unreachable() -> fetch_errors.FetchError:
    return fetch_errors.UnreachableError("connection refused")


def test_an_unreachable_model_is_retried_then_fails(make_world: Any) -> None:
    world = make_world()
    world.models.sources["resnet"] = unreachable()
    ref = world.submit()
    for retry in range(2):
        with pytest.raises(journal.RetryLaterError) as raised:
            world.reconcile(ref, retry=retry)
        assert raised.value.delay == 1.5
        ready = world.condition("resnet", dljob.ConditionType.MODEL_READY)
        assert ready["reason"] == "ModelUnreachable"
        assert f"retry {retry + 1} of 2" in ready["message"]
        assert world.cluster.status("resnet")["phase"] == "Pending"
    with pytest.raises(journal.DLJobFailedError):
        world.reconcile(ref, retry=2)
    assert world.cluster.status("resnet")["phase"] == "Failed"
    assert world.sample("kubeseer_operator_model_fetch_failures_total", reason="unreachable") == 3


def test_a_model_too_big_for_any_gpu_fails_with_no_fit_naming_need_and_largest(
    make_world: Any,
) -> None:
    world = make_world()
    world.predict_fn.table[b"resnet-bytes"] = (150.0, 170.0)
    with pytest.raises(journal.DLJobFailedError):
        world.reconcile(world.submit())
    placed = world.condition("resnet", dljob.ConditionType.PLACED)
    assert placed["reason"] == "NoFit"
    assert "170.00 GiB" in placed["message"]
    assert "largest free" in placed["message"]
    assert world.sample("kubeseer_operator_placements_total", profile="none", outcome="no_fit") == 1


def test_a_fit_that_is_only_busy_queues_the_pod_instead_of_failing(
    make_world: Any, pod: Any
) -> None:
    world = make_world()
    world.predict_fn.table[b"resnet-bytes"] = (60.0, 70.0)  # only a whole H100 holds it
    for i in range(2):
        world.inventory.observe_pod(
            "ADDED", pod(f"other-{i}", "nvidia.com/gpu", node_name="h100", namespace="x")
        )
    assert world.reconcile(world.submit()) is dljob.Phase.PLACED
    placement = world.cluster.status("resnet")["placement"]
    assert placement["resource"] == "nvidia.com/gpu"
    assert "the pod waits for one" in placement["reason"]


def test_dljobs_placed_one_after_another_never_share_the_last_slice(make_world: Any) -> None:
    world = make_world()
    names = [f"job{i}" for i in range(3)]
    for name in names:
        world.reconcile(world.submit(name))
    resources = [world.cluster.status(n)["placement"]["resource"] for n in names]
    assert resources == [
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-3g.40gb",
    ]


def test_the_same_model_is_predicted_once_and_placed_without_a_predicting_phase(
    make_world: Any,
) -> None:
    world = make_world()
    world.reconcile(world.submit("a"))
    patches = world.cluster.patches
    world.reconcile(world.submit("b"))
    assert world.predict_fn.calls == 1
    assert world.cluster.patches == patches + 2  # Fetching, then prediction + placement
    assert world.cluster.status("b")["phase"] == "Placed"
    assert world.cluster.status("b")["model"] == "resnet/model.onnx"
    assert world.sample("kubeseer_operator_predictions_total", mode="infer", outcome="cached") == 1


def test_a_named_digest_with_a_cached_prediction_reads_no_model(make_world: Any) -> None:
    world = make_world()
    world.reconcile(world.submit("a"))
    loads = world.models.loads
    digest = hashlib.sha256(b"resnet-bytes").hexdigest()
    model = {"configMapRef": {"name": "resnet", "key": "model.onnx"}, "sha256": digest}
    world.reconcile(world.submit("b", model=model))
    assert world.models.loads == loads
    assert world.cluster.status("b")["phase"] == "Placed"
    ready = world.condition("b", dljob.ConditionType.MODEL_READY)
    assert "was not read again" in ready["message"]


def test_a_different_batch_size_is_predicted_again(make_world: Any) -> None:
    world = make_world()
    world.reconcile(world.submit("a"))
    world.reconcile(world.submit("b", batchSize=16))
    assert world.predict_fn.calls == 2


def test_a_transient_create_failure_retries_and_a_rejected_template_fails(make_world: Any) -> None:
    world = make_world()
    ref = world.submit()
    world.cluster.create_error = errors.UnavailableError("503 unavailable", status=503)
    with pytest.raises(journal.RetryLaterError):
        world.reconcile(ref)
    world.cluster.create_error = errors.InvalidObjectError("422 invalid image", status=422)
    with pytest.raises(journal.DLJobFailedError):
        world.reconcile(ref)
    ready = world.condition("resnet", dljob.ConditionType.WORKLOAD_READY)
    assert ready["reason"] == "InvalidTemplate"


def placed_world(make_world: Any, **config: Any) -> Any:
    world = make_world(**config)
    world.reconcile(world.submit())
    return world


def observe(world: Any, attempt: int, outcome: pods.PodOutcome, message: str = "") -> None:
    world.reconciler.observe_workload(NS, "resnet", attempt, pods.Verdict(outcome, message))


def test_a_running_pod_moves_the_dljob_to_running_once(make_world: Any) -> None:
    world = placed_world(make_world)
    observe(world, 0, pods.PodOutcome.RUNNING)
    assert world.cluster.status("resnet")["phase"] == "Running"
    patches = world.cluster.patches
    observe(world, 0, pods.PodOutcome.RUNNING)
    assert world.cluster.patches == patches


def test_a_succeeded_pod_finishes_the_dljob_and_records_the_attempt(make_world: Any) -> None:
    world = placed_world(make_world)
    observe(world, 0, pods.PodOutcome.RUNNING)
    observe(world, 0, pods.PodOutcome.SUCCEEDED)
    status = world.cluster.status("resnet")
    assert status["phase"] == "Succeeded"
    assert [a["outcome"] for a in status["attempts"]] == ["Succeeded"]


def test_a_failed_pod_fails_the_dljob_with_the_pod_message(make_world: Any) -> None:
    world = placed_world(make_world)
    observe(world, 0, pods.PodOutcome.FAILED, "container main exited with code 2")
    ready = world.condition("resnet", dljob.ConditionType.WORKLOAD_READY)
    assert ready["reason"] == "PodFailed"
    assert "exited with code 2" in ready["message"]


def test_an_oom_escalates_to_the_next_larger_slice_with_a_new_pod(make_world: Any) -> None:
    world = placed_world(make_world)
    observe(world, 0, pods.PodOutcome.OOM, "container main was OOMKilled (exit code 137)")
    status = world.cluster.status("resnet")
    assert status["phase"] == "Placed"
    assert status["placement"]["attempt"] == 1
    assert status["placement"]["resource"] == "nvidia.com/mig-3g.40gb"
    assert status["attempts"] == [
        {
            "attempt": 0,
            "workload": "resnet-0",
            "resource": "nvidia.com/mig-1g.10gb",
            "profile": "A100-80GB/1g.10gb",
            "outcome": "OOMKilled",
            "message": "container main was OOMKilled (exit code 137)",
            "observation": {"memoryBytesAtLeast": 9.5 * GIB, "censored": True, "source": "oom"},
        }
    ]
    assert sorted(world.cluster.workloads) == ["resnet-0", "resnet-1"]
    assert world.cluster.workloads["resnet-1"]["metadata"]["labels"][workload.LABEL_ATTEMPT] == "1"
    assert ("Warning", "OOMEscalated") in [p[:2] for p in world.events.posted]
    assert world.sample("kubeseer_operator_oom_escalations_total", outcome="escalated") == 1


def test_the_same_oom_seen_twice_escalates_once(make_world: Any) -> None:
    world = placed_world(make_world)
    observe(world, 0, pods.PodOutcome.OOM, "OOMKilled")
    observe(world, 0, pods.PodOutcome.OOM, "OOMKilled")
    assert world.cluster.status("resnet")["placement"]["attempt"] == 1
    assert len(world.cluster.workloads) == 2


def test_ooms_stop_after_the_attempt_limit(make_world: Any) -> None:
    world = placed_world(make_world, max_attempts=2)
    observe(world, 0, pods.PodOutcome.OOM, "OOMKilled")
    observe(world, 1, pods.PodOutcome.OOM, "OOMKilled")
    status = world.cluster.status("resnet")
    assert status["phase"] == "Failed"
    assert [a["outcome"] for a in status["attempts"]] == ["OOMKilled", "OOMKilled"]
    ready = world.condition("resnet", dljob.ConditionType.WORKLOAD_READY)
    assert ready["reason"] == "OOMRetriesExhausted"
    assert "2 of 2 attempts used" in ready["message"]
    assert world.sample("kubeseer_operator_oom_escalations_total", outcome="exhausted") == 1


def test_an_oom_on_the_largest_gpu_fails_the_dljob(make_world: Any) -> None:
    world = make_world()
    world.predict_fn.table[b"resnet-bytes"] = (60.0, 70.0)
    world.reconcile(world.submit())
    observe(world, 0, pods.PodOutcome.OOM, "OOMKilled")
    ready = world.condition("resnet", dljob.ConditionType.WORKLOAD_READY)
    assert ready["reason"] == "OOMRetriesExhausted"
    assert "no larger GPU" in ready["message"]


def test_events_for_a_deleted_dljob_or_an_old_attempt_are_ignored(make_world: Any) -> None:
    world = placed_world(make_world)
    observe(world, 0, pods.PodOutcome.OOM, "OOMKilled")
    patches = world.cluster.patches
    observe(world, 0, pods.PodOutcome.SUCCEEDED)
    world.reconciler.observe_workload(NS, "gone", 0, pods.Verdict(pods.PodOutcome.RUNNING))
    assert world.cluster.patches == patches


def test_an_escalation_whose_workload_is_refused_keeps_its_escalated_condition(
    make_world: Any,
) -> None:
    world = placed_world(make_world)
    world.cluster.create_error = errors.InvalidObjectError("422 invalid", status=422)
    observe(world, 0, pods.PodOutcome.OOM, "OOMKilled")
    status = world.cluster.status("resnet")
    assert status["phase"] == "Failed"
    placed = world.condition("resnet", dljob.ConditionType.PLACED)
    assert (placed["status"], placed["reason"]) == ("True", "OOMEscalated")
    ready = world.condition("resnet", dljob.ConditionType.WORKLOAD_READY)
    assert (ready["status"], ready["reason"]) == ("False", "InvalidTemplate")
    assert status["placement"]["attempt"] == 1
    assert [a["outcome"] for a in status["attempts"]] == ["OOMKilled"]


def test_the_fetching_phase_is_recorded_before_the_model_is_read(make_world: Any) -> None:
    """Issue 17: `kubectl get dlj` showed no phase while a model was being fetched."""
    world = make_world()
    seen: list[str | None] = []
    load = world.models.load

    def watching_load(*args: Any, **kwargs: Any) -> Any:
        seen.append(world.cluster.status("resnet").get("phase"))
        return load(*args, **kwargs)

    world.models.load = watching_load
    world.reconcile(world.submit())
    assert seen == ["Fetching"]
    assert world.condition("resnet", dljob.ConditionType.ACCEPTED)["status"] == "True"


def test_a_model_server_too_slow_fails_at_once_with_its_own_reason(make_world: Any) -> None:
    world = make_world()
    world.models.sources["resnet"] = fetch_errors.TooSlowError("sent 12 bytes in 11 s")
    with pytest.raises(journal.DLJobFailedError):
        world.reconcile(world.submit())
    status = world.cluster.status("resnet")
    assert (status["phase"], status["reason"]) == ("Failed", "ModelTooSlow")
    assert world.sample("kubeseer_operator_model_fetch_failures_total", reason="too_slow") == 1


def test_a_dljob_deleted_during_its_fetch_is_left_alone(make_world: Any) -> None:
    world = make_world()
    world.models.sources["resnet"] = fetch_errors.CancelledError("the fetch was cancelled")
    assert world.reconcile(world.submit()) is None
    assert world.cluster.status("resnet")["phase"] == "Fetching"
    assert world.cluster.workloads == {}
    assert world.sample("kubeseer_operator_model_fetch_failures_total", reason="invalid") == 0


def test_a_namespace_quota_is_its_own_reason_retried_until_it_clears(make_world: Any) -> None:
    """Issue 17: a ResourceQuota rejection was reported as InvalidTemplate and failed the DLJob."""
    world = make_world()
    ref = world.submit()
    world.cluster.create_error = errors.QuotaExceededError(
        "403 exceeded quota: gpus, requested: nvidia.com/mig-1g.10gb=1", status=403
    )
    for retry in range(5):  # beyond max_retries: a quota may take long to clear
        with pytest.raises(journal.RetryLaterError):
            world.reconcile(ref, retry=retry)
    status = world.cluster.status("resnet")
    assert (status["phase"], status["reason"]) == ("Placed", "QuotaExceeded")
    assert "exceeded quota" in status["message"]
    ready = world.condition("resnet", dljob.ConditionType.WORKLOAD_READY)
    assert (ready["status"], ready["reason"]) == ("False", "QuotaExceeded")
    world.cluster.create_error = None
    assert world.reconcile(ref, retry=5) is dljob.Phase.PLACED
    assert "resnet-0" in world.cluster.workloads
    world.reconciler.observe_workload(NS, "resnet", 0, pods.Verdict(pods.PodOutcome.RUNNING))
    status = world.cluster.status("resnet")
    assert status["phase"] == "Running" and "reason" not in status


def test_a_failure_sets_the_reason_column(make_world: Any) -> None:
    world = make_world()
    world.predict_fn.table[b"resnet-bytes"] = (150.0, 170.0)
    with pytest.raises(journal.DLJobFailedError):
        world.reconcile(world.submit())
    status = world.cluster.status("resnet")
    assert status["reason"] == "NoFit"
    assert status["message"] == world.condition("resnet", dljob.ConditionType.PLACED)["message"]


def test_coverage_the_predictor_cannot_give_says_what_to_set(make_world: Any) -> None:
    world = make_world()
    placement = {"policy": "auto", "coverage": 0.99, "maxSlowdown": 2.0}
    with pytest.raises(journal.DLJobFailedError):
        world.reconcile(world.submit(placement=placement))
    placed = world.condition("resnet", dljob.ConditionType.PLACED)
    assert placed["reason"] == "CoverageUnavailable"
    assert "set spec.placement.coverage to 0.95 or less" in placed["message"]
    assert "KUBESEER_PREDICTOR_CHECKPOINT" in placed["message"]


def test_a_templates_own_gpu_limit_is_replaced_and_reported(make_world: Any) -> None:
    world = make_world()
    template = {
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "example.org/infer:1",
                    "resources": {"limits": {"nvidia.com/gpu": 2}},
                }
            ]
        }
    }
    world.reconcile(world.submit(template=template))
    limits = world.cluster.pod_spec("resnet-0")["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/mig-1g.10gb": "1"}
    warnings = [m for kind, r, m in world.events.posted if r == "GPULimitReplaced"]
    assert warnings == [
        "container main limits nvidia.com/gpu=2 is replaced by 1 nvidia.com/mig-1g.10gb: "
        "kubeseer chooses the GPU"
    ]
    placed = world.condition("resnet", dljob.ConditionType.PLACED)
    assert "nvidia.com/gpu=2" in placed["message"]


def test_a_batch_past_a_kernel_launch_limit_is_placed_with_a_warning(make_world: Any) -> None:
    world = make_world()
    crossed = "batch 8 launches fused attention over 70,000 sequences, above the 65,535 ..."
    world.predict_fn.launch_limits[b"resnet-bytes"] = (crossed,)
    world.reconcile(world.submit())
    assert world.cluster.pod_spec("resnet-0")["containers"][0]["resources"]["limits"]
    warnings = [(kind, m) for kind, r, m in world.events.posted if r == "KernelLaunchLimit"]
    assert warnings == [(ports.EventType.WARNING.value, crossed)]
    stored = world.cluster.status("resnet")["prediction"]
    assert stored["launchLimits"] == [crossed]


def test_a_pod_deleted_on_the_last_attempt_fails_the_dljob_with_a_reason(make_world: Any) -> None:
    world = placed_world(make_world, max_attempts=1)
    observe(world, 0, pods.PodOutcome.RUNNING)
    observe(world, 0, pods.PodOutcome.DELETED, "Pod resnet-0 was deleted before it finished")
    status = world.cluster.status("resnet")
    assert (status["phase"], status["reason"]) == ("Failed", "WorkloadDeleted")
    assert [a["outcome"] for a in status["attempts"]] == ["Deleted"]


def test_a_running_dljob_whose_pod_vanished_while_no_operator_ran_is_placed_again(
    make_world: Any,
) -> None:
    world = placed_world(make_world)
    observe(world, 0, pods.PodOutcome.RUNNING)
    del world.cluster.workloads["resnet-0"]
    assert world.reconcile(world.cluster.add_ref("resnet")) is dljob.Phase.PLACED
    status = world.cluster.status("resnet")
    assert status["placement"]["attempt"] == 1
    assert "resnet-1" in world.cluster.workloads


def test_deleting_a_dljob_cancels_its_download_under_way(make_world: Any) -> None:
    """kopf delivers the deletion only after the running handler returns, so the reconcile
    looks the DLJob up while its model downloads and cancels the download once it is gone."""
    world = make_world()
    world.reconciler.recheck_s = 0.05
    started = threading.Event()

    def hanging_load(
        source: Any, namespace: str, cancellation: cancel.Cancellation | None = None
    ) -> Any:
        assert cancellation is not None
        started.set()
        if not cancellation.wait(10):
            raise AssertionError("the download was never cancelled")
        raise fetch_errors.CancelledError("cancelled")

    world.models.load = hanging_load
    ref = world.submit(model={"url": "https://models.example.org/slow.onnx"})
    threading.Timer(0.2, lambda: world.cluster.dljobs.pop("resnet")).start()
    start = time.monotonic()
    assert world.reconcile(ref) is None
    assert started.is_set() and time.monotonic() - start < 2


def test_a_reconcile_cancelled_mid_download_takes_its_download_down_with_it(
    make_world: Any,
) -> None:
    """kopf cancels the running handlers when the operator stops, then waits up to 5 s for the
    tasks they leave behind: the download's own task was one, so a SIGTERM during a slow
    download held the operator's exit for those 5 s."""
    world = make_world()
    started = threading.Event()

    def hanging_load(
        source: Any, namespace: str, cancellation: cancel.Cancellation | None = None
    ) -> Any:
        assert cancellation is not None
        started.set()
        if not cancellation.wait(10):
            raise AssertionError("the download was never cancelled")
        raise fetch_errors.CancelledError("cancelled")

    world.models.load = hanging_load
    ref = world.submit(model={"url": "https://models.example.org/slow.onnx"})
    body = world.cluster.dljobs[ref.name]

    async def stop_mid_download() -> set[asyncio.Task[Any]]:
        handler = asyncio.ensure_future(
            world.reconciler.reconcile(ref, body["spec"], copy.deepcopy(body["status"]))
        )
        while not started.is_set():
            await asyncio.sleep(0.01)
        handler.cancel()
        with pytest.raises(asyncio.CancelledError):
            await handler
        left = asyncio.all_tasks() - {asyncio.current_task()}
        if not left:
            return set()
        return (await asyncio.wait(left, timeout=1.0))[1]

    assert asyncio.run(stop_mid_download()) == set()

"""The DLJob state machine against an in-memory API server, real inventory and real placement."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from operator_testlib import GIB, cluster_nodes, dljob_spec, pod, prediction
from prometheus_client import CollectorRegistry

from kubeseer import metrics
from kubeseer.operator import dljob, pods, predict, reconcile, workload
from kubeseer.operator.config import OperatorConfig
from kubeseer.operator.inventory import InventoryCache
from kubeseer.prediction import Mode, Precision, Prediction
from kubeseer.predictor import errors as graph_errors

NS = "ml"


def merge_patch(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386, as the API server applies a merge patch."""
    result = dict(target)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = merge_patch(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


class FakeCluster:
    """An API server holding DLJobs and created workloads in memory."""

    def __init__(self) -> None:
        self.dljobs: dict[str, dict[str, Any]] = {}
        self.workloads: dict[str, dict[str, Any]] = {}
        self.create_error: reconcile.ClusterError | None = None
        self.patches = 0

    def add(self, name: str, spec: dict[str, Any]) -> reconcile.DLJobRef:
        self.dljobs[name] = {
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
            "spec": spec,
            "status": {},
        }
        return reconcile.DLJobRef(NS, name, f"uid-{name}")

    def status(self, name: str) -> dict[str, Any]:
        return self.dljobs[name]["status"]

    def patch_status(self, ref: reconcile.DLJobRef, patch: Mapping[str, Any]) -> Mapping[str, Any]:
        self.patches += 1
        obj = self.dljobs[ref.name]
        obj["status"] = merge_patch(obj["status"], patch)
        return copy.deepcopy(obj["status"])

    def get_dljob(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return copy.deepcopy(self.dljobs.get(name))

    def create_workload(self, manifest: Mapping[str, Any]) -> bool:
        if self.create_error is not None:
            raise self.create_error
        name = manifest["metadata"]["name"]
        if name in self.workloads:
            return False
        self.workloads[name] = copy.deepcopy(dict(manifest))
        return True


class FakeModels:
    """Model sources by ConfigMap name: bytes, or the error loading them raises."""

    def __init__(self) -> None:
        self.sources: dict[str, bytes | reconcile.ModelError] = {"resnet": b"resnet-bytes"}
        self.loads = 0

    def load(self, source: dljob.ModelSource, namespace: str) -> reconcile.LoadedModel:
        self.loads += 1
        assert source.config_map is not None
        found = self.sources[source.config_map.name]
        if isinstance(found, reconcile.ModelError):
            raise found
        return reconcile.LoadedModel(found, hashlib.sha256(found).hexdigest())


class Events:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def emit(
        self, ref: reconcile.DLJobRef, kind: reconcile.EventType, reason: dljob.Reason, message: str
    ) -> None:
        self.posted.append((kind.value, reason.value, message))

    def reasons(self) -> list[str]:
        return [r for _, r, _ in self.posted]


class Predictor:
    """Predicts by model bytes: memory table in GiB, or an error to raise."""

    def __init__(self) -> None:
        self.table: dict[bytes, tuple[float, float] | Exception] = {b"resnet-bytes": (3.0, 4.0)}
        self.calls = 0

    def __call__(
        self, data: bytes, batch: int, mode: Mode, precision: Precision, inputs: Mapping[str, int]
    ) -> Prediction:
        self.calls += 1
        entry = self.table[data]
        if isinstance(entry, Exception):
            raise entry
        return replace(prediction(*entry), mode=mode, batch_size=batch, precision=precision)


class World:
    """A reconciler over the fakes, with the inventory seeded from `cluster_nodes()`."""

    def __init__(self, **config: Any) -> None:
        self.cluster = FakeCluster()
        self.models = FakeModels()
        self.events = Events()
        self.predict_fn = Predictor()
        self.registry = CollectorRegistry()
        self.metrics = metrics.OperatorMetrics(self.registry)
        self.inventory = InventoryCache()
        self.inventory.replace_all(cluster_nodes(), [])
        self.config = OperatorConfig(**{"max_retries": 2, "retry_delay_s": 1.5, **config})
        self.reconciler = reconcile.Reconciler(
            cluster=self.cluster,
            models=self.models,
            predictor=predict.CachedPredictor(self.predict_fn, self.metrics, size=8),
            inventory=self.inventory,
            events=self.events,
            operator_metrics=self.metrics,
            config=self.config,
            clock=lambda: datetime(2026, 11, 22, 4, tzinfo=UTC),
        )

    def submit(self, name: str = "resnet", **spec: Any) -> reconcile.DLJobRef:
        return self.cluster.add(name, dljob_spec(**spec))

    def reconcile(self, ref: reconcile.DLJobRef, retry: int = 0) -> dljob.Phase:
        body = self.cluster.dljobs[ref.name]
        return self.reconciler.reconcile(
            ref, body["spec"], copy.deepcopy(body["status"]), retry=retry
        )

    def condition(self, name: str, kind: dljob.ConditionType) -> dict[str, Any]:
        found = [c for c in self.cluster.status(name)["conditions"] if c["type"] == kind.value]
        assert len(found) == 1
        return found[0]

    def sample(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)


def test_a_good_dljob_is_predicted_placed_on_the_smallest_fitting_slice_and_gets_a_pod() -> None:
    world = World()
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
    pod_manifest = world.cluster.workloads["resnet-0"]
    assert pod_manifest["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/mig-1g.10gb": "1"
    }
    assert world.events.reasons() == ["Placed", "WorkloadCreated"]
    assert "predicted peak of 3072 MiB (upper bound 4096 MiB)" in world.events.posted[0][2]
    assert world.cluster.patches == 2  # Predicting, then prediction + placement together
    assert (
        world.sample(
            "kubeseer_operator_placements_total", profile="A100-80GB/1g.10gb", outcome="placed"
        )
        == 1
    )


def test_reconciling_again_repeats_nothing() -> None:
    world = World()
    ref = world.submit()
    world.reconcile(ref)
    patches, events = world.cluster.patches, list(world.events.posted)
    assert world.reconcile(ref) is dljob.Phase.PLACED
    assert world.cluster.patches == patches
    assert world.events.posted == events
    assert world.models.loads == 1
    assert list(world.cluster.workloads) == ["resnet-0"]


def test_a_restart_after_placement_creates_the_recorded_workload_without_predicting() -> None:
    first = World()
    ref = first.submit()
    first.reconcile(ref)
    restarted = World()
    restarted.cluster.dljobs = first.cluster.dljobs
    restarted.models.sources = {}
    assert restarted.reconcile(ref) is dljob.Phase.PLACED
    assert restarted.predict_fn.calls == 0
    assert restarted.cluster.workloads == first.cluster.workloads


def test_running_and_finished_dljobs_are_left_alone() -> None:
    world = World()
    ref = world.submit()
    world.cluster.dljobs["resnet"]["status"] = {"phase": "Running"}
    assert world.reconcile(ref) is dljob.Phase.RUNNING
    assert world.cluster.patches == 0


def test_an_invalid_spec_fails_with_a_condition_naming_the_field() -> None:
    world = World()
    ref = world.submit(batchSize=0)
    with pytest.raises(reconcile.DLJobFailedError, match="InvalidSpec"):
        world.reconcile(ref)
    assert world.cluster.status("resnet")["phase"] == "Failed"
    accepted = world.condition("resnet", dljob.ConditionType.ACCEPTED)
    assert (accepted["status"], accepted["reason"]) == ("False", "InvalidSpec")
    assert "spec.batchSize" in accepted["message"]
    assert world.events.posted[-1][:2] == ("Warning", "InvalidSpec")


def test_a_corrupt_model_fails_the_dljob_and_is_not_retried() -> None:
    world = World()
    world.models.sources["resnet"] = b"garbage"
    world.predict_fn.table[b"garbage"] = graph_errors.NotOnnxError("not an ONNX ModelProto")
    with pytest.raises(reconcile.DLJobFailedError):
        world.reconcile(world.submit())
    predicted = world.condition("resnet", dljob.ConditionType.PREDICTED)
    assert (predicted["status"], predicted["reason"]) == ("False", "CorruptModel")
    assert "not an ONNX ModelProto" in predicted["message"]
    assert world.condition("resnet", dljob.ConditionType.MODEL_READY)["status"] == "True"
    assert world.cluster.workloads == {}
    assert world.sample("kubeseer_operator_predictions_total", mode="infer", outcome="failed") == 1


def unreachable() -> reconcile.ModelError:
    return reconcile.ModelError(
        dljob.Reason.MODEL_UNREACHABLE,
        metrics.FetchFailure.UNREACHABLE,
        "connection refused",
        transient=True,
    )


def test_an_unreachable_model_is_retried_then_fails() -> None:
    world = World()
    world.models.sources["resnet"] = unreachable()
    ref = world.submit()
    for retry in range(2):
        with pytest.raises(reconcile.RetryLaterError) as raised:
            world.reconcile(ref, retry=retry)
        assert raised.value.delay == 1.5
        ready = world.condition("resnet", dljob.ConditionType.MODEL_READY)
        assert ready["reason"] == "ModelUnreachable"
        assert f"retry {retry + 1} of 2" in ready["message"]
        assert world.cluster.status("resnet")["phase"] == "Pending"
    with pytest.raises(reconcile.DLJobFailedError):
        world.reconcile(ref, retry=2)
    assert world.cluster.status("resnet")["phase"] == "Failed"
    assert world.sample("kubeseer_operator_model_fetch_failures_total", reason="unreachable") == 3


def test_a_model_too_big_for_any_gpu_fails_with_no_fit_naming_need_and_largest() -> None:
    world = World()
    world.predict_fn.table[b"resnet-bytes"] = (150.0, 170.0)
    with pytest.raises(reconcile.DLJobFailedError):
        world.reconcile(world.submit())
    placed = world.condition("resnet", dljob.ConditionType.PLACED)
    assert placed["reason"] == "NoFit"
    assert "170.00 GiB" in placed["message"]
    assert "largest free" in placed["message"]
    assert world.sample("kubeseer_operator_placements_total", profile="none", outcome="no_fit") == 1


def test_a_fit_that_is_only_busy_queues_the_pod_instead_of_failing() -> None:
    world = World()
    world.predict_fn.table[b"resnet-bytes"] = (60.0, 70.0)  # only a whole H100 holds it
    for i in range(2):
        world.inventory.observe_pod(
            "ADDED", pod(f"other-{i}", "nvidia.com/gpu", node_name="h100", namespace="x")
        )
    assert world.reconcile(world.submit()) is dljob.Phase.PLACED
    placement = world.cluster.status("resnet")["placement"]
    assert placement["resource"] == "nvidia.com/gpu"
    assert "the pod waits for one" in placement["reason"]


def test_dljobs_placed_one_after_another_never_share_the_last_slice() -> None:
    world = World()
    names = [f"job{i}" for i in range(3)]
    for name in names:
        world.reconcile(world.submit(name))
    resources = [world.cluster.status(n)["placement"]["resource"] for n in names]
    assert resources == [
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-3g.40gb",
    ]


def test_the_same_model_is_predicted_once_and_placed_in_one_patch() -> None:
    world = World()
    world.reconcile(world.submit("a"))
    patches = world.cluster.patches
    world.reconcile(world.submit("b"))
    assert world.predict_fn.calls == 1
    assert world.cluster.patches == patches + 1
    assert world.cluster.status("b")["phase"] == "Placed"
    assert world.cluster.status("b")["model"] == "resnet/model.onnx"
    assert world.sample("kubeseer_operator_predictions_total", mode="infer", outcome="cached") == 1


def test_a_named_digest_with_a_cached_prediction_reads_no_model() -> None:
    world = World()
    world.reconcile(world.submit("a"))
    loads = world.models.loads
    digest = hashlib.sha256(b"resnet-bytes").hexdigest()
    model = {"configMapRef": {"name": "resnet", "key": "model.onnx"}, "sha256": digest}
    world.reconcile(world.submit("b", model=model))
    assert world.models.loads == loads
    assert world.cluster.status("b")["phase"] == "Placed"
    ready = world.condition("b", dljob.ConditionType.MODEL_READY)
    assert "was not read again" in ready["message"]


def test_a_different_batch_size_is_predicted_again() -> None:
    world = World()
    world.reconcile(world.submit("a"))
    world.reconcile(world.submit("b", batchSize=16))
    assert world.predict_fn.calls == 2


def test_a_transient_create_failure_retries_and_a_rejected_template_fails() -> None:
    world = World()
    ref = world.submit()
    world.cluster.create_error = reconcile.ClusterError("503 unavailable", transient=True)
    with pytest.raises(reconcile.RetryLaterError):
        world.reconcile(ref)
    world.cluster.create_error = reconcile.ClusterError("422 invalid image", transient=False)
    with pytest.raises(reconcile.DLJobFailedError):
        world.reconcile(ref)
    ready = world.condition("resnet", dljob.ConditionType.WORKLOAD_READY)
    assert ready["reason"] == "InvalidTemplate"


def placed_world(**config: Any) -> World:
    world = World(**config)
    world.reconcile(world.submit())
    return world


def observe(world: World, attempt: int, outcome: pods.PodOutcome, message: str = "") -> None:
    world.reconciler.observe_workload(NS, "resnet", attempt, pods.Verdict(outcome, message))


def test_a_running_pod_moves_the_dljob_to_running_once() -> None:
    world = placed_world()
    observe(world, 0, pods.PodOutcome.RUNNING)
    assert world.cluster.status("resnet")["phase"] == "Running"
    patches = world.cluster.patches
    observe(world, 0, pods.PodOutcome.RUNNING)
    assert world.cluster.patches == patches


def test_a_succeeded_pod_finishes_the_dljob_and_records_the_attempt() -> None:
    world = placed_world()
    observe(world, 0, pods.PodOutcome.RUNNING)
    observe(world, 0, pods.PodOutcome.SUCCEEDED)
    status = world.cluster.status("resnet")
    assert status["phase"] == "Succeeded"
    assert [a["outcome"] for a in status["attempts"]] == ["Succeeded"]


def test_a_failed_pod_fails_the_dljob_with_the_pod_message() -> None:
    world = placed_world()
    observe(world, 0, pods.PodOutcome.FAILED, "container main exited with code 2")
    ready = world.condition("resnet", dljob.ConditionType.WORKLOAD_READY)
    assert ready["reason"] == "PodFailed"
    assert "exited with code 2" in ready["message"]


def test_an_oom_escalates_to_the_next_larger_slice_with_a_new_pod() -> None:
    world = placed_world()
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


def test_the_same_oom_seen_twice_escalates_once() -> None:
    world = placed_world()
    observe(world, 0, pods.PodOutcome.OOM, "OOMKilled")
    observe(world, 0, pods.PodOutcome.OOM, "OOMKilled")
    assert world.cluster.status("resnet")["placement"]["attempt"] == 1
    assert len(world.cluster.workloads) == 2


def test_ooms_stop_after_the_attempt_limit() -> None:
    world = placed_world(max_attempts=2)
    observe(world, 0, pods.PodOutcome.OOM, "OOMKilled")
    observe(world, 1, pods.PodOutcome.OOM, "OOMKilled")
    status = world.cluster.status("resnet")
    assert status["phase"] == "Failed"
    assert [a["outcome"] for a in status["attempts"]] == ["OOMKilled", "OOMKilled"]
    ready = world.condition("resnet", dljob.ConditionType.WORKLOAD_READY)
    assert ready["reason"] == "OOMRetriesExhausted"
    assert "2 of 2 attempts used" in ready["message"]
    assert world.sample("kubeseer_operator_oom_escalations_total", outcome="exhausted") == 1


def test_an_oom_on_the_largest_gpu_fails_the_dljob() -> None:
    world = World()
    world.predict_fn.table[b"resnet-bytes"] = (60.0, 70.0)
    world.reconcile(world.submit())
    observe(world, 0, pods.PodOutcome.OOM, "OOMKilled")
    ready = world.condition("resnet", dljob.ConditionType.WORKLOAD_READY)
    assert ready["reason"] == "OOMRetriesExhausted"
    assert "no larger GPU" in ready["message"]


def test_events_for_a_deleted_dljob_or_an_old_attempt_are_ignored() -> None:
    world = placed_world()
    observe(world, 0, pods.PodOutcome.OOM, "OOMKilled")
    patches = world.cluster.patches
    observe(world, 0, pods.PodOutcome.SUCCEEDED)
    world.reconciler.observe_workload(NS, "gone", 0, pods.Verdict(pods.PodOutcome.RUNNING))
    assert world.cluster.patches == patches

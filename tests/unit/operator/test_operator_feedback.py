"""The learning loop inside the operator: recalibrated bounds served, finished attempts recorded.

The reconciler runs over the in-memory API server of conftest.py (`make_world`), with the real
`OperatorFeedback` over a real observation store in a temporary directory.
"""

from __future__ import annotations

import copy
import hashlib

import pytest
from prometheus_client import CollectorRegistry

from kubeseer import metrics
from kubeseer.observations import feedback, operator_hook, recalibration, record, store
from kubeseer.operator import pods

GIB = 1 << 30
NS = "ml"  # conftest.py's namespace


def recorded_jobs(n: int, ratio: float, family: str = "resnet") -> list[record.Observation]:
    """n earlier jobs of `family` whose peaks were `ratio` times the point prediction."""
    made = []
    for i in range(n):
        uid = f"earlier-{i}"
        made.append(
            record.Observation(
                observation_id=record.observation_id(uid, 0),
                namespace=NS,
                dljob=uid,
                dljob_uid=uid,
                attempt=0,
                family=family,
                model_digest="cd" * 32,
                model_source="earlier",
                perfgraph_ref=None,
                inputs_json="{}",
                batch_size=8,
                mode="infer",
                precision="fp32",
                optimizer="none",
                gpu_product="A100-80GB",
                gpu_model_name=None,
                mig_profile=None,
                usable_memory_bytes=None,
                predictor_version="test-1",
                label_device="A100-80GB",
                coverage=0.95,
                predicted_memory_bytes=GIB,
                predicted_memory_upper_bytes=GIB,
                predicted_sm_util_percent=None,
                predicted_step_time_s=None,
                observed_peak_memory_bytes=round(ratio * GIB),
                observed_mean_memory_bytes=None,
                observed_sm_activity_percent=None,
                observed_sm_source=None,
                observed_samples=10,
                observed_source="nvml",
                window_start=None,
                window_end=None,
                outcome=record.Outcome.SUCCEEDED,
                memory_at_least_bytes=None,
                finished_at="2026-11-24T00:00:00Z",
                recorded_at="2026-11-24T00:00:00Z",
            )
        )
    return made


@pytest.fixture
def looped(make_world, tmp_path):
    """A world whose reconciler has the feedback loop, its store and registry."""
    world = make_world()
    registry = CollectorRegistry()
    records = store.open_store(str(tmp_path / "observations"))
    recorder = feedback.FeedbackRecorder(
        records,
        recalibration.Recalibrator(min_samples=20),
        metrics.FeedbackMetrics(registry, families=("resnet",)),
    )

    def labels(namespace, name):
        body = world.cluster.get_dljob(namespace, name)
        return None if body is None else body["metadata"].get("labels", {})

    hook = operator_hook.OperatorFeedback(recorder, labels)
    world.reconciler.feedback = hook
    return world, hook, records, registry


def label(world, name, family):
    world.cluster.dljobs[name]["metadata"]["labels"] = {feedback.FAMILY_LABEL: family}


def test_a_fresh_prediction_is_stored_and_placed_with_the_recalibrated_bound(looped):
    world, hook, _, registry = looped
    hook.recorder.recalibrator.observe_all(recorded_jobs(40, 1.6))
    ref = world.submit("resnet")
    label(world, "resnet", "resnet")
    world.reconcile(ref)
    stored = world.cluster.status("resnet")["prediction"]
    assert stored["memoryPointBytes"] == 3 * GIB
    assert stored["memoryUpperBytes"] == pytest.approx(3 * GIB * 1.6, rel=1e-6)  # not 4 GiB
    assert any(
        "recalibrated on the cluster's last 40 jobs of */resnet" in w for w in stored["warnings"]
    )
    placed = world.cluster.status("resnet")["placement"]
    assert placed["usableMemoryBytes"] >= 3 * GIB * 1.6
    assert registry.get_sample_value(
        "kubeseer_feedback_memory_margin_ratio", {"group": "*/resnet"}
    ) == pytest.approx(1.6)


def test_a_family_without_enough_jobs_keeps_the_checkpoint_bound(looped):
    world, hook, _, _ = looped
    hook.recorder.recalibrator.observe_all(recorded_jobs(40, 1.6, family="bert"))
    ref = world.submit("resnet")
    label(world, "resnet", "resnet")
    world.reconcile(ref)
    # 40 bert jobs are everything the cluster knows: the global group answers for resnet.
    assert world.cluster.status("resnet")["prediction"]["memoryUpperBytes"] == pytest.approx(
        3 * GIB * 1.6, rel=1e-6
    )
    fresh = world.submit("other")
    hook.recorder.recalibrator = recalibration.Recalibrator(min_samples=20)
    world.reconcile(fresh)
    assert world.cluster.status("other")["prediction"]["memoryUpperBytes"] == 4 * GIB


def profiler_entry(peak: int, final: bool) -> dict:
    return {
        "attempt": 0,
        "node": "gpu-a100-0",
        "source": "nvml",
        "final": final,
        "updatedAt": "2026-11-22T04:10:00Z",
        "peakMemoryBytes": peak,
        "meanMemoryBytes": peak,
        "smActivitySource": "unavailable",
        "samples": 40,
        "window": {
            "start": "2026-11-22T04:01:00Z",
            "end": "2026-11-22T04:10:00Z",
            "warmupSeconds": 30.0,
            "warmedUp": True,
        },
        "gpus": [{"uuid": "MIG-x", "modelName": "NVIDIA A100-SXM4-80GB", "migProfile": "1g.10gb"}],
    }


def test_a_finished_attempt_is_recorded_then_completed_by_the_profiler_and_counted_once(looped):
    world, hook, records, registry = looped
    ref = world.submit("resnet")
    label(world, "resnet", "resnet")
    world.reconcile(ref)
    world.reconciler.observe_workload(NS, "resnet", 0, pods.Verdict(pods.PodOutcome.RUNNING))
    world.reconciler.observe_workload(NS, "resnet", 0, pods.Verdict(pods.PodOutcome.SUCCEEDED))
    body = world.cluster.get_dljob(NS, "resnet")
    assert hook.dljob_changed(body) == 1
    (first,) = records.read().observations
    assert first.outcome is record.Outcome.SUCCEEDED and first.observed_peak_memory_bytes is None
    assert (first.family, first.predictor_version) == ("resnet", "test-1")
    assert hook.dljob_changed(body) == 0  # nothing changed: nothing written
    assert (
        registry.get_sample_value("kubeseer_feedback_observations_total", {"outcome": "succeeded"})
        == 0
    )

    # The profiler's last report arrives after the operator recorded the attempt.
    body["status"]["observed"] = {"pods": {"resnet-0": profiler_entry(int(3.3 * GIB), True)}}
    assert hook.dljob_changed(copy.deepcopy(body)) == 1
    (complete,) = records.read().observations
    assert complete.observed_peak_memory_bytes == int(3.3 * GIB)
    assert complete.finished_at == "2026-11-22T04:10:00Z"
    assert complete.gpu_product == world.cluster.status("resnet")["placement"]["gpuProduct"]
    assert hook.dljob_changed(copy.deepcopy(body)) == 0
    assert (
        registry.get_sample_value("kubeseer_feedback_observations_total", {"outcome": "succeeded"})
        == 1
    )
    error = registry.get_sample_value(
        "kubeseer_feedback_prediction_absolute_error_ratio_sum",
        {
            "quantity": "memory",
            "family": "resnet",
            "gpu_product": complete.gpu_product,
            "profile": f"{complete.gpu_product}/{complete.mig_profile or 'whole'}",
        },
    )
    assert error == pytest.approx(abs(3 - 3.3) / 3.3)
    # The record outlives the DLJob: the store is not the API server.
    del world.cluster.dljobs["resnet"]
    assert [o.dljob for o in records.read().observations] == ["resnet"]


def test_an_oom_attempt_is_a_censored_observation(looped):
    world, hook, records, registry = looped
    ref = world.submit("resnet")
    world.reconcile(ref)
    limit = world.cluster.status("resnet")["placement"]["usableMemoryBytes"]
    verdict = pods.Verdict(pods.PodOutcome.OOM, "CUDA out of memory")
    world.reconciler.observe_workload(NS, "resnet", 0, verdict)
    assert hook.dljob_changed(world.cluster.get_dljob(NS, "resnet")) == 1
    (oom,) = records.read().observations
    assert oom.censored and oom.memory_at_least_bytes == limit
    assert oom.family == feedback.UNKNOWN_FAMILY
    assert (
        registry.get_sample_value("kubeseer_feedback_observations_total", {"outcome": "oom"}) == 1
    )
    # One job is not a group; its censored score still counts towards one.
    group = recalibration.Group(None, None)
    assert hook.recorder.recalibrator.samples("test-1", group) == 1


def test_the_model_graph_is_kept_for_retraining(looped, tmp_path):
    from onnx import TensorProto, helper

    world, hook, records, _ = looped
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
    )
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    world.models.sources["resnet"] = data
    world.predict_fn.table[data] = (3.0, 4.0)
    ref = world.submit("resnet")
    world.reconcile(ref)
    digest = hashlib.sha256(data).hexdigest()
    name = store.Store.graph_name(digest, "{}", 8)
    assert records.get_graph(name) is not None
    # The fake predictor names a fixed digest; the real one names the model's.
    world.cluster.status("resnet")["prediction"]["modelDigest"] = digest
    world.reconciler.observe_workload(NS, "resnet", 0, pods.Verdict(pods.PodOutcome.SUCCEEDED))
    hook.dljob_changed(world.cluster.get_dljob(NS, "resnet"))
    (o,) = records.read().observations
    assert o.perfgraph_ref == name
    assert world.models.checked_out() == []  # the model file was released after use


def test_the_loop_is_configured_from_the_environment():
    from kubeseer.operator.config import ConfigError, OperatorConfig

    config = OperatorConfig.from_env(
        {
            "KUBESEER_OBSERVATION_STORE": "s3://kubeseer/cluster-a",
            "KUBESEER_RECALIBRATION_MIN_SAMPLES": "30",
            "KUBESEER_RECALIBRATION_WINDOW": "300",
        }
    )
    assert config.observation_store == "s3://kubeseer/cluster-a"
    assert (config.recalibration_min_samples, config.recalibration_window) == (30, 300)
    with pytest.raises(ConfigError, match="KUBESEER_RECALIBRATION_WINDOW"):
        OperatorConfig.from_env({"KUBESEER_RECALIBRATION_WINDOW": "5"})


def test_the_store_is_read_back_into_the_margins_at_start(make_world, tmp_path):
    from kubeseer.operator import main
    from kubeseer.operator.config import ConfigError, OperatorConfig
    from kubeseer.operator.fetch import policy

    world = make_world()
    records = store.open_store(str(tmp_path / "obs"))
    for o in recorded_jobs(25, 1.3):
        records.put(o)
    rules = policy.FetchPolicy(cache_dir=tmp_path / "models")
    config = OperatorConfig(observation_store=str(tmp_path / "obs"))
    hook = main.build_feedback(
        config, rules, metrics.FeedbackMetrics(CollectorRegistry()), world.cluster
    )
    margin = hook.recorder.recalibrator.margin(
        "test-1", gpu_product=None, family="resnet", coverage=0.95
    )
    assert margin.factor == pytest.approx(1.3, rel=1e-6)
    # A store that cannot be read does not stop the operator; a malformed one does.
    (tmp_path / "file").write_text("not a directory")
    broken = OperatorConfig(observation_store=str(tmp_path / "file" / "obs"))
    assert (
        main.build_feedback(
            broken, rules, metrics.FeedbackMetrics(CollectorRegistry()), world.cluster
        ).recorder.recalibrator.margin("test-1", gpu_product=None, family=None, coverage=0.5)
        is None
    )
    with pytest.raises(ConfigError, match="KUBESEER_OBSERVATION_STORE"):
        main.build_feedback(
            OperatorConfig(observation_store="ftp://x/y"),
            rules,
            metrics.FeedbackMetrics(CollectorRegistry()),
            world.cluster,
        )

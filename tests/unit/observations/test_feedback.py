"""An attempt's end and the profiler's entries -> store, error metrics and margins, once."""

from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry

from kubeseer import metrics
from kubeseer.observations import feedback, recalibration, record, store
from kubeseer.prediction import Estimate, Mode, Precision, Prediction

GIB = 1 << 30
NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def prediction(point=4 * GIB, upper=4.2 * GIB, version="ckpt-1"):
    return Prediction(
        mode=Mode.TRAIN,
        batch_size=32,
        precision=Precision.FP32,
        memory_bytes=Estimate(point, upper),
        sm_util_percent=Estimate(60.0, 80.0),
        step_time_s=Estimate(0.1, 0.2),
        coverage=0.95,
        model_digest="ab" * 32,
        predictor_version=version,
        label_device="AMD EPYC",
    )


def end(uid="uid-1", attempt=0, outcome=record.Outcome.SUCCEEDED, mig="1g.10gb", **kw):
    values = {
        "namespace": "team-a",
        "dljob": "resnet",
        "dljob_uid": uid,
        "attempt": attempt,
        "family": "resnet",
        "model_source": "https://models.example/resnet.onnx",
        "inputs": {},
        "optimizer": "adam",
        "gpu_product": "A100-80GB",
        "mig_profile": mig,
        "usable_memory_bytes": 9856 << 20,
        "prediction": prediction(),
        "outcome": outcome,
        "finished_at": NOW,
    }
    values.update(kw)
    return feedback.AttemptEnd(**values)


def entry(peak, *, final=True, sm=50.0, mean=None):
    """What the profiler writes under status.observed.pods.<pod> (report.build_pod_observed)."""
    return {
        "attempt": 0,
        "node": "node-a",
        "source": "nvml",
        "final": final,
        "updatedAt": "2026-11-25T12:00:00Z",
        "peakMemoryBytes": peak,
        "meanMemoryBytes": mean if mean is not None else peak,
        "smActivityPercent": sm,
        "smActivityPeakPercent": sm,
        "smActivitySource": "gpm-sm-activity",
        "samples": 30,
        "window": {
            "start": "2026-11-25T11:59:00Z",
            "end": "2026-11-25T12:00:00Z",
            "warmupSeconds": 30.0,
            "warmedUp": True,
        },
        "gpus": [{"uuid": "MIG-x", "modelName": "NVIDIA A100-SXM4-80GB", "migProfile": "1g.10gb"}],
    }


@pytest.fixture
def registry():
    return CollectorRegistry()


@pytest.fixture
def recorder(tmp_path, registry):
    return feedback.FeedbackRecorder(
        store.open_store(str(tmp_path)),
        recalibration.Recalibrator(min_samples=1),
        metrics.FeedbackMetrics(registry, families=("resnet",)),
        clock=lambda: NOW,
    )


def labels(**kw):
    return {"family": "resnet", "gpu_product": "A100-80GB", "profile": "A100-80GB/1g.10gb", **kw}


def test_replicas_aggregate_as_the_slice_needs_them(recorder):
    o = feedback.build_observation(end(), [entry(5 * GIB, sm=40.0), entry(6 * GIB, sm=60.0)], NOW)
    assert o.observed_peak_memory_bytes == 6 * GIB
    assert o.observed_sm_activity_percent == 50.0
    assert o.observed_samples == 60
    assert (o.gpu_model_name, o.window_start) == ("NVIDIA A100-SXM4-80GB", "2026-11-25T11:59:00Z")
    assert o.predictor_version == "ckpt-1" and o.mig_profile == "1g.10gb"


def test_an_attempt_is_written_at_once_and_counted_when_the_final_report_arrives(
    recorder, registry
):
    recorder.record_attempt(end(), [entry(5 * GIB, final=False)])
    assert len(recorder.store.read().observations) == 1
    assert (
        registry.get_sample_value("kubeseer_feedback_observations_total", {"outcome": "succeeded"})
        == 0
    )
    recorder.record_attempt(end(), [entry(5 * GIB)])
    recorder.record_attempt(end(), [entry(5 * GIB)])  # a repeated event
    (stored,) = recorder.store.read().observations
    assert stored.observed_peak_memory_bytes == 5 * GIB
    assert (
        registry.get_sample_value("kubeseer_feedback_observations_total", {"outcome": "succeeded"})
        == 1
    )
    error = registry.get_sample_value(
        "kubeseer_feedback_prediction_absolute_error_ratio_sum", labels(quantity="memory")
    )
    assert error == pytest.approx(0.2)  # |4 - 5| / 5
    exceeded = registry.get_sample_value(
        "kubeseer_feedback_bound_exceeded_total", labels(cause="observed")
    )
    assert exceeded == 1  # 5 GiB > the 4.2 GiB bound
    # SM utilisation was predicted for a whole GPU: a MIG slice's activity is not compared.
    assert (
        registry.get_sample_value(
            "kubeseer_feedback_prediction_absolute_error_ratio_count", labels(quantity="sm_util")
        )
        is None
    )


def test_an_oom_is_a_censored_observation_counted_without_any_report(recorder, registry):
    o = recorder.record_attempt(end(outcome=record.Outcome.OOM), [])
    assert o.censored and o.memory_at_least_bytes == 9856 << 20
    assert (
        registry.get_sample_value("kubeseer_feedback_bound_exceeded_total", labels(cause="oom"))
        == 1
    )
    assert (
        registry.get_sample_value("kubeseer_feedback_observations_total", {"outcome": "oom"}) == 1
    )


def test_sm_utilisation_on_a_whole_gpu_is_compared(recorder, registry):
    recorder.record_attempt(end(mig=None), [entry(4 * GIB, sm=75.0)])
    whole = {"family": "resnet", "gpu_product": "A100-80GB", "profile": "A100-80GB/whole"}
    assert registry.get_sample_value(
        "kubeseer_feedback_prediction_absolute_error_ratio_sum", {**whole, "quantity": "sm_util"}
    ) == pytest.approx(0.2)  # |60 - 75| / 75


def test_margins_learn_from_recorded_attempts_and_survive_a_restart(tmp_path, registry, recorder):
    recorder.record_attempt(end(uid="uid-1"), [entry(5 * GIB)])
    recorder.record_attempt(end(uid="uid-2"), [entry(6 * GIB)])
    served = recorder.apply(prediction(), gpu_product="A100-80GB", family="resnet", coverage=0.5)
    # Scores log(5/4) and log(6/4); at 50 % the ceil((2 + 1) * 0.5) = 2nd smallest: 6/4.
    assert served.memory_bytes.upper == pytest.approx(6 * GIB)
    assert "recalibrated on the cluster's last 2 jobs of A100-80GB/resnet" in served.warnings[-1]
    # A new operator reads the store back: same margins, nothing counted twice.
    fresh = feedback.FeedbackRecorder(
        store.open_store(str(tmp_path)),
        recalibration.Recalibrator(min_samples=1),
        metrics.FeedbackMetrics(CollectorRegistry(), families=("resnet",)),
        clock=lambda: NOW,
    )
    fresh.warm_start()
    again = fresh.apply(prediction(), gpu_product="A100-80GB", family="resnet", coverage=0.5)
    assert again.memory_bytes == served.memory_bytes
    fresh.record_attempt(end(uid="uid-1"), [entry(5 * GIB)])
    assert fresh.metrics.observations.labels(outcome="succeeded")._value.get() == 0


def test_without_enough_jobs_the_checkpoint_margin_stands(registry, tmp_path):
    recorder = feedback.FeedbackRecorder(
        None, recalibration.Recalibrator(min_samples=20), metrics.FeedbackMetrics(registry)
    )
    served = recorder.apply(prediction(), gpu_product=None, family="resnet", coverage=0.95)
    assert served == prediction()
    assert registry.get_sample_value(
        "kubeseer_feedback_memory_margin_ratio", {"group": "checkpoint"}
    ) == pytest.approx(1.05)


def test_a_store_that_refuses_the_write_is_counted_and_reported(registry, tmp_path):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the store's directory should be")
    recorder = feedback.FeedbackRecorder(
        store.open_store(str(blocked)),
        recalibration.Recalibrator(),
        metrics.FeedbackMetrics(registry),
    )
    with pytest.raises(store.StoreError):
        recorder.record_attempt(end(), [entry(GIB)])
    assert registry.get_sample_value("kubeseer_feedback_store_errors_total") == 1


def test_an_unknown_family_is_labelled_other_in_metrics(recorder, registry):
    recorder.record_attempt(end(family="my-secret-net"), [entry(4 * GIB)])
    assert (
        registry.get_sample_value("kubeseer_feedback_observations_total", {"outcome": "succeeded"})
        == 1
    )
    assert (
        registry.get_sample_value(
            "kubeseer_feedback_prediction_absolute_error_ratio_count",
            labels(family="other", quantity="memory"),
        )
        == 1
    )


def test_the_family_comes_from_the_dljob_label():
    assert feedback.family_of({feedback.FAMILY_LABEL: "vit"}) == "vit"
    assert feedback.family_of({}) == feedback.UNKNOWN_FAMILY
    assert feedback.default_optimizer(Mode.INFER) == "none"

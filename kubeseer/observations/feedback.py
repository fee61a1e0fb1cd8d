"""Prediction against observation, for the operator: one call per finished attempt.

When an attempt ends (its pod succeeded, failed or ran out of memory) the operator knows the
prediction, the placement and the outcome; the profiler's `status.observed` entries carry what
the pod used. `FeedbackRecorder.record_attempt` turns them into an `Observation`, writes it to
the store, and, once the observation is complete (an out-of-memory outcome, or the profiler's final
report), observes the prediction errors in the feedback metrics and feeds the memory score to
the `Recalibrator`. It is safe to call on every event of the attempt: the store keeps the latest
write of each attempt, and metrics and margins count an attempt once (across operator restarts
too, since `FeedbackRecorder.warm_start` reads back what the store already holds).

`recalibrated` applies the learned margin to a fresh prediction; the prediction's warnings
name the group the margin came from, and `status.prediction` keeps it with the rest.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from kubeseer import metrics
from kubeseer.observations import recalibration, record
from kubeseer.observations import store as store_mod
from kubeseer.prediction import Estimate, Mode, Prediction

log = logging.getLogger(__name__)

FAMILY_LABEL = "kubeseer.io/model-family"
"""DLJob label naming the model's family (`resnet`, `bert`, ...), which groups its margins."""
UNKNOWN_FAMILY = "unknown"
"""The family of a DLJob without the label."""


@dataclass(frozen=True)
class AttemptEnd:
    """What the operator knows about an attempt that ended.

    Attributes:
        model_source: where the model came from (`ModelSource.describe()`).
        optimizer: the training optimizer the prediction assumed ("none" for inference).
        usable_memory_bytes: the memory the placement gave the attempt (an OOM's lower bound).
        perfgraph_ref: the store name of the model's PerfGraph, if the operator stored one.
    """

    namespace: str
    dljob: str
    dljob_uid: str
    attempt: int
    family: str
    model_source: str
    inputs: Mapping[str, int]
    optimizer: str
    gpu_product: str
    mig_profile: str | None
    usable_memory_bytes: int | None
    prediction: Prediction
    outcome: record.Outcome
    finished_at: datetime
    perfgraph_ref: str | None = None


def default_optimizer(mode: Mode) -> str:
    """The optimizer the predictor assumes when the DLJob names none."""
    return "adam" if mode is Mode.TRAIN else "none"


def family_of(labels: Mapping[str, str] | None) -> str:
    """The DLJob's model family from its labels."""
    value = (labels or {}).get(FAMILY_LABEL, "").strip()
    return value or UNKNOWN_FAMILY


def _stamp(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _items(value: object) -> list[object]:
    return list(value) if isinstance(value, list | tuple) else []


def build_observation(
    end: AttemptEnd, observed: Sequence[Mapping[str, object]], recorded_at: datetime
) -> record.Observation:
    """The observation of one attempt from its end and the profiler's entries for its pods.

    Several pods (replicas) aggregate as the slice must: the largest peak and mean; SM activity
    is their mean; samples add up.
    """
    peaks = [v for e in observed if (v := _int(e.get("peakMemoryBytes"))) is not None]
    means = [v for e in observed if (v := _int(e.get("meanMemoryBytes"))) is not None]
    sms = [f for e in observed if (f := _float(e.get("smActivityPercent"))) is not None]
    windows = [e.get("window") for e in observed if isinstance(e.get("window"), Mapping)]
    starts = [str(w["start"]) for w in windows if isinstance(w, Mapping) and "start" in w]
    ends = [str(w["end"]) for w in windows if isinstance(w, Mapping) and "end" in w]
    gpus = [g for e in observed for g in _items(e.get("gpus")) if isinstance(g, Mapping)]
    prediction = end.prediction
    oom = end.outcome is record.Outcome.OOM
    return record.Observation(
        observation_id=record.observation_id(end.dljob_uid, end.attempt),
        namespace=end.namespace,
        dljob=end.dljob,
        dljob_uid=end.dljob_uid,
        attempt=end.attempt,
        family=end.family,
        model_digest=prediction.model_digest,
        model_source=end.model_source,
        perfgraph_ref=end.perfgraph_ref,
        inputs_json=record.canonical_inputs(end.inputs),
        batch_size=prediction.batch_size,
        mode=prediction.mode.value,
        precision=prediction.precision.value,
        optimizer=end.optimizer,
        gpu_product=end.gpu_product,
        gpu_model_name=str(gpus[0].get("modelName")) if gpus else None,
        mig_profile=end.mig_profile,
        usable_memory_bytes=end.usable_memory_bytes,
        predictor_version=prediction.predictor_version,
        label_device=prediction.label_device,
        coverage=prediction.coverage,
        predicted_memory_bytes=prediction.memory_bytes.point,
        predicted_memory_upper_bytes=prediction.memory_bytes.upper,
        predicted_sm_util_percent=prediction.sm_util_percent.point,
        predicted_step_time_s=prediction.step_time_s.point,
        observed_peak_memory_bytes=max(peaks) if peaks else None,
        observed_mean_memory_bytes=max(means) if means else None,
        observed_sm_activity_percent=sum(sms) / len(sms) if sms else None,
        observed_sm_source=str(observed[0].get("smActivitySource")) if observed else None,
        observed_samples=sum(_int(e.get("samples")) or 0 for e in observed),
        observed_source=str(observed[0].get("source")) if observed else None,
        window_start=min(starts) if starts else None,
        window_end=max(ends) if ends else None,
        outcome=end.outcome,
        memory_at_least_bytes=end.usable_memory_bytes if oom else None,
        finished_at=_stamp(end.finished_at),
        recorded_at=_stamp(recorded_at),
    )


def complete(observation: record.Observation, observed: Sequence[Mapping[str, object]]) -> bool:
    """Whether the observation is final: an out-of-memory label, or every pod's last report."""
    if observation.outcome is record.Outcome.OOM:
        return True
    return bool(observed) and all(e.get("final") is True for e in observed)


def recalibrated(prediction: Prediction, margin: recalibration.Margin | None) -> Prediction:
    """The prediction with its memory upper bound from `margin` (unchanged for None)."""
    if margin is None:
        return prediction
    point = prediction.memory_bytes.point
    return replace(
        prediction,
        memory_bytes=Estimate(point, point * margin.factor),
        warnings=(*prediction.warnings, margin.describe()),
    )


class FeedbackRecorder:
    """Observations into the store, errors into metrics, scores into the margins.

    Args:
        store: where observations go (None: metrics and margins only).
        recalibrator: the online margins.
        feedback_metrics: the `feedback` subsystem's series.
        clock: the time recorded in each write.
    """

    def __init__(
        self,
        store: store_mod.Store | None,
        recalibrator: recalibration.Recalibrator,
        feedback_metrics: metrics.FeedbackMetrics,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.store = store
        self.recalibrator = recalibrator
        self.metrics = feedback_metrics
        self.clock = clock
        self._lock = threading.Lock()
        self._counted: set[str] = set()

    def warm_start(self) -> store_mod.ReadResult | None:
        """Read the store back: margins from its observations, and those already counted.

        Raises:
            store_mod.StoreError: the store cannot be listed.
        """
        if self.store is None:
            return None
        found = self.store.read()
        for observation in found.observations:
            self.recalibrator.observe(observation)
            self._counted.add(observation.observation_id)
        for damaged in found.damaged:
            log.warning("observation store: skipped %s", damaged)
        return found

    def apply(
        self, prediction: Prediction, *, gpu_product: str | None, family: str, coverage: float
    ) -> Prediction:
        """The prediction with the cluster's margin for its group, if one has enough jobs."""
        margin = self.recalibrator.margin(
            prediction.predictor_version,
            gpu_product=gpu_product,
            family=family,
            coverage=coverage,
        )
        group = "checkpoint" if margin is None else margin.group_label()
        factor = (
            prediction.memory_bytes.upper / prediction.memory_bytes.point
            if margin is None and prediction.memory_bytes.point > 0
            else (margin.factor if margin is not None else 1.0)
        )
        self.metrics.margin.labels(group=group).set(factor)
        return recalibrated(prediction, margin)

    def record_attempt(
        self, end: AttemptEnd, observed: Sequence[Mapping[str, object]]
    ) -> record.Observation:
        """Write the attempt's observation; count it once it is complete.

        Raises:
            store_mod.StoreError: the store refused the write (counted; call again later).
        """
        observation = build_observation(end, observed, self.clock())
        if self.store is not None:
            try:
                self.store.put(observation)
            except store_mod.StoreError:
                self.metrics.store_errors.inc()
                raise
        if complete(observation, observed):
            with self._lock:
                first = observation.observation_id not in self._counted
                self._counted.add(observation.observation_id)
            if first:
                self._count(observation)
                self.recalibrator.observe(observation)
        return observation

    def _count(self, o: record.Observation) -> None:
        family = self.metrics.family(o.family)
        profile = f"{o.gpu_product}/{o.mig_profile or 'whole'}"
        self.metrics.observations.labels(outcome=o.outcome.value).inc()
        if o.outcome is record.Outcome.OOM:
            self.metrics.bound_exceeded.labels(
                family=family,
                gpu_product=o.gpu_product,
                profile=profile,
                cause=metrics.ExceedCause.OOM,
            ).inc()
            return
        peak = o.observed_peak_memory_bytes
        if peak:
            self.metrics.prediction_error.labels(
                quantity=metrics.Quantity.MEMORY,
                family=family,
                gpu_product=o.gpu_product,
                profile=profile,
            ).observe(abs(o.predicted_memory_bytes - peak) / peak)
            if peak > o.predicted_memory_upper_bytes:
                self.metrics.bound_exceeded.labels(
                    family=family,
                    gpu_product=o.gpu_product,
                    profile=profile,
                    cause=metrics.ExceedCause.OBSERVED,
                ).inc()
        sm = o.observed_sm_activity_percent
        # The prediction is SM utilisation on a whole GPU; a slice's activity is not comparable.
        if sm and o.mig_profile is None and o.predicted_sm_util_percent is not None:
            self.metrics.prediction_error.labels(
                quantity=metrics.Quantity.SM_UTIL,
                family=family,
                gpu_product=o.gpu_product,
                profile=profile,
            ).observe(abs(o.predicted_sm_util_percent - sm) / sm)

"""The DLJob state machine: plain functions over `status.phase`, each step safe to repeat.

```
(none) -> Pending -> Predicting -> Placed -> Running -> Succeeded
                         |            ^  |
                         |            |  +-- OOM --> (next larger profile, attempt + 1)
                         v            |
                       Failed <-------+---- invalid spec, corrupt or unreachable model, no fit,
                                            OOM attempts exhausted, any other pod failure
```

Every step records its result in the DLJob's status before the next one starts, and reads it back
instead of redoing it: a restarted operator resumes a DLJob from its status, and the workload's
deterministic name makes a repeated create a no-op. The effects (API server, model fetching,
events) come in as narrow protocols, so the whole machine is tested without a cluster.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol

from kubeseer import metrics
from kubeseer.operator import dljob, pods, predict, workload
from kubeseer.operator import inventory as inventory_cache
from kubeseer.operator import status as st
from kubeseer.operator.config import OperatorConfig
from kubeseer.placement import inventory as placement_inventory
from kubeseer.placement import policy
from kubeseer.prediction import Prediction

Phase = dljob.Phase
Cond = dljob.ConditionType
Reason = dljob.Reason


@dataclass(frozen=True)
class DLJobRef:
    """Which DLJob: enough to patch it, own its workloads and attach events to it."""

    namespace: str
    name: str
    uid: str


class EventType(StrEnum):
    """Kubernetes event types."""

    NORMAL = "Normal"
    WARNING = "Warning"


class ClusterError(Exception):
    """An API call failed. `transient` errors (timeouts, 5xx, 429) are worth retrying."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


class ModelError(Exception):
    """The model could not be obtained; carries the DLJob reason and the metric label."""

    def __init__(
        self,
        reason: dljob.Reason,
        failure: metrics.FetchFailure,
        message: str,
        *,
        transient: bool,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.failure = failure
        self.transient = transient


@dataclass(frozen=True)
class LoadedModel:
    """Model bytes and their sha256 (the cache key of predictions)."""

    data: bytes
    digest: str


class Cluster(Protocol):
    """The API calls the state machine makes."""

    def patch_status(self, ref: DLJobRef, patch: Mapping[str, Any]) -> Mapping[str, Any]:
        """Merge-patch the DLJob's status; return the status as stored."""
        ...

    def get_dljob(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The DLJob, or None if it is gone."""
        ...

    def create_workload(self, manifest: Mapping[str, Any]) -> bool:
        """Create a Pod or Job; False if one of that name already exists."""
        ...


class ModelLoader(Protocol):
    """Gets a DLJob's model bytes from a URL or a ConfigMap."""

    def load(self, source: dljob.ModelSource, namespace: str) -> LoadedModel:
        """Raises `ModelError`."""
        ...


class Events(Protocol):
    """Posts Kubernetes events about a DLJob."""

    def emit(self, ref: DLJobRef, kind: EventType, reason: dljob.Reason, message: str) -> None:
        """Post one event; never raises (an event is not worth failing a reconcile)."""
        ...


class RetryLaterError(Exception):
    """A step failed transiently; run the reconcile again after `delay` seconds."""

    def __init__(self, message: str, delay: float) -> None:
        super().__init__(message)
        self.delay = delay


class DLJobFailedError(Exception):
    """The DLJob was marked Failed; nothing more will be done for it."""


class _StepError(Exception):
    """A reconcile step failed; which condition it sets, why, and whether to retry."""

    def __init__(
        self,
        condition: dljob.ConditionType,
        reason: dljob.Reason,
        message: str,
        transient: bool = False,
    ) -> None:
        super().__init__(message)
        self.condition = condition
        self.reason = reason
        self.message = message
        self.transient = transient


class Reconciler:
    """Drives DLJobs through their phases.

    Args:
        cluster: API calls.
        models: model fetching.
        predictor: cached prediction.
        inventory: the GPU inventory cache (free capacity without API calls).
        events: event posting.
        operator_metrics: counters and histograms.
        config: operator settings.
        clock: current time for condition timestamps.
    """

    def __init__(
        self,
        *,
        cluster: Cluster,
        models: ModelLoader,
        predictor: predict.CachedPredictor,
        inventory: inventory_cache.InventoryCache,
        events: Events,
        operator_metrics: metrics.OperatorMetrics,
        config: OperatorConfig,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.cluster = cluster
        self.models = models
        self.predictor = predictor
        self.inventory = inventory
        self.events = events
        self.metrics = operator_metrics
        self.config = config
        self.clock = clock
        # Held from reading the inventory to recording the chosen workload in it, so that two
        # placements never both take the last free slice.
        self._placement_lock = threading.Lock()

    # -- the DLJob's own reconcile ------------------------------------------------------------

    def reconcile(
        self,
        ref: DLJobRef,
        spec_body: Mapping[str, Any],
        status: Mapping[str, Any],
        *,
        retry: int = 0,
    ) -> Phase:
        """Advance one DLJob as far as the operator can take it on its own (Placed).

        Raises:
            RetryLaterError: a transient failure; the caller retries after the delay.
            DLJobFailedError: the DLJob is now Failed (status and event written).
            ClusterError: the API server could not record progress.
        """
        phase = st.read_phase(status)
        if phase in (Phase.RUNNING, Phase.SUCCEEDED, Phase.FAILED):
            return phase
        # A fresh prediction is written together with the placement (one patch, not two); if
        # placing fails, it is written with the failure. A restart in between predicts again.
        carried: dict[str, Any] = {}
        carried_conditions: list[st.Condition] = []
        try:
            try:
                spec = dljob.parse_spec(spec_body)
            except dljob.InvalidSpecError as e:
                raise _StepError(Cond.ACCEPTED, Reason.INVALID_SPEC, str(e)) from e
            if phase is None:
                carried["model"] = spec.model.describe()
                carried_conditions.append(
                    st.build_condition(
                        Cond.ACCEPTED, True, Reason.ACCEPTED, "spec is valid", self.clock()
                    )
                )
            prediction = st.read_prediction(status)
            if prediction is None:
                status, prediction = self._predict(ref, spec, status, carried, carried_conditions)
            placed = st.read_placement(status)
            if placed is None:
                status, placed = self._place(
                    ref, spec, prediction, status, carried, carried_conditions
                )
            self._ensure_workload(ref, spec, prediction, *placed)
            return Phase.PLACED
        except _StepError as e:
            return self._step_failed(ref, status, e, retry, carried, carried_conditions)

    def _predict(
        self,
        ref: DLJobRef,
        spec: dljob.DLJobSpec,
        status: Mapping[str, Any],
        carried: dict[str, Any],
        carried_conditions: list[st.Condition],
    ) -> tuple[Mapping[str, Any], Prediction]:
        """Fetch and predict, adding the status fields and conditions to `carried` for the next
        patch. The phase shows Predicting only when a prediction has to be computed: a cache hit
        goes straight to Placed in one patch."""
        named = spec.model.sha256
        hit = self.predictor.lookup(named, spec) if named is not None else None
        if hit is not None:
            # The digest pins the model, so a prediction cached for it needs no fetch at all.
            carried_conditions.append(
                st.build_condition(
                    Cond.MODEL_READY,
                    True,
                    Reason.FETCHED,
                    f"sha256 {named} as the DLJob names it; its prediction is cached, so the "
                    "model was not read again",
                    self.clock(),
                )
            )
            return self._predicted(hit, carried, carried_conditions, status)
        with self._timed(metrics.ReconcileStep.PREDICT):
            try:
                model = self.models.load(spec.model, ref.namespace)
            except ModelError as e:
                self.metrics.fetch_failures.labels(reason=e.failure).inc()
                raise _StepError(Cond.MODEL_READY, e.reason, str(e), e.transient) from e
            fetched = st.build_condition(
                Cond.MODEL_READY, True, Reason.FETCHED, _describe_model(model), self.clock()
            )
            carried_conditions.append(fetched)
            if not self.predictor.is_cached(model.digest, spec):
                status = self._patch(
                    ref,
                    status,
                    {**carried, "phase": Phase.PREDICTING.value},
                    *carried_conditions,
                )
            try:
                prediction = self.predictor.predict(model.data, model.digest, spec)
            except predict.PredictionError as e:
                raise _StepError(Cond.PREDICTED, e.reason, str(e)) from e
        return self._predicted(prediction, carried, carried_conditions, status)

    def _predicted(
        self,
        prediction: Prediction,
        carried: dict[str, Any],
        carried_conditions: list[st.Condition],
        status: Mapping[str, Any],
    ) -> tuple[Mapping[str, Any], Prediction]:
        summary = _describe_prediction(prediction)
        carried["prediction"] = st.build_prediction_status(prediction)
        carried_conditions.append(
            st.build_condition(Cond.PREDICTED, True, Reason.PREDICTED, summary, self.clock())
        )
        return status, prediction

    def _place(
        self,
        ref: DLJobRef,
        spec: dljob.DLJobSpec,
        prediction: Prediction,
        status: Mapping[str, Any],
        carried: Mapping[str, Any],
        carried_conditions: Sequence[st.Condition],
    ) -> tuple[Mapping[str, Any], tuple[policy.Placement, int]]:
        with self._timed(metrics.ReconcileStep.PLACE), self._placement_lock:
            try:
                placement = self._choose(lambda inv: policy.choose(prediction, inv, spec.placement))
            except policy.NoFit as e:
                self.metrics.placements.labels(
                    profile=metrics.NO_PROFILE, outcome=metrics.PlacementOutcome.NO_FIT
                ).inc()
                raise _StepError(Cond.PLACED, Reason.NO_FIT, str(e)) from e
            except policy.CoverageError as e:
                raise _StepError(Cond.PLACED, Reason.COVERAGE_UNAVAILABLE, str(e)) from e
            self.inventory.assume(self._manifest(ref, spec, prediction, placement, 0))
        self.metrics.placements.labels(
            profile=workload.profile_label(placement), outcome=metrics.PlacementOutcome.PLACED
        ).inc()
        status = self._patch(
            ref,
            status,
            {
                **carried,
                "phase": Phase.PLACED.value,
                "placement": st.build_placement_status(placement, 0),
            },
            *carried_conditions,
            st.build_condition(Cond.PLACED, True, Reason.PLACED, placement.reason, self.clock()),
        )
        mib = 1 << 20
        self.events.emit(
            ref,
            EventType.NORMAL,
            Reason.PLACED,
            f"{placement.resource} on {placement.gpu_product} for a predicted peak of "
            f"{prediction.memory_bytes.point / mib:.0f} MiB (upper bound "
            f"{prediction.memory_bytes.upper / mib:.0f} MiB): {placement.reason}",
        )
        return status, (placement, 0)

    def _choose(
        self, pick: Callable[[placement_inventory.Inventory], policy.Placement]
    ) -> policy.Placement:
        """Pick from free capacity; if something that would fit is only busy, queue for it.

        A busy fit is not a failure: the pod is created for the smallest profile that fits the
        cluster's total capacity and waits in the scheduler's queue, as any pod would.
        """
        try:
            return pick(self.inventory.snapshot())
        except policy.NoFit as e:
            if not e.transient:
                raise
            queued = pick(self.inventory.capacity())
            return replace(
                queued, reason=f"{queued.reason}; none is free now, the pod waits for one"
            )

    def _manifest(
        self,
        ref: DLJobRef,
        spec: dljob.DLJobSpec,
        prediction: Prediction,
        placement: policy.Placement,
        attempt: int,
    ) -> dict[str, Any]:
        return workload.build_workload(
            spec,
            ref.name,
            ref.namespace,
            ref.uid,
            prediction,
            placement,
            attempt,
            scheduler_name=self.config.scheduler_name,
        )

    def _ensure_workload(
        self,
        ref: DLJobRef,
        spec: dljob.DLJobSpec,
        prediction: Prediction,
        placement: policy.Placement,
        attempt: int,
    ) -> None:
        manifest = self._manifest(ref, spec, prediction, placement, attempt)
        self.inventory.assume(manifest)
        try:
            created = self.cluster.create_workload(manifest)
        except ClusterError as e:
            self.inventory.forget(manifest)
            reason = Reason.WORKLOAD_FAILED if e.transient else Reason.INVALID_TEMPLATE
            raise _StepError(Cond.WORKLOAD_READY, reason, str(e), e.transient) from e
        if created:
            kind = str(manifest["kind"])
            name = workload.workload_name(ref.name, attempt)
            self.events.emit(
                ref,
                EventType.NORMAL,
                Reason.CREATED,
                f"{kind} {name} created with 1 {placement.resource} (attempt {attempt})",
            )

    def _step_failed(
        self,
        ref: DLJobRef,
        status: Mapping[str, Any],
        error: _StepError,
        retry: int,
        carried: Mapping[str, Any] | None = None,
        carried_conditions: Sequence[st.Condition] = (),
    ) -> Phase:
        conditions = list(carried_conditions)
        if error.transient and retry < self.config.max_retries:
            delay = self.config.retry_delay_s
            message = (
                f"{error.message} (retry {retry + 1} of {self.config.max_retries} in {delay:g} s)"
            )
            self._patch(
                ref,
                status,
                {**(carried or {}), "phase": Phase.PENDING.value},
                *conditions,
                st.build_condition(error.condition, False, error.reason, message, self.clock()),
            )
            self.events.emit(ref, EventType.WARNING, error.reason, message)
            raise RetryLaterError(message, delay)
        self._fail(ref, status, error.condition, error.reason, error.message, carried, conditions)
        raise DLJobFailedError(f"{error.reason}: {error.message}")

    def _fail(
        self,
        ref: DLJobRef,
        status: Mapping[str, Any],
        condition: dljob.ConditionType,
        reason: dljob.Reason,
        message: str,
        extra: Mapping[str, Any] | None = None,
        extra_conditions: Sequence[st.Condition] = (),
    ) -> None:
        self._patch(
            ref,
            status,
            {**(extra or {}), "phase": Phase.FAILED.value},
            *extra_conditions,
            st.build_condition(condition, False, reason, message, self.clock()),
        )
        self.events.emit(ref, EventType.WARNING, reason, message)

    # -- what became of the workload ------------------------------------------------------------

    def observe_workload(
        self, namespace: str, dljob_name: str, attempt: int, verdict: pods.Verdict
    ) -> None:
        """Move the DLJob on from a pod's (or Job's) outcome; stale attempts are ignored.

        Safe to repeat: an outcome already recorded finds the DLJob in a later phase or attempt.
        """
        if verdict.outcome is pods.PodOutcome.PENDING:
            return
        body = self.cluster.get_dljob(namespace, dljob_name)
        if body is None:
            return
        status: Mapping[str, Any] = body.get("status") or {}
        phase = st.read_phase(status)
        placed = st.read_placement(status)
        if phase is None or phase.terminal or placed is None or placed[1] != attempt:
            return
        ref = DLJobRef(namespace, dljob_name, str(body["metadata"]["uid"]))
        placement = placed[0]
        name = workload.workload_name(dljob_name, attempt)
        with self._timed(metrics.ReconcileStep.POD_EVENT):
            if verdict.outcome is pods.PodOutcome.RUNNING:
                if phase is Phase.PLACED:
                    message = f"{name} is running on {placement.resource}"
                    self._patch(
                        ref,
                        status,
                        {"phase": Phase.RUNNING.value},
                        st.build_condition(
                            Cond.WORKLOAD_READY, True, Reason.RUNNING, message, self.clock()
                        ),
                    )
            elif verdict.outcome is pods.PodOutcome.SUCCEEDED:
                message = f"{name} succeeded on {placement.resource}"
                attempts = [
                    *st.read_attempts(status),
                    st.build_attempt(placement, attempt, name, st.OUTCOME_SUCCEEDED),
                ]
                self._patch(
                    ref,
                    status,
                    {"phase": Phase.SUCCEEDED.value, "attempts": attempts},
                    st.build_condition(
                        Cond.WORKLOAD_READY, True, Reason.SUCCEEDED, message, self.clock()
                    ),
                )
                self.events.emit(ref, EventType.NORMAL, Reason.SUCCEEDED, message)
            elif verdict.outcome is pods.PodOutcome.FAILED:
                attempts = [
                    *st.read_attempts(status),
                    st.build_attempt(placement, attempt, name, st.OUTCOME_FAILED, verdict.message),
                ]
                self._fail(
                    ref,
                    status,
                    Cond.WORKLOAD_READY,
                    Reason.POD_FAILED,
                    f"{name} failed: {verdict.message}",
                    {"attempts": attempts},
                )
            else:
                self._escalate(ref, body, status, placement, attempt, verdict.message)

    def _escalate(
        self,
        ref: DLJobRef,
        body: Mapping[str, Any],
        status: Mapping[str, Any],
        current: policy.Placement,
        attempt: int,
        why: str,
    ) -> None:
        name = workload.workload_name(ref.name, attempt)
        attempts: Sequence[st.AttemptRecord] = [
            *st.read_attempts(status),
            st.build_attempt(current, attempt, name, st.OUTCOME_OOM, why),
        ]
        if attempt + 1 >= self.config.max_attempts:
            self._exhausted(
                ref,
                status,
                attempts,
                f"{name} ran out of memory on {current.resource}: {why}; "
                f"{attempt + 1} of {self.config.max_attempts} attempts used",
            )
            return
        spec = dljob.parse_spec(body.get("spec") or {})
        prediction = st.read_prediction(status)
        if prediction is None:
            raise ClusterError("status.prediction vanished from a placed DLJob", transient=False)
        with self._placement_lock:
            try:
                new = self._choose(lambda inv: policy.escalate(current, inv, spec.placement))
            except policy.NoFit as e:
                self._exhausted(
                    ref, status, attempts, f"{name} ran out of memory on {current.resource}: {e}"
                )
                return
            self.inventory.assume(self._manifest(ref, spec, prediction, new, attempt + 1))
        self.metrics.oom_escalations.labels(outcome=metrics.EscalationOutcome.ESCALATED).inc()
        self.metrics.placements.labels(
            profile=workload.profile_label(new), outcome=metrics.PlacementOutcome.ESCALATED
        ).inc()
        now = self.clock()
        message = f"{name} ran out of memory on {current.resource} ({why}); {new.reason}"
        status = self._patch(
            ref,
            status,
            {
                "phase": Phase.PLACED.value,
                "placement": st.build_placement_status(new, attempt + 1),
                "attempts": list(attempts),
            },
            st.build_condition(Cond.PLACED, True, Reason.ESCALATED, new.reason, now),
            st.build_condition(Cond.WORKLOAD_READY, False, Reason.OOM, why, now),
        )
        self.events.emit(ref, EventType.WARNING, Reason.ESCALATED, message)
        try:
            self._ensure_workload(ref, spec, prediction, new, attempt + 1)
        except _StepError as e:
            # A pod event is not retried by kopf; the create already retried transient errors.
            self._fail(ref, status, e.condition, e.reason, e.message)

    def _exhausted(
        self,
        ref: DLJobRef,
        status: Mapping[str, Any],
        attempts: Sequence[st.AttemptRecord],
        message: str,
    ) -> None:
        self.metrics.oom_escalations.labels(outcome=metrics.EscalationOutcome.EXHAUSTED).inc()
        self._fail(
            ref,
            status,
            Cond.WORKLOAD_READY,
            Reason.OOM_RETRIES_EXHAUSTED,
            message,
            {"attempts": list(attempts)},
        )

    # -- helpers --------------------------------------------------------------------------------

    def _patch(
        self,
        ref: DLJobRef,
        status: Mapping[str, Any],
        fields: Mapping[str, Any],
        *conditions: st.Condition,
    ) -> Mapping[str, Any]:
        """Patch status fields and conditions (merged with those in `status`)."""
        patch = dict(fields)
        if conditions:
            merged: list[Mapping[str, Any]] = list(status.get("conditions") or [])
            for c in conditions:
                merged = st.merge_conditions(merged, c)
            patch["conditions"] = merged
        return self.cluster.patch_status(ref, patch)

    @contextmanager
    def _timed(self, step: metrics.ReconcileStep) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.metrics.reconcile_duration.labels(step=step).observe(time.perf_counter() - start)


def _describe_model(model: LoadedModel) -> str:
    return f"{len(model.data)} bytes, sha256 {model.digest}"


def _describe_prediction(p: Prediction) -> str:
    mib = 1 << 20
    return (
        f"peak memory {p.memory_bytes.point / mib:.0f} MiB, upper bound "
        f"{p.memory_bytes.upper / mib:.0f} MiB at {p.coverage:.0%} coverage; "
        f"SM utilisation {p.sm_util_percent.point:.0f}%; step time "
        f"{p.step_time_s.point * 1e3:.1f} ms (predictor {p.predictor_version}, "
        f"labels from {p.label_device})"
    )

"""The DLJob state machine: plain functions over `status.phase`, each step safe to repeat.

```
(none) -> Pending -> Fetching -> Predicting -> Placed -> Running -> Succeeded
                        |            |           ^  |
                        |            |           |  +-- OOM, or workload deleted --> attempt + 1
                        v            v           |
                      Failed <-------+-----------+---- invalid spec, corrupt or unreachable model,
                                                       no fit, attempts exhausted, pod failure
```

Every step reads the DLJob's status once into a `status.DLJobStatus`, answers with one
`status.Patch`, and the steps of one reconcile are written together; a restarted operator
resumes a DLJob from its status, and the workload's deterministic name makes a repeated create a
no-op. The effects (API server, model fetching, events) come in as narrow protocols, so the
whole machine is tested without a cluster.

A reconcile runs on two thread pools: the model download on the fetch pool, everything else on
the work pool. A model server that trickles bytes holds a fetch thread, never the threads that
predict and place every other DLJob, and a DLJob deleted meanwhile cancels its download.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, NoReturn, Protocol, TypeVar

from kubeseer import metrics, units
from kubeseer.operator import dljob, fairpool, models, pods, predict, workload
from kubeseer.operator import errors as api_errors
from kubeseer.operator import inventory as inventory_cache
from kubeseer.operator import status as st
from kubeseer.operator.config import OperatorConfig
from kubeseer.operator.fetch import cancel
from kubeseer.operator.fetch import errors as fetch_errors
from kubeseer.placement import plan, policy
from kubeseer.prediction import Prediction
from kubeseer.predictor import errors as predictor_errors

_T = TypeVar("_T")
Phase = dljob.Phase
Cond = dljob.ConditionType
Reason = dljob.Reason
DLJobRef = dljob.DLJobRef

_MODEL_REASONS = {
    metrics.FetchFailure.UNREACHABLE: Reason.MODEL_UNREACHABLE,
    metrics.FetchFailure.REFUSED: Reason.MODEL_REFUSED,
    metrics.FetchFailure.TOO_LARGE: Reason.MODEL_TOO_LARGE,
    metrics.FetchFailure.DIGEST_MISMATCH: Reason.DIGEST_MISMATCH,
    metrics.FetchFailure.NOT_FOUND: Reason.MODEL_NOT_FOUND,
    metrics.FetchFailure.INVALID: Reason.MODEL_SOURCE_INVALID,
    metrics.FetchFailure.TOO_SLOW: Reason.MODEL_TOO_SLOW,
}
"""The ModelReady reason of each kind of fetch failure (the failure class chose the kind)."""


class EventType(StrEnum):
    """Kubernetes event types."""

    NORMAL = "Normal"
    WARNING = "Warning"


class Cluster(Protocol):
    """The API calls the state machine makes; failures raise `errors.ApiError` subclasses."""

    def patch_status(self, ref: DLJobRef, patch: Mapping[str, Any]) -> Mapping[str, Any]:
        """Merge-patch the DLJob's status; return the status as stored."""
        ...

    def get_dljob(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The DLJob, or None if it is gone."""
        ...

    def create_workload(self, manifest: Mapping[str, Any]) -> bool:
        """Create a Pod or Job; False if one of that name already exists."""
        ...

    def workload_exists(self, namespace: str, name: str, kind: str) -> bool:
        """Whether the Pod or Job of that name exists."""
        ...


class Feedback(Protocol):
    """The learning loop's hooks (`kubeseer.observations.operator_hook.OperatorFeedback`)."""

    def serve(
        self, ref: dljob.DLJobRef, spec: dljob.DLJobSpec, prediction: Prediction
    ) -> Prediction:
        """The prediction with the cluster's recalibrated memory bound; never raises."""
        ...

    def model_loaded(self, path: Path, digest: str, spec: dljob.DLJobSpec) -> None:
        """Keep the downloaded model's PerfGraph for retraining; never raises."""
        ...


class ModelLoader(Protocol):
    """Gets a DLJob's model from a URL or a ConfigMap (`models.ModelStore`)."""

    def verified(self, source: dljob.ModelSource, namespace: str) -> str | None:
        """The pinned digest if this very source served it before and it is still cached."""
        ...

    def load(
        self,
        source: dljob.ModelSource,
        namespace: str,
        cancellation: cancel.Cancellation | None = None,
    ) -> models.LoadedModel:
        """The model on disk; raises `fetch.errors.FetchError`."""
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
    """A reconcile step failed: the condition it sets, why, and whether to retry.

    `patient` failures (a namespace quota) are retried for as long as they last, the others at
    most `max_retries` times.
    """

    def __init__(
        self,
        condition: dljob.ConditionType,
        reason: dljob.Reason,
        message: str,
        *,
        transient: bool = False,
        patient: bool = False,
        fields: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.condition = condition
        self.reason = reason
        self.message = message
        self.fields = dict(fields or {})
        self.transient = transient or patient
        self.patient = patient


@dataclass(frozen=True)
class _ModelNeeded:
    """What the first half of a reconcile hands to the fetch pool and the second half."""

    ref: DLJobRef
    spec: dljob.DLJobSpec
    state: st.DLJobStatus


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
        work_pool: where the steps run (None: asyncio's default executor).
        fetch_pool: where downloads run, each namespace its fair share (None: the work pool).
        recheck_s: how often a DLJob whose model is downloading is looked up, so that deleting
            it cancels the download.
        feedback: recalibrated bounds for fresh predictions, PerfGraphs kept for retraining
            (None: the checkpoint's bounds, nothing kept).
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
        work_pool: Executor | None = None,
        fetch_pool: fairpool.FairPool | None = None,
        feedback: Feedback | None = None,
        recheck_s: float = 2.0,
    ) -> None:
        self.cluster = cluster
        self.models = models
        self.predictor = predictor
        self.inventory = inventory
        self.events = events
        self.metrics = operator_metrics
        self.config = config
        self.clock = clock
        self.work_pool = work_pool
        self.fetch_pool = fetch_pool
        self.feedback = feedback
        self.recheck_s = recheck_s
        # Held from reading the inventory to recording the chosen workload in it, so that two
        # placements never both take the last free slice.
        self._placement_lock = threading.Lock()

    # -- the DLJob's own reconcile ------------------------------------------------------------

    async def reconcile(
        self,
        ref: DLJobRef,
        spec_body: Mapping[str, Any],
        raw_status: Mapping[str, Any],
        *,
        retry: int = 0,
        cancellation: cancel.Cancellation | None = None,
    ) -> Phase | None:
        """Advance one DLJob as far as the operator can take it on its own (Placed).

        Returns the phase reached, or None when the DLJob was deleted during its fetch.

        Raises:
            RetryLaterError: a transient failure; the caller retries after the delay.
            DLJobFailedError: the DLJob is now Failed (status and event written).
            errors.ApiError: the API server could not record progress.
        """
        cancellation = cancellation or cancel.Cancellation()
        first = await in_thread(self.work_pool, self.begin, ref, spec_body, raw_status, retry)
        if not isinstance(first, _ModelNeeded):
            return first
        # Only downloads take a fetch thread; a ConfigMap is one API read, like any other step.
        pool = self.work_pool
        if first.spec.model.url is not None and self.fetch_pool is not None:
            pool = self.fetch_pool.for_key(ref.namespace)
        fetching = asyncio.ensure_future(in_thread(pool, self._load, first, cancellation))
        # kopf hands an object's next event (its deletion too) to its handler only once the
        # running one returns, so the DLJob is looked up while its model downloads.
        while not (await asyncio.wait({fetching}, timeout=self.recheck_s))[0]:
            if not await in_thread(self.work_pool, self._still_wanted, ref):
                cancellation.cancel()
        loaded = fetching.result()
        if isinstance(loaded, fetch_errors.CancelledError):
            return None
        return await in_thread(self.work_pool, self.finish, first, loaded, retry)

    def _still_wanted(self, ref: DLJobRef) -> bool:
        """Whether the DLJob still exists and is not being deleted (True when unsure)."""
        try:
            body = self.cluster.get_dljob(ref.namespace, ref.name)
        except api_errors.ApiError:
            return True
        metadata = (body or {}).get("metadata") or {}
        return metadata.get("uid") == ref.uid and not metadata.get("deletionTimestamp")

    def begin(
        self, ref: DLJobRef, spec_body: Mapping[str, Any], raw_status: Mapping[str, Any], retry: int
    ) -> Phase | _ModelNeeded:
        """Everything up to the model download: accept, reuse a stored or cached prediction
        (going on to place), or record Fetching and ask for the model."""
        state = st.read(raw_status)
        if state.phase in (Phase.SUCCEEDED, Phase.FAILED):
            return state.phase
        try:
            spec = dljob.parse_spec(spec_body)
        except dljob.InvalidSpecError as e:
            return self._step_failed(
                ref,
                state,
                st.Patch(),
                _StepError(Cond.ACCEPTED, Reason.INVALID_SPEC, str(e)),
                retry,
            )
        if state.phase is Phase.RUNNING:
            return self._check_running(ref, spec, state)
        accepted = self._accepted(spec) if state.phase is None else st.Patch()
        if state.prediction is not None:
            return self._place_and_run(ref, spec, state, accepted, state.prediction, retry)
        digest = self.models.verified(spec.model, ref.namespace)
        cached = self.predictor.lookup(digest, spec) if digest is not None else None
        if cached is not None:
            cached = self._served(ref, spec, cached)
            reused = st.Patch(
                conditions=(
                    self._condition(
                        Cond.MODEL_READY,
                        True,
                        Reason.FETCHED,
                        f"sha256 {digest}, served by this source before; its prediction is "
                        "cached, so the model was not read again",
                    ),
                )
            )
            ready = accepted.then(reused).then(self._predicted(cached))
            return self._place_and_run(ref, spec, state, ready, cached, retry)
        state = self._write(ref, state, accepted.then(st.progress(Phase.FETCHING)))
        return _ModelNeeded(ref, spec, state)

    def _load(
        self, need: _ModelNeeded, cancellation: cancel.Cancellation
    ) -> models.LoadedModel | fetch_errors.FetchError:
        """The model, or why not (run on the fetch pool; failures are the next step's input)."""
        with self._timed(metrics.ReconcileStep.FETCH):
            try:
                return self.models.load(need.spec.model, need.ref.namespace, cancellation)
            except fetch_errors.FetchError as e:
                return e

    def finish(
        self,
        need: _ModelNeeded,
        loaded: models.LoadedModel | fetch_errors.FetchError,
        retry: int,
    ) -> Phase:
        """From the downloaded model (or its failure) to a placed workload."""
        ref, spec, state = need.ref, need.spec, need.state
        if isinstance(loaded, fetch_errors.FetchError):
            self.metrics.fetch_failures.labels(reason=loaded.failure).inc()
            error = _StepError(
                Cond.MODEL_READY,
                _MODEL_REASONS[loaded.failure],
                str(loaded),
                transient=loaded.transient,
            )
            return self._step_failed(ref, state, st.Patch(), error, retry)
        try:
            ready = st.Patch(
                conditions=(
                    self._condition(Cond.MODEL_READY, True, Reason.FETCHED, loaded.describe()),
                )
            )
            if not self.predictor.is_cached(loaded.digest, spec):
                state = self._write(ref, state, ready.then(st.progress(Phase.PREDICTING)))
                ready = st.Patch()
            with self._timed(metrics.ReconcileStep.PREDICT):
                prediction = self.predictor.predict(loaded.path, loaded.digest, spec)
            if self.feedback is not None:
                self.feedback.model_loaded(loaded.path, loaded.digest, spec)
        except predictor_errors.PredictionError as e:
            error = _StepError(Cond.PREDICTED, predict.reason(e), str(e))
            return self._step_failed(ref, state, ready, error, retry)
        finally:
            loaded.release()
        prediction = self._served(ref, spec, prediction)
        return self._place_and_run(
            ref, spec, state, ready.then(self._predicted(prediction)), prediction, retry
        )

    def _served(
        self, ref: dljob.DLJobRef, spec: dljob.DLJobSpec, prediction: Prediction
    ) -> Prediction:
        """A fresh prediction as it is stored and placed: with the recalibrated bound."""
        return prediction if self.feedback is None else self.feedback.serve(ref, spec, prediction)

    def _accepted(self, spec: dljob.DLJobSpec) -> st.Patch:
        return st.Patch(
            {"model": spec.model.describe()},
            (self._condition(Cond.ACCEPTED, True, Reason.ACCEPTED, "spec is valid"),),
        )

    def _predicted(self, prediction: Prediction) -> st.Patch:
        return st.Patch(
            {"prediction": st.build_prediction_status(prediction)},
            (
                self._condition(
                    Cond.PREDICTED, True, Reason.PREDICTED, _describe_prediction(prediction)
                ),
            ),
        )

    def _place_and_run(
        self,
        ref: DLJobRef,
        spec: dljob.DLJobSpec,
        state: st.DLJobStatus,
        pending: st.Patch,
        prediction: Prediction,
        retry: int,
    ) -> Phase:
        """Place (unless placed before), write what is pending, and create the workload."""
        try:
            placed = state.placed
            if placed is None:
                placement, placing = self._place(ref, spec, prediction)
                state = self._write(ref, state, pending.then(placing))
                pending = st.Patch()
                placed = st.PlacedAttempt(placement, 0)
                self._announce(ref, spec, prediction, placement)
            elif pending.fields or pending.conditions:
                state = self._write(ref, state, pending)
                pending = st.Patch()
            self._ensure_workload(ref, spec, prediction, placed)
        except _StepError as e:
            return self._step_failed(ref, state, pending, e, retry)
        return Phase.PLACED

    def _place(
        self, ref: DLJobRef, spec: dljob.DLJobSpec, prediction: Prediction
    ) -> tuple[policy.Placement, st.Patch]:
        """Choose the first attempt's resource; its patch moves the DLJob to Placed."""
        with self._timed(metrics.ReconcileStep.PLACE), self._placement_lock:
            try:
                decision = policy.decide(prediction, self.inventory.snapshot(), spec.placement)
            except policy.NoFit as e:
                self.metrics.placements.labels(
                    profile=metrics.NO_PROFILE, outcome=metrics.PlacementOutcome.NO_FIT
                ).inc()
                raise _StepError(
                    Cond.PLACED, _NO_FIT_REASONS[e.cause], str(e), fields=_plan_fields(e.plan)
                ) from e
            except policy.CoverageError as e:
                raise _StepError(
                    Cond.PLACED,
                    Reason.COVERAGE_UNAVAILABLE,
                    _coverage_advice(prediction, spec.placement),
                ) from e
            placement = decision.placement
            self.inventory.assume(self._manifest(ref, spec, prediction, placement, 0))
        self.metrics.placements.labels(
            profile=workload.profile_label(placement), outcome=metrics.PlacementOutcome.PLACED
        ).inc()
        message = placement.reason
        replaced = workload.gpu_requests_replaced(spec.template)
        if replaced:
            message += f"; the template's own GPU requests ({', '.join(replaced)}) are replaced"
        patch = st.progress(
            Phase.PLACED,
            placement=st.build_placement_status(placement, 0),
            **_plan_fields(decision.plan),
        ).then(st.Patch(conditions=(self._condition(Cond.PLACED, True, Reason.PLACED, message),)))
        return placement, patch

    def _announce(
        self,
        ref: DLJobRef,
        spec: dljob.DLJobSpec,
        prediction: Prediction,
        placement: policy.Placement,
    ) -> None:
        """The Placed event, and a warning for each GPU request of the template replaced."""
        self.events.emit(
            ref,
            EventType.NORMAL,
            Reason.PLACED,
            f"{placement.resource} on {placement.gpu_product} for a predicted peak of "
            f"{prediction.memory_bytes.point / units.MIB:.0f} MiB (upper bound "
            f"{prediction.memory_bytes.upper / units.MIB:.0f} MiB): {placement.reason}",
        )
        for request in workload.gpu_requests_replaced(spec.template):
            self.events.emit(
                ref,
                EventType.WARNING,
                Reason.GPU_LIMIT_REPLACED,
                f"{request} is replaced by 1 {placement.resource}: kubeseer chooses the GPU",
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
        placed: st.PlacedAttempt,
    ) -> None:
        """Create the attempt's workload (a no-op if it exists); failures as `_StepError`."""
        manifest = self._manifest(ref, spec, prediction, placed.placement, placed.attempt)
        self.inventory.assume(manifest)
        try:
            created = self.cluster.create_workload(manifest)
        except api_errors.ApiError as e:
            self.inventory.forget(manifest)
            raise _workload_error(e) from e
        if created:
            kind = str(manifest["kind"])
            name = workload.workload_name(ref.name, placed.attempt)
            self.events.emit(
                ref,
                EventType.NORMAL,
                Reason.CREATED,
                f"{kind} {name} created with 1 {placed.placement.resource} "
                f"(attempt {placed.attempt})",
            )

    def _check_running(self, ref: DLJobRef, spec: dljob.DLJobSpec, state: st.DLJobStatus) -> Phase:
        """A Running DLJob found at start-up: its workload may have gone while no operator ran."""
        placed = state.placed
        if placed is None:
            return Phase.RUNNING
        kind = "Pod" if spec.replicas == 1 else "Job"
        name = workload.workload_name(ref.name, placed.attempt)
        if self.cluster.workload_exists(ref.namespace, name, kind):
            return Phase.RUNNING
        self._replace_lost(
            ref, spec, state, placed, f"{kind} {name} was deleted before it finished"
        )
        body = self.cluster.get_dljob(ref.namespace, ref.name)
        return st.read_phase((body or {}).get("status") or {}) or Phase.RUNNING

    def _step_failed(
        self,
        ref: DLJobRef,
        state: st.DLJobStatus,
        pending: st.Patch,
        error: _StepError,
        retry: int,
    ) -> NoReturn:
        """Record a failed step: retried later if transient and retries remain, else Failed.

        Raises:
            RetryLaterError: transient, with retries left (or patient).
            DLJobFailedError: otherwise; the DLJob is Failed.
        """
        pending = pending.then(st.Patch(error.fields))
        if error.transient and (error.patient or retry < self.config.max_retries):
            delay = self.config.retry_delay_s
            message = (
                f"{error.message} (retrying every {delay:g} s)"
                if error.patient
                else f"{error.message} (retry {retry + 1} of {self.config.max_retries} in "
                f"{delay:g} s)"
            )
            waiting = Phase.PLACED if state.placed is not None else Phase.PENDING
            self._write(
                ref,
                state,
                pending.then(
                    st.setback(waiting, error.condition, error.reason, message, self.clock())
                ),
            )
            self.events.emit(ref, EventType.WARNING, error.reason, message)
            raise RetryLaterError(message, delay)
        self._fail(ref, state, pending, error.condition, error.reason, error.message)
        raise DLJobFailedError(f"{error.reason}: {error.message}")

    def _fail(
        self,
        ref: DLJobRef,
        state: st.DLJobStatus,
        pending: st.Patch,
        condition: dljob.ConditionType,
        reason: dljob.Reason,
        message: str,
    ) -> None:
        failed = st.setback(Phase.FAILED, condition, reason, message, self.clock())
        self._write(ref, state, pending.then(failed))
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
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            return
        state = st.read(body.get("status") or {})
        placed = state.placed
        if state.phase is None or state.phase.terminal or placed is None:
            return
        if placed.attempt != attempt:
            return
        ref = DLJobRef(namespace, dljob_name, str(body["metadata"]["uid"]))
        name = workload.workload_name(dljob_name, attempt)
        resource = placed.placement.resource
        with self._timed(metrics.ReconcileStep.POD_EVENT):
            outcome = verdict.outcome
            if outcome is pods.PodOutcome.RUNNING:
                if state.phase is Phase.PLACED:
                    message = f"{name} is running on {resource}"
                    self._write(
                        ref,
                        state,
                        st.progress(Phase.RUNNING).then(
                            st.Patch(
                                conditions=(
                                    self._condition(
                                        Cond.WORKLOAD_READY, True, Reason.RUNNING, message
                                    ),
                                )
                            )
                        ),
                    )
            elif outcome is pods.PodOutcome.SUCCEEDED:
                message = f"{name} succeeded on {resource}"
                record = st.build_attempt(placed.placement, attempt, name, st.OUTCOME_SUCCEEDED)
                self._write(
                    ref,
                    state,
                    st.progress(Phase.SUCCEEDED, attempts=[*state.attempts, record]).then(
                        st.Patch(
                            conditions=(
                                self._condition(
                                    Cond.WORKLOAD_READY, True, Reason.SUCCEEDED, message
                                ),
                            )
                        )
                    ),
                )
                self.events.emit(ref, EventType.NORMAL, Reason.SUCCEEDED, message)
            elif outcome is pods.PodOutcome.FAILED:
                record = st.build_attempt(
                    placed.placement, attempt, name, st.OUTCOME_FAILED, verdict.message
                )
                self._fail(
                    ref,
                    state,
                    st.Patch({"attempts": [*state.attempts, record]}),
                    Cond.WORKLOAD_READY,
                    Reason.POD_FAILED,
                    f"{name} failed: {verdict.message}",
                )
            elif outcome is pods.PodOutcome.DELETED:
                spec = dljob.parse_spec(body.get("spec") or {})
                self._replace_lost(ref, spec, state, placed, verdict.message)
            else:
                self._escalate(ref, body, state, placed, verdict.message)

    def _escalate(
        self,
        ref: DLJobRef,
        body: Mapping[str, Any],
        state: st.DLJobStatus,
        current: st.PlacedAttempt,
        why: str,
    ) -> None:
        """Attempt n ran out of memory: attempt n + 1 on a larger profile, or Failed."""
        attempt, placement = current.attempt, current.placement
        name = workload.workload_name(ref.name, attempt)
        attempts = [
            *state.attempts,
            st.build_attempt(placement, attempt, name, st.OUTCOME_OOM, why),
        ]
        if attempt + 1 >= self.config.max_attempts:
            self._exhausted(
                ref,
                state,
                attempts,
                f"{name} ran out of memory on {placement.resource}: {why}; "
                f"{attempt + 1} of {self.config.max_attempts} attempts used",
            )
            return
        spec = dljob.parse_spec(body.get("spec") or {})
        prediction = state.prediction
        if prediction is None:
            raise api_errors.ApiError("status.prediction vanished from a placed DLJob")
        with self._placement_lock:
            try:
                decided = policy.escalate(
                    placement, self.inventory.snapshot(), spec.placement, prediction
                )
            except policy.NoFit as e:
                self._exhausted(
                    ref, state, attempts, f"{name} ran out of memory on {placement.resource}: {e}"
                )
                return
            new = decided.placement
            self.inventory.assume(self._manifest(ref, spec, prediction, new, attempt + 1))
        self.metrics.oom_escalations.labels(outcome=metrics.EscalationOutcome.ESCALATED).inc()
        self.metrics.placements.labels(
            profile=workload.profile_label(new), outcome=metrics.PlacementOutcome.ESCALATED
        ).inc()
        escalated = st.progress(
            Phase.PLACED,
            placement=st.build_placement_status(new, attempt + 1),
            attempts=attempts,
            **_plan_fields(decided.plan),
        ).then(
            st.Patch(
                conditions=(
                    self._condition(Cond.PLACED, True, Reason.ESCALATED, new.reason),
                    self._condition(Cond.WORKLOAD_READY, False, Reason.OOM, why),
                )
            )
        )
        state = self._write(ref, state, escalated)
        self.events.emit(
            ref,
            EventType.WARNING,
            Reason.ESCALATED,
            f"{name} ran out of memory on {placement.resource} ({why}); {new.reason}",
        )
        self._next_attempt(ref, spec, state, prediction, st.PlacedAttempt(new, attempt + 1))

    def _replace_lost(
        self,
        ref: DLJobRef,
        spec: dljob.DLJobSpec,
        state: st.DLJobStatus,
        lost: st.PlacedAttempt,
        why: str,
    ) -> None:
        """The workload of attempt n is gone before it finished (deleted by hand, evicted):
        attempt n + 1, placed afresh, or Failed when the attempts are used up."""
        attempt = lost.attempt
        name = workload.workload_name(ref.name, attempt)
        attempts = [
            *state.attempts,
            st.build_attempt(lost.placement, attempt, name, st.OUTCOME_DELETED, why),
        ]
        prediction = state.prediction
        if attempt + 1 >= self.config.max_attempts or prediction is None:
            self._fail(
                ref,
                state,
                st.Patch({"attempts": attempts}),
                Cond.WORKLOAD_READY,
                Reason.WORKLOAD_DELETED,
                f"{why}; {attempt + 1} of {self.config.max_attempts} attempts used",
            )
            return
        with self._placement_lock:
            try:
                decided = policy.decide(prediction, self.inventory.snapshot(), spec.placement)
            except (policy.NoFit, policy.CoverageError) as e:
                self._fail(
                    ref,
                    state,
                    st.Patch({"attempts": attempts}),
                    Cond.WORKLOAD_READY,
                    Reason.WORKLOAD_DELETED,
                    f"{why}, and no GPU is left for another attempt: {e}",
                )
                return
            new = decided.placement
            self.inventory.assume(self._manifest(ref, spec, prediction, new, attempt + 1))
        message = f"{why}; attempt {attempt + 1} on {new.resource}"
        replaced = st.progress(
            Phase.PLACED,
            placement=st.build_placement_status(new, attempt + 1),
            attempts=attempts,
            **_plan_fields(decided.plan),
        ).then(
            st.Patch(
                conditions=(
                    self._condition(Cond.PLACED, True, Reason.PLACED, new.reason),
                    self._condition(Cond.WORKLOAD_READY, False, Reason.WORKLOAD_DELETED, message),
                )
            )
        )
        state = self._write(ref, state, replaced)
        self.events.emit(ref, EventType.WARNING, Reason.WORKLOAD_DELETED, message)
        self._next_attempt(ref, spec, state, prediction, st.PlacedAttempt(new, attempt + 1))

    def _next_attempt(
        self,
        ref: DLJobRef,
        spec: dljob.DLJobSpec,
        state: st.DLJobStatus,
        prediction: Prediction,
        placed: st.PlacedAttempt,
    ) -> None:
        """Create the new attempt's workload; a pod event is not retried by kopf, so a failure
        here (transient ones were retried by the create) fails the DLJob."""
        try:
            self._ensure_workload(ref, spec, prediction, placed)
        except _StepError as e:
            self._fail(ref, state, st.Patch(), e.condition, e.reason, e.message)

    def _exhausted(
        self,
        ref: DLJobRef,
        state: st.DLJobStatus,
        attempts: list[st.AttemptRecord],
        message: str,
    ) -> None:
        self.metrics.oom_escalations.labels(outcome=metrics.EscalationOutcome.EXHAUSTED).inc()
        self._fail(
            ref,
            state,
            st.Patch({"attempts": attempts}),
            Cond.WORKLOAD_READY,
            Reason.OOM_RETRIES_EXHAUSTED,
            message,
        )

    # -- helpers --------------------------------------------------------------------------------

    def _write(self, ref: DLJobRef, state: st.DLJobStatus, patch: st.Patch) -> st.DLJobStatus:
        """Write `patch` against `state`; the status as stored, read again."""
        return st.read(self.cluster.patch_status(ref, patch.body(state)))

    def _condition(
        self, kind: dljob.ConditionType, ok: bool, reason: dljob.Reason, message: str
    ) -> st.Condition:
        return st.build_condition(kind, ok, reason, message, self.clock())

    @contextmanager
    def _timed(self, step: metrics.ReconcileStep) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.metrics.reconcile_duration.labels(step=step).observe(time.perf_counter() - start)


async def in_thread(pool: Executor | None, fn: Callable[..., _T], *args: Any) -> _T:
    """`fn(*args)` on a thread of `pool`, awaited, in a copy of the caller's context (kopf finds
    its settings for posting events there, as in the threads it runs sync handlers on)."""
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(pool, context.run, fn, *args)


def _workload_error(error: api_errors.ApiError) -> _StepError:
    """What a refused workload create means for the DLJob."""
    message = str(error)
    if isinstance(error, api_errors.QuotaExceededError):
        return _StepError(
            Cond.WORKLOAD_READY,
            Reason.QUOTA_EXCEEDED,
            f"{message}; the workload is created once the namespace quota has room",
            patient=True,
        )
    if isinstance(error, api_errors.InvalidObjectError):
        return _StepError(
            Cond.WORKLOAD_READY,
            Reason.INVALID_TEMPLATE,
            f"the API server refuses the pod built from spec.template: {message}",
        )
    return _StepError(
        Cond.WORKLOAD_READY, Reason.WORKLOAD_FAILED, message, transient=error.transient
    )


_NO_FIT_REASONS = {
    policy.NoFitCause.NOTHING_FITS: Reason.NO_FIT,
    policy.NoFitCause.PRODUCT_ABSENT: Reason.GPU_PRODUCT_NOT_IN_CLUSTER,
    policy.NoFitCause.NO_MATCHING_NODE: Reason.NO_MATCHING_NODE,
    policy.NoFitCause.TOO_MANY_REPLICAS: Reason.TOO_MANY_REPLICAS,
}
"""The Placed reason of each cause placement gives for placing nothing."""


def _plan_fields(made: plan.Plan | None) -> dict[str, Any]:
    """`status.plan` for a plan (every candidate, ranked), nothing without one."""
    return {} if made is None else {"plan": plan.to_status(made)}


def _coverage_advice(prediction: Prediction, request: policy.Request) -> str:
    """Why the requested coverage cannot be served, and what to change."""
    return (
        f"the predictor's upper bound is calibrated to cover {prediction.coverage:.0%} of peaks "
        f"and the DLJob asks for {request.coverage:.0%}; set spec.placement.coverage to "
        f"{prediction.coverage:g} or less, or ask the admin for a checkpoint calibrated at "
        f"{request.coverage:g} (KUBESEER_PREDICTOR_CHECKPOINT)"
    )


def _describe_prediction(p: Prediction) -> str:
    return (
        f"peak memory {p.memory_bytes.point / units.MIB:.0f} MiB, upper bound "
        f"{p.memory_bytes.upper / units.MIB:.0f} MiB at {p.coverage:.0%} coverage; "
        f"SM utilisation {p.sm_util_percent.point:.0f}%; step time "
        f"{p.step_time_s.point * 1e3:.1f} ms (predictor {p.predictor_version}, "
        f"labels from {p.label_device})"
    )

"""The DLJob state machine: plain functions over `status.phase`, each step safe to repeat.

```
(none) -> Pending -> Fetching -> Predicting -> Placed -> Running -> Succeeded
                        |            |          ^ | | |
                        |            |          +-+ | +-- OOM, or workload deleted --> attempt + 1
                        |            |        moved |
                        v            v              |
                      Failed <-------+--------------+---- invalid spec, corrupt or unreachable
                                                          model, no fit, attempts exhausted, pod
                                                          failure, pods refused at admission
```

This module takes a DLJob from its spec to a placed workload; the rest of the machine lives
beside it, one job per module: `placing` chooses each attempt's device, `launch` creates its Job
through the GPU backend (`backends`: extended resources or DRA), `outcomes` moves the DLJob on
from what became of the Job, `allocations` records the device DRA allocated, `waiting` says
why a Job lacks pods and moves pods that wait unschedulable (`stalls` notices both; `sweep`),
`journal` writes the status and events, `explain` holds the reasons. Every step reads the
DLJob's status once into a `status.DLJobStatus`, answers with one `status.Patch`, and the steps
of one reconcile are written together; a restarted operator resumes a DLJob from its status,
and the workload's deterministic name makes a repeated create a no-op. The effects (API server,
model fetching, events) come in as narrow protocols (`ports`), so the whole machine is tested
without a cluster.

A reconcile runs on two thread pools: the model download on the fetch pool, everything else on
the work pool. A model server that trickles bytes holds a fetch thread, never the threads that
predict and place every other DLJob, and a DLJob deleted meanwhile cancels its download.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from kubeseer import metrics
from kubeseer.operator import (
    allocations,
    backends,
    dljob,
    explain,
    fairpool,
    journal,
    launch,
    models,
    outcomes,
    placing,
    pods,
    ports,
    predict,
    serial,
    stalls,
    waiting,
    workload,
)
from kubeseer.operator import errors as api_errors
from kubeseer.operator import status as st
from kubeseer.operator.config import GpuBackend, OperatorConfig
from kubeseer.operator.dra import inventory as dra_inventory
from kubeseer.operator.fetch import cancel
from kubeseer.operator.fetch import errors as fetch_errors
from kubeseer.placement import policy
from kubeseer.prediction import Prediction
from kubeseer.predictor import errors as predictor_errors

_T = TypeVar("_T")
log = logging.getLogger(__name__)
Phase = dljob.Phase
Cond = dljob.ConditionType
Reason = dljob.Reason
DLJobRef = dljob.DLJobRef


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
        backend: how pods get their GPU, and the free capacity placement reads.
        events: event posting.
        operator_metrics: counters and histograms.
        config: operator settings.
        clock: current time for condition timestamps.
        work_pool: where the steps run (None: asyncio's default executor).
        fetch_pool: where downloads run, each namespace its fair share (None: the work pool).
        recheck_s: how often a DLJob whose model is downloading is looked up, so that deleting
            it cancels the download.
        monotonic: seconds for how long attempts have stalled (`stalls`).
        feedback: recalibrated bounds for fresh predictions, PerfGraphs kept for retraining
            (None: the checkpoint's bounds, nothing kept).
    """

    def __init__(
        self,
        *,
        cluster: ports.Cluster,
        models: ports.ModelLoader,
        predictor: predict.CachedPredictor,
        backend: backends.Backend,
        events: ports.Events,
        operator_metrics: metrics.OperatorMetrics,
        config: OperatorConfig,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        work_pool: Executor | None = None,
        fetch_pool: fairpool.FairPool | None = None,
        feedback: ports.Feedback | None = None,
        recheck_s: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cluster = cluster
        self.models = models
        self.predictor = predictor
        self.backend = backend
        self.metrics = operator_metrics
        self.config = config
        self.work_pool = work_pool
        self.fetch_pool = fetch_pool
        self.feedback = feedback
        self.recheck_s = recheck_s
        self.log = journal.Journal(cluster, events, operator_metrics, config, clock)
        self.placer = placing.Placer(
            backend,
            self.log,
            operator_metrics,
            config.scheduler_name,
            open_kinds=config.scheduler_extender,
        )
        self.launcher = launch.Launcher(cluster, backend, self.log)
        self.locks = locks = serial.KeyedLocks()
        self.outcomes = outcomes.Outcomes(
            cluster, self.log, self.placer, self.launcher, operator_metrics, config, locks
        )
        devices = (
            backend.inventory.device
            if isinstance(backend, backends.DynamicResources)
            else _no_device
        )
        self.allocations = allocations.Allocations(cluster, self.log, devices, locks)
        # Moves are for pods pinned to one kind of device: under DRA the claim's ladder, and with
        # the extender the pods' node affinity, already admit the other kinds.
        moves = (
            backend.kind is GpuBackend.EXTENDED
            and not config.scheduler_extender
            and config.move_after_s > 0
        )
        self.stalls: stalls.StallWatch[backends.Attempt] = stalls.StallWatch(
            config.move_after_s if moves else 0.0, monotonic
        )
        self.waiting = waiting.Waiting(
            cluster, self.log, self.placer, self.launcher, self.stalls, locks, moves=moves
        )

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
        try:
            while not (await asyncio.wait({fetching}, timeout=self.recheck_s))[0]:
                if not await in_thread(self.work_pool, self._still_wanted, ref):
                    cancellation.cancel()
        except asyncio.CancelledError:
            # The operator is stopping: the download stops with it rather than holding the
            # shutdown (the next operator fetches again; the model cache keeps what is whole).
            cancellation.cancel()
            fetching.cancel()
            raise
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
            return self.log.step_failed(
                ref,
                state,
                st.Patch(),
                journal.StepError(Cond.ACCEPTED, Reason.INVALID_SPEC, str(e)),
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
                    self.log.condition(
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
        state = self.log.write(ref, state, accepted.then(st.progress(Phase.FETCHING)))
        return _ModelNeeded(ref, spec, state)

    def _load(
        self, need: _ModelNeeded, cancellation: cancel.Cancellation
    ) -> models.LoadedModel | fetch_errors.FetchError:
        """The model, or why not (run on the fetch pool; failures are the next step's input)."""
        with self.log.timed(metrics.ReconcileStep.FETCH):
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
            error = journal.StepError(
                Cond.MODEL_READY,
                explain.MODEL_REASONS[loaded.failure],
                str(loaded),
                transient=loaded.transient,
            )
            return self.log.step_failed(ref, state, st.Patch(), error, retry)
        try:
            ready = st.Patch(
                conditions=(
                    self.log.condition(Cond.MODEL_READY, True, Reason.FETCHED, loaded.describe()),
                )
            )
            if not self.predictor.is_cached(loaded.digest, spec):
                state = self.log.write(ref, state, ready.then(st.progress(Phase.PREDICTING)))
                ready = st.Patch()
            with self.log.timed(metrics.ReconcileStep.PREDICT):
                prediction = self.predictor.predict(loaded.path, loaded.digest, spec)
            if self.feedback is not None:
                self.feedback.model_loaded(loaded.path, loaded.digest, spec)
        except predictor_errors.PredictionError as e:
            error = journal.StepError(Cond.PREDICTED, predict.reason(e), str(e))
            return self.log.step_failed(ref, state, ready, error, retry)
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
            (self.log.condition(Cond.ACCEPTED, True, Reason.ACCEPTED, "spec is valid"),),
        )

    def _predicted(self, prediction: Prediction) -> st.Patch:
        return st.Patch(
            {"prediction": st.build_prediction_status(prediction)},
            (
                self.log.condition(
                    Cond.PREDICTED, True, Reason.PREDICTED, explain.describe_prediction(prediction)
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
                attempt, placing_patch = self.placer.first(ref, spec, prediction)
                state = self.log.write(ref, state, pending.then(placing_patch))
                pending = st.Patch()
                self._announce(ref, spec, prediction, attempt.placed.placement)
            else:
                if pending.fields or pending.conditions:
                    state = self.log.write(ref, state, pending)
                    pending = st.Patch()
                attempt = self.placer.again(ref, spec, prediction, state, placed)
            launched = self.launcher.ensure(attempt)
        except journal.StepError as e:
            return self.log.step_failed(ref, state, pending, e, retry)
        if launched is not backends.Launched.RUNNING and state.reason is not None:
            self._clear_retry_reason(ref, state)
        return Phase.PLACED

    def _clear_retry_reason(self, ref: DLJobRef, seen: st.DLJobStatus) -> None:
        """A retry's reason (a quota on Jobs, an outage) no longer holds: the Job exists.

        By now the Job runs and its events may already have moved the DLJob on (Running), so
        the reason is cleared under the DLJob's lock, from its status read again, and only while
        it still says what this reconcile saw.
        """
        with self.locks.hold(f"{ref.namespace}/{ref.name}"):
            body = self.cluster.get_dljob(ref.namespace, ref.name)
            now = st.read((body or {}).get("status") or {})
            if (
                now.phase is Phase.PLACED
                and now.reason == seen.reason
                and now.placed == seen.placed
            ):
                self.log.write(ref, now, st.progress(Phase.PLACED))

    def _announce(
        self,
        ref: DLJobRef,
        spec: dljob.DLJobSpec,
        prediction: Prediction,
        placement: policy.Placement,
    ) -> None:
        """The Placed event, a warning for each kernel launch limit the batch crosses (no
        GPU cures those, so the job is placed as predicted and the user told), and one for
        each GPU request of the template replaced."""
        self.log.emit(
            ref, ports.EventType.NORMAL, Reason.PLACED, explain.placed_event(prediction, placement)
        )
        for limit in prediction.launch_limits:
            self.log.emit(ref, ports.EventType.WARNING, Reason.LAUNCH_LIMIT, limit)
        for request in workload.gpu_requests_replaced(spec.template):
            self.log.emit(
                ref,
                ports.EventType.WARNING,
                Reason.GPU_LIMIT_REPLACED,
                f"{request} is replaced by 1 {placement.resource}: kubeseer chooses the GPU",
            )

    def _check_running(self, ref: DLJobRef, spec: dljob.DLJobSpec, state: st.DLJobStatus) -> Phase:
        """A Running DLJob found at start-up: its Job may have gone while no operator ran."""
        placed = state.placed
        if placed is None:
            return Phase.RUNNING
        name = outcomes.placed_name(ref, placed)
        if self.cluster.job_exists(ref.namespace, name):
            return Phase.RUNNING
        self.outcomes.replace_lost(
            ref, spec, state, placed, f"Job {name} was deleted before it finished"
        )
        body = self.cluster.get_dljob(ref.namespace, ref.name)
        return st.read_phase((body or {}).get("status") or {}) or Phase.RUNNING

    # -- attempts that do not start -----------------------------------------------------------

    def sweep(self) -> None:
        """Look at every attempt whose Job lacks pods or whose pods wait unschedulable, as far
        as is due now (`stalls`, `waiting`); the operator's sweep thread calls this every
        second. An API failure is logged and the stall looked at again later."""
        for stall in self.stalls.due():
            try:
                self.waiting.look(stall)
            except api_errors.ApiError as e:
                log.warning("looking at the stalled Job %s: %s", stall.key, e)

    # -- what became of the workload ------------------------------------------------------------

    def observe_workload(
        self, namespace: str, dljob_name: str, attempt: int, verdict: pods.Verdict
    ) -> None:
        """Move the DLJob on from its Job's outcome (`outcomes.Outcomes.observe`)."""
        self.outcomes.observe(namespace, dljob_name, attempt, verdict)

    def observe_allocation(
        self, namespace: str, dljob_name: str, attempt: int, claim: Mapping[str, Any]
    ) -> None:
        """Record the device DRA allocated to a claim of the attempt
        (`allocations.Allocations.observe`)."""
        self.allocations.observe(namespace, dljob_name, attempt, claim)


async def in_thread(pool: Executor | None, fn: Callable[..., _T], *args: Any) -> _T:
    """`fn(*args)` on a thread of `pool`, awaited, in a copy of the caller's context (kopf finds
    its settings for posting events there, as in the threads it runs sync handlers on)."""
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(pool, context.run, fn, *args)


def _no_device(key: dra_inventory.DeviceKey) -> dra_inventory.Device | None:
    """No published devices: the extended-resource backend allocates none."""
    return None

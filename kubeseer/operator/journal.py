"""Writing down what happened to a DLJob: its status, its events, and how a failed step ends.

Every step of the state machine answers with a `status.Patch`; `Journal.write` merges it into
the status it was made for and reads the stored status back. A step that cannot go on raises a
`StepError`; `Journal.step_failed` turns it into a retry later (`RetryLaterError`, for kopf's
TemporaryError) or a Failed DLJob (`DLJobFailedError`), with the reason in the status, a
condition and a Warning event either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any, NoReturn

from kubeseer import metrics
from kubeseer.operator import dljob, ports
from kubeseer.operator import status as st
from kubeseer.operator.config import OperatorConfig

Phase = dljob.Phase


class RetryLaterError(Exception):
    """A step failed transiently; run the reconcile again after `delay` seconds."""

    def __init__(self, message: str, delay: float) -> None:
        super().__init__(message)
        self.delay = delay


class DLJobFailedError(Exception):
    """The DLJob was marked Failed; nothing more will be done for it."""


class StepError(Exception):
    """A reconcile step failed: the condition it sets, why, and whether to retry.

    `patient` failures (a namespace quota) are retried for as long as they last, the others at
    most `max_retries` times. `fields` go into the status with the failure (the plan of a job
    that fits nothing).
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


class Journal:
    """Status writes, conditions, events and step timings of one operator.

    Args:
        cluster: where the status is written.
        events: where events are posted.
        operator_metrics: step durations.
        config: retries and their delay.
        clock: condition timestamps.
    """

    def __init__(
        self,
        cluster: ports.Cluster,
        events: ports.Events,
        operator_metrics: metrics.OperatorMetrics,
        config: OperatorConfig,
        clock: Callable[[], datetime],
    ) -> None:
        self.cluster = cluster
        self.events = events
        self.metrics = operator_metrics
        self.config = config
        self.clock = clock

    def write(self, ref: dljob.DLJobRef, state: st.DLJobStatus, patch: st.Patch) -> st.DLJobStatus:
        """Write `patch` against `state`; the status as stored, read again."""
        return st.read(self.cluster.patch_status(ref, patch.body(state)))

    def condition(
        self, kind: dljob.ConditionType, ok: bool, reason: dljob.Reason, message: str
    ) -> st.Condition:
        """A condition stamped now."""
        return st.build_condition(kind, ok, reason, message, self.clock())

    def conditions(self, *entries: st.Condition) -> st.Patch:
        """A patch that sets these conditions."""
        return st.Patch(conditions=entries)

    def emit(
        self, ref: dljob.DLJobRef, kind: ports.EventType, reason: dljob.Reason, message: str
    ) -> None:
        """Post one event about the DLJob."""
        self.events.emit(ref, kind, reason, message)

    def fail(
        self,
        ref: dljob.DLJobRef,
        state: st.DLJobStatus,
        pending: st.Patch,
        condition: dljob.ConditionType,
        reason: dljob.Reason,
        message: str,
    ) -> None:
        """Mark the DLJob Failed with what is pending, and say why in an event."""
        failed = st.setback(Phase.FAILED, condition, reason, message, self.clock())
        self.write(ref, state, pending.then(failed))
        self.emit(ref, ports.EventType.WARNING, reason, message)

    def step_failed(
        self,
        ref: dljob.DLJobRef,
        state: st.DLJobStatus,
        pending: st.Patch,
        error: StepError,
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
            self.write(
                ref,
                state,
                pending.then(
                    st.setback(waiting, error.condition, error.reason, message, self.clock())
                ),
            )
            self.emit(ref, ports.EventType.WARNING, error.reason, message)
            raise RetryLaterError(message, delay)
        self.fail(ref, state, pending, error.condition, error.reason, error.message)
        raise DLJobFailedError(f"{error.reason}: {error.message}")

    @contextmanager
    def timed(self, step: metrics.ReconcileStep) -> Iterator[None]:
        """Count the block's duration as one reconcile step."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.metrics.reconcile_duration.labels(step=step).observe(time.perf_counter() - start)

"""What became of an attempt's workload, and the DLJob's next step.

```
Placed --running--> Running --succeeded--> Succeeded
   |                   |
   +---- OOM ----------+--> attempt n + 1 on a larger device (policy.escalate), or Failed
   +---- deleted ------+--> attempt n + 1 placed afresh, or Failed
   +---- failed -------+--> Failed
```

Each outcome is read from the DLJob's status as stored, so an outcome seen twice (a watch that
restarts, a second event of one failure) finds the DLJob in a later phase or attempt and changes
nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubeseer import metrics
from kubeseer.operator import (
    backends,
    dljob,
    journal,
    launch,
    placing,
    pods,
    ports,
    serial,
    workload,
)
from kubeseer.operator import errors as api_errors
from kubeseer.operator import status as st
from kubeseer.operator.config import OperatorConfig
from kubeseer.placement import policy

Phase = dljob.Phase
Cond = dljob.ConditionType
Reason = dljob.Reason


class Outcomes:
    """Moves DLJobs on from their workloads' outcomes.

    Args:
        cluster: DLJob reads.
        log: status writes and events.
        placer: the next attempt's device.
        launcher: the next attempt's workload.
        operator_metrics: escalation counters.
        config: the attempt limit.
        locks: one DLJob's events one at a time.
    """

    def __init__(
        self,
        cluster: ports.Cluster,
        log: journal.Journal,
        placer: placing.Placer,
        launcher: launch.Launcher,
        operator_metrics: metrics.OperatorMetrics,
        config: OperatorConfig,
        locks: serial.KeyedLocks,
    ) -> None:
        self.cluster = cluster
        self.log = log
        self.placer = placer
        self.launcher = launcher
        self.metrics = operator_metrics
        self.config = config
        self.locks = locks

    def observe(self, namespace: str, dljob_name: str, attempt: int, verdict: pods.Verdict) -> None:
        """Move the DLJob on from its Job's outcome; stale attempts are ignored."""
        if verdict.outcome is pods.PodOutcome.PENDING:
            return
        with self.locks.hold(f"{namespace}/{dljob_name}"):
            body = self.cluster.get_dljob(namespace, dljob_name)
            if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
                return
            state = st.read(body.get("status") or {})
            placed = state.placed
            if state.phase is None or state.phase.terminal or placed is None:
                return
            if placed.attempt != attempt:
                return
            ref = dljob.DLJobRef(namespace, dljob_name, str(body["metadata"]["uid"]))
            with self.log.timed(metrics.ReconcileStep.POD_EVENT):
                self._move_on(ref, body, state, placed, verdict)

    def _move_on(
        self,
        ref: dljob.DLJobRef,
        body: Mapping[str, Any],
        state: st.DLJobStatus,
        placed: st.PlacedAttempt,
        verdict: pods.Verdict,
    ) -> None:
        name = placed_name(ref, placed)
        where = _where(state, placed)
        outcome = verdict.outcome
        if outcome is pods.PodOutcome.RUNNING:
            if state.phase is Phase.PLACED:
                message = f"Job {name} is running on {where}"
                running = self.log.condition(Cond.WORKLOAD_READY, True, Reason.RUNNING, message)
                self.log.write(
                    ref, state, st.progress(Phase.RUNNING).then(self.log.conditions(running))
                )
        elif outcome is pods.PodOutcome.SUCCEEDED:
            message = f"Job {name} succeeded on {where}"
            record = st.build_attempt(placed.placement, placed.attempt, name, st.OUTCOME_SUCCEEDED)
            done = self.log.condition(Cond.WORKLOAD_READY, True, Reason.SUCCEEDED, message)
            self.log.write(
                ref,
                state,
                st.progress(Phase.SUCCEEDED, attempts=[*state.attempts, record]).then(
                    self.log.conditions(done)
                ),
            )
            self.log.emit(ref, ports.EventType.NORMAL, Reason.SUCCEEDED, message)
        elif outcome is pods.PodOutcome.FAILED:
            record = st.build_attempt(
                placed.placement, placed.attempt, name, st.OUTCOME_FAILED, verdict.message
            )
            self.log.fail(
                ref,
                state,
                st.Patch({"attempts": [*state.attempts, record]}),
                Cond.WORKLOAD_READY,
                Reason.POD_FAILED,
                f"Job {name} failed: {verdict.message}",
            )
        elif outcome is pods.PodOutcome.DELETED:
            spec = dljob.parse_spec(body.get("spec") or {})
            self.replace_lost(ref, spec, state, placed, verdict.message)
        else:
            ran = self.placer.as_run(placed, verdict.node)
            self._escalate(ref, body, state, ran, verdict.message)

    def _escalate(
        self,
        ref: dljob.DLJobRef,
        body: Mapping[str, Any],
        state: st.DLJobStatus,
        current: st.PlacedAttempt,
        why: str,
    ) -> None:
        """Attempt n ran out of memory: attempt n + 1 on a larger device, or Failed."""
        attempt, placement = current.attempt, current.placement
        name = placed_name(ref, current)
        attempts = [
            *state.attempts,
            st.build_attempt(placement, attempt, name, st.OUTCOME_OOM, why),
        ]
        if attempt + 1 >= self.config.max_attempts:
            self._exhausted(
                ref,
                state,
                attempts,
                f"Job {name} ran out of memory on {placement.resource}: {why}; "
                f"{attempt + 1} of {self.config.max_attempts} attempts used",
            )
            return
        spec = dljob.parse_spec(body.get("spec") or {})
        prediction = state.prediction
        if prediction is None:
            raise api_errors.ApiError("status.prediction vanished from a placed DLJob")
        try:
            nxt = self.placer.after_oom(ref, spec, prediction, current)
        except policy.NoFit as e:
            self._exhausted(
                ref, state, attempts, f"Job {name} ran out of memory on {placement.resource}: {e}"
            )
            return
        self.metrics.oom_escalations.labels(outcome=metrics.EscalationOutcome.ESCALATED).inc()
        new = nxt.placed.placement
        escalated = self._next_placed(nxt, attempts, Reason.ESCALATED, Reason.OOM, why)
        state = self.log.write(ref, state, escalated)
        self.log.emit(
            ref,
            ports.EventType.WARNING,
            Reason.ESCALATED,
            f"Job {name} ran out of memory on {placement.resource} ({why}); {new.reason}",
        )
        self.launcher.next_attempt(state, nxt)

    def replace_lost(
        self,
        ref: dljob.DLJobRef,
        spec: dljob.DLJobSpec,
        state: st.DLJobStatus,
        lost: st.PlacedAttempt,
        why: str,
    ) -> None:
        """The workload of attempt n is gone before it finished (deleted by hand, evicted):
        attempt n + 1, placed afresh, or Failed when the attempts are used up."""
        attempt = lost.attempt
        name = placed_name(ref, lost)
        attempts = [
            *state.attempts,
            st.build_attempt(lost.placement, attempt, name, st.OUTCOME_DELETED, why),
        ]
        prediction = state.prediction
        if attempt + 1 >= self.config.max_attempts or prediction is None:
            self.log.fail(
                ref,
                state,
                st.Patch({"attempts": attempts}),
                Cond.WORKLOAD_READY,
                Reason.WORKLOAD_DELETED,
                f"{why}; {attempt + 1} of {self.config.max_attempts} attempts used",
            )
            return
        try:
            nxt = self.placer.after_loss(ref, spec, prediction, attempt)
        except (policy.NoFit, policy.CoverageError) as e:
            self.log.fail(
                ref,
                state,
                st.Patch({"attempts": attempts}),
                Cond.WORKLOAD_READY,
                Reason.WORKLOAD_DELETED,
                f"{why}, and no GPU is left for another attempt: {e}",
            )
            return
        message = f"{why}; attempt {attempt + 1} on {nxt.placed.placement.resource}"
        replaced = self._next_placed(nxt, attempts, Reason.PLACED, Reason.WORKLOAD_DELETED, message)
        state = self.log.write(ref, state, replaced)
        self.log.emit(ref, ports.EventType.WARNING, Reason.WORKLOAD_DELETED, message)
        self.launcher.next_attempt(state, nxt)

    def _next_placed(
        self,
        nxt: backends.Attempt,
        attempts: list[st.AttemptRecord],
        placed: Reason,
        ready: Reason,
        message: str,
    ) -> st.Patch:
        """The patch that moves the DLJob to its next attempt: Placed on `nxt`'s device with
        its plan, the finished attempts recorded, the last allocation gone."""
        new = nxt.placed.placement
        return st.progress(
            Phase.PLACED,
            placement=st.build_placement_status(new, nxt.placed.attempt),
            attempts=attempts,
            allocation=None,
            **placing.plan_fields(nxt.plan),
        ).then(
            self.log.conditions(
                self.log.condition(Cond.PLACED, True, placed, new.reason),
                self.log.condition(Cond.WORKLOAD_READY, False, ready, message),
            )
        )

    def _exhausted(
        self,
        ref: dljob.DLJobRef,
        state: st.DLJobStatus,
        attempts: list[st.AttemptRecord],
        message: str,
    ) -> None:
        self.metrics.oom_escalations.labels(outcome=metrics.EscalationOutcome.EXHAUSTED).inc()
        self.log.fail(
            ref,
            state,
            st.Patch({"attempts": attempts}),
            Cond.WORKLOAD_READY,
            Reason.OOM_RETRIES_EXHAUSTED,
            message,
        )


def placed_name(ref: dljob.DLJobRef, placed: st.PlacedAttempt) -> str:
    """The attempt's Job."""
    return workload.workload_name(ref.name, placed.attempt)


def _where(state: st.DLJobStatus, placed: st.PlacedAttempt) -> str:
    """The device the attempt runs on: what DRA allocated, else the placement's resource."""
    allocation = state.allocation or {}
    if allocation.get("attempt") == placed.attempt and allocation.get("device"):
        return f"{allocation['device']} ({placed.placement.resource})"
    return placed.placement.resource

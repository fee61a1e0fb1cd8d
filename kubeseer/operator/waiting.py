"""An attempt whose Job does not start: what the DLJob says, and what the operator does about it.

`stalls.StallWatch` notices; `Waiting.look` acts, on the operator's sweep thread:

* **Pods refused at admission.** The Job controller, not the operator, creates an attempt's
  pods, so admission refuses the Job controller; its `FailedCreate` events (`refusals`) say why.
  A namespace quota makes the DLJob wait, `Placed` with reason `QuotaExceeded`, until the pods
  are created, which clears it (`PodsCreated`); an API server or webhook that cannot answer
  makes it wait with `PodsNotCreated`; a refusal of the pod as written (Pod Security, a
  LimitRange, a policy or webhook that denies it) fails it with `PodsRefused`, quoting the
  refusal, and suspends the Job so that its controller stops trying.
* **Pods unschedulable on a busy kind while another is free** (extended resources, the kind
  pinned by `nodeSelector`). The scheduler only knows the kind the pods ask for, so a pod queued
  on a busy `1g.10gb` waits there while a `2g.20gb` that also holds the job stands idle. Once
  every pod of the attempt has been unschedulable for `KUBESEER_MOVE_AFTER_S` and the plan, made
  again, has a free rung of another kind while its own kind has no room for it, the attempt
  moves there: the Job is suspended (the Job controller deletes the pending pods and resets the
  Job), the new placement is written, and once the Job is reset it is given the new resource and
  node selection and resumed (KEP-5440 and mutable scheduling directives of suspended Jobs).
  Under DRA the claim's `firstAvailable` ladder already lets the scheduler take any free rung,
  and with the scheduler extender the pods already admit every kind of the rung's resource.

The Job is suspended before the placement is written: an operator that stops in between leaves
a suspended Job whose DLJob still names the old placement, and the next operator's reconcile
resumes it there; one that stops after finds the new placement and finishes the move.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kubeseer.operator import backends, dljob, journal, launch, placing, ports, refusals, serial
from kubeseer.operator import errors as api_errors
from kubeseer.operator import stalls as stall_watch
from kubeseer.operator import status as st
from kubeseer.placement import policy

Phase = dljob.Phase
Cond = dljob.ConditionType
Reason = dljob.Reason
StallKind = stall_watch.StallKind

SUSPEND_PATCH: Mapping[str, Any] = {"spec": {"suspend": True}}
"""The merge patch that stops a Job: its controller deletes its active pods and creates none."""

_WAITING_REASONS = frozenset({Reason.QUOTA_EXCEEDED.value, Reason.PODS_NOT_CREATED.value})
"""Reasons a Placed DLJob shows while its Job cannot create its pods."""


@dataclass(frozen=True)
class _Current:
    """The DLJob of a stalled attempt, as stored, while that attempt is still its current one."""

    ref: dljob.DLJobRef
    body: Mapping[str, Any]
    state: st.DLJobStatus
    placed: st.PlacedAttempt


class Waiting:
    """Says why attempts wait, and moves those that wait for nothing.

    Args:
        cluster: DLJob reads, Job events, Job patches.
        log: status writes and events.
        placer: a move's device.
        launcher: a moved Job's new device.
        stalls: the attempts followed (and the moves started).
        locks: one DLJob's events one at a time.
        moves: whether unschedulable attempts may move (extended resources, kind pinned).
    """

    def __init__(
        self,
        cluster: ports.Cluster,
        log: journal.Journal,
        placer: placing.Placer,
        launcher: launch.Launcher,
        stalls: stall_watch.StallWatch[backends.Attempt],
        locks: serial.KeyedLocks,
        *,
        moves: bool,
    ) -> None:
        self.cluster = cluster
        self.log = log
        self.placer = placer
        self.launcher = launcher
        self.stalls = stalls
        self.locks = locks
        self.moves = moves

    def look(self, stall: stall_watch.Stall) -> None:
        """Act on one stall (`stalls.StallWatch.due`).

        Raises:
            errors.ApiError: the API server failed; the stall is due again later.
        """
        if stall.kind is StallKind.MISSING_PODS:
            self._missing_pods(stall)
        elif stall.kind is StallKind.CLEARED:
            self._pods_created(stall)
        elif stall.kind is StallKind.UNSCHEDULABLE:
            if self.moves:
                self._move(stall)
        else:
            self._resume_moved(stall)

    # -- pods refused at admission ----------------------------------------------------------------

    def _missing_pods(self, stall: stall_watch.Stall) -> None:
        events = self.cluster.list_events(stall.namespace, stall.job_uid, refusals.FAILED_CREATE)
        refusal = refusals.latest(events, since=stall.started)
        if refusal is None:
            return  # not refused (yet): the Job controller is still catching up
        with self._current(stall) as current:
            if current is None:
                return
            if refusal.kind is refusals.RefusalKind.POLICY:
                self._refused(stall, current, refusal)
                return
            if refusal.kind is refusals.RefusalKind.QUOTA:
                reason = Reason.QUOTA_EXCEEDED
                message = (
                    f"the namespace quota refuses the pods of Job {stall.job}: "
                    f"{refusal.message}; the Job controller creates them once the quota has room"
                )
            else:
                reason = Reason.PODS_NOT_CREATED
                message = (
                    f"the Job controller cannot create the pods of Job {stall.job}: "
                    f"{refusal.message}; it keeps trying"
                )
            self.stalls.reported(stall.key)
            state = current.state
            if state.reason == reason.value and state.message == message:
                return
            phase = state.phase or Phase.PLACED
            self.log.write(
                current.ref,
                state,
                st.setback(phase, Cond.WORKLOAD_READY, reason, message, self.log.clock()),
            )
            if state.reason != reason.value:
                self.log.emit(current.ref, ports.EventType.WARNING, reason, message)

    def _refused(
        self, stall: stall_watch.Stall, current: _Current, refusal: refusals.Refusal
    ) -> None:
        """Admission will refuse the pods as written on every try: the Job is suspended so that
        its controller stops trying, then the DLJob fails (so a Failed DLJob's Job is always
        stopped already; a suspension that does not go through leaves the stall to retry)."""
        self.cluster.patch_job(stall.namespace, stall.job, SUSPEND_PATCH, strategic=False)
        self.log.fail(
            current.ref,
            current.state,
            st.Patch(),
            Cond.WORKLOAD_READY,
            Reason.PODS_REFUSED,
            f"admission refuses the pods of Job {stall.job} as spec.template makes them: "
            f"{refusal.message}",
        )
        self.stalls.forget(stall.key)

    def _pods_created(self, stall: stall_watch.Stall) -> None:
        """The pods a refusal kept from being created exist now: the reason clears."""
        with self._current(stall) as current:
            if current is None:
                return
            state = current.state
            if state.phase is not Phase.PLACED or state.reason not in _WAITING_REASONS:
                return
            message = f"the Job controller created the pods of Job {stall.job}"
            created = self.log.condition(Cond.WORKLOAD_READY, False, Reason.PODS_CREATED, message)
            self.log.write(
                current.ref, state, st.progress(Phase.PLACED).then(self.log.conditions(created))
            )
            self.log.emit(
                current.ref,
                ports.EventType.NORMAL,
                Reason.PODS_CREATED,
                f"{message}, which it could not before ({state.reason}: {state.message})",
            )

    # -- pods unschedulable while another kind is free -------------------------------------------

    def _move(self, stall: stall_watch.Stall) -> None:
        """Move the attempt to a free kind of its plan, if one is free and its own has no room."""
        with self._current(stall) as current:
            if current is None or current.state.phase is not Phase.PLACED:
                return
            prediction = current.state.prediction
            if prediction is None or not self.stalls.unschedulable(stall.key):
                return  # a pod was bound meanwhile: it must not be stopped
            spec = dljob.parse_spec(current.body.get("spec") or {})
            try:
                moved = self.placer.move(current.ref, spec, prediction, current.placed)
            except (policy.NoFit, policy.CoverageError):
                return  # the ladder is empty now; its own kind may still free
            if moved is None:
                return
            try:
                self.cluster.patch_job(stall.namespace, stall.job, SUSPEND_PATCH, strategic=False)
            except api_errors.ApiError:
                self.launcher.backend.forget(moved)
                raise
            old, new = current.placed.placement, moved.placed.placement
            message = (
                f"the pods of Job {stall.job} waited {stall.waited_s:.0f} s unschedulable for "
                f"{old.resource} on {old.gpu_product}, which has no room, while {new.resource} "
                f"on {new.gpu_product} is free: moved there ({new.reason})"
            )
            moving = st.progress(
                Phase.PLACED,
                placement=st.build_placement_status(new, moved.placed.attempt),
                **placing.plan_fields(moved.plan),
            ).then(
                self.log.conditions(self.log.condition(Cond.PLACED, True, Reason.MOVED, message))
            )
            try:
                self.log.write(current.ref, current.state, moving)
            except api_errors.ApiError:
                # The placement stays the old one: the Job goes back to it.
                self.launcher.backend.forget(moved)
                self.cluster.patch_job(
                    stall.namespace, stall.job, {"spec": {"suspend": False}}, strategic=False
                )
                raise
            self.log.emit(current.ref, ports.EventType.NORMAL, Reason.MOVED, message)
            self.stalls.moving(stall.key, moved)

    def _resume_moved(self, stall: stall_watch.Stall) -> None:
        """The Job suspended to move is reset: give it its new device and resume it."""
        moved = self.stalls.take_move(stall.key)
        if moved is None:
            return
        with self._current(stall) as current:
            if current is None or not _same_device(current.placed, moved.placed):
                self.launcher.backend.forget(moved)
                return  # the DLJob moved on (deleted, failed, another attempt)
            try:
                self.launcher.ensure(moved)
            except journal.StepError as e:
                if e.transient:
                    self.stalls.moving(stall.key, moved)  # due again on the next sweep
                    return
                self.log.fail(
                    moved.ref, current.state, st.Patch(), e.condition, e.reason, e.message
                )

    @contextmanager
    def _current(self, stall: stall_watch.Stall) -> Iterator[_Current | None]:
        """The stall's DLJob under its lock, if the stalled attempt is still its current one
        and it has not finished (else None, and the Job is no longer followed)."""
        with self.locks.hold(f"{stall.namespace}/{stall.dljob}"):
            body = self.cluster.get_dljob(stall.namespace, stall.dljob)
            metadata = (body or {}).get("metadata") or {}
            state = st.read((body or {}).get("status") or {})
            placed = state.placed
            if (
                body is None
                or metadata.get("deletionTimestamp")
                or state.phase is None
                or state.phase.terminal
                or placed is None
                or placed.attempt != stall.attempt
            ):
                self.stalls.forget(stall.key)
                yield None
                return
            ref = dljob.DLJobRef(stall.namespace, stall.dljob, str(metadata.get("uid", "")))
            yield _Current(ref, body, state, placed)


def _same_device(stored: st.PlacedAttempt, moved: st.PlacedAttempt) -> bool:
    """Whether the status still names the attempt and kind of device a move chose."""
    a, b = stored.placement, moved.placement
    return (stored.attempt, a.resource, a.product_label) == (
        moved.attempt,
        b.resource,
        b.product_label,
    )

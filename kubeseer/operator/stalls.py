"""Attempts that do not start: a resumed Job that lacks pods, or pods that wait unschedulable.

Neither shows in a DLJob's own events. A Job whose pods admission refuses (a quota on pods, a
LimitRange, Pod Security, a webhook) has no pods and nothing but the Job controller's
`FailedCreate` events say why (`refusals`); a pod queued for a busy kind of device waits in
the scheduler even when another kind that holds the job frees. `StallWatch` follows the
attempts' Jobs and pods from the watches the operator has anyway (cheap, on the event loop, no
API call) and says which attempts are due for a look (`due`): one whose Job has lacked pods for
`POD_GRACE_S`, then again after twice as long, up to `RECHECK_MAX_S`; one whose every pod has
been unschedulable for `move_after_s`, then every third of that. What to do about them is
`waiting.Waiting`'s.

It also remembers, per Job, what the operator told the DLJob (a refusal, so that the pods'
creation clears it) and the move it started (so that the Job, once the Job controller has reset
it, is given its new device). That memory is lost with the process; a restarted operator finds
the stalls again from the watches' first listing, and a move half-done from the DLJob's status.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Generic, TypeVar

from kubeseer.operator import refusals, workload

POD_GRACE_S = 5.0
"""How long a resumed Job may lack pods before its events are read: the Job controller creates
them within milliseconds when idle, within seconds under a burst (its client's 20 QPS)."""
RECHECK_MAX_S = 60.0
"""The longest wait between two looks at a Job that still lacks pods (the Job controller's own
longest backoff between tries)."""
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
"""The label the Job controller puts on its pods."""

_M = TypeVar("_M")


class StallKind(StrEnum):
    """Why an attempt is due for a look."""

    MISSING_PODS = "missing pods"
    """The Job is resumed and has fewer pods than it runs in parallel."""
    CLEARED = "cleared"
    """The pods a refusal had kept from being created now exist: the DLJob's reason clears."""
    UNSCHEDULABLE = "unschedulable"
    """Every pod of the Job is unbound and the scheduler finds no node for it."""
    SUSPENDED = "suspended"
    """A Job suspended to move has been reset by the Job controller (no pods, no start time):
    it can be given its new device and resumed."""


@dataclass(frozen=True)
class Stall:
    """An attempt due for a look.

    `started` is the Job's `status.startTime` (refusals before it are history); `waited_s`
    how long it has stalled, as this operator has seen it.
    """

    kind: StallKind
    namespace: str
    job: str
    dljob: str
    attempt: int
    job_uid: str
    started: datetime | None
    waited_s: float

    @property
    def key(self) -> str:
        """The Job, as `StallWatch` keys it."""
        return f"{self.namespace}/{self.job}"


@dataclass
class _Pod:
    bound: bool
    unschedulable_since: float | None


@dataclass
class _Job(Generic[_M]):
    dljob: str
    attempt: int
    uid: str
    started: datetime | None = None
    missing_since: float | None = None
    next_missing_look: float = 0.0
    missing_looks: int = 0
    reported: bool = False
    cleared: bool = False
    next_move_look: float = 0.0
    move: _M | None = None
    reset: bool = False


class StallWatch(Generic[_M]):
    """Which attempts have stalled, kept current from Job and pod watch events.

    Thread-safe: the watches run on kopf's event loop, the looks on a sweep thread.

    Args:
        move_after_s: how long every pod of a Job must have been unschedulable before it is
            due for a move (0: never).
        clock: monotonic seconds.
    """

    def __init__(self, move_after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.move_after_s = move_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job[_M]] = {}
        self._pods: dict[str, dict[str, _Pod]] = {}

    def observe_job(self, event_type: str | None, job: Mapping[str, Any]) -> None:
        """Apply one watch event of an attempt's Job (labelled by kubeseer)."""
        metadata = job.get("metadata") or {}
        key = f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"
        owner = workload.owning_dljob(job)
        attempt = _attempt(metadata.get("labels") or {})
        now = self._clock()
        with self._lock:
            if event_type == "DELETED" or owner is None or attempt is None or _finished(job):
                self._jobs.pop(key, None)
                self._pods.pop(key, None)
                return
            entry = self._jobs.get(key)
            if entry is None or entry.uid != metadata.get("uid"):
                entry = _Job[_M](owner, attempt, str(metadata.get("uid", "")))
                self._jobs[key] = entry
            status = job.get("status") or {}
            entry.started = refusals.parse_time(str(status.get("startTime") or ""))
            suspended = workload.is_suspended(job)
            entry.reset = suspended and _reset(job)
            if suspended or _created(job) >= _parallelism(job):
                entry.missing_since = None
                entry.missing_looks = 0
                if entry.reported and not suspended:
                    entry.reported = False
                    entry.cleared = True
            elif entry.missing_since is None:
                entry.missing_since = now
                entry.next_missing_look = now + POD_GRACE_S

    def observe_pod(self, event_type: str | None, pod: Mapping[str, Any]) -> None:
        """Apply one watch event of a pod; only pods of kubeseer's Jobs are kept."""
        metadata = pod.get("metadata") or {}
        labels = metadata.get("labels") or {}
        job = labels.get(JOB_NAME_LABEL)
        if not job or workload.LABEL_DLJOB not in labels:
            return
        key = f"{metadata.get('namespace', '')}/{job}"
        name = str(metadata.get("name", ""))
        with self._lock:
            pods = self._pods.setdefault(key, {})
            if event_type == "DELETED" or metadata.get("deletionTimestamp") or _ended(pod):
                pods.pop(name, None)
                if not pods:
                    del self._pods[key]
                return
            bound = bool((pod.get("spec") or {}).get("nodeName"))
            unschedulable = not bound and _unschedulable(pod)
            known = pods.get(name)
            since = known.unschedulable_since if known is not None else None
            if unschedulable and since is None:
                since = self._clock()
                entry = self._jobs.get(key)
                if entry is not None:
                    entry.next_move_look = max(entry.next_move_look, since + self.move_after_s)
            pods[name] = _Pod(bound, since if unschedulable else None)

    def due(self) -> list[Stall]:
        """The attempts due for a look now, longest-waiting first; each is due again later."""
        now = self._clock()
        found: list[Stall] = []
        with self._lock:
            for key, entry in self._jobs.items():
                since = self._unschedulable_since(key)
                kind = self._due(entry, since, now)
                if kind is None:
                    continue
                waited = {
                    StallKind.MISSING_PODS: entry.missing_since,
                    StallKind.UNSCHEDULABLE: since,
                }.get(kind)
                namespace, job = key.split("/", 1)
                found.append(
                    Stall(
                        kind,
                        namespace,
                        job,
                        entry.dljob,
                        entry.attempt,
                        entry.uid,
                        entry.started,
                        0.0 if waited is None else now - waited,
                    )
                )
        return sorted(found, key=lambda s: -s.waited_s)

    def _due(
        self, entry: _Job[_M], unschedulable_since: float | None, now: float
    ) -> StallKind | None:
        """What the Job is due for now, if anything; the next look is scheduled here."""
        if entry.move is not None:
            return StallKind.SUSPENDED if entry.reset else None
        if entry.cleared:
            entry.cleared = False
            return StallKind.CLEARED
        if entry.missing_since is not None and now >= entry.next_missing_look:
            entry.missing_looks += 1
            wait = min(RECHECK_MAX_S, POD_GRACE_S * 2**entry.missing_looks)
            entry.next_missing_look = now + wait
            return StallKind.MISSING_PODS
        if (
            unschedulable_since is not None
            and self.move_after_s > 0
            and now - unschedulable_since >= self.move_after_s
            and now >= entry.next_move_look
        ):
            entry.next_move_look = now + max(1.0, self.move_after_s / 3)
            return StallKind.UNSCHEDULABLE
        return None

    def unschedulable(self, key: str) -> bool:
        """Whether the Job has pods and every one is unbound and unschedulable (checked again
        right before a move: a pod bound meanwhile must not be stopped)."""
        with self._lock:
            return self._unschedulable_since(key) is not None

    def reported(self, key: str) -> None:
        """The DLJob now says why the Job lacks pods: their creation is to clear it."""
        with self._lock:
            entry = self._jobs.get(key)
            if entry is not None:
                entry.reported = True

    def moving(self, key: str, move: _M) -> None:
        """The Job was suspended to move to another device: `move` is what to launch once the
        Job controller has reset it (due as `StallKind.SUSPENDED`)."""
        with self._lock:
            entry = self._jobs.get(key)
            if entry is not None:
                entry.move = move

    def take_move(self, key: str) -> _M | None:
        """The move started for the Job, now to be finished (None: none, or taken)."""
        with self._lock:
            entry = self._jobs.get(key)
            if entry is None:
                return None
            move, entry.move = entry.move, None
            return move

    def forget(self, key: str) -> None:
        """Stop following a Job (its DLJob has finished or failed)."""
        with self._lock:
            self._jobs.pop(key, None)

    def _unschedulable_since(self, key: str) -> float | None:
        """When the last of the Job's pods became unschedulable, if every one is."""
        since = [p.unschedulable_since for p in self._pods.get(key, {}).values()]
        if not since or None in since:
            return None
        return max(s for s in since if s is not None)


def _attempt(labels: Mapping[str, str]) -> int | None:
    try:
        return int(labels[workload.LABEL_ATTEMPT])
    except (KeyError, ValueError):
        return None


def _parallelism(job: Mapping[str, Any]) -> int:
    spec = job.get("spec") or {}
    return int(spec.get("parallelism", 1) if spec.get("parallelism") is not None else 1)


def _created(job: Mapping[str, Any]) -> int:
    """Pods the Job controller has created and not lost: active, succeeded or failed."""
    status = job.get("status") or {}
    return sum(int(status.get(k) or 0) for k in ("active", "succeeded", "failed"))


def _finished(job: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    )


def _reset(job: Mapping[str, Any]) -> bool:
    """A suspended Job the Job controller has caught up with: its pods gone and its start time
    cleared, so the apiserver lets its pods' node selection change (mutable scheduling
    directives are for suspended Jobs that have not started)."""
    status = job.get("status") or {}
    return not status.get("startTime") and not status.get("active")


def _ended(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _unschedulable(pod: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "PodScheduled"
        and c.get("status") == "False"
        and c.get("reason") == "Unschedulable"
        for c in (pod.get("status") or {}).get("conditions") or []
    )

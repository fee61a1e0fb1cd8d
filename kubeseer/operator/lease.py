"""Leader election over a `coordination.k8s.io/v1` Lease: of several operators, one acts.

Two operators acting on the same DLJobs each create pods and patch statuses, and their writes
cross. Before it starts kopf, an operator takes the Lease in its namespace; the others wait
until the holder stops renewing it. The rules are client-go's (`leaderelection`):

- a Lease is free when it has no holder, or when its record has not changed for
  `duration_s` by the waiting operator's own clock (no clocks are compared across machines);
- every write carries the `resourceVersion` it read, so of two operators taking a free Lease
  at once, one write fails with a conflict;
- the holder renews every `duration_s / 3`; when it cannot renew for `2 * duration_s / 3` it
  stops acting before any successor may start, so two never act at once;
- a holder that stops cleanly gives the Lease up, so its successor starts at once.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from kubeseer.operator import errors

log = logging.getLogger(__name__)


class LeaseStore(Protocol):
    """Reads and writes of one Lease (`kube.KubeCluster` has them)."""

    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Lease, or None if there is none."""
        ...

    def write_lease(self, namespace: str, lease: Mapping[str, Any]) -> dict[str, Any]:
        """Create, or replace at the `resourceVersion` read; `ConflictError` if it moved on."""
        ...


def identity() -> str:
    """This process's holder name: host, pid and a random suffix (a restarted pod differs)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _micro_time(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderLease:
    """One operator's claim on the Lease `namespace/name`.

    Args:
        store: the API calls.
        namespace, name: the Lease.
        holder: this operator's identity.
        duration_s: how long a Lease not renewed stays held.
        clock: monotonic seconds (the observation clock); wall time stamps the record only.
    """

    def __init__(
        self,
        store: LeaseStore,
        namespace: str,
        name: str,
        holder: str,
        duration_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.namespace = namespace
        self.name = name
        self.holder = holder
        self.duration_s = duration_s
        self.clock = clock
        self._observed: tuple[str, str] | None = None
        self._observed_at = 0.0
        self._renewed_at = 0.0

    @property
    def retry_s(self) -> float:
        """How often a waiting operator looks, and a holder renews."""
        return self.duration_s / 3

    def try_acquire(self) -> bool:
        """Take or renew the Lease if it is free or ours; False if another holds it."""
        now = self.clock()
        current = self.store.read_lease(self.namespace, self.name)
        wall = time.time()
        if current is None:
            lease = self._record(None, wall, transitions=0, acquired=_micro_time(wall))
            return self._write(lease, now)
        spec = current.get("spec") or {}
        held_by = str(spec.get("holderIdentity") or "")
        record = (held_by, str(spec.get("renewTime") or ""))
        if record != self._observed:
            self._observed, self._observed_at = record, now
        mine = held_by == self.holder
        expired = now >= self._observed_at + float(spec.get("leaseDurationSeconds") or 0)
        if held_by and not mine and not expired:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
        acquired = spec.get("acquireTime") if mine else _micro_time(wall)
        lease = self._record(current, wall, transitions=transitions, acquired=acquired)
        return self._write(lease, now)

    def acquire(self, stop: threading.Event) -> bool:
        """Wait until the Lease is ours (True) or `stop` is set (False)."""
        announced = False
        while not stop.is_set():
            try:
                if self.try_acquire():
                    log.info("holding Lease %s/%s as %s", self.namespace, self.name, self.holder)
                    return True
            except errors.ApiError as e:
                if not e.transient:
                    raise
                log.warning("cannot read Lease %s/%s: %s", self.namespace, self.name, e)
            if not announced:
                log.info(
                    "Lease %s/%s is held by another operator; waiting to take over",
                    self.namespace,
                    self.name,
                )
                announced = True
            stop.wait(self.retry_s)
        return False

    def hold(self, stop: threading.Event, lost: Callable[[], object]) -> None:
        """Renew until `stop` is set; call `lost` (once) when renewal fails for too long."""
        deadline = 2 * self.duration_s / 3
        while not stop.wait(self.retry_s):
            try:
                if self.try_acquire():
                    continue
            except errors.ApiError as e:
                log.warning("renewing Lease %s/%s failed: %s", self.namespace, self.name, e)
            if self.clock() - self._renewed_at >= deadline:
                log.error(
                    "lost Lease %s/%s (not renewed for %.0f s); stopping",
                    self.namespace,
                    self.name,
                    self.clock() - self._renewed_at,
                )
                lost()
                return

    def release(self) -> None:
        """Give the Lease up if it is still ours, so a successor need not wait for it."""
        try:
            current = self.store.read_lease(self.namespace, self.name)
            if current is None or (current.get("spec") or {}).get("holderIdentity") != self.holder:
                return
            released = {
                **current,
                "spec": {**current["spec"], "holderIdentity": "", "leaseDurationSeconds": 1},
            }
            self.store.write_lease(self.namespace, released)
        except errors.ApiError as e:
            log.warning("could not give up Lease %s/%s: %s", self.namespace, self.name, e)

    def _record(
        self, current: Mapping[str, Any] | None, wall: float, *, transitions: int, acquired: Any
    ) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if current is not None:
            metadata["resourceVersion"] = current["metadata"]["resourceVersion"]
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": self.holder,
                "leaseDurationSeconds": max(1, round(self.duration_s)),
                "acquireTime": acquired,
                "renewTime": _micro_time(wall),
                "leaseTransitions": transitions,
            },
        }

    def _write(self, lease: Mapping[str, Any], now: float) -> bool:
        try:
            written = self.store.write_lease(self.namespace, lease)
        except errors.ConflictError:
            return False
        spec = written.get("spec") or {}
        self._observed = (str(spec.get("holderIdentity") or ""), str(spec.get("renewTime") or ""))
        self._observed_at = self._renewed_at = now
        return True

"""Leader election over a Lease: one holder, takeover only after the holder stops renewing."""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from typing import Any

from kubeseer.operator import errors, lease


class Store:
    """One Lease with resourceVersion checks, as the API server keeps it."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.down = False

    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.down:
            raise errors.UnavailableError("503")
        return copy.deepcopy(self.lease)

    def write_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        if self.down:
            raise errors.UnavailableError("503")
        sent = body["metadata"].get("resourceVersion")
        if (self.lease is None) != (sent is None) or (
            self.lease is not None and sent != self.lease["metadata"]["resourceVersion"]
        ):
            raise errors.ConflictError("409", status=409)
        self.version += 1
        self.lease = copy.deepcopy(dict(body))
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.lease)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def claim(store: Store, clock: Clock, holder: str) -> lease.LeaderLease:
    return lease.LeaderLease(store, "kubeseer-system", "kubeseer-operator", holder, 15.0, clock)


def test_the_first_operator_takes_the_lease_and_the_second_waits() -> None:
    store, clock = Store(), Clock()
    first, second = claim(store, clock, "a"), claim(store, clock, "b")
    assert first.try_acquire()
    assert not second.try_acquire()
    clock.now += 10
    assert first.try_acquire()  # renewed
    clock.now += 10
    assert not second.try_acquire()  # renewed 10 s ago by its clock: still held
    assert store.lease is not None and store.lease["spec"]["holderIdentity"] == "a"


def test_a_holder_that_stops_renewing_is_taken_over_after_the_duration() -> None:
    store, clock = Store(), Clock()
    first, second = claim(store, clock, "a"), claim(store, clock, "b")
    assert first.try_acquire()
    assert not second.try_acquire()
    clock.now += 14
    assert not second.try_acquire()
    clock.now += 2
    assert second.try_acquire()
    assert store.lease is not None
    assert (store.lease["spec"]["holderIdentity"], store.lease["spec"]["leaseTransitions"]) == (
        "b",
        1,
    )
    assert not first.try_acquire()


def test_a_released_lease_is_taken_at_once() -> None:
    store, clock = Store(), Clock()
    first, second = claim(store, clock, "a"), claim(store, clock, "b")
    assert first.try_acquire()
    assert not second.try_acquire()
    first.release()
    assert second.try_acquire()


def test_of_two_operators_racing_for_a_free_lease_one_wins() -> None:
    store, clock = Store(), Clock()
    first, second = claim(store, clock, "a"), claim(store, clock, "b")
    # Both read "no lease"; the second write conflicts.
    read = store.read_lease
    store.read_lease = lambda ns, name: None  # type: ignore[method-assign]
    assert first.try_acquire()
    assert not second.try_acquire()
    store.read_lease = read  # type: ignore[method-assign]
    assert store.lease is not None and store.lease["spec"]["holderIdentity"] == "a"


def test_a_holder_that_cannot_renew_gives_up_before_a_successor_may_start() -> None:
    store, clock = Store(), Clock()
    holder = claim(store, clock, "a")
    assert holder.try_acquire()
    store.down = True
    lost = threading.Event()
    stop = threading.Event()
    ticks = iter(range(100))

    def waiting(seconds: float) -> bool:
        clock.now += seconds
        next(ticks)
        return stop.is_set()

    stop.wait = waiting  # type: ignore[method-assign]
    holder.hold(stop, lost.set)
    assert lost.is_set()
    assert clock.now - 100.0 < 15.0  # it stopped acting before the lease could expire

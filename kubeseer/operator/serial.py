"""One lock per key: what happens to one DLJob is recorded one event at a time.

A Job's event and a claim's allocation of the same DLJob arrive on different watches and are
handled on different worker threads; each reads the status and writes a patch computed from it,
so two at once could write a placement the other has just replaced. Holding the DLJob's own
lock while reading and writing keeps them in order without slowing other DLJobs down.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class KeyedLocks:
    """Locks created on first use and dropped once nobody holds or waits for them."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, int]] = {}

    @contextmanager
    def hold(self, key: str) -> Iterator[None]:
        """Hold the lock of `key` for the block."""
        with self._guard:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[key]
                if users == 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)

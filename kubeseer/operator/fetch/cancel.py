"""Cancelling a fetch from another thread, even one blocked in a socket read.

A DLJob deleted while its model downloads must free the fetch worker at once, not when the
server next sends a byte. The download registers a callback that shuts its socket down; `cancel`
runs it, which makes the blocked read return, and the download then raises `CancelledError`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Cancellation:
    """A one-way flag plus the callbacks that interrupt whatever is waiting on it."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._interrupts: list[Callable[[], object]] = []

    @property
    def cancelled(self) -> bool:
        """Whether `cancel` was called."""
        return self._event.is_set()

    def cancel(self) -> None:
        """Set the flag and interrupt every registered wait; repeated calls do nothing more."""
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            interrupts = list(self._interrupts)
        for interrupt in interrupts:
            interrupt()

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`, returning early (True) when cancelled."""
        return self._event.wait(seconds)

    @contextmanager
    def interrupting(self, interrupt: Callable[[], object]) -> Iterator[None]:
        """Run `interrupt` on `cancel` while the block runs (at once if already cancelled)."""
        with self._lock:
            self._interrupts.append(interrupt)
            already = self._event.is_set()
        if already:
            interrupt()
        try:
            yield
        finally:
            with self._lock:
                self._interrupts.remove(interrupt)

"""Retrying a call that failed transiently, the one backoff loop of the operator.

Model downloads, workload creates and pod-event handling all retry the same way: a failure whose
class says `transient` is tried again after an exponentially growing, jittered delay, until the
tries or the deadline run out; anything else is raised at once.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from kubeseer.operator import errors

_T = TypeVar("_T")


@dataclass(frozen=True)
class Backoff:
    """How often and how patiently to retry.

    Args:
        tries: calls in all (1: no retry).
        base_s, max_s: the delay before retry n (1-based) is uniform in [d/2, d] with
            d = min(max_s, base_s * 2**(n-1)); jitter keeps many failing callers apart.
    """

    tries: int = 3
    base_s: float = 0.5
    max_s: float = 8.0

    def __post_init__(self) -> None:
        if self.tries < 1:
            raise ValueError(f"backoff needs at least one try, got {self.tries}")
        if self.base_s < 0 or self.max_s < self.base_s:
            raise ValueError("backoff needs 0 <= base_s <= max_s")

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry `retry` (1 for the first)."""
        ceiling = min(self.max_s, self.base_s * 2 ** (retry - 1))
        return random.uniform(ceiling / 2, ceiling)


def retrying(
    call: Callable[[], _T],
    backoff: Backoff,
    *,
    deadline: float | None = None,
    sleep: Callable[[float], object] = time.sleep,
) -> _T:
    """`call()`, tried again after each transient `OperatorError` while tries and time remain.

    Args:
        call: the operation; raises an `OperatorError` subclass on failure.
        backoff: tries and delays.
        deadline: `time.monotonic()` after which no retry starts (its delay would end past it).
        sleep: waits between tries (a cancellable wait for fetches).
    """
    retry = 0
    while True:
        try:
            return call()
        except errors.OperatorError as e:
            retry += 1
            if not e.transient or retry >= backoff.tries:
                raise
            delay = backoff.delay(retry)
            if deadline is not None and time.monotonic() + delay >= deadline:
                raise
            sleep(delay)

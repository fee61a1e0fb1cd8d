"""A thread pool that shares its threads fairly between keys (the operator's fetch pool).

Model downloads are keyed by the DLJob's namespace. One namespace may hold at most `per_key`
of the pool's threads at once, and waiting work is taken from the namespaces in turn, so a
tenant whose model servers trickle (or who submits a thousand DLJobs at once) delays its own
downloads, not everyone's. A plain `ThreadPoolExecutor` serves its queue first come, first
served: 64 slow downloads ahead of one ordinary DLJob hold it for as long as all 64 take.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

_T = TypeVar("_T")

_Task = tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]


class FairPool:
    """`workers` threads; at most `per_key` of them on one key's work at a time.

    Args:
        workers: threads in all.
        per_key: threads one key may hold at once (at most `workers`).
        name: prefix of the threads' names.
    """

    def __init__(self, workers: int, per_key: int, name: str) -> None:
        if not 1 <= per_key <= workers:
            raise ValueError(f"need 1 <= per_key <= workers, got {per_key} and {workers}")
        self.workers = workers
        self.per_key = per_key
        self.name = name
        self._lock = threading.Condition()
        self._waiting: dict[str, deque[_Task]] = {}
        self._turns: deque[str] = deque()  # keys with waiting work, in the order they are served
        self._running: dict[str, int] = {}
        self._threads: list[threading.Thread] = []
        self._closed = False

    def for_key(self, key: str) -> Executor:
        """An `Executor` whose work counts against `key` (what asyncio's run_in_executor takes)."""
        return _KeyedExecutor(self, key)

    def submit(self, key: str, fn: Callable[..., _T], *args: Any) -> Future[_T]:
        """Run `fn(*args)` when a thread is free and `key` holds fewer than `per_key`."""
        future: Future[_T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name} is shut down")
            if key not in self._waiting:
                self._waiting[key] = deque()
                self._turns.append(key)
            self._waiting[key].append((future, fn, args))
            if len(self._threads) < self.workers:
                thread = threading.Thread(
                    target=self._work, name=f"{self.name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            self._lock.notify()
        return future

    def shutdown(self, *, cancel_futures: bool = True) -> None:
        """Stop taking work; waiting work is cancelled, running work finishes on its own."""
        with self._lock:
            self._closed = True
            if cancel_futures:
                for tasks in self._waiting.values():
                    for future, _, _ in tasks:
                        future.cancel()
                self._waiting.clear()
                self._turns.clear()
            self._lock.notify_all()

    def _next(self) -> tuple[str, _Task] | None:
        """The first waiting task, in turn, of a key below its share (under the lock)."""
        for _ in range(len(self._turns)):
            key = self._turns[0]
            self._turns.rotate(-1)
            if self._running.get(key, 0) >= self.per_key:
                continue
            tasks = self._waiting[key]
            task = tasks.popleft()
            if not tasks:
                del self._waiting[key]
                self._turns.remove(key)
            return key, task
        return None

    def _work(self) -> None:
        while True:
            with self._lock:
                picked = self._next()
                while picked is None:
                    if self._closed and not self._waiting:
                        return
                    self._lock.wait()
                    picked = self._next()
                key, (future, fn, args) = picked
                self._running[key] = self._running.get(key, 0) + 1
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn(*args))
                    except BaseException as e:  # handed to whoever awaits the future
                        future.set_exception(e)
            finally:
                with self._lock:
                    self._running[key] -= 1
                    if not self._running[key]:
                        del self._running[key]
                    self._lock.notify_all()


class _KeyedExecutor(Executor):
    """One key's view of a `FairPool`."""

    def __init__(self, pool: FairPool, key: str) -> None:
        self._pool = pool
        self._key = key

    def submit(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> Future[_T]:
        """Submit under this view's key (keyword arguments are not supported)."""
        if kwargs:
            raise TypeError("FairPool work takes positional arguments only")
        return self._pool.submit(self._key, fn, *args)

"""The fetch pool: one namespace's slow downloads never hold the threads another needs."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import CancelledError, Future

import pytest

from kubeseer.operator import fairpool


def wait_running(future: Future[object]) -> None:
    deadline = time.monotonic() + 5
    while not future.running():
        assert time.monotonic() < deadline, "the task never started"
        time.sleep(0.001)


def test_a_key_at_its_share_leaves_the_other_threads_to_other_keys() -> None:
    pool = fairpool.FairPool(workers=4, per_key=1, name="test")
    release = threading.Event()
    slow = [pool.submit("greedy", release.wait, 10.0) for _ in range(8)]
    wait_running(slow[0])
    try:
        # Three threads are free while "greedy" holds its one: other keys run at once.
        assert pool.submit("ordinary", lambda: "done").result(timeout=2) == "done"
        assert pool.submit("another", lambda: "done").result(timeout=2) == "done"
        assert sum(f.running() for f in slow) == 1
    finally:
        release.set()
    assert all(f.result(timeout=5) for f in slow)
    pool.shutdown()


def test_waiting_keys_are_served_in_turn() -> None:
    pool = fairpool.FairPool(workers=1, per_key=1, name="test")
    gate = threading.Event()
    order: list[str] = []
    first = pool.submit("a", gate.wait, 10.0)
    wait_running(first)
    futures = [pool.submit(key, order.append, key) for key in ("a", "a", "a", "b", "c")]
    gate.set()
    first.result(timeout=5)
    for future in futures:
        future.result(timeout=5)
    assert order == ["a", "b", "c", "a", "a"]  # not the three a's first
    pool.shutdown()


def test_failures_reach_the_caller_and_shutdown_cancels_what_waits() -> None:
    pool = fairpool.FairPool(workers=1, per_key=1, name="test")
    with pytest.raises(ZeroDivisionError):
        pool.submit("k", lambda: 1 / 0).result(timeout=5)
    gate = threading.Event()
    running = pool.submit("k", gate.wait, 10.0)
    wait_running(running)
    waiting = pool.submit("k", lambda: "never")
    pool.shutdown()
    gate.set()
    assert running.result(timeout=5) is True
    with pytest.raises(CancelledError):
        waiting.result(timeout=5)
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit("k", lambda: None)


def test_asyncio_runs_work_on_a_keys_view() -> None:
    pool = fairpool.FairPool(workers=2, per_key=1, name="test")

    async def main() -> str:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(pool.for_key("ns"), str.upper, "ok")

    assert asyncio.run(main()) == "OK"
    pool.shutdown()


def test_a_share_larger_than_the_pool_is_refused() -> None:
    with pytest.raises(ValueError, match="per_key"):
        fairpool.FairPool(workers=2, per_key=3, name="test")

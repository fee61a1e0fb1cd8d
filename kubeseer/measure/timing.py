"""Step-time statistics and the two clocks the harness times steps with."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class StepTimes:
    """Summary of the timed iterations, in seconds."""

    mean_s: float
    median_s: float
    p95_s: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> StepTimes:
        """Mean, median and 95th percentile (linear interpolation) of `samples`."""
        if not samples:
            raise ValueError("no timed iterations to summarise")
        values = np.asarray(samples, dtype=np.float64)
        return cls(
            mean_s=float(values.mean()),
            median_s=float(np.median(values)),
            p95_s=float(np.percentile(values, 95)),
        )


def time_cpu(
    step: Callable[[], None], warmup: int, iterations: int
) -> tuple[list[float], list[float]]:
    """Run `step` `warmup` times untimed, then `iterations` times, each timed on its own.

    CPU kernels run synchronously on the calling thread (or its OpenMP pool, joined before
    return), so a monotonic wall clock around each call is the step time. The process CPU
    time of each step is returned too: on a machine shared with other work the wall time
    includes time the scheduler gave to others, the CPU time does not.

    Returns:
        (wall seconds per step, process CPU seconds per step).
    """
    for _ in range(warmup):
        step()
    wall: list[float] = []
    cpu: list[float] = []
    for _ in range(iterations):
        start, start_cpu = time.perf_counter(), time.process_time()
        step()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return wall, cpu


def time_cuda(step: Callable[[], None], warmup: int, iterations: int) -> list[float]:
    """Like `time_cpu`, with CUDA events recorded on the current stream around each step.

    Events measure device time between the first and last kernel of the step, unaffected by
    Python's launch overhead overlapping the previous step; the device is synchronised once
    after the warm-up and once at the end, so timing does not serialise the steps.
    """
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    events = [(_timing_event(), _timing_event()) for _ in range(iterations)]
    for start, end in events:
        start.record()
        step()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) / 1000.0 for start, end in events]


def _timing_event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # untyped stub

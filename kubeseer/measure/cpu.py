"""Measuring one task on the CPU, in a forked child process of its own.

A child per configuration gives three things a shared process cannot: its peak resident set
belongs to that configuration alone (the kernel's high-water mark is reset in the child via
`/proc/self/clear_refs`), a memory cap can be enforced by the kernel (`RLIMIT_AS`) so an
out-of-memory is a real allocation failure rather than a guess, and a crash (even a segfault in
a native kernel) ends that configuration only. Forking after torch is imported in the parent
costs milliseconds, against the seconds a fresh interpreter would take.

Utilisation on a CPU is defined as process CPU time over the timed window divided by
(wall time x threads torch was allowed), in percent: 100 means every allowed thread was busy
for the whole window. Step-time labels are taken with `torch.set_num_threads(settings.threads)`
(1 by default, so a shared machine does not distort them).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import resource
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Final

import torch

from kubeseer.measure import collect, memtrack, plans, records, steps, timing

_STATUS_FIELDS: Final = ("VmRSS", "RssFile", "VmHWM", "VmSize")


class MeasurementError(RuntimeError):
    """The child failed for a reason other than running out of memory (kept in the error log)."""


@dataclass(frozen=True)
class CpuSettings:
    """How the CPU harness runs each task.

    Attributes:
        warmup: untimed steps before timing (at least 5).
        iterations: timed steps (at least 30).
        threads: intra-op threads torch may use.
        memory_cap_bytes: address-space budget above the child's size at fork; an allocation
            beyond it fails and the task is recorded as censored. None: no cap.
        timeout_s: a child still running after this is killed and the task logged as an error.
    """

    warmup: int = 5
    iterations: int = 30
    threads: int = 1
    memory_cap_bytes: int | None = None
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.warmup < 5 or self.iterations < 30:
            raise ValueError(
                f"need >= 5 warm-up and >= 30 timed iterations, got {self.warmup} and "
                f"{self.iterations}"
            )
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")


@dataclass(frozen=True)
class CpuResult:
    """What the child measured (or the cap it hit: `oom` with only `memory_cap_bytes` set)."""

    oom: bool
    step_times: timing.StepTimes | None
    step_cpu_time_median_s: float | None
    rss_baseline_bytes: int | None
    rss_peak_delta_bytes: int | None
    allocator_peak_bytes: int | None
    utilisation_percent: float | None
    threads: int


def _proc_status() -> dict[str, int]:
    """The memory lines of /proc/self/status, in bytes."""
    values: dict[str, int] = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            name, _, rest = line.partition(":")
            if name in _STATUS_FIELDS:
                values[name] = int(rest.split()[0]) * 1024
    return values


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark to the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
            refs.write("5")
    except OSError:
        return False
    return True


def is_out_of_memory(error: BaseException, *, capped: bool = False) -> bool:
    """Whether an exception from a step means an allocation failed.

    oneDNN reports a failed scratch-pad allocation only as "could not create a primitive", so
    that message counts as out-of-memory when a memory cap is in force (and only then).
    """
    if isinstance(error, MemoryError | torch.OutOfMemoryError):
        return True
    if not isinstance(error, RuntimeError):
        return False
    text = str(error)
    if "can't allocate memory" in text or "not enough memory" in text:
        return True
    return capped and "could not create a primitive" in text


def _run(task: steps.Task, settings: CpuSettings) -> CpuResult:
    torch.set_num_threads(settings.threads)
    can_reset = _reset_peak_rss()
    before = _proc_status()
    if settings.memory_cap_bytes is not None:
        limit = before["VmSize"] + settings.memory_cap_bytes
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        prepared = steps.prepare(task, torch.device("cpu"))
        for _ in range(settings.warmup):
            prepared.step()
        wall_start = time.perf_counter()
        cpu_start = time.process_time()
        samples, cpu_samples = timing.time_cpu(prepared.step, 0, settings.iterations)
        cpu_timed = time.process_time() - cpu_start
        wall_timed = time.perf_counter() - wall_start
        allocator_peak = memtrack.peak_tensor_bytes(prepared, torch.device("cpu"))
    except Exception as e:
        if is_out_of_memory(e, capped=settings.memory_cap_bytes is not None):
            return CpuResult(True, None, None, None, None, None, None, settings.threads)
        raise
    after = _proc_status()
    peak_delta = None
    if can_reset:
        # File-backed pages (library code first touched in the child) are not the model's
        # memory; they only grow during a run, so their growth is taken off the peak.
        file_growth = max(0, after["RssFile"] - before["RssFile"])
        peak_delta = max(0, after["VmHWM"] - before["VmRSS"] - file_growth)
    utilisation = 100.0 * cpu_timed / (wall_timed * settings.threads) if wall_timed > 0 else None
    return CpuResult(
        oom=False,
        step_times=timing.StepTimes.of(samples),
        step_cpu_time_median_s=timing.StepTimes.of(cpu_samples).median_s,
        rss_baseline_bytes=before["VmRSS"],
        rss_peak_delta_bytes=peak_delta,
        allocator_peak_bytes=allocator_peak,
        utilisation_percent=utilisation,
        threads=settings.threads,
    )


def _child(connection: Connection, task: steps.Task, settings: CpuSettings) -> None:
    try:
        connection.send(("ok", _run(task, settings)))
    except BaseException as e:
        connection.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        connection.close()


def measure(task: steps.Task, settings: CpuSettings) -> CpuResult:
    """Measure `task` in a forked child and return what it measured.

    Raises:
        MeasurementError: the child raised (other than out of memory), crashed or timed out.
    """
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(sender, task, settings), daemon=True)
    process.start()
    sender.close()
    try:
        if not receiver.poll(settings.timeout_s):
            process.kill()
            raise MeasurementError(f"timed out after {settings.timeout_s:.0f} s")
        outcome: tuple[str, Any] = receiver.recv()
    except EOFError:
        process.join()
        raise MeasurementError(f"child died with exit code {process.exitcode}") from None
    finally:
        receiver.close()
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
            process.join()
    kind, payload = outcome
    if kind == "error":
        raise MeasurementError(str(payload))
    result: CpuResult = payload
    return result


def cpu_name() -> str:
    """The CPU model name from /proc/cpuinfo (or the machine architecture elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return os.uname().machine


def describe_device(threads: int) -> records.DeviceDescriptor:
    """The CPU descriptor: model name, host memory, logical cores, torch version."""
    return records.DeviceDescriptor(
        kind=records.DeviceKind.CPU,
        name=cpu_name(),
        memory_bytes=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        sm_count=None,
        cores=os.cpu_count(),
        mig_profile=None,
        driver_version=None,
        cuda_version=None,
        torch_version=torch.__version__,
    )


def _warm_up() -> None:
    """Run one tracked training step of a tiny model in the parent before any fork.

    The first autograd step and the first `MemTracker` session in a process pay seconds of
    one-off initialisation; done once here, every forked child inherits it instead of paying it
    per task (which would also land in the first task's peak RSS).
    """
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs = torch.randn(4, 8)

    def step() -> None:
        optimizer.zero_grad()
        model(inputs).sum().backward()
        optimizer.step()

    memtrack.peak_tensor_bytes(steps.Prepared(model, optimizer, step), torch.device("cpu"))


class CpuBackend:
    """Measures tasks on this machine's CPU, one forked child per task."""

    label_source = records.LabelSource.MEASURED

    def __init__(self, settings: CpuSettings) -> None:
        self.settings = settings
        self.device = describe_device(settings.threads)
        _warm_up()

    def supports(self, task: steps.Task) -> bool:
        """Every task can be measured here."""
        return True

    def measure(self, planned: plans.PlannedTask, plan: plans.Plan) -> records.Record:
        """Measure one planned task and turn the child's result into a record."""
        task = planned.task
        settings = dataclasses.replace(
            self.settings, warmup=plan.warmup, iterations=plan.iterations
        )
        started = collect.now()
        result = measure(task, settings)
        times = result.step_times
        memory = result.rss_peak_delta_bytes
        status = records.Status.OK
        if result.oom:
            status = records.Status.OUT_OF_MEMORY
            memory = settings.memory_cap_bytes
        return records.Record(
            **collect.task_identity(planned, plan, self),
            status=status,
            warmup_iterations=settings.warmup,
            timed_iterations=settings.iterations,
            step_time_mean_s=times.mean_s if times else None,
            step_time_median_s=times.median_s if times else None,
            step_time_p95_s=times.p95_s if times else None,
            step_cpu_time_median_s=result.step_cpu_time_median_s,
            memory_bytes=memory,
            context_bytes=None,
            allocator_peak_allocated_bytes=result.allocator_peak_bytes,
            allocator_peak_reserved_bytes=None,
            rss_baseline_bytes=result.rss_baseline_bytes,
            rss_peak_delta_bytes=result.rss_peak_delta_bytes,
            sm_util_mean_percent=result.utilisation_percent,
            sm_util_peak_percent=None,
            utilisation_source="cpu-process-time"
            if result.utilisation_percent is not None
            else None,
            utilisation_samples=None,
            energy_j=None,
            threads=result.threads,
            started_at=started,
            finished_at=collect.now(),
        )

    def cooldown(self, seconds: float) -> None:
        """Let the machine settle; the task's memory left with its child process."""
        time.sleep(seconds)

"""Check the derived GPU memory of real architectures against a GPU's own caching allocator.

The memory labels of the default checkpoint are derived without a GPU (`gpu_memory`: the job's
allocation trace on the meta device, replayed through `caching_allocator`), and so far they
were checked only against the public out-of-memory boundaries, where the card's runtime
context, the allocator's fragmentation and the trace cannot be told apart. On a GPU each can be
read separately, and this module reads them for a list of timm jobs (a *check plan*, JSON
lines of `CheckJob`):

* the **allocated and reserved peaks** of the job's steps with room to spare
  (`torch.cuda.max_memory_allocated` / `max_memory_reserved`), against the trace's live peak
  and the replay's unconstrained reservation;
* the **required capacity**: the smallest cap on the allocator's reservation
  (`torch.cuda.set_per_process_memory_fraction`) within which the steps run, found by bisection
  between the two peaks. A capped allocator frees its cached segments and retries before it
  fails, exactly where a smaller card would make it, so this is the figure
  `caching_allocator.required_capacity` derives, and the allocator part of the memory target;
* the **runtime context**: what NVML sees in use beyond the allocator's reservation and the
  device's idle use, the one constant `gpu_memory.Runtime` has had to assume;
* the **median step time** of the same job, for the step-time predictor on this GPU.

Each job runs as `gpu_memory.trace` derives it (timm's `benchmark.py` job: the model built on
the host and moved with `.to()`, random weights, fp16 autocast, inference under `no_grad` or
SGD with Nesterov momentum, `steps` steps), after one unmeasured warm-up run, so that cuDNN's
algorithm search (`torch.backends.cudnn.benchmark`, as timm's benchmark sets it) and the
cuBLAS workspace are settled before anything is read. `check_plan` appends one JSON line per
job as it finishes and skips jobs already written, so a run cut short by a device lease keeps
what it measured and the next run resumes.
"""

from __future__ import annotations

import gc
import json
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, Protocol

import torch
from torch import nn

from kubeseer.measure import caching_allocator, cpu, gpu_memory, nvml, public_gpu, timing

__all__ = [
    "CheckJob",
    "GpuRunner",
    "MeasuredJob",
    "Probe",
    "Run",
    "Runner",
    "bisect_capacity",
    "check_job",
    "check_plan",
    "measured_keys",
    "read_plan",
    "write_plan",
]

GRANULE: Final = caching_allocator.ROUND_LARGE
"""Caps are whole multiples of the allocator's large-segment rounding (`kRoundLarge`)."""

Mode = Literal["infer", "train"]


@dataclass(frozen=True)
class CheckJob:
    """One timm job to measure.

    Attributes:
        model: timm architecture name (random weights; nothing is downloaded).
        img_size: input resolution (the architecture's default in timm's public benchmark).
        mode: "infer" (under `no_grad`) or "train" (SGD with Nesterov momentum).
        batch_size: images per step.
        steps: steps per run, as the derivation traces them (the third shows the steady state).
        why: what the job is in the plan for (free text, carried into the measured row).
    """

    model: str
    img_size: int
    mode: Mode
    batch_size: int
    steps: int = 3
    why: str = ""

    def __post_init__(self) -> None:
        if self.mode not in ("infer", "train"):
            raise ValueError(f"mode must be infer or train, got {self.mode!r}")
        if self.batch_size < 1 or self.img_size < 1 or self.steps < 1:
            raise ValueError(f"batch size, image size and steps must be >= 1: {self}")

    @property
    def key(self) -> str:
        """The job's identity in a measured file (`bench/gpu_memory.py`'s job key, less the
        runtime, which the measured row records)."""
        return f"{self.model}|{self.img_size}|{self.mode}|{self.batch_size}|{self.steps}"

    def gpu_memory_job(self) -> gpu_memory.Job:
        """The derivation's description of the same job."""
        return gpu_memory.Job(
            mode=self.mode,
            precision="fp16",
            optimizer="sgd-nesterov" if self.mode == "train" else "none",
            batch_size=self.batch_size,
            steps=self.steps,
        )


@dataclass(frozen=True)
class Probe:
    """One capped run of the bisection: the cap (bytes) and whether the steps ran within it."""

    cap_bytes: int
    ran: bool


@dataclass(frozen=True)
class MeasuredJob:
    """What the GPU's allocator did for one job (bytes, seconds), as a measured file's row.

    `required_bytes` lies within `required_tolerance_bytes` above the true smallest cap; it is
    None when the job did not run even uncapped (then `error` says why).
    """

    key: str
    model: str
    img_size: int
    mode: str
    batch_size: int
    steps: int
    why: str
    gpu: str
    memory_total_bytes: int
    torch_version: str
    cuda_version: str | None
    cudnn_version: int | None
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    required_bytes: int | None = None
    required_tolerance_bytes: int | None = None
    context_bytes: int | None = None
    step_time_s: float | None = None
    probes: list[Probe] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None

    def as_json(self) -> str:
        """One line of a measured file."""
        return json.dumps(asdict(self), sort_keys=True)


def read_plan(path: Path) -> list[CheckJob]:
    """The jobs of a check plan (JSON lines of `CheckJob` fields).

    Raises:
        ValueError: a line is not a valid job (the message names the line).
    """
    jobs = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            jobs.append(CheckJob(**json.loads(line)))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}:{number}: not a check job: {e}") from e
    return jobs


def write_plan(jobs: Iterable[CheckJob], path: Path) -> None:
    """Write `jobs` as a check plan."""
    path.write_text("".join(json.dumps(asdict(job)) + "\n" for job in jobs))


def bisect_capacity(
    runs_within: Callable[[int], bool], low: int, high: int, *, tolerance: float = 0.01
) -> tuple[int, list[Probe]]:
    """The smallest cap (a multiple of `GRANULE`) from `low` to `high` within which the job
    runs, to `tolerance` of `high`, and the probes that found it: the search
    `caching_allocator.required_capacity` makes of the model, made of the GPU.

    `high` must be a cap the job runs in (the unconstrained reservation); nothing below `low`
    (the allocated peak, which no allocator does with less) is tried.
    """
    probes: list[Probe] = []

    def probed(cap: int) -> bool:
        ran = runs_within(cap)
        probes.append(Probe(cap, ran))
        return ran

    found = caching_allocator.smallest_capacity(
        probed, low, high, granularity=GRANULE, tolerance=tolerance
    )
    return found, probes


@dataclass(frozen=True)
class Run:
    """One run of a job's steps: the allocator's peaks (bytes) and the timed steps (s)."""

    allocated: int
    reserved: int
    step_times: list[float]


class Runner(Protocol):
    """What `check_job` needs of a device: `GpuRunner`, or a fake of it in tests."""

    @property
    def gpu_name(self) -> str: ...

    @property
    def memory_total_bytes(self) -> int: ...

    def context_bytes(self) -> int: ...

    def run(
        self,
        job: CheckJob,
        parts: gpu_memory.StepParts,
        host_model: nn.Module,
        *,
        cap_bytes: int | None = None,
        timed: int = 0,
    ) -> Run | None: ...


class GpuRunner:
    """Runs check jobs on one CUDA device of this machine, in this process.

    NVML's idle reading is taken before this process touches the device, so that the context
    can be told from the rest of the device's use (the device must otherwise be idle).
    """

    def __init__(self, device_index: int = 0, *, cudnn_benchmark: bool = True) -> None:
        if not torch.cuda.is_available():
            raise nvml.NvmlError("no CUDA device is available to torch")
        self.device = torch.device("cuda", device_index)
        self.properties = torch.cuda.get_device_properties(self.device)
        self.nvml = nvml.Device(str(self.properties.uuid))
        self.idle_bytes = self.nvml.memory_used_bytes()
        torch.backends.cudnn.benchmark = cudnn_benchmark
        torch.zeros(1, device=self.device)
        torch.cuda.synchronize(self.device)

    @property
    def gpu_name(self) -> str:
        """The device's name as CUDA reports it (the hardware table's names)."""
        return str(self.properties.name)

    @property
    def memory_total_bytes(self) -> int:
        """The device's memory."""
        return int(self.properties.total_memory)

    def context_bytes(self) -> int:
        """What the process holds on the device beyond the allocator's reservation."""
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.synchronize(self.device)
        used = self.nvml.memory_used_bytes()
        return max(0, used - self.idle_bytes - torch.cuda.memory_reserved(self.device))

    def run(
        self,
        job: CheckJob,
        parts: gpu_memory.StepParts,
        host_model: nn.Module,
        *,
        cap_bytes: int | None = None,
        timed: int = 0,
    ) -> Run | None:
        """The job's steps (then `timed` timed ones) from an empty cache, `host_model` moved to
        the device for them and back after; None when the allocator runs out within
        `cap_bytes` (uncapped: within the device)."""
        self._release()
        fraction = 1.0 if cap_bytes is None else min(1.0, cap_bytes / self.properties.total_memory)
        torch.cuda.set_per_process_memory_fraction(fraction, self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        try:
            times = self._steps(job, parts, host_model, timed)
        except Exception as error:
            if not cpu.is_out_of_memory(error):
                raise
            times = None
        finally:
            host_model.to("cpu")
            for parameter in host_model.parameters():
                parameter.grad = None
            torch.cuda.set_per_process_memory_fraction(1.0, self.device)
        self._release()
        if times is None:
            return None
        return Run(
            allocated=torch.cuda.max_memory_allocated(self.device),
            reserved=torch.cuda.max_memory_reserved(self.device),
            step_times=times,
        )

    def _release(self) -> None:
        gc.collect()
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()

    def _steps(
        self, job: CheckJob, parts: gpu_memory.StepParts, host_model: nn.Module, timed: int
    ) -> list[float]:
        # `.to()` copies parameters and buffers children first, as the derivation tracks them
        model = host_model.to(self.device)
        inputs, target = parts.batch(job.batch_size, self.device)
        for tensor in inputs:
            tensor.normal_()
        target.random_(0, int(getattr(model, "num_classes", 0) or 1000))
        step = gpu_memory.make_step(
            parts,
            job.gpu_memory_job(),
            gpu_memory.RUNTIMES["torch2-cuda12"],
            model,
            inputs,
            target,
            lambda: torch.autocast("cuda", dtype=torch.float16),
        )
        if timed:
            return timing.time_cuda(step, job.steps, timed)
        for _ in range(job.steps):
            step()
        torch.cuda.synchronize(self.device)
        return []


def _versions() -> dict[str, Any]:
    return {
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "cudnn_version": torch.backends.cudnn.version(),  # type: ignore[no-untyped-call]
    }


def check_job(
    job: CheckJob, runner: Runner, *, timed: int = 10, tolerance: float = 0.01
) -> MeasuredJob:
    """Measure one job (module docstring): warm-up, an uncapped timed run, the bisection."""
    started = time.perf_counter()
    described: dict[str, Any] = {
        "key": job.key,
        "model": job.model,
        "img_size": job.img_size,
        "mode": job.mode,
        "batch_size": job.batch_size,
        "steps": job.steps,
        "why": job.why,
        "gpu": runner.gpu_name,
        "memory_total_bytes": runner.memory_total_bytes,
        **_versions(),
    }
    try:
        parts = public_gpu.timm_parts(job.model, job.img_size)
        host_model = parts.build()
        warm = runner.run(job, parts, host_model)
        uncapped = runner.run(job, parts, host_model, timed=timed) if warm is not None else None
    except Exception as error:  # an architecture this timm lacks, a kernel that cannot launch
        return MeasuredJob(
            **described,
            seconds=time.perf_counter() - started,
            error=f"{type(error).__name__}: {error}"[:300],
        )
    if uncapped is None:
        return MeasuredJob(
            **described,
            seconds=time.perf_counter() - started,
            error="out of memory without a cap",
        )
    required, probes = bisect_capacity(
        lambda cap: runner.run(job, parts, host_model, cap_bytes=cap) is not None,
        uncapped.allocated,
        uncapped.reserved,
        tolerance=tolerance,
    )
    return MeasuredJob(
        **described,
        allocated_bytes=uncapped.allocated,
        reserved_bytes=uncapped.reserved,
        required_bytes=required,
        required_tolerance_bytes=max(GRANULE, math.floor(tolerance * uncapped.reserved)),
        context_bytes=runner.context_bytes(),
        step_time_s=statistics.median(uncapped.step_times) if uncapped.step_times else None,
        probes=probes,
        seconds=time.perf_counter() - started,
    )


def measured_keys(path: Path) -> set[str]:
    """Keys of the jobs a measured file already holds."""
    if not path.exists():
        return set()
    return {json.loads(line)["key"] for line in path.read_text().splitlines() if line.strip()}


def check_plan(
    jobs: Sequence[CheckJob],
    out: Path,
    runner: Runner,
    *,
    deadline_s: float | None = None,
    timed: int = 10,
    tolerance: float = 0.01,
    progress: Callable[[MeasuredJob], None] | None = None,
) -> int:
    """Measure every job `out` does not hold yet, appending each row as it finishes; start no
    job after `deadline_s` seconds. Returns the number of rows written."""
    started = time.monotonic()
    done = measured_keys(out)
    written = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as handle:
        for job in jobs:
            if job.key in done:
                continue
            if deadline_s is not None and time.monotonic() - started > deadline_s:
                break
            row = check_job(job, runner, timed=timed, tolerance=tolerance)
            handle.write(row.as_json() + "\n")
            handle.flush()
            done.add(job.key)
            written += 1
            if progress is not None:
                progress(row)
    return written

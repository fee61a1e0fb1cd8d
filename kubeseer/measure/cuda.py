"""Measuring one task on an NVIDIA GPU: CUDA-event timing, NVML memory, utilisation, energy.

All tasks run in the one collecting process (CUDA cannot be forked), so the device-wide NVML
figures are turned into per-task ones by bookkeeping that lives here:

- the idle baseline is NVML "used" before this process creates its CUDA context; the context
  size is the growth when it does (less the few bytes torch allocated to force it);
- during a task, a sampler thread reads NVML used memory and utilisation at `sample_hz`; the
  memory target is max(peak sampled used - idle baseline, context + allocator peak reserved),
  the second term catching peaks shorter than a sampling period;
- utilisation is averaged over the timed window only, from GPM SM activity where the GPU
  supports it (Hopper and later), else NVML's coarser "GPU busy" utilisation;
- energy is the difference of the NVML total-energy counter across the timed window.

The GPU must otherwise be idle: NVML sees every process's memory.
"""

from __future__ import annotations

import gc
import threading
import time
from dataclasses import dataclass, field

import torch

from kubeseer.measure import collect, cpu, nvml, plans, records, steps, timing


@dataclass(frozen=True)
class CudaSettings:
    """How the CUDA harness runs.

    Attributes:
        memory_cap_bytes: cap on what the torch allocator may reserve (via
            `torch.cuda.set_per_process_memory_fraction`); beyond it a task is censored.
        sample_hz: sampler frequency (>= 50).
        device_index: the CUDA device to measure.
    """

    memory_cap_bytes: int | None = None
    sample_hz: float = 100.0
    device_index: int = 0

    def __post_init__(self) -> None:
        if self.sample_hz < 50:
            raise ValueError(f"sample_hz must be >= 50, got {self.sample_hz}")


@dataclass
class Readings:
    """What the sampler saw: peak memory over the whole task, utilisation in the window."""

    peak_used_bytes: int = 0
    utilisation: list[float] = field(default_factory=list)
    source: str | None = None

    @property
    def mean_percent(self) -> float | None:
        return sum(self.utilisation) / len(self.utilisation) if self.utilisation else None

    @property
    def peak_percent(self) -> float | None:
        return max(self.utilisation) if self.utilisation else None


class Sampler:
    """A thread polling NVML while a task runs.

    Memory is sampled for the whole task (the peak can come from building the model or the
    first step); utilisation only between `open_window()` and `close_window()`.
    """

    def __init__(self, device: nvml.Device, hz: float) -> None:
        self._device = device
        self._period = 1.0 / hz
        self._use_gpm = device.gpm_supported()
        self._stop = threading.Event()
        self._window = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
        self.readings = Readings(source="gpm-sm-activity" if self._use_gpm else "nvml-utilization")
        self.error: BaseException | None = None

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.readings.peak_used_bytes = max(
            self.readings.peak_used_bytes, self._device.memory_used_bytes()
        )

    def open_window(self) -> None:
        """Start counting utilisation samples (the timed iterations begin)."""
        if self._use_gpm:
            self._device.gpm_sm_activity_percent()
        self._window.set()

    def close_window(self) -> None:
        """Stop counting utilisation samples."""
        self._window.clear()

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                used = self._device.memory_used_bytes()
                self.readings.peak_used_bytes = max(self.readings.peak_used_bytes, used)
                if self._window.is_set():
                    value = (
                        self._device.gpm_sm_activity_percent()
                        if self._use_gpm
                        else self._device.utilisation_percent()
                    )
                    if value is not None:
                        self.readings.utilisation.append(value)
                self._stop.wait(self._period)
        except BaseException as e:
            self.error = e


def memory_target(
    peak_used_bytes: int, idle_baseline_bytes: int, context_bytes: int, peak_reserved_bytes: int
) -> int:
    """The "memory" label: bytes a GPU or MIG slice must hold for the task (docs/dataset.md)."""
    return max(peak_used_bytes - idle_baseline_bytes, context_bytes + peak_reserved_bytes)


def energy_joules(before_mj: int | None, after_mj: int | None) -> float | None:
    """Energy over a window from two readings of the millijoule counter."""
    if before_mj is None or after_mj is None or after_mj < before_mj:
        return None
    return (after_mj - before_mj) / 1000.0


class CudaBackend:
    """Measures tasks on one CUDA device of this machine, in this process."""

    label_source = records.LabelSource.MEASURED

    def __init__(self, settings: CudaSettings) -> None:
        if not torch.cuda.is_available():
            raise nvml.NvmlError("no CUDA device is available to torch")
        self.settings = settings
        self.torch_device = torch.device("cuda", settings.device_index)
        properties = torch.cuda.get_device_properties(self.torch_device)
        self.nvml = nvml.Device(str(properties.uuid))
        # Read before this process has a context on the device.
        self.idle_baseline_bytes = self.nvml.memory_used_bytes()
        torch.zeros(1, device=self.torch_device)
        torch.cuda.synchronize(self.torch_device)
        self.context_bytes = max(
            0,
            self.nvml.memory_used_bytes()
            - self.idle_baseline_bytes
            - torch.cuda.memory_reserved(self.torch_device),
        )
        info = self.nvml.info()
        self.device = records.DeviceDescriptor(
            kind=records.DeviceKind.CUDA,
            name=info.name,
            memory_bytes=info.memory_total_bytes,
            sm_count=info.sm_count or properties.multi_processor_count,
            cores=None,
            mig_profile=info.mig_profile,
            driver_version=info.driver_version,
            cuda_version=torch.version.cuda,
            torch_version=torch.__version__,
        )
        if settings.memory_cap_bytes is not None:
            fraction = min(1.0, settings.memory_cap_bytes / properties.total_memory)
            torch.cuda.set_per_process_memory_fraction(fraction, self.torch_device)
        self._limit_bytes = settings.memory_cap_bytes or info.memory_total_bytes

    def supports(self, task: steps.Task) -> bool:
        """Every task can be measured here."""
        return True

    def measure(self, planned: plans.PlannedTask, plan: plans.Plan) -> records.Record:
        """Measure one task; out-of-memory becomes a censored record."""
        task = planned.task
        started = collect.now()
        torch.cuda.reset_peak_memory_stats(self.torch_device)
        with torch.cuda.device(self.torch_device), Sampler(self.nvml, self.settings.sample_hz) as s:
            try:
                times, energy = self._run(task, plan, s)
                oom = False
            except Exception as e:
                if not cpu.is_out_of_memory(e):
                    raise
                times, energy, oom = None, None, True
        if s.error is not None:
            raise nvml.NvmlError(f"sampler failed: {s.error}") from s.error
        readings = s.readings
        allocated = torch.cuda.max_memory_allocated(self.torch_device)
        reserved = torch.cuda.max_memory_reserved(self.torch_device)
        memory = memory_target(
            readings.peak_used_bytes, self.idle_baseline_bytes, self.context_bytes, reserved
        )
        return records.Record(
            **collect.task_identity(planned, plan, self),
            status=records.Status.OUT_OF_MEMORY if oom else records.Status.OK,
            warmup_iterations=plan.warmup,
            timed_iterations=plan.iterations,
            step_time_mean_s=times.mean_s if times else None,
            step_time_median_s=times.median_s if times else None,
            step_time_p95_s=times.p95_s if times else None,
            step_cpu_time_median_s=None,
            memory_bytes=self._limit_bytes if oom else memory,
            context_bytes=self.context_bytes,
            allocator_peak_allocated_bytes=allocated,
            allocator_peak_reserved_bytes=reserved,
            rss_baseline_bytes=None,
            rss_peak_delta_bytes=None,
            sm_util_mean_percent=None if oom else readings.mean_percent,
            sm_util_peak_percent=None if oom else readings.peak_percent,
            utilisation_source=None if oom else readings.source,
            utilisation_samples=None if oom else len(readings.utilisation),
            energy_j=energy,
            threads=None,
            started_at=started,
            finished_at=collect.now(),
        )

    def _run(
        self, task: steps.Task, plan: plans.Plan, sampler: Sampler
    ) -> tuple[timing.StepTimes, float | None]:
        """Build, warm up and time `task`; the model is freed when this returns."""
        prepared = steps.prepare(task, self.torch_device)
        for _ in range(plan.warmup):
            prepared.step()
        torch.cuda.synchronize(self.torch_device)
        energy_before = self.nvml.energy_mj()
        sampler.open_window()
        samples = timing.time_cuda(prepared.step, 0, plan.iterations)
        sampler.close_window()
        energy = energy_joules(energy_before, self.nvml.energy_mj())
        return timing.StepTimes.of(samples), energy

    def cooldown(self, seconds: float) -> None:
        """Free what the task left (cached blocks, garbage) and let clocks and power settle."""
        gc.collect()
        torch.cuda.empty_cache()
        time.sleep(seconds)

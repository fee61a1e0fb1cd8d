"""Derived GPU-memory labels without a GPU: PyTorch's storage accounting on fake CUDA tensors.

Under `FakeTensorMode`, tensors on "cuda" carry shapes, dtypes and storage sizes but no data,
so a model can be built and run "on a GPU" on a machine that has none. `memtrack` then follows
the storages and reports the peak of live tensor bytes, rounded to the caching allocator's
512-byte blocks: an estimate of `torch.cuda.max_memory_allocated` over one step.

What it cannot see (documented in docs/dataset.md): the CUDA context, cuBLAS/cuDNN workspaces
and the allocator's reserved-but-free segments, so it is a lower bound of the "memory" target
and is stored under its own label source, never as `memory_bytes`. Only fp32 inference can be
derived this way with torch 2.13 on a machine without a GPU: autocast to CUDA is disabled when
CUDA is unavailable, and the autograd engine asks the driver for a primary context before
running a CUDA backward.
"""

from __future__ import annotations

from typing import Final

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from kubeseer.measure import collect, memtrack, plans, records, steps

# Memory totals as NVML reports them, and SM counts, for the GPUs a fake run may describe.
KNOWN_GPUS: Final[dict[str, tuple[int, int]]] = {
    "NVIDIA H100 80GB HBM3": (81559 * 2**20, 132),
    "NVIDIA H200": (143771 * 2**20, 132),
    "NVIDIA A100-SXM4-80GB": (81920 * 2**20, 108),
    "NVIDIA A100-SXM4-40GB": (40960 * 2**20, 108),
}


class UnsupportedTaskError(ValueError):
    """A task the fake-CUDA path cannot derive (training, or autocast precisions)."""


def supported(task: steps.Task) -> bool:
    """Only fp32 inference runs under fake CUDA without a GPU (see the module docstring)."""
    return task.mode == "infer" and task.precision == "fp32"


def derive_peak_bytes(task: steps.Task) -> int:
    """Peak live tensor bytes of one step of `task` on a fake CUDA device.

    Raises:
        UnsupportedTaskError: the task is not fp32 inference.
    """
    if not supported(task):
        raise UnsupportedTaskError(
            f"{task.describe()}: only fp32 inference can be derived on fake CUDA tensors"
        )
    device = torch.device("cuda", 0)
    with FakeTensorMode():
        prepared = steps.prepare(task, device)
        return memtrack.peak_tensor_bytes(prepared, device)


class FakeCudaBackend:
    """Derives allocator-peak labels for a named GPU without touching one."""

    label_source = records.LabelSource.DERIVED_FAKE_CUDA_ALLOCATOR

    def __init__(self, gpu_name: str) -> None:
        if gpu_name not in KNOWN_GPUS:
            raise ValueError(f"unknown GPU {gpu_name!r}; known: {', '.join(KNOWN_GPUS)}")
        memory, sms = KNOWN_GPUS[gpu_name]
        self.device = records.DeviceDescriptor(
            kind=records.DeviceKind.CUDA,
            name=gpu_name,
            memory_bytes=memory,
            sm_count=sms,
            cores=None,
            mig_profile=None,
            driver_version=None,
            cuda_version=torch.version.cuda,
            torch_version=torch.__version__,
        )

    def supports(self, task: steps.Task) -> bool:
        """Whether `task` can be derived (fp32 inference only)."""
        return supported(task)

    def measure(self, planned: plans.PlannedTask, plan: plans.Plan) -> records.Record:
        """Derive one task's allocator peak; every other label stays empty."""
        task = planned.task
        started = collect.now()
        peak = derive_peak_bytes(task)
        return records.Record(
            **collect.task_identity(planned, plan, self),
            status=records.Status.OK,
            warmup_iterations=0,
            timed_iterations=0,
            step_time_mean_s=None,
            step_time_median_s=None,
            step_time_p95_s=None,
            step_cpu_time_median_s=None,
            memory_bytes=None,
            context_bytes=None,
            allocator_peak_allocated_bytes=peak,
            allocator_peak_reserved_bytes=None,
            rss_baseline_bytes=None,
            rss_peak_delta_bytes=None,
            sm_util_mean_percent=None,
            sm_util_peak_percent=None,
            utilisation_source=None,
            utilisation_samples=None,
            energy_j=None,
            threads=None,
            started_at=started,
            finished_at=collect.now(),
        )

    def cooldown(self, seconds: float) -> None:
        """Nothing to release: fake tensors hold no memory."""

"""Derived GPU memory labels for any zoo task, without a GPU (label source
`derived-allocator-replay`).

Where `fake_cuda` derives only fp32 inference and only live tensors, this backend derives the
memory target itself (`gpu_memory`: the job's allocation trace on the meta device, replayed
through the caching-allocator model, plus the runtime context) for training and inference,
fp32 and fp16/bf16 autocast. `memory_bytes` is the target, `allocator_peak_allocated_bytes` and
`allocator_peak_reserved_bytes` what `torch.cuda.max_memory_allocated` / `max_memory_reserved`
would report on a GPU with room to spare, `context_bytes` the runtime's context. Time and
utilisation stay empty: nothing runs. The zoo's fp16 training steps go through a GradScaler,
whose few scalars per step are not modelled (docs/dataset.md).
"""

from __future__ import annotations

import torch

from kubeseer import zoo
from kubeseer.measure import collect, fake_cuda, gpu_memory, plans, records, steps

_OPTIMIZERS = {"sgd": "sgd", "adam": "adam", records.NO_OPTIMIZER: "none"}


def parts_of(spec: zoo.ModelSpec) -> gpu_memory.StepParts:
    """The zoo's model, batch and loss for `spec`, as the derivation builds them."""

    def build() -> torch.nn.Module:
        return zoo.build_model(spec)

    def batch(size: int, device: torch.device) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        with torch.device("cpu"):
            inputs, target = zoo.example_batch(spec, size)
        return tuple(t.to(device) for t in inputs), target.to(device)

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return zoo.training_loss(spec, output, target)

    return gpu_memory.StepParts(build=build, batch=batch, loss=loss)


def runtime_for(gpu_name: str) -> gpu_memory.Runtime:
    """Hopper GPUs get cuBLAS's 32 MiB workspace; every other GPU the 8 MiB one."""
    hopper = "H100" in gpu_name or "H200" in gpu_name
    return gpu_memory.RUNTIMES["torch2-cuda12-hopper" if hopper else "torch2-cuda12"]


def derive(task: steps.Task, runtime: gpu_memory.Runtime) -> gpu_memory.MemoryDerivation:
    """The derived memory of one zoo task (any mode and precision)."""
    job = gpu_memory.Job(
        mode="train" if task.mode == "train" else "infer",
        precision=task.precision,  # type: ignore[arg-type]  # validated by steps.Task
        optimizer=_OPTIMIZERS[task.optimizer],  # type: ignore[arg-type]
        batch_size=task.batch_size,
    )
    return gpu_memory.derive(parts_of(task.spec), job, runtime)


class ReplayCudaBackend(fake_cuda.FakeCudaBackend):
    """Derives memory-target labels for a named GPU without touching one."""

    label_source = records.LabelSource.DERIVED_ALLOCATOR_REPLAY

    def __init__(self, gpu_name: str) -> None:
        super().__init__(gpu_name)
        self.runtime = runtime_for(gpu_name)

    def supports(self, task: steps.Task) -> bool:
        """Every mode and precision."""
        return True

    def measure(self, planned: plans.PlannedTask, plan: plans.Plan) -> records.Record:
        """Derive one task's memory labels; time and utilisation stay empty."""
        started = collect.now()
        derived = derive(planned.task, self.runtime)
        return records.Record(
            **collect.task_identity(planned, plan, self),
            status=records.Status.OK,
            warmup_iterations=0,
            timed_iterations=0,
            step_time_mean_s=None,
            step_time_median_s=None,
            step_time_p95_s=None,
            step_cpu_time_median_s=None,
            memory_bytes=derived.memory_bytes,
            context_bytes=derived.context_bytes,
            allocator_peak_allocated_bytes=derived.allocated_peak,
            allocator_peak_reserved_bytes=derived.reserved_peak,
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

"""The GPU memory a job needs, derived without a GPU.

The target (docs/dataset.md, "GPU memory without a GPU") is what a whole GPU or MIG slice must
hold for the job to run:

    memory = runtime context + the caching allocator's required reservation

* the **required reservation** is the smallest device capacity in which the caching allocator
  serves the job's allocation trace without running out (`caching_allocator.required_capacity`),
  with its block and segment rounding, small and large pools and best-fit reuse. The trace is
  the job's own: its model built on the meta device, weights and batch placed in the order the
  job creates them, then warm-up and steady-state steps run under `alloc_trace.Recorder`, with
  CUDA's autocast policy and attention kernel supplied by `meta_cuda.CudaSemantics`. cuBLAS
  workspaces are in the trace (the recorder inserts them where PyTorch allocates them).
* the **runtime context** is what no allocator sees: the CUDA context with the kernels and
  libraries the job loads. It depends on the driver, the CUDA version and lazy loading, not on
  the model, and is a constant of the `Runtime`.

Not modelled, and why: cuDNN convolution workspaces (allocated per call through the caching
allocator, but elastic: PyTorch falls back to an algorithm with a smaller workspace when one
does not fit, so they never decide whether a job runs); NCCL buffers (single-GPU jobs only);
`torch.compile` (eager jobs only).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import torch
from torch import nn

from kubeseer.measure import alloc_trace, caching_allocator, meta_cuda

__all__ = [
    "RUNTIMES",
    "Job",
    "MemoryDerivation",
    "Runtime",
    "StepParts",
    "derive",
    "make_optimizer",
    "make_step",
    "no_fused_attention",
    "trace",
]

MIB: Final = 1 << 20

Mode = Literal["infer", "train"]
Precision = Literal["fp32", "fp16", "bf16"]
Optimizer = Literal["sgd", "sgd-nesterov", "adam", "none"]

_AUTOCAST = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Runtime:
    """What the software stack holds or does that no tensor of the model shows.

    Attributes:
        name: e.g. `torch2-cuda12`.
        context_bytes: the CUDA context with PyTorch's kernels and libraries loaded.
        cublas_workspace_bytes: one cuBLAS handle's workspace (PyTorch's default
            `CUBLAS_WORKSPACE_CONFIG`: ":4096:2:16:8" = 8 MiB + 128 KiB before Hopper,
            ":4096:8" = 32 MiB on Hopper).
        fused_attention: `F.scaled_dot_product_attention` exists (torch >= 2.0), so libraries
            such as timm use it; before that attention materialises its scores.
        foreach_optimizer: optimisers update all parameters with multi-tensor kernels (the
            CUDA default from torch 2.0; one tensor at a time before).
        zero_grad_to_none: `optimizer.zero_grad()` frees gradients (torch >= 2.0) rather
            than zeroing them in place, so they do not exist during the forward pass.
    """

    name: str
    context_bytes: int
    cublas_workspace_bytes: int
    fused_attention: bool
    foreach_optimizer: bool
    zero_grad_to_none: bool


_CUBLAS_PRE_HOPPER: Final = 4096 * 1024 * 2 + 16 * 1024 * 8
_CUBLAS_HOPPER: Final = 4096 * 1024 * 8

RUNTIMES: Final[dict[str, Runtime]] = {
    # Lazy module loading (CUDA >= 12.2 enables it by default; PyTorch sets it from 1.13 on):
    # only the kernels a job touches are loaded, so the context stays a few hundred MiB.
    "torch2-cuda12": Runtime(
        name="torch2-cuda12",
        context_bytes=500 * MIB,
        cublas_workspace_bytes=_CUBLAS_PRE_HOPPER,
        fused_attention=True,
        foreach_optimizer=True,
        zero_grad_to_none=True,
    ),
    "torch2-cuda12-hopper": Runtime(
        name="torch2-cuda12-hopper",
        context_bytes=500 * MIB,
        cublas_workspace_bytes=_CUBLAS_HOPPER,
        fused_attention=True,
        foreach_optimizer=True,
        zero_grad_to_none=True,
    ),
    # torch 1.12/1.13 with CUDA 11.3-11.7 load every kernel of libtorch_cuda and cuDNN eagerly.
    "torch1-cuda11": Runtime(
        name="torch1-cuda11",
        context_bytes=1200 * MIB,
        cublas_workspace_bytes=_CUBLAS_PRE_HOPPER,
        fused_attention=False,
        foreach_optimizer=False,
        zero_grad_to_none=False,
    ),
}
"""Runtimes by name. The context sizes are not published figures: docs/dataset.md says how
they were chosen and how far the derivation depends on them."""


@dataclass(frozen=True)
class Job:
    """One step to derive: mode, autocast precision, optimiser, batch size, attention kernel."""

    mode: Mode
    precision: Precision
    optimizer: Optimizer
    batch_size: int
    attention: meta_cuda.AttentionKernel = "auto"
    steps: int = 3

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {self.batch_size}")
        if (self.mode == "infer") != (self.optimizer == "none"):
            raise ValueError("inference takes optimizer 'none'; training one of sgd, adam")
        if self.precision not in _AUTOCAST:
            raise ValueError(f"precision must be fp32, fp16 or bf16, got {self.precision!r}")


@dataclass(frozen=True)
class StepParts:
    """How to build a job on a device: its model, its batch, and its training loss."""

    build: Callable[[], nn.Module]
    batch: Callable[[int, torch.device], tuple[tuple[torch.Tensor, ...], torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class MemoryDerivation:
    """The derived memory of one job (bytes).

    Attributes:
        allocated_peak: peak of live blocks (`torch.cuda.max_memory_allocated`).
        reserved_peak: peak of reserved segments on a device with room to spare
            (`torch.cuda.max_memory_reserved`).
        required_reservation: the smallest allocator capacity the job runs in.
        context_bytes: the runtime's context.
        events: allocations and frees in the trace.
    """

    allocated_peak: int
    reserved_peak: int
    required_reservation: int
    context_bytes: int
    events: int

    @property
    def memory_bytes(self) -> int:
        """The target: what a GPU or slice must hold (context + required reservation)."""
        return self.context_bytes + self.required_reservation

    @property
    def observed_bytes(self) -> int:
        """What NVML would show on a larger GPU: context + the unconstrained reserved peak."""
        return self.context_bytes + self.reserved_peak


def _apply_order(module: nn.Module) -> Iterator[torch.Tensor]:
    """Parameters and buffers in the order `module.to(device)` copies them (children first)."""
    for child in module.children():
        yield from _apply_order(child)
    for parameter in module._parameters.values():
        if parameter is not None:
            yield parameter
    for buffer in module._buffers.values():
        if buffer is not None:
            yield buffer


def make_optimizer(name: Optimizer, model: nn.Module, runtime: Runtime) -> torch.optim.Optimizer:
    """The optimiser a job steps with: Adam, or SGD with momentum (Nesterov where named)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-3, foreach=runtime.foreach_optimizer)
    return torch.optim.SGD(
        params,
        lr=1e-3,
        momentum=0.9,
        nesterov=name == "sgd-nesterov",
        foreach=runtime.foreach_optimizer,
    )


@contextlib.contextmanager
def no_fused_attention(runtime: Runtime) -> Iterator[None]:
    """Hide `F.scaled_dot_product_attention` from libraries that test for it (torch 1.x).

    The zoo's llama family calls it directly, as Llama code written for torch 2 does: its
    jobs are derived on torch 2 runtimes only (`replay_cuda.runtime_for`)."""
    if runtime.fused_attention:
        yield
        return
    try:
        from timm.layers import config as timm_config
    except ImportError:  # pragma: no cover - timm is a dependency
        yield
        return
    before = timm_config._USE_FUSED_ATTN
    timm_config.set_fused_attn(False)
    try:
        yield
    finally:
        timm_config._USE_FUSED_ATTN = before


def trace(parts: StepParts, job: Job, runtime: Runtime) -> list[caching_allocator.Event]:
    """The job's allocation trace: weights, batch, then `job.steps` steps, on the meta device."""
    meta = torch.device("meta")
    with no_fused_attention(runtime), meta:
        model = parts.build()
    recorder = alloc_trace.Recorder(cublas_workspace_bytes=runtime.cublas_workspace_bytes)
    recorder.track(_apply_order(model))
    inputs, target = parts.batch(job.batch_size, meta)
    recorder.track([*inputs, target])
    semantics = meta_cuda.CudaSemantics(_AUTOCAST[job.precision], job.attention)
    step = make_step(parts, job, runtime, model, inputs, target, lambda: semantics)
    with recorder:
        for _ in range(job.steps):
            step()
    return recorder.close()


def make_step(
    parts: StepParts,
    job: Job,
    runtime: Runtime,
    model: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    target: torch.Tensor,
    precision: Callable[[], contextlib.AbstractContextManager[Any]],
) -> Callable[[], None]:
    """One step of `job` on `model` as `trace` records it: inference under `no_grad`, or
    zero-grad, forward and loss, backward and the optimiser's step, the forward (and loss)
    inside `precision()` (CUDA's autocast policy on the meta device, `torch.autocast` on a
    GPU). `derived_check` runs this same step on a GPU, so what it measures is the job the
    derivation traced. Sets the model's mode and creates the optimiser (its state comes with
    the first step, as on a GPU)."""
    if job.mode == "infer":
        model.eval()

        def infer() -> None:
            with torch.no_grad(), precision():
                out = model(*inputs)
            del out

        return infer
    model.train()
    optimizer = make_optimizer(job.optimizer, model, runtime)

    def train() -> None:
        optimizer.zero_grad(set_to_none=runtime.zero_grad_to_none)
        with precision():
            loss = parts.loss(model(*inputs), target)
        loss.backward()  # type: ignore[no-untyped-call]  # untyped in torch's stubs
        del loss
        optimizer.step()

    return train


def derive(parts: StepParts, job: Job, runtime: Runtime) -> MemoryDerivation:
    """Derive the job's memory target on the given runtime (see the module docstring)."""
    events = trace(parts, job, runtime)
    return from_trace(events, runtime)


def from_trace(events: Sequence[caching_allocator.Event], runtime: Runtime) -> MemoryDerivation:
    """Replay a recorded trace through the allocator model and add the runtime's context."""
    unlimited = caching_allocator.replay(events)
    return MemoryDerivation(
        allocated_peak=unlimited.peak_allocated,
        reserved_peak=unlimited.peak_reserved,
        required_reservation=caching_allocator.required_capacity(events),
        context_bytes=runtime.context_bytes,
        events=len(events),
    )

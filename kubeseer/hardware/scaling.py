"""How a step's time scales with a device's compute and bandwidth, and the slowdown on a slice.

A step asks a device for FLOPs (matmuls, convolutions and attention on tensor cores at the job's
precision) and memory traffic (every operator's inputs and outputs), launches a number of
kernels, and pays a fixed cost per step; the last two no device size changes (launch latency,
the host's Python). With a device's peak FLOP/s P and bandwidth W (`mig.Device`: a whole GPU or
a MIG instance's SMs and memory slices):

    t(device) = c_f * flops / P + c_b * bytes / W + c_k * kernels + c_0

The coefficients are fitted on the public timm step times of four GPUs (RTX 3090, 4090, 5090,
RTX PRO 6000; bench/gpu_step_time.py prints the fit and how well it holds, leave one GPU out),
so they fold in how far real kernels stay below peak. A job's **slowdown** on a slice is
`t(slice) / t(whole GPU)`: close to the SM share's inverse for a job that keeps the GPU busy,
close to 1 for one whose steps are mostly fixed cost. This is the first-order model: it ignores
wave quantisation (a kernel of fewer blocks than the slice has SMs does not slow down at all),
so for small kernels it errs towards more slowdown, the safe side for placement.

Pure Python, so placement may import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal

from kubeseer.hardware import gpus, mig

__all__ = ["FITTED", "Coefficients", "Work", "slowdown", "step_time"]


@dataclass(frozen=True)
class Work:
    """What one step asks of a device.

    Attributes:
        flops: floating-point operations per step (2 per multiply-add; a training step counts
            forward and backward).
        bytes: bytes the step's operators read and write (inputs plus outputs of every
            operator that is not a view), at the width autocast gives them.
        kernels: operators launched per step (views excluded).
        precision: the precision matmuls and convolutions run in (`fp16`/`bf16` under
            autocast, `fp32` otherwise).
        mode: `infer` or `train`: which fitted coefficients apply.
    """

    flops: float
    bytes: float
    kernels: float
    precision: gpus.Precision
    mode: Literal["infer", "train"] = "infer"

    def __post_init__(self) -> None:
        if min(self.flops, self.bytes, self.kernels) < 0:
            raise ValueError(
                f"work must be non-negative, got {self.flops} FLOPs, {self.bytes} B, "
                f"{self.kernels} kernels"
            )


@dataclass(frozen=True)
class Coefficients:
    """`c_f`, `c_b` (dimensionless: how many times the peak-rate time a step takes), `c_k`
    (seconds per kernel) and `c_0` (seconds per step), and where they were fitted."""

    compute: float
    memory: float
    per_kernel_s: float
    fixed_s: float
    fitted_on: str


_FIT = (
    "relative least squares on 5,935 public timm step times (RTX 3090/4090/5090/PRO 6000, "
    "fp16 AMP, eager), bench/gpu_step_time.py, eleventh session"
)

FITTED: Final[Mapping[str, Coefficients]] = MappingProxyType(
    {
        # Close to 1 x peak-rate compute plus 1 x peak-rate traffic: at the batch sizes timm
        # measured, kernels reach about their roofline, and launches vanish into the fixed cost.
        "infer": Coefficients(
            compute=0.8285, memory=1.0114, per_kernel_s=0.0, fixed_s=2.746e-3, fitted_on=_FIT
        ),
        # Training rows come from one GPU and torch 1.12, whose per-parameter SGD loop is most
        # of the fixed 68 ms.
        "train": Coefficients(
            compute=0.9244, memory=1.1370, per_kernel_s=0.0, fixed_s=68.126e-3, fitted_on=_FIT
        ),
    }
)
"""The coefficients per mode, fitted on the public timm step times (docs/accuracy.md, "GPU step
time from public measurements")."""


def step_time(device: mig.Device, work: Work, coefficients: Coefficients | None = None) -> float:
    """Predicted seconds per step of `work` on `device` (coefficients: `FITTED[work.mode]`)."""
    if coefficients is None:
        coefficients = FITTED[work.mode]
    compute = work.flops / device.peak_flops(work.precision)
    memory = work.bytes / device.memory_bandwidth
    launches = coefficients.per_kernel_s * work.kernels
    return (
        coefficients.compute * compute
        + coefficients.memory * memory
        + launches
        + coefficients.fixed_s
    )


def slowdown(
    whole: mig.Device, part: mig.Device, work: Work, coefficients: Coefficients | None = None
) -> float:
    """How many times slower `work` runs on `part` (a MIG instance) than on `whole` (at least 1).

    Raises:
        ValueError: `part` is not a part of `whole`'s GPU.
    """
    if part.gpu.key != whole.gpu.key:
        raise ValueError(f"{part.name} is not a part of {whole.name}")
    ratio = step_time(part, work, coefficients) / step_time(whole, work, coefficients)
    return max(1.0, ratio)

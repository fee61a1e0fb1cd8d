"""The `Prediction` value that crosses from the predictor to placement and the operator.

It lives outside `kubeseer.predictor` so that `kubeseer.placement` (which must not import torch)
and the operator can use it without pulling in the model code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Mode(StrEnum):
    """What the job does with the model on each step."""

    TRAIN = "train"
    INFER = "infer"


class Precision(StrEnum):
    """Numeric precision the job computes in (fp16/bf16 mean autocast over fp32 weights)."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"


class Attention(StrEnum):
    """Which kernel runs a job's attention, which decides whether its ``(batch, heads, S, S)``
    matrices exist (`kubeseer.predictor.attention`).

    ``auto`` is what PyTorch (2.5 or later) chooses on an SM80+ GPU:
    ``F.scaled_dot_product_attention`` on four-dimensional operands runs FlashAttention-2 or the
    memory-efficient kernel, on other ranks its math path, attention written by hand runs as
    written. ``flash`` and ``efficient`` fuse every attention, ``math`` none: scaled-dot-product
    attention takes the math path, which computes fp16 and bf16 attention in fp32. ``written``
    runs every attention as the graph spells it, in the job's precision: PyTorch 1.x (which has
    no scaled-dot-product attention, so libraries write it by hand) and the math path before
    PyTorch 2.5.
    """

    AUTO = "auto"
    FLASH = "flash"
    EFFICIENT = "efficient"
    MATH = "math"
    WRITTEN = "written"


@dataclass(frozen=True)
class Estimate:
    """A point prediction and the calibrated upper bound at the prediction's coverage."""

    point: float
    upper: float

    def __post_init__(self) -> None:
        if self.upper < self.point:
            raise ValueError(f"upper bound {self.upper} is below the point estimate {self.point}")


@dataclass(frozen=True)
class StepWork:
    """What one step asks of a GPU, counted from the model's graph (not learned).

    A slowdown model scales step time from one device to another with it
    (`kubeseer.hardware.scaling`): how much of the step is arithmetic, how much memory traffic,
    how much fixed cost per kernel launch.

    Attributes:
        flops: floating-point operations per step (2 per multiply-add; a training step counts
            forward and backward, three forward passes).
        bytes_moved: bytes the step's operators read and write, at the width autocast gives
            matrix products and convolutions.
        kernels: operators launched per step.
    """

    flops: float
    bytes_moved: float
    kernels: float

    def __post_init__(self) -> None:
        if min(self.flops, self.bytes_moved, self.kernels) < 0:
            raise ValueError(f"step work must be non-negative, got {self}")


@dataclass(frozen=True)
class Prediction:
    """Predicted needs of one (model, batch size, mode, precision) on one GPU type.

    `memory_bytes` is the target defined in docs/dataset.md: device memory a MIG slice must hold,
    i.e. NVML used bytes during the job including the CUDA context.
    """

    mode: Mode
    batch_size: int
    precision: Precision
    memory_bytes: Estimate
    sm_util_percent: Estimate
    step_time_s: Estimate
    coverage: float
    model_digest: str
    predictor_version: str
    label_device: str
    warnings: tuple[str, ...] = field(default_factory=tuple)
    unlearned: tuple[str, ...] = field(default_factory=tuple)
    """Quantities (`sm_util_percent`, ...) the predictor has no labels for and filled with a
    documented stand-in: not evidence, so placement does not act on them."""
    launch_limits: tuple[str, ...] = field(default_factory=tuple)
    """Kernel launch limits the step crosses at this batch size (fused attention above 65,535
    sequences, a depthwise convolution of 2^31 elements): the job fails there on any GPU, so
    no placement cures it (`kubeseer.predictor.launch_limits`)."""
    work: StepWork | None = None
    """The step's work as the graph counts it, where the predictor provides it: what a
    slowdown model derives a slice's step time from (`kubeseer.placement.slowdown.from_work`)."""

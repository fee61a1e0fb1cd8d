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


@dataclass(frozen=True)
class Estimate:
    """A point prediction and the calibrated upper bound at the prediction's coverage."""

    point: float
    upper: float

    def __post_init__(self) -> None:
        if self.upper < self.point:
            raise ValueError(f"upper bound {self.upper} is below the point estimate {self.point}")


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

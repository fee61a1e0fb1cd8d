"""Step time as a sum of operator-class costs: the prior that the step-time heads correct.

Left to itself, a graph network learns step time from the families it was trained on, and on a
family it has never seen its error grows several-fold (docs/accuracy.md, leave one family
out). How long a step takes is mostly a matter of how much work of each kind the graph holds,
and that transfers between architectures: a dense convolution's FLOPs cost about the same in a
DenseNet as in a ResNet. This model is that view, with one non-negative cost per unit of
work in each operator class (`TERMS`), fitted per mode on the training split and stored with
the normaliser. A step-time head then learns ``log(label) - log(estimate)``, the part the
classes miss (kernel choice, fusion, cache effects).

The classes come from the node features every PerfGraph has, so the model reads the same
tensors as the network: convolutions (a kernel extent and weights), grouped and depthwise
convolutions (more than one group), pooling (a kernel extent, no weights), matrix products (a
reduction length K) and everything else. FLOPs and bytes moved are separate terms because
depthwise convolutions, pooling and elementwise operators are bound by memory traffic and
matrix products by arithmetic; pooling's FLOPs are left out as that of a memory-bound class.
A count of operators per class carries the fixed cost of launching each (on the CPU data a
convolution's overhead is not an Add's: per-class counts cut the leave-one-family-out error of
the model alone from 33 % to 21 %, docs/accuracy.md). There is no constant term: fitted on
large models it would dominate the smallest ones.

The fit minimises the mean squared log error, the network's own objective, with positive
coefficients (each is ``exp`` of a free parameter), by L-BFGS on the standardised terms.

**On a named GPU** (`DEVICE_TERMS`, `device_terms`): the same classes, each FLOPs term divided
by the device's peak rate for it and each bytes term by its bandwidth (seconds at peak), the
counts as they are, and one constant for the step's fixed cost (the host's Python, the
optimiser's launches: measured step times of small GPU jobs are mostly that). The coefficients
are then dimensionless efficiencies and seconds per launch, which is what carries a model
fitted on some GPUs to another, or to a MIG slice, through its specs
(`kubeseer.hardware.scaling` is the four-term form of the same law).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import torch
from torch import Tensor
from torch_geometric.data import Data

from kubeseer.hardware import mig
from kubeseer.predictor import schema, targets

TERMS: Final[tuple[str, ...]] = (
    "conv_flops",
    "grouped_conv_flops",
    "matmul_flops",
    "other_flops",
    "conv_mac_bytes",
    "pool_mac_bytes",
    "matmul_mac_bytes",
    "other_mac_bytes",
    "conv_operators",
    "pool_operators",
    "matmul_operators",
    "other_operators",
)

DEVICE_TERMS: Final[tuple[str, ...]] = (
    "conv_flops_at_peak",
    "grouped_conv_flops_at_peak",
    "matmul_flops_at_peak",
    "other_flops_at_fp32_peak",
    "conv_bytes_at_bandwidth",
    "pool_bytes_at_bandwidth",
    "matmul_bytes_at_bandwidth",
    "other_bytes_at_bandwidth",
    "conv_operators",
    "pool_operators",
    "matmul_operators",
    "other_operators",
    "step",
)
"""`TERMS` on a device: FLOPs over its peak, bytes over its bandwidth (seconds), counts, and 1."""

_FLOPS = schema.NODE_FEATURES.index("flops")
_MAC = schema.NODE_FEATURES.index("mac_bytes")
_KERNEL = schema.NODE_FEATURES.index("kernel_h")
_WEIGHTS = schema.NODE_FEATURES.index("weight_bytes")
_GROUP = schema.NODE_FEATURES.index("group")
_REDUCTION = schema.NODE_FEATURES.index("gemm_k")

#: Fewer step labels than this for a mode and the mode gets no cost model (its heads then
#: learn the plain log label): twelve coefficients need many more samples than twelve.
MIN_SAMPLES: Final[int] = 32


class CostModelError(ValueError):
    """Terms of the wrong shape, or stored coefficients that are not a cost model."""


def terms(x: Tensor) -> Tensor:
    """The work of one graph per `TERMS` entry, ``(1, len(TERMS))`` float64.

    Args:
        x: the graph's node features as `perfgraph.to_pyg` makes them (log1p-transformed,
            not yet standardised), so that training samples and requests give equal terms.
    """
    if x.dim() != 2 or x.size(1) != len(schema.NODE_FEATURES):
        raise CostModelError(f"node features must be (Nv, {len(schema.NODE_FEATURES)})")
    raw = torch.expm1(x.double())
    flops, mac = raw[:, _FLOPS], raw[:, _MAC]
    windowed = raw[:, _KERNEL] > 0
    conv = windowed & (raw[:, _WEIGHTS] > 0)
    pool = windowed & ~conv
    grouped = conv & (raw[:, _GROUP] > 1.5)
    matmul = ~windowed & (raw[:, _REDUCTION] > 0)
    other = ~windowed & ~matmul
    values = [
        flops[conv & ~grouped].sum(),
        flops[grouped].sum(),
        flops[matmul].sum(),
        flops[other].sum(),
        *(mac[kind].sum() for kind in (conv, pool, matmul, other)),
        *(kind.sum().double() for kind in (conv, pool, matmul, other)),
    ]
    return torch.stack(values).reshape(1, -1)


def device_terms(x: Tensor, device: mig.Device, precision: str) -> Tensor:
    """The work of one graph on `device` per `DEVICE_TERMS` entry, ``(1, len(DEVICE_TERMS))``.

    Convolutions and matrix products run at the device's peak for `precision` (tensor cores
    under fp16/bf16 autocast, TF32 for fp32), other operators at its FP32 peak; bytes are the
    graph's (an fp32 export) scaled to the autocast width (`kubeseer.predictor.device`).
    """
    from kubeseer.predictor import device as device_mod

    work = terms(x)[0]
    matmul_peak = device.peak_flops(device_mod.matmul_precision(precision))
    fp32_peak = device.peak_flops("fp32")
    width = 1.0 if precision == "fp32" else device_mod.AUTOCAST_BYTES
    flops = work[:4] / torch.tensor([matmul_peak, matmul_peak, matmul_peak, fp32_peak])
    moved = work[4:8] * width / device.memory_bandwidth
    return torch.cat([flops, moved, work[8:], torch.ones(1, dtype=work.dtype)]).reshape(1, -1)


def _term_names(width: int) -> tuple[str, ...]:
    for names in (TERMS, DEVICE_TERMS):
        if len(names) == width:
            return names
    raise CostModelError(f"{width} work terms are neither TERMS nor DEVICE_TERMS")


@dataclass(frozen=True)
class StepCostModel:
    """Seconds per unit of each term, per mode (``"train"``, ``"infer"``).

    Attributes:
        seconds_per_unit: mode -> one non-negative coefficient per entry of `terms`.
        terms: `TERMS` (device-free) or `DEVICE_TERMS` (on a named device).
    """

    seconds_per_unit: Mapping[str, tuple[float, ...]]
    terms: tuple[str, ...] = TERMS

    def __post_init__(self) -> None:
        if self.terms not in (TERMS, DEVICE_TERMS):
            raise CostModelError(f"unknown cost model terms {self.terms}")
        for mode, coefficients in self.seconds_per_unit.items():
            if mode not in targets.MODES:
                raise CostModelError(f"unknown mode {mode!r}; known: {targets.MODES}")
            if len(coefficients) != len(self.terms):
                raise CostModelError(
                    f"{mode}: {len(coefficients)} coefficients, need {len(self.terms)}"
                )
            if not all(math.isfinite(c) and c >= 0 for c in coefficients):
                raise CostModelError(f"{mode}: coefficients must be finite and non-negative")

    @classmethod
    def fit(cls, work: Tensor, labels: Tensor, modes: Sequence[str]) -> StepCostModel:
        """Fit each mode with at least `MIN_SAMPLES` labels.

        Args:
            work: ``(N, len(TERMS))`` or ``(N, len(DEVICE_TERMS))`` terms of the labelled
                samples.
            labels: ``(N,)`` step times in seconds, all positive.
            modes: the mode of each row.
        """
        widths = (len(TERMS), len(DEVICE_TERMS))
        if work.dim() != 2 or work.size(1) not in widths or work.size(0) != labels.numel():
            raise CostModelError(
                f"work must be (N, {len(TERMS)}) or (N, {len(DEVICE_TERMS)}) with one label per row"
            )
        names = _term_names(work.size(1))
        if len(modes) != labels.numel():
            raise CostModelError("one mode per label")
        fitted = {}
        for mode in targets.MODES:
            rows = torch.tensor([m == mode for m in modes], dtype=torch.bool)
            if int(rows.sum()) >= MIN_SAMPLES:
                fitted[mode] = _fit_one(work[rows].double(), labels[rows].double())
        return cls(fitted, names)

    def log_estimate(self, mode: str, work: Tensor) -> Tensor | None:
        """``log`` of the estimated step time of each row of `work` ``(B, len(TERMS))``, or
        None when `mode` has no fit."""
        coefficients = self.seconds_per_unit.get(mode)
        if coefficients is None:
            return None
        seconds = work.double() @ torch.tensor(coefficients, dtype=torch.float64)
        return seconds.clamp_min(1e-12).log()

    def to_dict(self) -> dict[str, Any]:
        """Plain lists, so a checkpoint loads with ``weights_only=True``."""
        return {
            "terms": list(self.terms),
            "seconds_per_unit": {m: list(c) for m, c in self.seconds_per_unit.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepCostModel:
        """Inverse of `to_dict`; terms stored in another order are an error, not a reorder."""
        try:
            stored_terms = tuple(data["terms"])
            coefficients = {
                str(m): tuple(float(c) for c in values)
                for m, values in data["seconds_per_unit"].items()
            }
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CostModelError(f"not a step cost model: {e!r}") from e
        if stored_terms not in (TERMS, DEVICE_TERMS):
            raise CostModelError(
                f"cost model terms {stored_terms} differ from {TERMS} and {DEVICE_TERMS}"
            )
        return cls(coefficients, stored_terms)


def fit_samples(samples: Sequence[Data], metrics: Sequence[str]) -> StepCostModel:
    """`StepCostModel.fit` on every label of a step metric in `metrics` that `samples` carry
    (each with ``cost_terms``, ``y`` and ``y_mask`` in `metrics` order)."""
    work, labels, modes = [], [], []
    for sample in samples:
        sample_terms = getattr(sample, "cost_terms", None)
        if sample_terms is None:
            raise CostModelError("a step-time prior needs every sample to carry cost_terms")
        for k, name in enumerate(metrics):
            mode, quantity = targets.split_metric(name)
            if quantity == "step_time_s" and bool(sample.y_mask[0, k]):
                work.append(sample_terms)
                labels.append(float(sample.y[0, k]))
                modes.append(mode)
    if not labels:
        raise CostModelError("a step-time prior needs step-time labels")
    return StepCostModel.fit(torch.cat(work), torch.tensor(labels, dtype=torch.float64), modes)


#: Bound on each log coefficient of the standardised terms. L-BFGS's line search can step far
#: enough to overflow ``exp`` (it did with the RTX 5090's rows left out of the timm labels:
#: every coefficient inf or 0); a standardised term's coefficient is about a step time in
#: seconds, so e^+-30 leaves the fit free and keeps it finite.
_LOG_COEFFICIENT_BOUND: Final[float] = 30.0


def _fit_one(work: Tensor, labels: Tensor) -> tuple[float, ...]:
    """Non-negative coefficients minimising the mean squared log error of ``work @ c``."""
    if bool((labels <= 0).any()):
        raise CostModelError("step times must be positive")
    # Standardising each term to mean 1 makes the free parameters comparable for L-BFGS; an
    # all-zero term (no grouped convolutions in the data) keeps scale 1 and its coefficient
    # has no gradient, so it stays at its start.
    scale = work.mean(dim=0)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    scaled = work / scale
    log_labels = labels.log()
    start = float(labels.median()) / work.size(1)
    log_coefficients = torch.full((work.size(1),), math.log(start), dtype=torch.float64)
    log_coefficients.requires_grad_(True)
    optimiser = torch.optim.LBFGS(
        [log_coefficients], max_iter=500, tolerance_change=1e-12, line_search_fn="strong_wolfe"
    )

    def bounded() -> Tensor:
        return log_coefficients.clamp(-_LOG_COEFFICIENT_BOUND, _LOG_COEFFICIENT_BOUND).exp()

    def closure() -> Tensor:
        optimiser.zero_grad()
        estimate = (scaled @ bounded()).clamp_min(1e-30)
        loss = ((estimate.log() - log_labels) ** 2).mean()
        torch.autograd.backward(loss)
        return loss

    optimiser.step(closure)  # type: ignore[no-untyped-call]
    coefficients = bounded().detach() / scale
    return tuple(float(c) for c in coefficients)

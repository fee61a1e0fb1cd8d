"""How much slower a job runs on part of a GPU than on all of it, and what that figure rests on.

A slowdown model is a pure function `(prediction, device) -> Slowdown`; the plan calls whichever
it is given (`SlowdownModel`), so a learned model (docs/placement.md, "The slowdown model") can
replace the default without touching the policy. Every figure says what it rests on:

* ``learned``: the predictor learned SM utilisation from labels measured on this GPU product.
* ``derived``: learned on another GPU and carried over (the share of SMs a job keeps busy is
  assumed to be the same on the placed GPU), or computed from such a figure.
* ``no evidence``: the predictor never learned SM utilisation (its figure is a stand-in, or its
  labels come from a CPU). There is no slowdown figure then, and placement does not act on one:
  a stand-in is not evidence, so the job gets the cheapest device that holds its memory.

`from_utilisation`: a job that keeps ``u`` % of a whole GPU's SMs busy needs about ``u/100`` of
its SMs; on a slice with compute share ``s`` it runs about ``max(1, (u/100) / s)`` times slower.
It is first order: it ignores the bandwidth and L2 a slice also loses, so memory-bound jobs can
be slower than it says.

`from_work`: the step's work as the graph counts it (`Prediction.work`: FLOPs, bytes moved,
kernels) through the step-time scaling law `kubeseer.hardware.scaling`, whose coefficients were
fitted on public step times of four other GPUs: ``t = c_f F/P + c_b B/W + c_k K + c_0`` on the
slice (its SMs' share of the peak P, its memory slices' share of the bandwidth W) over the same
on the whole GPU. Evidence ``derived``: no MIG step time was measured (docs/placement.md says how
well the law holds between whole GPUs).

The default, `from_evidence`, takes the learned utilisation where there is one, the work where
there is no utilisation, and otherwise says there is no evidence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from kubeseer import prediction as prediction_mod
from kubeseer.hardware import gpus, mig, scaling
from kubeseer.placement import catalogue

__all__ = [
    "SM_UTILISATION",
    "Device",
    "Evidence",
    "Slowdown",
    "SlowdownModel",
    "from_evidence",
    "from_utilisation",
    "from_work",
    "required_compute_share",
    "utilisation_factor",
    "utilisation_source",
]

SM_UTILISATION = "sm_util_percent"
"""The quantity of a `Prediction` the default model reads (see `Prediction.unlearned`)."""


class Evidence(StrEnum):
    """What a slowdown figure rests on (`status.placement.slowdownEvidence`)."""

    LEARNED = "learned"
    DERIVED = "derived"
    NONE = "no evidence"


@dataclass(frozen=True)
class Device:
    """What one candidate gives a job, as a slowdown model sees it.

    `compute_share` is the profile's SMs over the GPU's, tightened by the node's
    multiprocessors label where the inventory has one.
    """

    gpu: catalogue.GpuModel
    profile: catalogue.Profile
    compute_share: float


@dataclass(frozen=True)
class Slowdown:
    """Step time on a device over step time on the whole GPU, and its grounds.

    `factor` is None exactly when `evidence` is `Evidence.NONE`: no figure is made up.
    """

    factor: float | None
    evidence: Evidence
    basis: str

    def __post_init__(self) -> None:
        if (self.factor is None) != (self.evidence is Evidence.NONE):
            raise ValueError("a slowdown has a factor exactly when it rests on evidence")
        if self.factor is not None and self.factor < 1:
            raise ValueError(f"a slowdown factor is at least 1, got {self.factor}")

    def within(self, max_slowdown: float) -> bool:
        """True unless evidence says the job would run slower than `max_slowdown`."""
        return self.factor is None or self.factor <= max_slowdown


SlowdownModel = Callable[[prediction_mod.Prediction, Device], Slowdown]
"""Any pure function from a prediction and a device to a `Slowdown`."""


def utilisation_factor(compute_share: float, sm_util_percent: float) -> float:
    """`max(1, (u/100) / s)`, utilisation clamped to 0..100 % (see the module docstring)."""
    if compute_share <= 0:
        raise ValueError(f"compute share must be positive, got {compute_share}")
    demand = min(max(sm_util_percent, 0.0), 100.0) / 100.0
    return max(1.0, demand / compute_share)


def required_compute_share(sm_util_percent: float, max_slowdown: float) -> float:
    """The smallest compute share whose `utilisation_factor` stays within `max_slowdown`."""
    return min(max(sm_util_percent, 0.0), 100.0) / 100.0 / max_slowdown


def utilisation_source(pred: prediction_mod.Prediction) -> catalogue.GpuModel | None:
    """The GPU the prediction's SM utilisation was learned on, or None if it is no evidence.

    None when the predictor filled utilisation with a stand-in (`Prediction.unlearned`) or
    learned it from a device that is not a GPU of the catalogue (a CPU's "utilisation" is CPU
    time over wall time, which says nothing about SMs).
    """
    if SM_UTILISATION in pred.unlearned:
        return None
    return catalogue.find_model(pred.label_device)


def from_utilisation(pred: prediction_mod.Prediction, device: Device) -> Slowdown:
    """The default model: predicted SM demand over the device's compute share."""
    source = utilisation_source(pred)
    util = pred.sm_util_percent.point
    if source is None:
        why = (
            "the predictor has no SM utilisation labels"
            if SM_UTILISATION in pred.unlearned
            else f"its utilisation labels come from {pred.label_device}, not a GPU"
        )
        return Slowdown(None, Evidence.NONE, f"no evidence of a slowdown: {why}")
    factor = utilisation_factor(device.compute_share, util)
    if source.key == device.gpu.key:
        return Slowdown(
            factor,
            Evidence.LEARNED,
            f"{util:.0f} % SM utilisation learned on {source.key}, "
            f"compute share {device.compute_share:.3f}",
        )
    return Slowdown(
        factor,
        Evidence.DERIVED,
        f"{util:.0f} % SM utilisation learned on {source.key}, assumed to carry over to "
        f"{device.gpu.key}, compute share {device.compute_share:.3f}",
    )


_LAW_PRECISION: dict[prediction_mod.Precision, gpus.Precision] = {
    prediction_mod.Precision.FP32: "fp32",
    prediction_mod.Precision.FP16: "fp16",
    prediction_mod.Precision.BF16: "bf16",
}


def from_work(pred: prediction_mod.Prediction, device: Device) -> Slowdown:
    """The scaling law's step time on the device over its whole GPU's, for the step's work.

    No evidence when the prediction carries no work, or the hardware table lacks the GPU or
    the profile (then nothing is made up).
    """
    if pred.work is None:
        return Slowdown(
            None, Evidence.NONE, "no evidence of a slowdown: the step's work is unknown"
        )
    try:
        whole = mig.device(device.gpu.key)
        part = (
            whole if device.profile.name is None else mig.device(whole.gpu.key, device.profile.name)
        )
    except (gpus.UnknownGpuError, mig.UnknownProfileError) as e:
        return Slowdown(None, Evidence.NONE, f"no evidence of a slowdown: {e}")
    work = scaling.Work(
        flops=pred.work.flops,
        bytes=pred.work.bytes_moved,
        kernels=pred.work.kernels,
        precision=_LAW_PRECISION[pred.precision],
        mode="train" if pred.mode is prediction_mod.Mode.TRAIN else "infer",
    )
    factor = scaling.slowdown(whole, part, work)
    return Slowdown(
        factor,
        Evidence.DERIVED,
        f"step-time scaling law fitted on public step times of other GPUs: "
        f"{work.flops:.3g} FLOPs and {work.bytes:.3g} bytes per step on {part.sms} of "
        f"{whole.sms} SMs and {part.memory_bandwidth / whole.memory_bandwidth:.3f} of the "
        "bandwidth",
    )


def from_evidence(pred: prediction_mod.Prediction, device: Device) -> Slowdown:
    """The default model: learned utilisation where the predictor has it, else the step's work
    through the scaling law (`from_work`), else no evidence."""
    learned = from_utilisation(pred, device)
    if learned.evidence is not Evidence.NONE or pred.work is None:
        return learned
    return from_work(pred, device)

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

The default model, `from_utilisation`: a job that keeps ``u`` % of a whole GPU's SMs busy needs
about ``u/100`` of its SMs; on a slice with compute share ``s`` it runs about
``max(1, (u/100) / s)`` times slower. It is first order: it ignores the bandwidth and L2 a slice
also loses, so memory-bound jobs can be slower than it says.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from kubeseer import prediction as prediction_mod
from kubeseer.placement import catalogue

__all__ = [
    "SM_UTILISATION",
    "Device",
    "Evidence",
    "Slowdown",
    "SlowdownModel",
    "from_utilisation",
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

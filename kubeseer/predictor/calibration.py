"""The conformal margins a checkpoint carries: ``upper = point * exp(margin)`` per metric.

The operator sizes a GPU slice from the upper bound, not the point estimate; the margins are
fitted by split conformal prediction when a checkpoint is trained (`kubeseer.predictor.conformal`,
which says what the coverage guarantees). This module is the value alone, so that serving a
prediction never imports the fitting code.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class Calibration:
    """Per-metric log margins at one coverage.

    `offsets` (label units, one per metric; none means 0) is what the served figure adds to
    the label before the margin applies: ``upper = (point + offset) * exp(margin) - offset``.
    A checkpoint that learns memory less the runtime's context (the `reserved` label) is
    calibrated on what a GPU must hold, context included, as the issue defines the target:
    a 68 MiB job predicted at 30 MiB is a 2.2x miss on the label but 1.07x on what the GPU
    holds, and a margin fitted on the first would multiply a 60 GiB job's bound by 2.2.
    """

    coverage: float
    metrics: tuple[str, ...]
    log_margins: tuple[float, ...]
    samples: tuple[int, ...]
    offsets: tuple[float, ...] = ()

    def upper(self, points: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Upper bounds ``(N, T)`` for point predictions ``(N, T)`` in label units."""
        shift = np.asarray(self.offsets or (0.0,) * len(self.metrics), dtype=np.float64)
        scaled = (points + shift) * np.exp(np.asarray(self.log_margins))
        return np.asarray(scaled - shift, dtype=np.float64)

    def margin(self, metric: str) -> float:
        """Multiplicative margin of `metric` (``upper / point`` of the label plus its offset)."""
        return math.exp(self.log_margins[self.metrics.index(metric)])

    def offset(self, metric: str) -> float:
        """What `metric`'s label is shifted by before the margin applies (0: none)."""
        return self.offsets[self.metrics.index(metric)] if self.offsets else 0.0

    def widened(self, metric: str, log_margin: float) -> Calibration:
        """This calibration with `metric`'s margin raised to at least `log_margin` (evidence
        beyond the labels, `conformal.censored_margin`); the other margins are unchanged."""
        index = self.metrics.index(metric)
        margins = list(self.log_margins)
        margins[index] = max(margins[index], log_margin)
        return replace(self, log_margins=tuple(margins))

    def raised(self, metric: str, extra_log_margin: float) -> Calibration:
        """This calibration with `extra_log_margin` (at least 0) added to `metric`'s margin: a
        shift of the data the calibration samples did not see (`Checkpoint.step_calibration`)."""
        if extra_log_margin < 0:
            raise ValueError(f"{metric}: a margin is only ever raised, got {extra_log_margin}")
        index = self.metrics.index(metric)
        margins = list(self.log_margins)
        margins[index] += extra_log_margin
        return replace(self, log_margins=tuple(margins))

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the checkpoint."""
        return {
            "coverage": self.coverage,
            "metrics": list(self.metrics),
            "log_margins": list(self.log_margins),
            "samples": list(self.samples),
            "offsets": list(self.offsets),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Calibration:
        """Inverse of `to_dict`."""
        return cls(
            float(data["coverage"]),
            tuple(str(m) for m in data["metrics"]),
            tuple(float(v) for v in data["log_margins"]),
            tuple(int(v) for v in data["samples"]),
            tuple(float(v) for v in data.get("offsets", ())),
        )

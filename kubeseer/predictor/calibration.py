"""The conformal margins a checkpoint carries: ``upper = point * exp(margin)`` per metric.

The operator sizes a GPU slice from the upper bound, not the point estimate; the margins are
fitted by split conformal prediction when a checkpoint is trained (`kubeseer.predictor.conformal`,
which says what the coverage guarantees). This module is the value alone, so that serving a
prediction never imports the fitting code.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class Calibration:
    """Per-metric log margins at one coverage."""

    coverage: float
    metrics: tuple[str, ...]
    log_margins: tuple[float, ...]
    samples: tuple[int, ...]

    def upper(self, points: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Upper bounds ``(N, T)`` for point predictions ``(N, T)`` in label units."""
        return np.asarray(points * np.exp(np.asarray(self.log_margins)), dtype=np.float64)

    def margin(self, metric: str) -> float:
        """Multiplicative margin of `metric` (``upper / point``)."""
        return math.exp(self.log_margins[self.metrics.index(metric)])

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the checkpoint."""
        return {
            "coverage": self.coverage,
            "metrics": list(self.metrics),
            "log_margins": list(self.log_margins),
            "samples": list(self.samples),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Calibration:
        """Inverse of `to_dict`."""
        return cls(
            float(data["coverage"]),
            tuple(str(m) for m in data["metrics"]),
            tuple(float(v) for v in data["log_margins"]),
            tuple(int(v) for v in data["samples"]),
        )

"""Accuracy tables: MAPE and accuracy within 5 % / 10 %, per metric and per model family.

The paper reports percentage errors because the metrics span very different ranges
(section 4.1, "Evaluation Metrics"): MAPE, and "x % accuracy", the share of predictions whose
relative error is within x % (Dudziak et al., 2020). When upper bounds are supplied the table
also reports their empirical coverage, the share of true values at or below the bound, which
the operator relies on when it sizes a GPU slice.

`evaluate` takes any prediction function, so SeerNet, SeerNet-Multi and every baseline are
scored by exactly the same code on exactly the same samples. The tables themselves
(`report.EvaluationTable`) are plain values, stored in every checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
import torch
from torch_geometric.data import Data

from kubeseer.predictor import report

PredictFn = Callable[[Sequence[Data]], npt.NDArray[np.float64]]
"""Samples -> predictions ``(N, T)`` in label units."""


def relative_errors(
    predicted: npt.NDArray[np.float64], true: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """``|predicted - true| / |true|``, elementwise."""
    return np.asarray(np.abs(predicted - true) / np.abs(true), dtype=np.float64)


def _score(
    metric: str,
    family: str,
    predicted: npt.NDArray[np.float64],
    true: npt.NDArray[np.float64],
    upper: npt.NDArray[np.float64] | None,
) -> report.Row:
    errors = relative_errors(predicted, true)
    return report.Row(
        metric=metric,
        family=family,
        n=int(true.size),
        mape=float(100 * errors.mean()),
        acc5=float((errors <= 0.05).mean()),
        acc10=float((errors <= 0.10).mean()),
        coverage=None if upper is None else float((true <= upper).mean()),
    )


def labels(samples: Sequence[Data]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """True labels ``(N, T)`` and their presence mask from samples."""
    y = torch.cat([s.y for s in samples]).double().numpy()
    mask = torch.cat([s.y_mask for s in samples]).bool().numpy()
    return y, mask


def evaluate(
    predict: PredictFn,
    samples: Sequence[Data],
    metrics: Sequence[str],
    *,
    upper: PredictFn | None = None,
    label: str = "",
) -> report.EvaluationTable:
    """Score `predict` (and the bounds of `upper`) on `samples`, per metric and family.

    Only labels that exist count (a sample measured in one mode has no score in the other).
    """
    if not samples:
        raise ValueError("cannot evaluate on no samples")
    true, mask = labels(samples)
    predicted = np.asarray(predict(samples), dtype=np.float64)
    if predicted.shape != true.shape:
        raise ValueError(f"predictions {predicted.shape} do not match labels {true.shape}")
    bounds = None if upper is None else np.asarray(upper(samples), dtype=np.float64)
    families = np.array([str(s.family) for s in samples])
    rows = []
    for k, metric in enumerate(metrics):
        groups = [(report.ALL_FAMILIES, mask[:, k])]
        groups += [(f, mask[:, k] & (families == f)) for f in sorted(set(families.tolist()))]
        for family, selected in groups:
            if not selected.any():
                continue
            rows.append(
                _score(
                    metric,
                    family,
                    predicted[selected, k],
                    true[selected, k],
                    None if bounds is None else bounds[selected, k],
                )
            )
    return report.EvaluationTable(label, tuple(rows))

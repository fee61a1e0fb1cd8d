"""Accuracy tables: MAPE and accuracy within 5 % / 10 %, per metric and per model family.

The paper reports percentage errors because the metrics span very different ranges
(section 4.1, "Evaluation Metrics"): MAPE, and "x % accuracy", the share of predictions whose
relative error is within x % (Dudziak et al., 2020). When upper bounds are supplied the table
also reports their empirical coverage, the share of true values at or below the bound, which
the operator relies on when it sizes a GPU slice.

`evaluate` takes any prediction function, so SeerNet, SeerNet-Multi and every baseline are
scored by exactly the same code on exactly the same samples.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch_geometric.data import Data

PredictFn = Callable[[Sequence[Data]], npt.NDArray[np.float64]]
"""Samples -> predictions ``(N, T)`` in label units."""

ALL_FAMILIES = "all"


@dataclass(frozen=True)
class Row:
    """Scores of one metric on one family (or on all samples, ``family == "all"``)."""

    metric: str
    family: str
    n: int
    mape: float
    acc5: float
    acc10: float
    coverage: float | None


@dataclass(frozen=True)
class EvaluationTable:
    """All rows of one evaluation; `label` says what was evaluated on what data."""

    label: str
    rows: tuple[Row, ...]

    def row(self, metric: str, family: str = ALL_FAMILIES) -> Row:
        """The row of `metric` on `family`."""
        for r in self.rows:
            if r.metric == metric and r.family == family:
                return r
        raise KeyError(f"no row for {metric} on {family}")

    @property
    def metrics(self) -> tuple[str, ...]:
        """Metrics present, in row order."""
        return tuple(dict.fromkeys(r.metric for r in self.rows))

    def mean_mape(self) -> float:
        """Mean over metrics of the all-family MAPE (the paper's "Mean (6 metrics)")."""
        overall = [r.mape for r in self.rows if r.family == ALL_FAMILIES]
        return float(np.mean(overall)) if overall else float("nan")

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for JSON and for the checkpoint)."""
        return {"label": self.label, "rows": [asdict(r) for r in self.rows]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EvaluationTable:
        """Inverse of `to_dict`."""
        return cls(str(data["label"]), tuple(Row(**r) for r in data["rows"]))

    def to_json(self) -> str:
        """Indented JSON, with the mean MAPE alongside the rows."""
        return json.dumps({**self.to_dict(), "mean_mape": self.mean_mape()}, indent=2)

    def to_markdown(self) -> str:
        """A Markdown table: one line per metric, overall first, then each family."""
        with_coverage = any(r.coverage is not None for r in self.rows)
        header = "| metric | family | n | MAPE % | acc@5% | acc@10% |"
        rule = "|---|---|---:|---:|---:|---:|"
        if with_coverage:
            header += " coverage |"
            rule += "---:|"
        lines = [f"**{self.label}**", "", header, rule]
        for r in self.rows:
            line = (
                f"| {r.metric} | {r.family} | {r.n} | {r.mape:.2f} | "
                f"{100 * r.acc5:.1f} | {100 * r.acc10:.1f} |"
            )
            if with_coverage:
                line += " - |" if r.coverage is None else f" {100 * r.coverage:.1f} |"
            lines.append(line)
        lines += ["", f"Mean MAPE over {len(self.metrics)} metrics: {self.mean_mape():.2f} %"]
        return "\n".join(lines)


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
) -> Row:
    errors = relative_errors(predicted, true)
    return Row(
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
) -> EvaluationTable:
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
        groups = [(ALL_FAMILIES, mask[:, k])]
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
    return EvaluationTable(label, tuple(rows))

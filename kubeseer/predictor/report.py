"""The evaluation tables a checkpoint carries: MAPE and accuracy within 5 % / 10 %, per metric
and per model family, with the empirical coverage of the upper bounds where there are some.

The values only; `kubeseer.predictor.evaluate` computes them. They live apart so that serving a
prediction (which loads a checkpoint, tables included) never imports the evaluation code.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

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

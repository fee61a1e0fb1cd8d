"""The Grafana dashboard's panels drawn from a real Prometheus, for people to look at.

Grafana cannot be installed here, so each panel's targets are run as range queries against the
Prometheus the chart's end-to-end test starts, and drawn with matplotlib the way the panel would
show them: one image per dashboard row, one plot per panel, its unit on the y axis, each series
named by the target's legend format. docs/observability.md shows the images.

Not a test module: tests/e2e/test_chart.py imports it.
"""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

_UNITS: Mapping[str, tuple[str, Callable[[float], float]]] = {
    "bytes": ("GiB", lambda v: v / 2**30),
    "percent": ("%", lambda v: v),
    "percentunit": ("%", lambda v: v * 100),
    "s": ("ms", lambda v: v * 1000),
    "reqps": ("per second", lambda v: v),
    "short": ("", lambda v: v),
}
_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")


@dataclass(frozen=True)
class Series:
    """One series of a range query: its labels and (unix time, value) points."""

    labels: Mapping[str, str]
    points: Sequence[tuple[float, float]]


class PrometheusApi:
    """The few HTTP API calls the tests make."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _get(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=30) as response:
            body = json.loads(response.read())
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body}")
        return body["data"]

    def range_query(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        data = self._get(
            "/api/v1/query_range",
            query=expr,
            start=f"{start:.3f}",
            end=f"{end:.3f}",
            step=f"{step:g}",
        )
        return [
            Series(r["metric"], [(float(t), float(v)) for t, v in r["values"]])
            for r in data["result"]
        ]

    def targets(self) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/targets")["activeTargets"])

    def rules(self) -> list[dict[str, Any]]:
        return [rule for group in self._get("/api/v1/rules")["groups"] for rule in group["rules"]]

    def alerts(self) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/alerts")["alerts"])


def legend(template: str, labels: Mapping[str, str]) -> str:
    return _LEGEND.sub(lambda m: labels.get(m.group(1), ""), template).strip() or "value"


def render_rows(
    board: Mapping[str, Any],
    results: Mapping[tuple[int, str], list[Series]],
    out: Path,
) -> list[Path]:
    """One PNG per dashboard row under `out`; `results` maps (panel id, refId) to series."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    rows: list[tuple[str, list[Mapping[str, Any]]]] = []
    for panel in board["panels"]:
        if panel["type"] == "row":
            rows.append((panel["title"], []))
        elif rows:
            rows[-1][1].append(panel)
    written = []
    for index, (title, panels) in enumerate(rows, start=1):
        columns = 2 if len(panels) > 1 else 1
        lines = (len(panels) + columns - 1) // columns
        figure, axes = pyplot.subplots(
            lines, columns, figsize=(7 * columns, 3.4 * lines), squeeze=False
        )
        for ax, panel in zip(axes.flat, panels, strict=False):
            _plot(ax, panel, results)
        for ax in list(axes.flat)[len(panels) :]:
            ax.set_visible(False)
        figure.suptitle(f"{board['title']}: {title}", fontsize=11)
        figure.tight_layout()
        path = out / f"dashboard-row-{index}.png"
        figure.savefig(path, dpi=80)
        pyplot.close(figure)
        written.append(path)
    return written


def _plot(
    ax: Any, panel: Mapping[str, Any], results: Mapping[tuple[int, str], list[Series]]
) -> None:
    from matplotlib import dates

    unit, scale = _UNITS.get(
        panel["fieldConfig"]["defaults"].get("unit", "short"), ("", lambda v: v)
    )
    drawn = 0
    every = [
        (target, series)
        for target in panel["targets"]
        for series in results.get((panel["id"], target["refId"]), [])
    ]
    # Series that stay 0 throughout (pre-initialised counters of profiles nothing used) are
    # left out when others move, as a person reading the panel would hide them.
    moving = any(v != 0.0 and v == v for _, series in every for _, v in series.points)
    for target, series in every:
        points = [(t, v) for t, v in series.points if v == v]  # NaN: no value at that time
        if not points or (moving and all(v == 0.0 for _, v in points)):
            continue
        times = [datetime.fromtimestamp(t, UTC) for t, _ in points]
        ax.plot(
            times,
            [scale(v) for _, v in points],
            label=legend(target["legendFormat"], series.labels),
        )
        drawn += 1
    ax.xaxis.set_major_formatter(dates.DateFormatter("%H:%M:%S"))
    ax.set_title(panel["title"], fontsize=9)
    ax.set_ylabel(unit, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    if drawn:
        handles, labels = ax.get_legend_handles_labels()
        ax.legend(handles[:8], labels[:8], fontsize=6, loc="best")
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)

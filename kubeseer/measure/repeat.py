"""Repeatability: measure stored configurations again and report how far the labels move.

The issue sets the bar at 2 % for step time and 1 % for memory between two measurements of
the same configuration. The second measurements are written to a separate dataset, so the
main one stays "first measurement wins" and the comparison can be redone from disk.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kubeseer import zoo
from kubeseer.measure import collect, plans, records, steps


@dataclass(frozen=True)
class Spread:
    """Relative differences |second - first| / first of one label over the repeated rows."""

    label: str
    pairs: int
    median_percent: float
    p90_percent: float
    within_percent: float
    share_within: float


def pick(rows: Sequence[records.Record], n: int, seed: int) -> list[records.Record]:
    """Up to `n` measured, uncensored rows, drawn evenly across families."""
    eligible = [
        r for r in rows if r.label_source is records.LabelSource.MEASURED and not r.censored
    ]
    rng = random.Random(seed)
    by_family: dict[str, list[records.Record]] = {}
    for row in eligible:
        by_family.setdefault(row.family, []).append(row)
    for group in by_family.values():
        rng.shuffle(group)
    chosen: list[records.Record] = []
    while len(chosen) < n and any(by_family.values()):
        for family in sorted(by_family):
            if by_family[family] and len(chosen) < n:
                chosen.append(by_family[family].pop())
    return chosen


def _plan_for(row: records.Record) -> plans.Plan:
    """A one-off plan carrying the original run's iteration counts."""
    return plans.Plan(
        name=f"repeat-of-{row.plan}",
        seed=0,
        families=(row.family,),
        sizes=("tiny",),
        specs_per_size=1,
        oversample=1,
        configs_per_spec=1,
        batch_sizes=(row.batch_size,),
        modes=(row.mode,),
        precisions=(row.precision,),
        optimizers=(row.optimizer,) if row.mode == "train" else (),
        warmup=row.warmup_iterations,
        iterations=row.timed_iterations,
        cooldown_s=0.0,
    )


def remeasure(
    rows: Sequence[records.Record],
    backend: collect.Backend,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> list[records.Record]:
    """Measure each row's configuration again with `backend` (same spec, batch, mode ...)."""
    again: list[records.Record] = []
    for index, row in enumerate(rows):
        spec = zoo.ModelSpec.from_json(row.spec_json)
        task = steps.Task(spec, row.batch_size, row.mode, row.precision, row.optimizer)
        planned = plans.PlannedTask(task, row.flops or 0, row.params or 0)
        again.append(backend.measure(planned, _plan_for(row)))
        backend.cooldown(0.0)
        if progress is not None:
            progress(index + 1, len(rows))
    return again


def spread(
    first: Sequence[records.Record],
    second: Sequence[records.Record],
    label: str,
    within_percent: float,
) -> Spread | None:
    """How far `label` moved between matching rows (matched on `Record.key`)."""
    before = {r.key: getattr(r, label) for r in first}
    differences = []
    for row in second:
        a, b = before.get(row.key), getattr(row, label)
        if a is not None and b is not None and a > 0:
            differences.append(100.0 * abs(b - a) / a)
    if not differences:
        return None
    differences.sort()
    return Spread(
        label=label,
        pairs=len(differences),
        median_percent=statistics.median(differences),
        p90_percent=differences[min(len(differences) - 1, int(0.9 * len(differences)))],
        within_percent=within_percent,
        share_within=sum(d <= within_percent for d in differences) / len(differences),
    )


LABEL_BARS: tuple[tuple[str, float], ...] = (
    ("step_time_median_s", 2.0),
    ("step_time_mean_s", 2.0),
    ("step_cpu_time_median_s", 2.0),
    ("memory_bytes", 1.0),
    ("allocator_peak_allocated_bytes", 1.0),
    ("sm_util_mean_percent", 2.0),
)


def report(first: Sequence[records.Record], second: Sequence[records.Record]) -> str:
    """A Markdown table of `spread` for every label with a repeatability bar."""
    lines = [
        "| label | pairs | median diff | p90 diff | bar | share within bar |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, bar in LABEL_BARS:
        result = spread(first, second, label, bar)
        if result is not None:
            lines.append(
                f"| {label} | {result.pairs} | {result.median_percent:.2f} % | "
                f"{result.p90_percent:.2f} % | {bar:g} % | {100 * result.share_within:.0f} % |"
            )
    return "\n".join(lines)

"""The collection loop: expand a plan, skip what is stored, measure the rest, append as we go.

The loop is the same for every backend (CPU, CUDA, derived fake-CUDA); a backend is anything
with a device descriptor, a label source, `supports(task)`, `measure(planned, plan) -> Record`
and `cooldown(seconds)`.
Rows are flushed to a new part file every `flush_every` tasks, so an interruption (budget,
Ctrl-C, a killed job) loses at most that many; restarting with the same plan and output skips
every key already stored and carries on. A task that fails for any reason other than running
out of memory is written to `errors.jsonl` beside the dataset and retried on the next run;
out-of-memory is a censored row, not an error.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypedDict

from kubeseer.measure import plans, records, steps, storage

ERROR_LOG = "errors.jsonl"


class Backend(Protocol):
    """What the loop needs from a measuring backend."""

    @property
    def device(self) -> records.DeviceDescriptor: ...

    @property
    def label_source(self) -> records.LabelSource: ...

    def supports(self, task: steps.Task) -> bool: ...

    def measure(self, planned: plans.PlannedTask, plan: plans.Plan) -> records.Record: ...

    def cooldown(self, seconds: float) -> None: ...


@dataclass(frozen=True)
class Summary:
    """What one collection run did."""

    dataset: Path
    planned: int
    skipped: int
    unsupported: int
    measured: int
    censored: int
    failed: int
    rejected_specs: int
    out_of_budget: bool


Progress = Callable[[int, int, str], None]


class TaskIdentity(TypedDict):
    """The `Record` fields that say what was measured where, the same for every backend."""

    schema_version: int
    config_hash: str
    family: str
    spec_json: str
    batch_size: int
    mode: str
    precision: str
    optimizer: str
    device: records.DeviceDescriptor
    label_source: records.LabelSource
    plan: str
    flops: int | None
    params: int | None


def task_identity(planned: plans.PlannedTask, plan: plans.Plan, backend: Backend) -> TaskIdentity:
    """The identity half of a record; a backend adds its status, labels and timestamps."""
    task = planned.task
    return TaskIdentity(
        schema_version=records.SCHEMA_VERSION,
        config_hash=task.spec.config_hash(),
        family=task.spec.family,
        spec_json=task.spec.to_json(),
        batch_size=task.batch_size,
        mode=task.mode,
        precision=task.precision,
        optimizer=task.optimizer,
        device=backend.device,
        label_source=backend.label_source,
        plan=plan.name,
        flops=planned.flops,
        params=planned.params,
    )


def now() -> str:
    """UTC timestamp, ISO 8601 with seconds, as stored in `started_at` / `finished_at`."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def dataset_directory(root: Path, backend: Backend) -> Path:
    """The per-device dataset under `root`; derived labels get their own directory."""
    name = backend.device.slug()
    if backend.label_source is not records.LabelSource.MEASURED:
        name = f"{name}-{backend.label_source.value}"
    return root / name


def stored_keys(
    directory: Path, source: records.LabelSource
) -> set[tuple[str, int, str, str, str]]:
    """Keys already measured in `directory` with the given label source."""
    if not directory.exists():
        return set()
    return {r.key for r in storage.iter_records(directory) if r.label_source is source}


def _log_error(directory: Path, planned: plans.PlannedTask, error: BaseException) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    entry = {
        "at": now(),
        "task": planned.task.describe(),
        "spec_json": planned.task.spec.to_json(),
        "key": list(planned.task.key),
        "error": f"{type(error).__name__}: {error}",
    }
    with (directory / ERROR_LOG).open("a", encoding="utf-8") as log:
        log.write(json.dumps(entry) + "\n")


def run(
    plan: plans.Plan,
    backend: Backend,
    root: Path,
    *,
    budget_s: float | None = None,
    flush_every: int = 20,
    limit: int | None = None,
    progress: Progress | None = None,
    expansion: plans.Expansion | None = None,
    shard: tuple[int, int] = (0, 1),
) -> Summary:
    """Measure every task of `plan` not yet stored under `root` for this backend's device.

    Args:
        budget_s: stop starting new tasks after this many seconds (None: no limit).
        flush_every: tasks between part files.
        limit: measure at most this many tasks (None: all pending).
        progress: called as (done, total, description) after each task.
        expansion: a precomputed `plans.expand(plan)` (expansion counts FLOPs, which costs
            seconds for large plans).
        shard: (index, count): take only every count-th task from the index-th, so several
            processes can share one plan and dataset (each writes its own part files).
    """
    index, count = shard
    if not 0 <= index < count:
        raise ValueError(f"shard {index}/{count}: need 0 <= index < count")
    started = time.monotonic()
    directory = dataset_directory(root, backend)
    expansion = expansion or plans.expand(plan)
    done = stored_keys(directory, backend.label_source)
    mine = expansion.tasks[index::count]
    supported = [p for p in mine if backend.supports(p.task)]
    pending = [p for p in supported if p.task.key not in done]
    skipped = len(supported) - len(pending)
    if limit is not None:
        pending = pending[:limit]
    buffer: list[records.Record] = []
    measured = censored = failed = 0
    out_of_budget = False
    try:
        for position, planned in enumerate(pending):
            if budget_s is not None and time.monotonic() - started > budget_s:
                out_of_budget = True
                break
            try:
                record = backend.measure(planned, plan)
            except Exception as e:
                failed += 1
                _log_error(directory, planned, e)
            else:
                buffer.append(record)
                measured += 1
                censored += record.censored
            if len(buffer) >= flush_every:
                storage.write_part(directory, buffer)
                buffer = []
            backend.cooldown(plan.cooldown_s)
            if progress is not None:
                progress(position + 1, len(pending), planned.task.describe())
    finally:
        if buffer:
            storage.write_part(directory, buffer)
    return Summary(
        dataset=directory,
        planned=len(mine),
        skipped=skipped,
        unsupported=len(mine) - len(supported),
        measured=measured,
        censored=censored,
        failed=failed,
        rejected_specs=len(expansion.rejected),
        out_of_budget=out_of_budget,
    )

"""`kubeseer dataset collect|merge|stats|export|check-derived`: the measured dataset from the
command line."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pyarrow and numpy load only in the handlers that read records
    from kubeseer.measure import records

FLOPS_CACHE = "flops-cache.json"


def register(subparsers: Any) -> None:
    """Add the `dataset` command group to the CLI."""
    parser = subparsers.add_parser("dataset", help="collect and inspect the measured dataset")
    commands = parser.add_subparsers(dest="dataset_command", metavar="ACTION", required=True)

    collect = commands.add_parser("collect", help="measure the configurations of a plan")
    collect.add_argument(
        "--device",
        choices=("cpu", "cuda", "fake-cuda", "replay-cuda"),
        required=True,
        help="cpu or cuda measure; fake-cuda derives fp32 inference allocator peaks and "
        "replay-cuda the GPU memory target of any task, both without a GPU",
    )
    collect.add_argument("--plan", type=Path, required=True, help="plan YAML (see plans/)")
    collect.add_argument("--out", type=Path, required=True, help="dataset root directory")
    collect.add_argument("--budget-minutes", type=float, default=None)
    collect.add_argument("--limit", type=int, default=None, help="measure at most N tasks")
    collect.add_argument("--threads", type=int, default=1, help="torch threads (cpu)")
    collect.add_argument(
        "--memory-cap-mib",
        type=int,
        default=None,
        help="treat more than this much memory as out-of-memory (censored)",
    )
    collect.add_argument(
        "--fake-gpu",
        default="NVIDIA H100 80GB HBM3",
        help="the GPU a fake-cuda run describes (name only; labels do not depend on it)",
    )
    collect.add_argument(
        "--count-workers",
        type=int,
        default=1,
        help="processes counting FLOPs while the plan expands (use the cores of a GPU host)",
    )
    collect.add_argument(
        "--shard",
        default="0/1",
        help="I/N: measure every N-th task from the I-th (parallel collectors; use --no-compact "
        "on all but one, or compact afterwards with merge)",
    )
    collect.add_argument("--no-compact", action="store_true", help="keep one part per flush")
    collect.add_argument("--quiet", action="store_true", help="no progress bar")
    collect.set_defaults(handler=_collect)

    repeat = commands.add_parser("repeat", help="measure stored configurations again")
    repeat.add_argument("path", type=Path, help="the dataset whose rows to repeat")
    repeat.add_argument("--device", choices=("cpu", "cuda"), required=True)
    repeat.add_argument("--out", type=Path, required=True, help="root for the repeated rows")
    repeat.add_argument("-n", type=int, default=200, help="how many configurations")
    repeat.add_argument("--seed", type=int, default=0)
    repeat.add_argument("--threads", type=int, default=1, help="torch threads (cpu)")
    repeat.set_defaults(handler=_repeat, memory_cap_mib=None, fake_gpu=None)

    compare = commands.add_parser(
        "compare", help="label differences between two measurements of the same configurations"
    )
    compare.add_argument("first", type=Path)
    compare.add_argument("second", type=Path)
    compare.set_defaults(handler=_compare)

    merge = commands.add_parser("merge", help="merge datasets into per-device datasets")
    merge.add_argument("sources", type=Path, nargs="+")
    merge.add_argument("--out", type=Path, required=True)
    merge.set_defaults(handler=_merge)

    stats = commands.add_parser("stats", help="counts per family, mode, batch and FLOPs decade")
    stats.add_argument("path", type=Path)
    stats.add_argument("--markdown", action="store_true", help="print Markdown tables")
    stats.set_defaults(handler=_stats)

    check = commands.add_parser(
        "check-derived",
        help="measure a check plan's timm jobs on this machine's GPU: allocator peaks, the "
        "required capacity, the runtime context and step time, against which the derived "
        "memory is scored (bench/derived_vs_gpu.py)",
    )
    check.add_argument("--plan", type=Path, required=True, help="check plan (JSON lines)")
    check.add_argument("--out", type=Path, required=True, help="measured rows (appended to)")
    check.add_argument(
        "--deadline-minutes",
        type=float,
        default=None,
        help="start no job after this long (a device lease's limit; resume with the same --out)",
    )
    check.add_argument("--timed", type=int, default=10, help="timed steps after the job's own")
    check.add_argument(
        "--tolerance", type=float, default=0.01, help="bisection stops within this share"
    )
    check.add_argument("--device-index", type=int, default=0)
    check.set_defaults(handler=_check_derived)

    export = commands.add_parser("export", help="write the deduplicated rows as CSV or JSONL")
    export.add_argument("path", type=Path)
    export.add_argument("--format", choices=("csv", "jsonl"), default="csv")
    export.add_argument("--out", type=Path, default=None, help="file (default: stdout)")
    export.set_defaults(handler=_export)


def _check_derived(args: argparse.Namespace) -> int:
    from kubeseer.measure import derived_check, nvml

    try:
        jobs = derived_check.read_plan(args.plan)
        runner = derived_check.GpuRunner(args.device_index)
    except (OSError, ValueError, nvml.NvmlError) as e:
        print(f"kubeseer dataset check-derived: {e}", file=sys.stderr)
        return 2

    def progress(row: derived_check.MeasuredJob) -> None:
        if row.error is not None:
            print(f"{row.key}: {row.error}", flush=True)
            return
        print(
            f"{row.key}: allocated {(row.allocated_bytes or 0) / 2**30:.2f} GiB, required "
            f"{(row.required_bytes or 0) / 2**30:.2f}, context "
            f"{(row.context_bytes or 0) / 2**20:.0f} MiB, step {row.step_time_s or 0:.4f} s "
            f"({row.seconds:.0f} s, {len(row.probes)} probes)",
            flush=True,
        )

    deadline = None if args.deadline_minutes is None else args.deadline_minutes * 60
    written = derived_check.check_plan(
        jobs,
        args.out,
        runner,
        deadline_s=deadline,
        timed=args.timed,
        tolerance=args.tolerance,
        progress=progress,
    )
    print(f"{written} jobs measured into {args.out}")
    return 0


def _backend(args: argparse.Namespace) -> Any:
    cap = None if args.memory_cap_mib is None else args.memory_cap_mib * 2**20
    if args.device == "cpu":
        from kubeseer.measure import cpu

        return cpu.CpuBackend(cpu.CpuSettings(threads=args.threads, memory_cap_bytes=cap))
    if args.device == "cuda":
        from kubeseer.measure import cuda

        return cuda.CudaBackend(cuda.CudaSettings(memory_cap_bytes=cap))
    if args.device == "replay-cuda":
        from kubeseer.measure import replay_cuda

        return replay_cuda.ReplayCudaBackend(args.fake_gpu)
    from kubeseer.measure import fake_cuda

    return fake_cuda.FakeCudaBackend(args.fake_gpu)


def _collect(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from kubeseer.measure import collect, plans, storage

    console = Console(stderr=True, soft_wrap=True)
    try:
        plan = plans.load_plan(args.plan)
    except plans.PlanError as e:
        console.print(f"[red]bad plan:[/red] {e}")
        return 2
    try:
        index, _, count = args.shard.partition("/")
        shard = (int(index), int(count))
    except ValueError:
        console.print(f"[red]bad --shard {args.shard!r}:[/red] expected I/N, e.g. 0/2")
        return 2
    console.print(f"expanding plan {plan.name!r} (counting FLOPs on the meta device)")
    counter = plans.CachedCounter(args.out / FLOPS_CACHE)
    counter.prefill(plans.candidates(plan), args.count_workers)
    expansion = plans.expand(plan, counter)
    counter.save()
    # Created after expansion: counting forks workers, and CUDA must not be initialised then.
    backend = _backend(args)
    budget = None if args.budget_minutes is None else args.budget_minutes * 60
    columns = (
        TextColumn("{task.description}", style="cyan"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, disable=args.quiet) as bar:
        task_id = bar.add_task(backend.device.name, total=None)

        def progress(done: int, total: int, description: str) -> None:
            bar.update(task_id, completed=done, total=total, description=description[:60])

        summary = collect.run(
            plan,
            backend,
            args.out,
            budget_s=budget,
            limit=args.limit,
            progress=progress,
            expansion=expansion,
            shard=shard,
        )
    if not args.no_compact and summary.dataset.exists():
        storage.compact(summary.dataset)
    console.print(
        f"{summary.dataset}: {summary.measured} measured ({summary.censored} censored), "
        f"{summary.skipped} already stored, {summary.unsupported} not supported by this "
        f"backend, {summary.failed} failed (see {collect.ERROR_LOG}), "
        f"{summary.rejected_specs} candidate specs rejected"
        + (", stopped by the time budget" if summary.out_of_budget else "")
    )
    return 0


def _repeat(args: argparse.Namespace) -> int:
    from kubeseer.measure import collect, repeat, storage

    first = repeat.pick(storage.read_records(args.path), args.n, args.seed)
    backend = _backend(args)

    def progress(done: int, total: int) -> None:
        print(f"\rrepeated {done}/{total}", end="", file=sys.stderr, flush=True)

    second = repeat.remeasure(first, backend, progress=progress)
    print(file=sys.stderr)
    if second:
        storage.write_part(collect.dataset_directory(args.out, backend), second)
    print(repeat.report(first, second))
    return 0


def _compare(args: argparse.Namespace) -> int:
    from kubeseer.measure import repeat, storage

    print(repeat.report(storage.read_records(args.first), storage.read_records(args.second)))
    return 0


def _merge(args: argparse.Namespace) -> int:
    from kubeseer.measure import storage

    counts = storage.merge(args.sources, args.out)
    for device, count in sorted(counts.items()):
        print(f"{device}: {count} rows")
    return 0


def _decade(value: Any) -> str:
    return "unknown" if value is None else f"1e{value}"


def _table(
    title: str, counts: Counter[Any], markdown: bool, render: Callable[[Any], str] = str
) -> list[str]:
    # Sorted on the raw keys (numbers numerically), rendered afterwards.
    ordered = sorted(counts.items(), key=lambda item: (item[0] is None, item[0]))
    if markdown:
        lines = [f"| {title} | rows |", "| --- | ---: |"]
        lines += [f"| {render(key)} | {value} |" for key, value in ordered]
        return [*lines, ""]
    width = max([len(render(k)) for k in counts] + [len(title)])
    lines = [title]
    lines += [f"  {render(key):<{width}}  {value:>7}" for key, value in ordered]
    return lines


def format_stats(rows: Iterable[records.Record], *, markdown: bool = False) -> str:
    """Counts per dataset, family, mode, batch size, FLOPs decade and status."""
    from kubeseer.measure import plans

    rows = list(rows)
    groups: dict[str, Counter[Any]] = {
        "device / label source": Counter(f"{r.device.name} / {r.label_source}" for r in rows),
        "family": Counter(r.family for r in rows),
        "mode": Counter(r.mode for r in rows),
        "precision": Counter(r.precision for r in rows),
        "batch size": Counter(r.batch_size for r in rows),
        "FLOPs decade (batch-1 forward)": Counter(
            plans.flops_decade(r.flops) if r.flops is not None else None for r in rows
        ),
        "status": Counter(r.status.value for r in rows),
    }
    lines = [f"{len(rows)} rows, {len({r.config_hash for r in rows})} distinct specs", ""]
    for title, counts in groups.items():
        render = _decade if title.startswith("FLOPs") else str
        lines += _table(title, counts, markdown, render)
    return "\n".join(lines)


def _stats(args: argparse.Namespace) -> int:
    from kubeseer.measure import storage

    print(format_stats(storage.read_records(args.path), markdown=args.markdown))
    return 0


def _export(args: argparse.Namespace) -> int:
    from kubeseer.measure import records, storage

    rows = [records.to_row(r) for r in storage.read_records(args.path)]
    stream = args.out.open("w", encoding="utf-8", newline="") if args.out else sys.stdout
    try:
        if args.format == "jsonl":
            for row in rows:
                stream.write(json.dumps(row) + "\n")
        else:
            writer = csv.DictWriter(stream, fieldnames=records.SCHEMA.names)
            writer.writeheader()
            writer.writerows(rows)
    finally:
        if args.out:
            stream.close()
    return 0

"""Derived GPU memory and predicted step time against one GPU's own measurements.

The public out-of-memory boundaries (`bench/gpu_memory.py`) say only whether a job fitted a
card; where the derivation misplaces one, they cannot say whether the trace, the allocator
model or the card's runtime context is off. A GPU can: `kubeseer dataset check-derived`
(`kubeseer.measure.derived_check`) measures, for each job of a check plan, the allocated and
reserved peaks, the smallest allocator cap the steps run in (the required capacity), the
runtime context and the step time. This script writes that plan and scores the measurements.

    .venv/bin/python bench/derived_vs_gpu.py --write-plan plans/derived-check.jsonl [--per-kind N]
    .venv/bin/python bench/derived_vs_gpu.py --measured MEASURED.jsonl [--json PATH]

The plan takes the memory-evidence boundaries of `bench/gpu_memory.py` (committed derivations,
the documented context) in three kinds, interleaved so that a run cut short by a device lease
covers all of them (after the failed batches a checkpoint's bound answered "fits", when a
`bench/gpu_predictor.py --boundaries --json` file is given: those are its out-of-memory
placements): batches that ran where the derivation says they do not fit (the job at the
batch that ran), batches that failed where it says they fit (at the failed batch), and
boundaries it places right (at either batch, seeded), training and inference.

The score derives every measured job again here, in the runtime of the GPU it ran on (Hopper:
cuBLAS's 32 MiB workspace), and prints per job and per mode: derived / measured for the
allocated peak, the reserved peak and the required capacity; the share of jobs whose derived
requirement is below the measured one by more than the bisection's tolerance (each of those is
a job kubeseer would place where it runs out of memory); the measured context against the
documented one; and the default checkpoint's step time on that GPU against the measured one
(MAPE, within 10 %, and whether the upper bound covers it).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import gpu_memory as boundary_bench

from kubeseer.hardware import gpus
from kubeseer.measure import derived_check, gpu_memory, public_gpu, replay_cuda

REPO = Path(__file__).resolve().parents[1]
MEASURED = REPO / "data" / "derived-check-gpu" / "measured.jsonl"
"""Where a GPU session commits what `kubeseer dataset check-derived` measured."""
DOCUMENTED_CONTEXT = {name: runtime.context_bytes for name, runtime in gpu_memory.RUNTIMES.items()}
MAX_CARD = 32 << 30
"""Boundaries on cards up to 32 GB only: their jobs take a few seconds a run on a data-centre
GPU, where a 96 GB card's take several times that."""


def _ratio(case: boundary_bench.Case, which: str) -> float:
    entry = case.fit if which == "fit" else case.fail
    return float(entry["required"] + DOCUMENTED_CONTEXT[case.runtime]) / case.capacity


def _job(case: boundary_bench.Case, which: str) -> derived_check.CheckJob:
    """The boundary's job at its batch that ran ("fit") or failed ("fail")."""
    model, img, mode, batch, _ = (case.fit if which == "fit" else case.fail)["key"].split("|")
    verb = "ran" if which == "fit" else "failed"
    why = (
        f"{verb} on {case.gpu} ({case.runtime}); derived {_ratio(case, which):.2f} of the card "
        f"with the documented context"
    )
    return derived_check.CheckJob(
        model=model, img_size=int(img), mode=mode, batch_size=int(batch), why=why
    )


def _alternating(cases: Sequence[boundary_bench.Case]) -> Iterator[derived_check.CheckJob]:
    """The cases' jobs at the batch that ran and the one that failed, in turn."""
    for index, case in enumerate(cases):
        yield _job(case, ("fit", "fail")[index % 2])


def would_be_oom_jobs(scored: Path) -> list[derived_check.CheckJob]:
    """The failed batches whose memory bound a checkpoint answered "fits", from a
    `bench/gpu_predictor.py --boundaries --json` file (memory evidence only)."""
    entries = json.loads(scored.read_text())["architectures"]["boundaries"]
    return [
        derived_check.CheckJob(
            model=e["model"],
            img_size=e["img"],
            mode=e["mode"],
            batch_size=e["fail"],
            why=(
                f"failed on {e['gpu']} ({e['runtime']}); the checkpoint's bound "
                f"{e['fail_upper'] / e['capacity']:.2f} of the card"
            ),
        )
        for e in entries
        if e.get("limit") is None
        and e.get("contradiction") is None
        and "error" not in e
        and not e["fail_launch"]
        and e["fail_upper"] <= e["capacity"]
    ]


def plan_jobs(
    per_kind: int, seed: int = 0, first: Sequence[derived_check.CheckJob] = ()
) -> list[derived_check.CheckJob]:
    """The check plan's jobs (module docstring), `first` ahead of at most `per_kind` of each
    kind."""
    items = boundary_bench.boundaries()
    cases = [
        c
        for c in boundary_bench.cases(
            items,
            boundary_bench.load_cache(),
            boundary_bench.limits_of(items),
            boundary_bench.contradictions(),
        )
        if c.memory_evidence and c.capacity <= MAX_CARD
    ]
    over = sorted((c for c in cases if _ratio(c, "fit") > 1), key=lambda c: -_ratio(c, "fit"))
    under = sorted((c for c in cases if _ratio(c, "fail") <= 1), key=lambda c: _ratio(c, "fail"))
    right = [c for c in cases if _ratio(c, "fit") <= 1 < _ratio(c, "fail")]
    random.Random(seed).shuffle(right)
    kinds: list[Iterator[derived_check.CheckJob]] = [
        (_job(c, "fit") for c in over),
        (_job(c, "fail") for c in under),
        _alternating([c for c in right if c.mode == "infer"]),
        _alternating([c for c in right if c.mode == "train"]),
    ]
    taken = {job.key: job for job in first}
    counts = [0] * len(kinds)
    while any(count < per_kind for count in counts):
        progressed = False
        for index, kind in enumerate(kinds):
            if counts[index] >= per_kind:
                continue
            for job in kind:
                if job.key not in taken:
                    taken[job.key] = job
                    counts[index] += 1
                    progressed = True
                    break
        if not progressed:
            break
    return list(taken.values())


def derived_row(row: dict[str, Any]) -> dict[str, Any]:
    """`row` (a measured job) with the derivation of the same job beside it."""
    job = derived_check.CheckJob(
        model=row["model"],
        img_size=row["img_size"],
        mode=row["mode"],
        batch_size=row["batch_size"],
        steps=row["steps"],
    )
    runtime = replay_cuda.runtime_for(row["gpu"])
    derived = gpu_memory.derive(
        public_gpu.timm_parts(job.model, job.img_size), job.gpu_memory_job(), runtime
    )
    return {
        **row,
        "derived_allocated_bytes": derived.allocated_peak,
        "derived_reserved_bytes": derived.reserved_peak,
        "derived_required_bytes": derived.required_reservation,
        "documented_context_bytes": runtime.context_bytes,
    }


def predicted_step(rows: Sequence[dict[str, Any]]) -> None:
    """Add the default checkpoint's step time (point, upper) on each row's GPU, where the
    architecture's ONNX export is cached (`timm_models.onnx_path`)."""
    from kubeseer.predictor import api, timm_models

    predictor = api.Predictor.load()
    for row in rows:
        path = timm_models.onnx_path(row["model"], row["img_size"])
        if not path.exists() or row.get("step_time_s") is None:
            continue
        try:
            made = predictor.predict(
                str(path),
                row["batch_size"],
                row["mode"],
                "fp16",
                optimizer="sgd",
                gpu=gpus.lookup(row["gpu"]).key,
            )
        except Exception as error:  # an export that does not bind at that batch
            row["step_error"] = f"{type(error).__name__}: {error}"[:200]
            continue
        row["predicted_step_s"] = made.step_time_s.point
        row["predicted_step_upper_s"] = made.step_time_s.upper


def _quantiles(values: Sequence[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    low = ordered[int(0.1 * (len(ordered) - 1))]
    high = ordered[int(0.9 * (len(ordered) - 1))]
    return f"{statistics.median(ordered):.3f} ({low:.3f}-{high:.3f})"


def _ratios(rows: Sequence[dict[str, Any]], numerator: str, denominator: str) -> str:
    return _quantiles([r[numerator] / r[denominator] for r in rows])


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per mode and over all: median (10th-90th percentile) derived / measured, jobs the
    derivation under-states, context, step-time error."""
    out: dict[str, dict[str, Any]] = {}
    for name in ("infer", "train", "all"):
        chosen = [r for r in rows if name in ("all", r["mode"])]
        if not chosen:
            continue
        under = [
            r
            for r in chosen
            if r["derived_required_bytes"] < r["required_bytes"] - r["required_tolerance_bytes"]
        ]
        stepped = [r for r in chosen if "predicted_step_s" in r]
        errors = [abs(r["predicted_step_s"] / r["step_time_s"] - 1) for r in stepped]
        covered = sum(r["predicted_step_upper_s"] >= r["step_time_s"] for r in stepped)
        out[name] = {
            "jobs": len(chosen),
            "allocated": _ratios(chosen, "derived_allocated_bytes", "allocated_bytes"),
            "reserved": _ratios(chosen, "derived_reserved_bytes", "reserved_bytes"),
            "required": _ratios(chosen, "derived_required_bytes", "required_bytes"),
            "measured required / allocated": _ratios(chosen, "required_bytes", "allocated_bytes"),
            "derived below measured": f"{len(under)} of {len(chosen)}",
            "context MiB (measured median; documented)": (
                f"{statistics.median(r['context_bytes'] for r in chosen) / 2**20:.0f}; "
                f"{chosen[0]['documented_context_bytes'] / 2**20:.0f}"
            ),
            "step MAPE %": f"{100 * statistics.mean(errors):.1f}" if errors else "-",
            "step within 10 %": (
                f"{100 * sum(e <= 0.1 for e in errors) / len(errors):.0f}" if errors else "-"
            ),
            "step bound covers %": f"{100 * covered / len(stepped):.0f}" if stepped else "-",
        }
    return out


def job_table(rows: Sequence[dict[str, Any]]) -> str:
    """One line per job: measured GiB and derived / measured."""
    lines = [
        "| job | why | measured allocated / required GiB | derived / measured: allocated, "
        "reserved, required | step measured / predicted ms |",
        "|---|---|---:|---:|---:|",
    ]
    for r in rows:
        step = (
            f"{1000 * r['step_time_s']:.1f} / {1000 * r['predicted_step_s']:.1f}"
            if "predicted_step_s" in r
            else "-"
        )
        lines.append(
            f"| {r['key']} | {r['why']} | {r['allocated_bytes'] / 2**30:.2f} / "
            f"{r['required_bytes'] / 2**30:.2f} | "
            f"{r['derived_allocated_bytes'] / r['allocated_bytes']:.3f}, "
            f"{r['derived_reserved_bytes'] / r['reserved_bytes']:.3f}, "
            f"{r['derived_required_bytes'] / r['required_bytes']:.3f} | {step} |"
        )
    return "\n".join(lines)


def summary_table(found: dict[str, dict[str, Any]]) -> str:
    """The per-mode summary as a Markdown table."""
    columns = list(next(iter(found.values())).keys())
    lines = ["| mode | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for mode, values in found.items():
        lines.append(f"| {mode} | " + " | ".join(str(values[c]) for c in columns) + " |")
    return "\n".join(lines)


def score(measured: Path) -> dict[str, Any]:
    """Score a measured file (module docstring); jobs that failed on the GPU are listed."""
    rows = [json.loads(line) for line in measured.read_text().splitlines() if line.strip()]
    failed = [r for r in rows if r.get("error")]
    scored = [derived_row(r) for r in rows if not r.get("error")]
    predicted_step(scored)
    return {"rows": scored, "failed": failed, "summary": summary(scored) if scored else {}}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-plan", type=Path, help="write the check plan here")
    parser.add_argument("--per-kind", type=int, default=12, help="jobs of each kind at most")
    parser.add_argument(
        "--would-be-oom-from",
        type=Path,
        help="a `bench/gpu_predictor.py --boundaries --json` file: its failed batches the "
        "checkpoint answered 'fits' go first in the plan",
    )
    parser.add_argument(
        "--measured",
        type=Path,
        default=MEASURED if MEASURED.exists() else None,
        help=f"a `kubeseer dataset check-derived` file (default: {MEASURED.relative_to(REPO)}, "
        "where a GPU session committed one)",
    )
    parser.add_argument("--json", type=Path, help="write the scored rows and summary here")
    args = parser.parse_args(argv)
    if args.write_plan is None and args.measured is None:
        print(f"no GPU measurements yet ({MEASURED.relative_to(REPO)}); nothing to score")
        return 0
    if args.write_plan is not None:
        first = [] if args.would_be_oom_from is None else would_be_oom_jobs(args.would_be_oom_from)
        jobs = plan_jobs(args.per_kind, first=first)
        derived_check.write_plan(jobs, args.write_plan)
        print(f"{len(jobs)} jobs written to {args.write_plan}")
    if args.measured is not None:
        found = score(args.measured)
        if found["rows"]:
            print(job_table(found["rows"]))
            print()
            print(summary_table(found["summary"]))
        for row in found["failed"]:
            print(f"failed on the GPU: {row['key']}: {row['error']}")
        if args.json is not None:
            args.json.write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

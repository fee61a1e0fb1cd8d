"""Does the derived GPU memory agree with where real GPUs ran out of memory?

Evidence: timm's public benchmark boundaries (shared/data/public-gpu/timm, eager runs, NCHW):
for each architecture, the largest batch of timm's sequence that ran on an RTX 3090, 4090,
5090 or RTX PRO 6000 (96 GB) and the next one, which did not. Training rows are fp16 AMP with
SGD (Nesterov momentum) on torch 1.12; inference rows fp16 AMP on torch 1.13-2.9.

For each boundary the job is derived at both batches without a GPU
(`kubeseer.measure.gpu_memory`: meta-device trace, caching-allocator replay, runtime context)
and scored against the card's memory:

* fail exceeds: the upper bound at the batch that failed is above the card (goal >= 95 %);
* fit fits: the point estimate at the batch that ran is within the card (goal >= 90 %);
* max batch: both, i.e. the largest batch predicted to fit is the one that ran (goal >= 80 %).

A failure is memory evidence only when nothing else explains it: not a kernel's launch limit
(`kernel_limits`), and not another run of the same job that shows the failed batch fits the
card (`public_gpu.memory_contradictions`: a 24 GB card ran the batch the 96 GB one failed).

Rows, in the same run:

* **derived (documented context)**: the `Runtime` constants as shipped, nothing fitted;
* **derived (context fitted, leave-one-family-out)**: the runtime context is the one constant
  not derivable from the model; it is fitted on the other families' boundaries (the value
  that satisfies most of them) and scored on the held-out family, for every family (a family
  is the timm module that defines the architecture: `resnet`, `vision_transformer`, ...);
* **live-tensor peak**: what a FakeTensor/MemTracker estimate gives (peak of live tensors,
  no allocator rounding or reserve), plus the same fitted context;
* the upper bound is the point times a margin calibrated on the other families so that 95 %
  of their failing batches exceed the card.

    .venv/bin/python bench/gpu_memory.py [--limit N] [--jobs-only] [--shard I/N] [--json PATH]
        [--labels-in RUNTIME]

By default it scores the derivations committed in data/derived-gpu-memory-timm/ and those
cached in ~/.cache/kubeseer/gpu-memory/; `--limit N` derives N more (a few seconds each, in a
seeded order of whole boundaries), `--limit -1` all of them. `--labels-in torch2-cuda12
--jobs-only [--mode train]` derives the same jobs in the runtime the predictor's labels assume
(`gpu_samples.RUNTIME`) rather than the one each file ran: timm's training boundaries ran on
torch 1.12, and without these the predictor has no training memory of a timm architecture to
learn from.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubeseer.hardware import gpus
from kubeseer.measure import gpu_memory, kernel_limits, public_gpu

REPO = Path(__file__).resolve().parents[1]
TIMM_DIR = REPO.parent / "shared" / "data" / "public-gpu" / "timm"
CACHE = Path.home() / ".cache" / "kubeseer" / "gpu-memory" / "derived-v1.jsonl"
LIMITS_CACHE = CACHE.with_name("limits-v2.jsonl")
# The derivations this benchmark was last run on, committed so that it re-scores without
# re-deriving (data/derived-gpu-memory-timm/README.md says how they were made).
COMMITTED = REPO / "data" / "derived-gpu-memory-timm" / "derivations.jsonl"
COMMITTED_LIMITS = COMMITTED.with_name("kernel-limits.jsonl")
MIB = 1 << 20
GOALS = {"fail_exceeds": 95.0, "fit_fits": 90.0, "max_batch": 80.0}


@dataclass(frozen=True)
class JobKey:
    model: str
    img_size: int
    mode: str
    batch: int
    runtime: str

    def as_text(self) -> str:
        return f"{self.model}|{self.img_size}|{self.mode}|{self.batch}|{self.runtime}"


def family_of(model: str) -> str:
    """The timm module defining `model` (resnet, vision_transformer, ...)."""
    from timm.models import _registry

    return str(_registry._model_to_module.get(model, model.split("_")[0]))


def load_cache() -> dict[str, dict[str, Any]]:
    cached: dict[str, dict[str, Any]] = {}
    for path in (COMMITTED, CACHE):
        if path.exists():
            for line in path.read_text().splitlines():
                entry = json.loads(line)
                cached[entry["key"]] = entry
    return cached


def derive_job(key: JobKey) -> dict[str, Any]:
    parts = public_gpu.timm_parts(key.model, key.img_size)
    job = gpu_memory.Job(
        mode="train" if key.mode == "train" else "infer",
        precision="fp16",
        optimizer="sgd-nesterov" if key.mode == "train" else "none",
        batch_size=key.batch,
    )
    runtime = gpu_memory.RUNTIMES[key.runtime]
    started = time.perf_counter()
    try:
        derived = gpu_memory.derive(parts, job, runtime)
    except Exception as error:
        return {"key": key.as_text(), "error": f"{type(error).__name__}: {str(error)[:200]}"}
    return {
        "key": key.as_text(),
        "allocated": derived.allocated_peak,
        "reserved": derived.reserved_peak,
        "required": derived.required_reservation,
        "events": derived.events,
        "seconds": round(time.perf_counter() - started, 2),
    }


def boundaries() -> list[public_gpu.Boundary]:
    rows = public_gpu.read_timm(TIMM_DIR)
    return [
        b
        for b in public_gpu.boundaries(rows)
        if not b.row.channels_last and b.row.precision == "fp16"
    ]


def contradictions() -> dict[public_gpu.Boundary, str]:
    """The boundaries whose failure another run of the same job contradicts, with why."""
    return public_gpu.memory_contradictions(public_gpu.read_timm(TIMM_DIR))


def jobs_of(items: Iterable[public_gpu.Boundary], runtime: str | None = None) -> list[JobKey]:
    """Both batches of every boundary, boundaries in a seeded random order, so that a cache
    filled part way holds whole boundaries from every family; in `runtime` where given, else
    in the runtime each boundary's file ran."""
    shuffled = list(items)
    random.Random(0).shuffle(shuffled)
    keys: dict[str, JobKey] = {}
    for b in shuffled:
        for batch in (b.fit, b.fail):
            key = JobKey(b.row.model, b.row.img_size, b.row.mode, batch, runtime or b.row.runtime)
            keys.setdefault(key.as_text(), key)
    return list(keys.values())


def fill_cache(
    keys: Sequence[JobKey], limit: int | None, shard: tuple[int, int] = (0, 1)
) -> dict[str, dict[str, Any]]:
    cached = load_cache()
    todo = [k for i, k in enumerate(keys) if i % shard[1] == shard[0] and k.as_text() not in cached]
    if limit is not None:
        todo = todo[:limit]
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    with CACHE.open("a") as handle:
        for index, key in enumerate(todo):
            entry = derive_job(key)
            cached[entry["key"]] = entry
            handle.write(json.dumps(entry) + "\n")
            handle.flush()
            print(f"[{index + 1}/{len(todo)}] {entry}", file=sys.stderr)
    return cached


def limits_of(items: Sequence[public_gpu.Boundary]) -> dict[str, kernel_limits.Limits | None]:
    """Per (model, image size, runtime): the kernel limits of one example (committed, cached,
    or probed now)."""
    return kernel_limits.lookup(items, [COMMITTED_LIMITS], LIMITS_CACHE)


@dataclass(frozen=True)
class Case:
    """One boundary with both derivations: memory at the batch that ran and the next one."""

    family: str
    gpu: str
    mode: str
    runtime: str
    capacity: int
    fit: dict[str, Any]
    fail: dict[str, Any]
    limit: str | None
    contradiction: str | None

    @property
    def memory_evidence(self) -> bool:
        """Nothing but memory explains the failure: no kernel limit, no contradicting run."""
        return self.limit is None and self.contradiction is None


def cases(
    items: Sequence[public_gpu.Boundary],
    cached: dict[str, dict[str, Any]],
    limits: dict[str, kernel_limits.Limits | None],
    contradicted: dict[public_gpu.Boundary, str],
) -> list[Case]:
    out = []
    for b in items:
        r = b.row
        fit = cached.get(JobKey(r.model, r.img_size, r.mode, b.fit, r.runtime).as_text())
        fail = cached.get(JobKey(r.model, r.img_size, r.mode, b.fail, r.runtime).as_text())
        if fit is None or fail is None or "error" in fit or "error" in fail:
            continue
        out.append(
            Case(
                family=family_of(r.model),
                gpu=r.gpu,
                mode=r.mode,
                runtime=r.runtime,
                capacity=gpus.by_key(r.gpu).memory_bytes,
                fit=fit,
                fail=fail,
                limit=(
                    None
                    if (found := limits.get(kernel_limits.key(r.model, r.img_size, r.runtime)))
                    is None
                    else found.explains(b.fit, b.fail)
                ),
                contradiction=contradicted.get(b),
            )
        )
    return out


def score(
    items: Sequence[Case], column: str, context: dict[str, int], margin: float
) -> dict[str, float]:
    """Percentages of the three checks over `items` with the given context and margin."""
    fail_exceeds = fit_fits = both = 0
    for case in items:
        ctx = context[case.runtime]
        point_fit = ctx + case.fit[column]
        point_fail = ctx + case.fail[column]
        fit_fits += point_fit <= case.capacity
        fail_exceeds += point_fail * margin > case.capacity
        both += point_fit <= case.capacity < point_fail
    n = max(len(items), 1)
    return {
        "n": len(items),
        "fail_exceeds": 100 * fail_exceeds / n,
        "fit_fits": 100 * fit_fits / n,
        "max_batch": 100 * both / n,
    }


def fit_context(items: Sequence[Case], column: str, runtime: str) -> int:
    """The context (MiB multiple) that puts the most boundaries between their two batches."""
    candidates = range(0, 4096 * MIB, 32 * MIB)
    relevant = [c for c in items if c.runtime == runtime]

    def satisfied(ctx: int) -> int:
        return sum(ctx + c.fit[column] <= c.capacity < ctx + c.fail[column] for c in relevant)

    best = max(candidates, key=lambda ctx: (satisfied(ctx), -ctx))
    return best


def fit_margin(items: Sequence[Case], column: str, context: dict[str, int]) -> float:
    """Smallest multiplicative margin with 95 % of failing batches above the card."""
    needed = sorted(c.capacity / (context[c.runtime] + c.fail[column]) for c in items)
    if not needed:
        return 1.0
    index = min(len(needed) - 1, int(0.95 * len(needed)))
    return max(1.0, needed[index] * 1.0001)


def leave_one_family_out(items: Sequence[Case], column: str) -> tuple[dict[str, float], list[str]]:
    families = sorted({c.family for c in items})
    totals = collections.Counter[str]()
    n = 0
    notes = []
    for family in families:
        held = [c for c in items if c.family == family]
        rest = [c for c in items if c.family != family]
        context = {rt: fit_context(rest, column, rt) for rt in {c.runtime for c in items}}
        margin = fit_margin(rest, column, context)
        result = score(held, column, context, margin)
        for key in GOALS:
            totals[key] += result[key] * len(held) / 100
        n += len(held)
        notes.append(
            f"{family}: context {dict((k, v // MIB) for k, v in context.items())} MiB, "
            f"margin {margin:.3f}"
        )
    return {"n": n, **{k: 100 * totals[k] / max(n, 1) for k in GOALS}}, notes


def table(rows: list[tuple[str, dict[str, float]]]) -> str:
    lines = [
        "| rows | n | failed batch: upper bound > card | batch that ran: point fits "
        "| max batch in interval |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, result in rows:
        lines.append(
            f"| {name} | {result['n']} | {result['fail_exceeds']:.1f} % | "
            f"{result['fit_fits']:.1f} % | {result['max_batch']:.1f} % |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--limit",
        type=int,
        default=0,
        help="derive up to N jobs not yet derived (default 0: score the committed and cached "
        "derivations only; -1: all, about an hour per 300 jobs on one core)",
    )
    parser.add_argument("--jobs-only", action="store_true", help="only fill the cache")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--shard", default="0/1", help="I/N: derive every N-th job from I")
    parser.add_argument(
        "--labels-in",
        choices=sorted(gpu_memory.RUNTIMES),
        default=None,
        help="derive the jobs in this runtime instead of each boundary's own (predictor "
        "labels; not scored, so it needs --jobs-only)",
    )
    parser.add_argument(
        "--mode", choices=("train", "infer"), default=None, help="only this mode's boundaries"
    )
    args = parser.parse_args(argv)
    if args.labels_in is not None and not args.jobs_only:
        parser.error("--labels-in derives labels, not evidence: add --jobs-only")
    shard_index, shard_count = (int(x) for x in args.shard.split("/"))
    items = [b for b in boundaries() if args.mode in (None, b.row.mode)]
    limit = None if args.limit < 0 else args.limit
    cached = fill_cache(jobs_of(items, args.labels_in), limit, (shard_index, shard_count))
    if args.jobs_only:
        return 0
    scored = [
        b
        for b in items
        if JobKey(b.row.model, b.row.img_size, b.row.mode, b.fail, b.row.runtime).as_text()
        in cached
    ]
    all_cases = cases(items, cached, limits_of(scored), contradictions())
    limited = [c for c in all_cases if c.limit is not None]
    contradicted = [c for c in all_cases if c.limit is None and c.contradiction is not None]
    plausible = [c for c in all_cases if c.memory_evidence]
    errors = sum("error" in entry for entry in cached.values())
    documented = {name: rt.context_bytes for name, rt in gpu_memory.RUNTIMES.items()}
    rows: list[tuple[str, dict[str, float]]] = []
    report: dict[str, Any] = {"errors": errors, "cases": len(all_cases)}
    groups = (("all", all_cases), ("memory evidence", plausible))
    for name, subset in groups:
        rows.append(
            (f"{name}: derived, documented context, no margin",
             score(subset, "required", documented, 1.0))
        )  # fmt: skip
        for column, label in (("required", "derived"), ("allocated", "live-tensor peak")):
            result, notes = leave_one_family_out(subset, column)
            rows.append((f"{name}: {label}, context and margin fitted LOFO", result))
            report[f"{name}-{column}-notes"] = notes
    report["kernel-limited"] = len(limited)
    report["contradicted"] = len(contradicted)
    for gpu in sorted({c.gpu for c in plausible}):
        for mode in ("infer", "train"):
            subset = [c for c in plausible if c.gpu == gpu and c.mode == mode]
            if subset:
                result, _ = leave_one_family_out(subset, "required")
                rows.append((f"memory evidence: derived, {gpu} {mode} (LOFO)", result))
    print(table(rows))
    print("\nper family (memory evidence; context and margin fitted on the other families):\n")
    family_rows = []
    for family in sorted({c.family for c in plausible}):
        held = [c for c in plausible if c.family == family]
        rest = [c for c in plausible if c.family != family]
        context = {rt: fit_context(rest, "required", rt) for rt in {c.runtime for c in plausible}}
        family_rows.append(
            (family, score(held, "required", context, fit_margin(rest, "required", context)))
        )
    print(table(family_rows))
    print(
        f"\n{len(all_cases)} boundaries scored, {len(limited)} of them failed at a batch that "
        f"hits a kernel limit and {len(contradicted)} more at a batch another run of the job "
        f"shows fits the card; {errors} derivations failed (not on meta)"
    )
    report["table"] = rows
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

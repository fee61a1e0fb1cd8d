"""Which placement rule serves a stream of jobs best on dynamic-MIG GPUs?

Question (issue 19): kubeseer ranks every device that holds a job by the GPU time a step holds
(`kubeseer.placement.plan`: share of the GPU held x step time x slowdown) and takes the cheapest
free rung. HAMi and Volcano take the smallest MIG profile whose memory holds the declared
memory; the simplest rule gives every job a whole GPU. Run the same seeded stream of jobs
through all three on the same inventory and compare, as ratios against the peers of the same
run: jobs placed (started within the horizon) and finished, GPU memory stranded, mean slowdown.

Pure simulation, no cluster: the real scheduler's version comes with the DRA backend.

* Inventory: 2 nodes x 4 H100-80GB-SXM and 2 nodes x 4 A100-80GB, dynamic MIG: a GPU is
  partitioned on demand under MIG's geometry (7 compute slices; 8 memory slices at the placement
  offsets of the MIG user guide: 1g.10gb at 0..6, 1g.20gb and 2g.20gb at even offsets (2g not
  at 6), 3g.40gb at 0 or 4, 4g.40gb and 7g.80gb at 0), or given whole when it has no partition.
  Within the rung a policy chose, the GPU is best fit: the one with the fewest free memory slices
  that can host it (the fragmentation-aware choice HAMi also makes).
* Jobs: Poisson arrivals; calibrated upper bound of memory log-uniform in [0.5, 75] GiB; SM
  utilisation uniform in [5, 100] %; run time on a whole GPU log-normal around 45 min, on the
  device placed times its slowdown by that utilisation (`slowdown.utilisation_factor`), so a
  slow placement also holds its device longer. Two scenarios: the predictor learned the
  utilisation on an H100 (slowdowns on H100 `learned`, on A100 `derived`), or it has no
  utilisation labels (the shipped checkpoint: `no evidence`, memory alone decides). Every
  policy sees the same jobs in the same order; waiting jobs are retried first-come first-served
  with backfill at every arrival and departure.
* Stranded memory, time-averaged over the horizon, as a share of the cluster's memory: usable
  memory held beyond each running job's upper bound, plus memory slices of partitioned GPUs whose
  compute slices are all taken (no profile can use them).

    .venv/bin/python bench/placement_policies.py [--seeds 3] [--jobs 480] [--json]
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kubeseer import prediction as prediction_mod
from kubeseer.placement import catalogue, plan, slowdown

GIB = catalogue.GIB
PRODUCTS = (catalogue.model_by_key("H100-80GB-SXM"), catalogue.model_by_key("A100-80GB"))
GPUS_PER_PRODUCT = 8
MAX_SLOWDOWN = 2.0
ARRIVALS_PER_HOUR = 60.0
MEDIAN_RUN_S = 45 * 60.0

PLACEMENTS = {
    (1, 1): (0, 1, 2, 3, 4, 5, 6),
    (1, 2): (0, 2, 4, 6),
    (2, 2): (0, 2, 4),
    (3, 4): (0, 4),
    (4, 4): (0,),
    (7, 8): (0,),
}
"""(compute slices, memory slices) -> memory-slice offsets a MIG instance of that shape may
start at (MIG user guide, "A100/H100 MIG profiles", placements column)."""


@dataclass
class Gpu:
    """One GPU: whole (one job, no partition) or partitioned into MIG instances."""

    model: catalogue.GpuModel
    whole_job: int | None = None
    instances: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    """job -> (start, memory slices, compute slices)."""

    def compute_used(self) -> int:
        return sum(c for _, _, c in self.instances.values())

    def memory_used(self) -> set[int]:
        return {s + i for s, m, _ in self.instances.values() for i in range(m)}

    def offset_for(self, profile: catalogue.Profile) -> int | None:
        """Where an instance of `profile` can start now, or None."""
        if self.whole_job is not None:
            return None
        if self.compute_used() + profile.compute_slices > catalogue.COMPUTE_SLICES:
            return None
        used = self.memory_used()
        for start in PLACEMENTS[(profile.compute_slices, profile.memory_slices)]:
            if not used & set(range(start, start + profile.memory_slices)):
                return start
        return None

    def stranded_slices(self) -> int:
        """Free memory slices no profile can use: the compute slices are all taken."""
        if self.whole_job is not None or not self.instances:
            return 0
        if self.compute_used() < catalogue.COMPUTE_SLICES:
            return 0
        return catalogue.MEMORY_SLICES - len(self.memory_used())


@dataclass(frozen=True)
class Job:
    """One arrival of the stream; `util` is its true SM utilisation, whatever was predicted."""

    index: int
    arrival_s: float
    run_s: float
    util: float
    prediction: prediction_mod.Prediction


@dataclass(frozen=True)
class Rung:
    """What a policy asks for: a product and a profile (None: a whole GPU)."""

    model: catalogue.GpuModel
    profile: catalogue.Profile
    slowdown: float


Policy = Callable[[Job], list[Rung]]


def stream(seed: int, count: int, *, learned: bool) -> list[Job]:
    """The seeded job stream every policy sees (the same jobs whether `learned` or not)."""
    rng = random.Random(seed)
    jobs, now = [], 0.0
    for i in range(count):
        now += rng.expovariate(ARRIVALS_PER_HOUR / 3600.0)
        upper = math.exp(rng.uniform(math.log(0.5), math.log(75.0))) * GIB
        util = rng.uniform(5.0, 100.0)
        made = prediction_mod.Prediction(
            mode=prediction_mod.Mode.TRAIN,
            batch_size=32,
            precision=prediction_mod.Precision.FP32,
            memory_bytes=prediction_mod.Estimate(upper * 0.9, upper),
            sm_util_percent=prediction_mod.Estimate(util, min(100.0, util + 5)),
            step_time_s=prediction_mod.Estimate(0.1, 0.12),
            coverage=0.95,
            model_digest=f"{i:064x}",
            predictor_version="bench",
            label_device="NVIDIA-H100-80GB-HBM3",
            unlearned=() if learned else (slowdown.SM_UTILISATION,),
        )
        run = MEDIAN_RUN_S * math.exp(rng.gauss(0.0, 0.5))
        jobs.append(Job(i, now, run, util, made))
    return jobs


def ladder_policy(job: Job) -> list[Rung]:
    """kubeseer: the plan's ladder, cheapest first."""
    made = plan.build(job.prediction, plan.from_catalogue(PRODUCTS), max_slowdown=MAX_SLOWDOWN)
    return [_rung(job, r.candidate.gpu, r.candidate.profile) for r in made.ladder]


def smallest_profile_policy(job: Job) -> list[Rung]:
    """HAMi / Volcano: the smallest MIG profile whose memory holds it; a whole GPU if none."""
    need = job.prediction.memory_bytes.upper
    profiles = [
        (p.usable_memory_bytes, p.compute_slices, m.key, m, p)
        for m in PRODUCTS
        for p in m.profiles
        if p.usable_memory_bytes >= need
    ]
    if not profiles:
        profiles = [
            (m.whole.usable_memory_bytes, 7, m.key, m, m.whole)
            for m in PRODUCTS
            if m.whole.usable_memory_bytes >= need
        ]
    return [_rung(job, m, p) for *_, m, p in sorted(profiles, key=lambda t: t[:3])]


def whole_gpu_policy(job: Job) -> list[Rung]:
    """Every job a whole GPU that holds it, the smallest first."""
    need = job.prediction.memory_bytes.upper
    fitting = sorted(
        (m for m in PRODUCTS if m.whole.usable_memory_bytes >= need),
        key=lambda m: (m.whole.usable_memory_bytes, m.key),
    )
    return [_rung(job, m, m.whole) for m in fitting]


def _rung(job: Job, model: catalogue.GpuModel, profile: catalogue.Profile) -> Rung:
    """A rung with the job's true slowdown on it (what its run time is stretched by)."""
    return Rung(model, profile, slowdown.utilisation_factor(profile.compute_share, job.util))


POLICIES: dict[str, Policy] = {
    "cost-ordered ladder (kubeseer)": ladder_policy,
    "smallest fitting profile (HAMi, Volcano)": smallest_profile_policy,
    "whole GPUs only": whole_gpu_policy,
}


@dataclass
class Outcome:
    """What one policy did with one stream."""

    placed: int = 0
    finished: int = 0
    slowdowns: list[float] = field(default_factory=list)
    waits_s: list[float] = field(default_factory=list)
    stranded_gib_s: float = 0.0


def simulate(jobs: Sequence[Job], policy: Policy, horizon_s: float) -> Outcome:
    """Run the stream through one policy; events are arrivals and departures."""
    gpus = [Gpu(m) for m in PRODUCTS for _ in range(GPUS_PER_PRODUCT)]
    ladders = {job.index: policy(job) for job in jobs}
    held: dict[int, tuple[Gpu, float]] = {}  # job -> (gpu, bytes held beyond its bound)
    events: list[tuple[float, int, int]] = [(j.arrival_s, 1, j.index) for j in jobs]
    heapq.heapify(events)
    waiting: list[Job] = []
    outcome = Outcome()
    now = 0.0

    def stranded_bytes() -> float:
        over = sum(extra for _, extra in held.values())
        frag = sum(
            g.stranded_slices() * g.model.whole.usable_memory_bytes / catalogue.MEMORY_SLICES
            for g in gpus
        )
        return over + frag

    def try_place(job: Job) -> bool:
        for rung in ladders[job.index]:
            gpu = _best_fit(gpus, rung)
            if gpu is None:
                continue
            if rung.profile.is_whole_gpu:
                gpu.whole_job = job.index
            else:
                start = gpu.offset_for(rung.profile)
                assert start is not None
                shape = (start, rung.profile.memory_slices, rung.profile.compute_slices)
                gpu.instances[job.index] = shape
            extra = rung.profile.usable_memory_bytes - job.prediction.memory_bytes.upper
            held[job.index] = (gpu, extra)
            outcome.placed += 1
            outcome.slowdowns.append(rung.slowdown)
            outcome.waits_s.append(now - job.arrival_s)
            heapq.heappush(events, (now + job.run_s * rung.slowdown, 0, job.index))
            return True
        return False

    by_index = {j.index: j for j in jobs}
    while events:
        at, kind, index = heapq.heappop(events)
        at = min(at, horizon_s)
        outcome.stranded_gib_s += stranded_bytes() / GIB * (at - now)
        now = at
        if now >= horizon_s:
            break
        if kind == 0:
            outcome.finished += 1
            gpu, _ = held.pop(index)
            if gpu.whole_job == index:
                gpu.whole_job = None
            gpu.instances.pop(index, None)
        else:
            waiting.append(by_index[index])
        waiting = [j for j in waiting if not try_place(j)]
    return outcome


def _best_fit(gpus: Sequence[Gpu], rung: Rung) -> Gpu | None:
    """The GPU of the rung's product that can host it with the fewest free memory slices."""
    candidates = []
    for gpu in gpus:
        if gpu.model is not rung.model:
            continue
        if rung.profile.is_whole_gpu:
            if gpu.whole_job is None and not gpu.instances:
                candidates.append((0, len(candidates), gpu))
        elif gpu.offset_for(rung.profile) is not None:
            free = catalogue.MEMORY_SLICES - len(gpu.memory_used())
            candidates.append((free, len(candidates), gpu))
    return min(candidates)[2] if candidates else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=480, help="arrivals per seed (60 an hour)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    horizon = args.jobs / ARRIVALS_PER_HOUR * 3600.0
    cluster_gib = sum(m.whole.usable_memory_bytes for m in PRODUCTS) * GPUS_PER_PRODUCT / GIB
    scenarios = {
        "utilisation learned": _compare(args.seeds, args.jobs, horizon, cluster_gib, True),
        "no evidence (shipped checkpoint)": _compare(
            args.seeds, args.jobs, horizon, cluster_gib, False
        ),
    }
    if args.json:
        print(json.dumps({"jobs": args.jobs, "seeds": args.seeds, **scenarios}, indent=2))
        return 0
    print(
        f"{args.jobs} jobs per seed over {horizon / 3600:.0f} h, {args.seeds} seeds, "
        f"{len(PRODUCTS) * GPUS_PER_PRODUCT} GPUs ({cluster_gib:,.0f} GiB), maxSlowdown "
        f"{MAX_SLOWDOWN:g}"
    )
    for scenario, rows in scenarios.items():
        print(f"\n{scenario}")
        print(
            f"{'policy':<42} {'placed':>7} {'x ours':>7} {'finished':>8} {'stranded':>9} "
            f"{'slowdown':>9} {'wait min':>9}"
        )
        for name, row in rows.items():
            print(
                f"{name:<42} {row['placed']:>7.1f} {row['placed_vs_ladder']:>7.3f} "
                f"{row['finished']:>8.1f} {100 * row['stranded_share']:>8.1f}% "
                f"{row['mean_slowdown']:>8.2f}x {row['mean_wait_min']:>9.1f}"
            )
    return 0


def _compare(
    seeds: int, count: int, horizon: float, cluster_gib: float, learned: bool
) -> dict[str, dict[str, float]]:
    """Every policy on the same streams: means over seeds, and placed as a ratio to ours."""
    rows: dict[str, dict[str, float]] = {}
    for name, policy in POLICIES.items():
        runs = [
            simulate(stream(seed, count, learned=learned), policy, horizon) for seed in range(seeds)
        ]
        rows[name] = {
            "placed": statistics.mean(r.placed for r in runs),
            "placed_share": statistics.mean(r.placed / count for r in runs),
            "finished": statistics.mean(r.finished for r in runs),
            "stranded_share": statistics.mean(
                r.stranded_gib_s / horizon / cluster_gib for r in runs
            ),
            "mean_slowdown": statistics.mean(statistics.mean(r.slowdowns) for r in runs),
            "mean_wait_min": statistics.mean(statistics.mean(r.waits_s) / 60 for r in runs),
        }
    ours = rows["cost-ordered ladder (kubeseer)"]
    for row in rows.values():
        row["placed_vs_ladder"] = row["placed"] / ours["placed"]
    return rows


if __name__ == "__main__":
    sys.exit(main())

"""Which MIG rule packs a stream of jobs best when the real kube-scheduler allocates under DRA?

Question (issue 19): kubeseer asks Dynamic Resource Allocation for a `firstAvailable` ladder of
every device that holds a job, cheapest first (`kubeseer.placement.plan`: share of the GPU held
x step time x predicted slowdown; rendered by `kubeseer.placement.claims`). HAMi and Volcano
take the smallest MIG profile whose memory holds the job; the simplest rule gives every job a
whole GPU. A fourth row is kubeseer as shipped: its checkpoint has no utilisation labels, so
no slowdown is known and the ladder is ordered by the share of the GPU held (the jobs still run
as slowly as their utilisation makes them). The same seeded stream goes through all of them on
the same dynamic-MIG GPUs, in one
run of the real control plane: kube-apiserver, kube-scheduler (which evaluates the claims' CEL
and the GPUs' shared counters, so MIG geometry and fragmentation are its own), the claim
controller, and KWOK running the pods. `bench/placement_policies.py` asks the same question of a
pure simulation that places best-fit; this one lets the scheduler choose the device.

* Inventory: `deploy/devcluster/dra-bench.yaml`, 4 nodes x 4 GPUs (8 H100-80GB, 8 A100-80GB)
  published as NVIDIA's DRA driver does under DynamicMIG: every profile at every placement and
  the whole GPU, consuming per-GPU counters (`kubeseer.devcluster.dra`).
* Jobs: Poisson arrivals, 60 an hour. Memory: the shipped predictor's calibrated upper bounds
  for real architectures of the zoo (ResNet, VGG, DenseNet, MobileNet, ViT, BERT, GPT-2; train
  and infer, several batches; `bench/data/extender-jobs.json`, made by `bench/extender.py`).
  SM utilisation: uniform 5-100 %, learned on an H100 (the project has no GPU utilisation labels
  yet; the same assumption as bench/placement_policies.py), so slowdowns are `learned` on H100
  and `derived` on A100. Run time on a whole GPU log-normal around 45 min, times the predicted
  slowdown of the device the job got. Predicted step time scales a job's run time only: the
  cost order of one job's rungs does not depend on it.
* Each job is a ResourceClaim and a pod that uses it, created directly (no operator). Virtual
  time: at an arrival the job's claim and pod are created and the scheduler either allocates
  (the job runs) or reports the pod unschedulable (the pod and claim are deleted and the job
  waits); at a departure the job's pod and claim are deleted and the waiting jobs are tried
  again first-come first-served with backfill. A waiting job is sent to the scheduler only when
  some rung of its ladder selects a device that is free by the GPUs' geometry (`could_fit`);
  this skips attempts the scheduler must refuse. The scheduler breaks ties between equal nodes
  at random, so two runs differ a little; `--no-prune` sends every attempt.
* Metrics, each also as a ratio against the ladder's: jobs placed (started within the
  horizon), jobs finished within it, mean predicted slowdown on the devices they got, GPU
  memory stranded (time-averaged share of the cluster's memory: usable memory of allocated
  devices beyond each job's bound, plus free memory slices of GPUs whose 7 compute slices are
  all taken), the share placed on their first rung, and the mean wait of placed jobs.

    .venv/bin/python bench/dra_packing.py [--jobs 480] [--rate 60] [--seeds 1] [--no-prune]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config

from kubeseer import prediction, resources
from kubeseer.devcluster import binaries, cluster, errors, inventory
from kubeseer.devcluster.dra import allocation, geometry
from kubeseer.placement import catalogue, claims, plan, slowdown

GIB = catalogue.GIB
REPO = Path(__file__).resolve().parents[1]
JOBS_FILE = REPO / "bench" / "data" / "extender-jobs.json"
INVENTORY = resources.path("deploy", "devcluster", "dra-bench.yaml")
PRODUCTS = (catalogue.model_by_key("H100-80GB-SXM"), catalogue.model_by_key("A100-80GB"))
MAX_SLOWDOWN = 2.0
ARRIVALS_PER_HOUR = 60.0
MEDIAN_RUN_S = 45 * 60.0
GROUP, VERSION = "resource.k8s.io", "v1"
NAMESPACE = "dra-bench"
_POLL_S = 0.02
_TIMEOUT_S = 30.0
_RETRY_S = (0.25, 0.5, 1.0)


@dataclass(frozen=True)
class Job:
    """One arrival of the stream."""

    index: int
    arrival_s: float
    run_s: float
    model: str
    prediction: prediction.Prediction

    @property
    def name(self) -> str:
        return f"job-{self.index:04d}"


def stream(seed: int, count: int, largest_bytes: int, per_hour: float) -> list[Job]:
    """The seeded stream every policy sees: architectures from the table, drawn uniformly."""
    rows = json.loads(JOBS_FILE.read_text())["rows"]
    usable = [r for r in rows if r["upper_bytes"] <= largest_bytes]
    rng = random.Random(seed)
    jobs, now = [], 0.0
    for index in range(count):
        now += rng.expovariate(per_hour / 3600.0)
        row = rng.choice(usable)
        util = rng.uniform(5.0, 100.0)
        made = prediction.Prediction(
            mode=prediction.Mode(row["mode"]),
            batch_size=int(row["batch"]),
            precision=prediction.Precision(row["precision"]),
            memory_bytes=prediction.Estimate(row["point_bytes"], row["upper_bytes"]),
            sm_util_percent=prediction.Estimate(util, min(100.0, util + 5)),
            step_time_s=prediction.Estimate(0.1, 0.12),
            coverage=0.95,
            model_digest=f"sha256:{index:064x}",
            predictor_version="bench",
            label_device="NVIDIA-H100-80GB-HBM3",
        )
        run = MEDIAN_RUN_S * math.exp(rng.gauss(0.0, 0.5))
        jobs.append(Job(index, now, run, f"{row['model']}/{row['mode']}/b{row['batch']}", made))
    return jobs


# -- the three rules, each a plan whose ladder becomes the claim -------------------------------


def ladder_plan(job: Job) -> plan.Plan:
    """kubeseer: every device that holds the job within maxSlowdown, cheapest first."""
    return plan.build(job.prediction, plan.from_catalogue(PRODUCTS), max_slowdown=MAX_SLOWDOWN)


def unlearned_ladder_plan(job: Job) -> plan.Plan:
    """kubeseer with the shipped checkpoint, which has no utilisation labels: no slowdown is
    known, so the ladder is in order of the share of the GPU held (the job still runs as slow
    as its utilisation makes it)."""
    blind = dataclasses.replace(job.prediction, unlearned=(slowdown.SM_UTILISATION,))
    return plan.build(blind, plan.from_catalogue(PRODUCTS), max_slowdown=MAX_SLOWDOWN)


def smallest_profile_plan(job: Job) -> plan.Plan:
    """HAMi / Volcano: the MIG profiles that hold the memory, smallest first (slowdown is not
    theirs to weigh); whole GPUs only when no profile holds it."""
    made = plan.build(job.prediction, plan.from_catalogue(PRODUCTS), max_slowdown=math.inf)
    rows = [r for r in made.ladder if not r.candidate.profile.is_whole_gpu] or list(made.ladder)
    rows.sort(
        key=lambda r: (
            r.candidate.usable_memory_bytes,
            r.candidate.profile.compute_slices,
            r.candidate.gpu.key,
        )
    )
    return _reranked(made, rows)


def whole_gpu_plan(job: Job) -> plan.Plan:
    """Every job a whole GPU that holds it, the smallest first."""
    wholes = [c for c in plan.from_catalogue(PRODUCTS) if c.profile.is_whole_gpu]
    made = plan.build(job.prediction, wholes, max_slowdown=math.inf)
    rows = sorted(made.ladder, key=lambda r: (r.candidate.usable_memory_bytes, r.candidate.gpu.key))
    return _reranked(made, rows)


def _reranked(made: plan.Plan, rows: Sequence[plan.Row]) -> plan.Plan:
    """`made` with only `rows` as its ladder, in that order (ranks, so rung names, renumbered)."""
    ranked = tuple(dataclasses.replace(r, rank=i) for i, r in enumerate(rows, start=1))
    return dataclasses.replace(made, rows=ranked)


POLICIES: dict[str, Callable[[Job], plan.Plan]] = {
    "cost-ordered ladder (kubeseer)": ladder_plan,
    "ladder without utilisation evidence": unlearned_ladder_plan,
    "smallest fitting profile (HAMi, Volcano)": smallest_profile_plan,
    "whole GPUs only": whole_gpu_plan,
}


# -- what is allocated, as the scheduler chose it ----------------------------------------------


@dataclass
class _Gpu:
    model: catalogue.GpuModel
    whole: bool = False
    memory_slices: set[int] = field(default_factory=set)
    compute_slices: int = 0

    def empty(self) -> bool:
        return not self.whole and not self.memory_slices


class Holdings:
    """The devices running jobs hold, per GPU, read from their claims' allocations."""

    def __init__(self, nodes: inventory.Inventory) -> None:
        self.gpus: dict[tuple[str, int], _Gpu] = {}
        for node in nodes.dra_nodes():
            assert node.gpu_model is not None
            model, _ = catalogue.parse_product_label(node.gpu_model.product)
            for minor in range(node.gpus):
                self.gpus[(node.name, minor)] = _Gpu(model)
        self.jobs: dict[str, tuple[tuple[str, int], str, int]] = {}
        """job -> (GPU, device, bytes held beyond its bound)."""

    def add(self, job: str, pool: str, device: str, extra_bytes: int) -> None:
        placement = allocation.parse_mig_name(device)
        minor = placement.gpu if placement else int(device.removeprefix("gpu-"))
        gpu = self.gpus[(pool, minor)]
        if placement is None:
            gpu.whole = True
        else:
            gpu.memory_slices |= set(placement.memory_slices)
            gpu.compute_slices += placement.compute_slices
        self.jobs[job] = ((pool, minor), device, extra_bytes)

    def remove(self, job: str) -> None:
        key, device, _ = self.jobs.pop(job)
        gpu = self.gpus[key]
        placement = allocation.parse_mig_name(device)
        if placement is None:
            gpu.whole = False
        else:
            gpu.memory_slices -= set(placement.memory_slices)
            gpu.compute_slices -= placement.compute_slices

    def stranded_bytes(self) -> float:
        """Memory held beyond the bounds, plus free slices no profile can use any more."""
        over = sum(extra for _, _, extra in self.jobs.values())
        blocked = sum(
            (geometry.MEMORY_SLICES - len(g.memory_slices))
            * g.model.whole.usable_memory_bytes
            / geometry.MEMORY_SLICES
            for g in self.gpus.values()
            if not g.whole and g.compute_slices >= geometry.COMPUTE_SLICES
        )
        return over + blocked

    def could_fit(self, made: plan.Plan) -> bool:
        """Whether some rung of the ladder has a device the scheduler could allocate now.

        A rung selects the devices of its product with memory from the need up to its own and
        exactly its profile's SMs (`claims.rung_selectors`); one of them is free when a GPU has
        no whole-GPU allocation, a legal offset with its memory slices free, and the compute
        slices left. The counters' SMs and engines never refuse what that allows (the unit
        tests try every layout), so this only skips attempts the scheduler must refuse.
        """
        for row in made.ladder:
            model, rung = row.candidate.gpu, row.candidate.profile
            gpus = [g for g in self.gpus.values() if g.model is model]
            if rung.is_whole_gpu:
                if any(g.empty() for g in gpus):
                    return True
                continue
            admitted = [
                p
                for p in model.profiles
                if made.need_bytes <= p.usable_memory_bytes <= rung.usable_memory_bytes
                and (rung.sms is None or p.sms == rung.sms)
            ]
            for g in gpus:
                for p in admitted:
                    if g.whole or g.compute_slices + p.compute_slices > geometry.COMPUTE_SLICES:
                        continue
                    for start in geometry.starts(p.compute_slices, p.memory_slices):
                        if not g.memory_slices & set(range(start, start + p.memory_slices)):
                            return True
        return False


# -- one policy through the real scheduler -----------------------------------------------------


@dataclass
class Outcome:
    """What one policy did with the stream."""

    placed: int = 0
    finished: int = 0
    first_choice: int = 0
    slowdowns: list[float] = field(default_factory=list)
    waits_s: list[float] = field(default_factory=list)
    stranded_gib_s: float = 0.0
    attempts: int = 0
    refused: int = 0
    retried: int = 0
    pruned: int = 0
    wall_s: float = 0.0


class Scheduler:
    """Claims and pods in one namespace; the real scheduler's answer to each."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.core.create_namespace({"metadata": {"name": namespace}})
        self._serial = 0

    def attempt(self, made: plan.Plan) -> tuple[str, claims.Allocation] | None:
        """Create a claim with the plan's ladder and a pod using it; the allocation, or None
        (pod and claim deleted again) when the scheduler finds the pod unschedulable."""
        self._serial += 1
        name = f"a{self._serial:05d}"
        template = claims.build_claim_template(made, name, self.namespace)
        claim = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": template["spec"]["spec"],
        }
        self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "resourceclaims", claim
        )
        self.core.create_namespaced_pod(self.namespace, _pod(name))
        deadline = time.monotonic() + _TIMEOUT_S
        while time.monotonic() < deadline:
            pod = self.core.read_namespaced_pod(name, self.namespace)
            if pod.spec.node_name:
                found = self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, "resourceclaims", name
                )
                got = claims.read_allocation(found)
                if got is None:
                    raise RuntimeError(f"pod {name} is bound but its claim is not allocated")
                return name, got
            for condition in pod.status.conditions or ():
                if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
                    self.release(name, wait=False)
                    return None
            time.sleep(_POLL_S)
        raise RuntimeError(f"the scheduler neither placed nor refused {name} in {_TIMEOUT_S} s")

    def release(self, name: str, *, wait: bool = True) -> None:
        """Delete a job's pod and claim; with `wait`, until the claim (its device) is gone."""
        self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
        self.custom.delete_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "resourceclaims", name
        )
        deadline = time.monotonic() + _TIMEOUT_S
        while wait and time.monotonic() < deadline:
            listed = self.custom.list_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                "resourceclaims",
                field_selector=f"metadata.name={name}",
            )
            if not listed["items"]:
                return
            time.sleep(_POLL_S)
        if wait:
            raise RuntimeError(f"claim {name} was not released in {_TIMEOUT_S} s")

    def close(self) -> None:
        """Delete everything left and wait until every claim is released."""
        self.core.delete_collection_namespaced_pod(self.namespace, grace_period_seconds=0)
        self.custom.delete_collection_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "resourceclaims"
        )
        deadline = time.monotonic() + _TIMEOUT_S
        while time.monotonic() < deadline:
            left = self.custom.list_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "resourceclaims"
            )["items"]
            if not left:
                break
            time.sleep(0.1)
        self.core.delete_namespace(self.namespace)


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
        },
    }


@dataclass(frozen=True)
class Granted:
    """What the scheduler allocated to one attempt: the claim's owner, the device, the rung."""

    name: str
    pool: str
    device: str
    row: plan.Row
    first_choice: bool


Ask = Callable[[Job, plan.Plan], Granted | None]
"""Submit one job with its plan and wait for the scheduler's answer (None: nothing free)."""


def run(
    api: client.ApiClient,
    nodes: inventory.Inventory,
    jobs: Sequence[Job],
    policy: Callable[[Job], plan.Plan],
    horizon_s: float,
    namespace: str,
    *,
    prune: bool,
) -> Outcome:
    """The stream through one policy, in virtual time; the scheduler decides every placement."""
    scheduler = Scheduler(api, namespace)

    def ask(job: Job, made: plan.Plan) -> Granted | None:
        answer = scheduler.attempt(made)
        if answer is None:
            return None
        name, got = answer
        row = next(r for r in made.ladder if claims.rung_name(r) == got.rung)
        return Granted(name, got.pool, got.device, row, got.first_choice)

    try:
        return replay(api, nodes, jobs, policy, horizon_s, ask, scheduler.release, prune=prune)
    finally:
        scheduler.close()


def replay(
    api: client.ApiClient,
    nodes: inventory.Inventory,
    jobs: Sequence[Job],
    policy: Callable[[Job], plan.Plan],
    horizon_s: float,
    ask: Ask,
    release: Callable[[str], None],
    *,
    prune: bool,
) -> Outcome:
    """The protocol every arm follows, in virtual time: at an arrival the job is asked for, at
    a finish its claim is released and the waiting jobs are asked for again, in arrival order;
    a placed job runs its duration times the slowdown of the device it got. `ask` is the arm's
    way of submitting (claims made here, or DLJobs through the operator)."""
    began = time.monotonic()
    plans = {job.index: policy(job) for job in jobs}
    listed = client.CustomObjectsApi(api).list_cluster_custom_object(
        GROUP, VERSION, "resourceslices"
    )
    ledger = allocation.Ledger(listed["items"])
    holdings = Holdings(nodes)
    outcome = Outcome()
    events: list[tuple[float, int, int]] = [(j.arrival_s, 1, j.index) for j in jobs]
    heapq.heapify(events)
    waiting: list[Job] = []
    attempt_of: dict[int, str] = {}
    now = 0.0

    def try_place(job: Job) -> bool:
        made = plans[job.index]
        if prune and not holdings.could_fit(made):
            outcome.pruned += 1
            return False
        outcome.attempts += 1
        got = ask(job, made)
        # A refusal right after a release can be the scheduler not having seen it yet; the real
        # scheduler retries a pending pod on that event, so a job the geometry says fits is
        # asked again after a moment.
        for delay in _RETRY_S if prune else ():
            if got is not None:
                break
            time.sleep(delay)
            outcome.attempts += 1
            outcome.retried += 1
            got = ask(job, made)
        if got is None:
            outcome.refused += 1
            return False
        device_bytes = ledger.capacity((got.pool, got.device), "memory") or 0
        holdings.add(got.name, got.pool, got.device, device_bytes - made.need_bytes)
        factor = _slowdown(job, got.row.candidate.gpu, got.device)
        outcome.placed += 1
        outcome.first_choice += got.first_choice
        outcome.slowdowns.append(factor)
        outcome.waits_s.append(now - job.arrival_s)
        attempt_of[job.index] = got.name
        heapq.heappush(events, (now + job.run_s * factor, 0, job.index))
        return True

    by_index = {j.index: j for j in jobs}
    while events:
        at, kind, index = heapq.heappop(events)
        at = min(at, horizon_s)
        outcome.stranded_gib_s += holdings.stranded_bytes() / GIB * (at - now)
        now = at
        if now >= horizon_s:
            break
        if kind == 0:
            name = attempt_of.pop(index)
            release(name)
            holdings.remove(name)
            outcome.finished += 1
            waiting = [j for j in waiting if not try_place(j)]
        elif not try_place(by_index[index]):
            waiting.append(by_index[index])
    outcome.wall_s = time.monotonic() - began
    return outcome


def _slowdown(job: Job, model: catalogue.GpuModel, device: str) -> float:
    """The predicted slowdown on the device the scheduler allocated (not the rung it asked)."""
    placement = allocation.parse_mig_name(device)
    if placement is None:
        profile = model.whole
    else:
        size = len(placement.memory_slices)
        profile = next(
            p
            for p in model.profiles
            if (p.compute_slices, p.memory_slices) == (placement.compute_slices, size)
        )
    device_view = slowdown.Device(model, profile, profile.compute_share)
    return slowdown.from_utilisation(job.prediction, device_view).factor or 1.0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=480, help="arrivals per seed")
    parser.add_argument(
        "--rate", type=float, default=ARRIVALS_PER_HOUR, help="arrivals an hour (default 60)"
    )
    parser.add_argument("--seeds", type=int, default=1, help="streams, averaged (default 1)")
    parser.add_argument(
        "--no-prune",
        dest="prune",
        action="store_false",
        help="send every waiting job to the scheduler at every departure",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    try:
        bins = binaries.build() if binaries.go_available() else binaries.locate()
    except errors.BinariesMissingError as e:
        print(f"dra_packing: skipped, no control plane here ({e})")
        return 0
    if not JOBS_FILE.is_file():
        print(f"dra_packing: {JOBS_FILE} is missing; `bench/extender.py --refresh-jobs` makes it")
        return 1
    nodes = inventory.load(INVENTORY)
    largest = min(
        p.usable_memory_bytes for m in PRODUCTS for p in m.profiles if p.compute_slices == 7
    )
    horizon = args.jobs / args.rate * 3600.0
    gpus = sum(n.gpus for n in nodes.dra_nodes())
    cluster_gib = (
        sum(g.model.whole.usable_memory_bytes for g in Holdings(nodes).gpus.values()) / GIB
    )
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in POLICIES}
    arrived = []
    with cluster.LocalCluster(inventory_file=INVENTORY, bins=bins) as local:
        api = config.new_client_from_config(config_file=str(local.admin_kubeconfig))
        for seed in range(19, 19 + args.seeds):
            jobs = stream(seed, args.jobs, largest, args.rate)
            arrived.append(sum(1 for j in jobs if j.arrival_s < horizon))
            for i, (label, policy) in enumerate(POLICIES.items()):
                namespace = f"{NAMESPACE}-{seed}-{i}"
                got = run(api, nodes, jobs, policy, horizon, namespace, prune=args.prune)
                runs[label].append(_figures(got, horizon, cluster_gib))
                print(
                    f"  seed {seed}, {label}: {got.placed} placed, {got.attempts} attempts "
                    f"({got.refused} refused, {got.retried} retried, {got.pruned} pruned), "
                    f"{got.wall_s:.0f} s",
                    flush=True,
                )
        api.close()
    rows = {
        label: {k: statistics.mean(r[k] for r in got) for k in got[0]}
        for label, got in runs.items()
    }
    ours = rows["cost-ordered ladder (kubeseer)"]
    for row in rows.values():
        for key in ("placed", "finished", "mean_slowdown", "stranded_share"):
            row[f"{key}_vs_ladder"] = row[key] / ours[key] if ours[key] else math.nan
    print(
        f"{statistics.mean(arrived):.0f} jobs arrived in {horizon / 3600:.1f} h per seed, "
        f"{args.seeds} seed(s), {gpus} dynamic-MIG GPUs ({cluster_gib:,.0f} GiB), "
        f"maxSlowdown {MAX_SLOWDOWN:g}, real kube-scheduler"
    )
    print(
        f"{'policy':<42} {'placed':>7} {'x ladder':>9} {'finished':>9} {'1st rung':>9} "
        f"{'slowdown':>9} {'stranded':>9} {'wait min':>9}"
    )
    for label, row in rows.items():
        print(
            f"{label:<42} {row['placed']:>7.1f} {row['placed_vs_ladder']:>9.3f} "
            f"{row['finished']:>9.1f} {100 * row['first_choice_share']:>8.1f}% "
            f"{row['mean_slowdown']:>8.2f}x {100 * row['stranded_share']:>8.1f}% "
            f"{row['mean_wait_min']:>9.1f}"
        )
    if args.json:
        document = {
            "jobs": args.jobs,
            "arrived": arrived,
            "rate_per_hour": args.rate,
            "seeds": args.seeds,
            "prune": args.prune,
            "policies": rows,
            "runs": runs,
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0


def _figures(got: Outcome, horizon_s: float, cluster_gib: float) -> dict[str, float]:
    return {
        "placed": got.placed,
        "finished": got.finished,
        "first_choice_share": got.first_choice / got.placed if got.placed else 0.0,
        "mean_slowdown": statistics.mean(got.slowdowns) if got.slowdowns else 0.0,
        "stranded_share": got.stranded_gib_s / horizon_s / cluster_gib,
        "mean_wait_min": statistics.mean(got.waits_s) / 60 if got.waits_s else 0.0,
        "scheduler_attempts": got.attempts,
        "refused": got.refused,
        "retried": got.retried,
        "pruned": got.pruned,
        "wall_s": got.wall_s,
    }


if __name__ == "__main__":
    sys.exit(main())

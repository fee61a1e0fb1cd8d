"""The plan: every device a job could get, whether it holds the job, what it costs, in one table.

A `Plan` has one `Row` per candidate (a GPU product and a MIG profile or the whole GPU), built
by `build` from a prediction and the candidates, either the cluster's (`from_inventory`: with
free and allocatable units) or the catalogue's (`from_catalogue`: what `kubeseer plan` shows
before anything runs). It is pure data: the policy marks the row it chooses
(`Plan.with_choice`), the operator writes it to `status.plan` (`status_rows`), and the DRA
backend renders its `ladder` as a `firstAvailable` request (`kubeseer.placement.claims`).

Cost order (docs/placement.md, "The plan and its cost order"): a rung costs the GPU time one
step holds, ``share_held x step_time x slowdown``, where `share_held` is the part of the GPU the
rung takes out of use (`catalogue.Profile.share_held`: the scarcer of its compute and memory
slices; 1 for a whole GPU) and `step_time` the predicted step time on a whole GPU. Without
evidence of a slowdown the factor is 1, so the order is by share held: the smallest slice that
holds the memory comes first. Ties go to less usable memory (less of it stranded), then less
compute, then names, so the order is total and repeatable.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TypedDict

from kubeseer import prediction as prediction_mod
from kubeseer.placement import catalogue, inventory, slowdown

__all__ = [
    "Candidate",
    "Plan",
    "PlanStatus",
    "Row",
    "RowStatus",
    "Verdict",
    "build",
    "from_catalogue",
    "from_inventory",
    "status_rows",
    "to_status",
]


class Verdict(StrEnum):
    """Whether a row is on the ladder, and if not the first reason it is not."""

    FITS = "fits"
    TOO_SMALL = "too small"
    WHOLE_GPU_NOT_ALLOWED = "whole GPU not allowed"
    TOO_SLOW = "too slow"
    TOO_FEW = "too few in the cluster"


@dataclass(frozen=True)
class Candidate:
    """One kind of device: a (GPU product label, resource) with what one unit gives a job.

    `free` and `allocatable` are None when there is no cluster to count (the catalogue's plan);
    `pending` is how many units unbound pods may take of this kind (its queue); `offered_as` is
    the resource the nodes offer it as, when the cluster says (`nvidia.com/gpu` for a slice of
    the device plugin's single strategy).
    """

    gpu: catalogue.GpuModel
    product_label: str
    profile: catalogue.Profile
    usable_memory_bytes: int
    compute_share: float
    free: int | None = None
    allocatable: int | None = None
    pending: int = 0
    best_node: str | None = None
    offered_as: str | None = None

    @property
    def resource(self) -> str:
        """The extended resource a pod requests for it: what its nodes offer it as, else the
        profile's own (`nvidia.com/mig-1g.10gb`, `nvidia.com/gpu` for a whole GPU)."""
        return self.offered_as or self.profile.resource_name

    @property
    def device(self) -> slowdown.Device:
        """What a slowdown model needs to know about it."""
        return slowdown.Device(self.gpu, self.profile, self.compute_share)


@dataclass(frozen=True)
class Row:
    """One candidate judged against the job.

    `margin_bytes` is usable memory minus the need (negative: it is short by that much);
    `step_time_s` the predicted step time on it (None without evidence of the slowdown);
    `cost` the GPU time a step holds (module docstring); `rank` 1 for the cheapest row that
    fits, None for rows that do not fit.
    """

    candidate: Candidate
    margin_bytes: int
    slowdown: slowdown.Slowdown
    step_time_s: float | None
    cost: float
    verdict: Verdict
    rank: int | None
    chosen: bool
    note: str

    @property
    def fits(self) -> bool:
        """On the ladder: holds the memory, is allowed, within the slowdown, enough of it."""
        return self.verdict is Verdict.FITS


@dataclass(frozen=True)
class Plan:
    """Every candidate for one job, fitting rows first in cost order."""

    need_bytes: int
    need_basis: str
    max_slowdown: float
    replicas: int
    rows: tuple[Row, ...]

    @property
    def ladder(self) -> tuple[Row, ...]:
        """The rows that fit, cheapest first: a DRA `firstAvailable` request, in order."""
        return tuple(r for r in self.rows if r.fits)

    @property
    def chosen(self) -> Row | None:
        """The row the policy chose, if it chose one."""
        return next((r for r in self.rows if r.chosen), None)

    def with_choice(self, row: Row, note: str) -> Plan:
        """This plan with `row` marked chosen and `note` saying why."""
        if row not in self.rows:
            raise ValueError("the chosen row is not in the plan")
        rows = tuple(replace(r, chosen=True, note=note) if r == row else r for r in self.rows)
        return replace(self, rows=rows)


def from_catalogue(models: Iterable[catalogue.GpuModel]) -> tuple[Candidate, ...]:
    """Every profile and the whole GPU of each model, with the catalogue's figures."""
    return tuple(
        Candidate(
            gpu=model,
            product_label=model.product_labels[0],
            profile=profile,
            usable_memory_bytes=profile.usable_memory_bytes,
            compute_share=profile.compute_share,
        )
        for model in models
        for profile in (*model.profiles, model.whole)
    )


def from_inventory(
    inv: inventory.Inventory,
    models: Iterable[catalogue.GpuModel],
    node_selector: Sequence[tuple[str, str]] = (),
) -> tuple[Candidate, ...]:
    """The cluster's kinds of device on these GPU models, on nodes the selector matches.

    Nodes of one product may publish different labels; a kind is planned with the tightest
    memory and compute any of its nodes reports.
    """
    allowed = {m.key for m in models}
    selector = dict(node_selector)
    groups: dict[tuple[str, str], list[inventory.Offer]] = {}
    for offer in inv.offers:
        labels = inv.node_labels.get(offer.node, {})
        if offer.model_key in allowed and inventory.selects(selector, labels):
            groups.setdefault((offer.product_label, offer.resource), []).append(offer)
    result = []
    for (label, resource), offers in sorted(groups.items()):
        nodes = {o.node for o in offers}
        free = inv.free_units(label, resource, nodes)
        roomiest = min(offers, key=lambda o: (-o.free, o.node))
        result.append(
            Candidate(
                gpu=catalogue.model_by_key(offers[0].model_key),
                product_label=label,
                profile=offers[0].profile,
                usable_memory_bytes=min(o.usable_memory_bytes for o in offers),
                compute_share=min(o.compute_share for o in offers),
                free=free,
                allocatable=sum(o.allocatable for o in offers),
                pending=inv.pending_units(label, resource),
                best_node=roomiest.node if free > 0 and roomiest.free > 0 else None,
                offered_as=resource,
            )
        )
    return tuple(result)


def build(
    pred: prediction_mod.Prediction,
    candidates: Iterable[Candidate],
    *,
    max_slowdown: float,
    allow_whole_gpu: bool = True,
    replicas: int = 1,
    need_bytes: float | None = None,
    need_basis: str | None = None,
    model: slowdown.SlowdownModel = slowdown.from_evidence,
) -> Plan:
    """Judge every candidate against the job; nothing is chosen yet.

    The need is the prediction's calibrated upper bound unless `need_bytes` says otherwise (an
    escalation after an out-of-memory failure needs more, see `policy.escalate`).
    """
    need = math.ceil(pred.memory_bytes.upper if need_bytes is None else need_bytes)
    basis = need_basis or f"upper bound at {pred.coverage:.0%} coverage"
    judged = [
        _judge(pred, c, need, max_slowdown, allow_whole_gpu, replicas, model) for c in candidates
    ]
    fitting = sorted((r for r in judged if r.fits), key=_cost_key)
    others = sorted((r for r in judged if not r.fits), key=_size_key)
    ranked = tuple(replace(r, rank=i) for i, r in enumerate(fitting, start=1))
    return Plan(
        need_bytes=need,
        need_basis=basis,
        max_slowdown=max_slowdown,
        replicas=replicas,
        rows=ranked + tuple(others),
    )


def _judge(
    pred: prediction_mod.Prediction,
    c: Candidate,
    need: int,
    max_slowdown: float,
    allow_whole_gpu: bool,
    replicas: int,
    model: slowdown.SlowdownModel,
) -> Row:
    estimate = model(pred, c.device)
    factor = estimate.factor
    step = pred.step_time_s.point
    margin = c.usable_memory_bytes - need
    if margin < 0:
        verdict, note = Verdict.TOO_SMALL, f"{_gib(-margin)} short of the need"
    elif c.profile.is_whole_gpu and not allow_whole_gpu:
        verdict, note = Verdict.WHOLE_GPU_NOT_ALLOWED, "whole GPUs not allowed (allowWholeGPU)"
    elif not estimate.within(max_slowdown):
        verdict = Verdict.TOO_SLOW
        note = f"≈{factor:.2f}x the whole-GPU step time, over the limit of {max_slowdown:g}x"
    elif c.allocatable is not None and c.allocatable < replicas:
        verdict = Verdict.TOO_FEW
        note = f"{c.allocatable} in the cluster, the job needs {replicas} at once"
    else:
        verdict, note = Verdict.FITS, f"holds the need with {_gib(margin)} to spare"
    return Row(
        candidate=c,
        margin_bytes=margin,
        slowdown=estimate,
        step_time_s=None if factor is None else step * factor,
        cost=c.profile.share_held * step * (factor or 1.0),
        verdict=verdict,
        rank=None,
        chosen=False,
        note=note,
    )


def _cost_key(row: Row) -> tuple[float, int, float, str, str]:
    c = row.candidate
    return (row.cost, c.usable_memory_bytes, c.compute_share, c.product_label, c.resource)


def _size_key(row: Row) -> tuple[int, float, str, str]:
    c = row.candidate
    return (c.usable_memory_bytes, c.compute_share, c.product_label, c.resource)


class RowStatus(TypedDict):
    """One entry of `status.plan.rows` (and of `kubeseer plan --json`)."""

    gpuProduct: str
    productLabel: str
    profile: str
    resource: str
    usableMemoryMiB: int
    fits: bool
    marginMiB: int
    slowdown: float | None
    slowdownEvidence: str
    stepTimeSeconds: float | None
    shareHeld: float
    cost: float
    rank: int | None
    free: int | None
    chosen: bool
    note: str


def status_rows(plan: Plan) -> list[RowStatus]:
    """The plan's rows as JSON-ready dicts (camelCase, MiB), in the plan's order."""
    mib = catalogue.MIB
    return [
        {
            "gpuProduct": r.candidate.gpu.key,
            "productLabel": r.candidate.product_label,
            "profile": r.candidate.profile.name or "whole",
            "resource": r.candidate.resource,
            "usableMemoryMiB": r.candidate.usable_memory_bytes // mib,
            "fits": r.fits,
            "marginMiB": math.floor(r.margin_bytes / mib),
            "slowdown": None if r.slowdown.factor is None else round(r.slowdown.factor, 3),
            "slowdownEvidence": r.slowdown.evidence.value,
            "stepTimeSeconds": r.step_time_s,
            "shareHeld": round(r.candidate.profile.share_held, 4),
            "cost": r.cost,
            "rank": r.rank,
            "free": r.candidate.free,
            "chosen": r.chosen,
            "note": r.note,
        }
        for r in plan.rows
    ]


class PlanStatus(TypedDict):
    """`status.plan`: what the job needs and every candidate, fitting rows first by rank."""

    needMiB: int
    needBasis: str
    maxSlowdown: float
    replicas: int
    rungs: int
    rows: list[RowStatus]


def to_status(plan: Plan) -> PlanStatus:
    """The plan as `status.plan` stores it (and `kubeseer plan --json` prints it)."""
    return {
        "needMiB": math.ceil(plan.need_bytes / catalogue.MIB),
        "needBasis": plan.need_basis,
        "maxSlowdown": plan.max_slowdown,
        "replicas": plan.replicas,
        "rungs": len(plan.ladder),
        "rows": status_rows(plan),
    }


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / catalogue.GIB:.2f} GiB"

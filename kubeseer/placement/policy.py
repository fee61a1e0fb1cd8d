"""Turn a `Prediction` and the GPU inventory into a `Placement` and its `Plan`, or say why none.

Three policies (docs/placement.md has the reasoning and worked examples):

* ``auto`` (default): the cheapest rung of the plan's ladder that is free: every device whose
  usable memory holds the calibrated upper bound and whose slowdown, where there is evidence of
  one, stays within ``max_slowdown``, ordered by the GPU time a step holds
  (`kubeseer.placement.plan`). Without evidence of a slowdown that is the smallest slice that
  holds the memory. When no rung is free the job waits for the rung with the shortest queue.
* ``fixed``: the profile the user named, validated against the catalogue and the cluster.
* ``dippm``: DIPPM's memory-threshold rule (Panner Selvam & Brorsson, Euro-Par 2023 workshops,
  eq. 2) on the point prediction, kept for comparison with the paper.

After an out-of-memory failure, `escalate` re-plans for clearly more memory than failed
(`ESCALATION_GROWTH`). Why a job cannot be placed is a `NoFit` with a `NoFitCause`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from kubeseer import prediction as prediction_mod
from kubeseer.placement import catalogue, inventory, plan, slowdown

__all__ = [
    "ESCALATION_GROWTH",
    "ESCALATION_MIN_GROWTH",
    "CoverageError",
    "Decision",
    "NoFit",
    "NoFitCause",
    "Placement",
    "PlacementError",
    "PolicyName",
    "Request",
    "RequestError",
    "choose",
    "decide",
    "dippm_profile",
    "escalate",
]

ESCALATION_GROWTH = 1.5
"""After an OOM on a device with X usable bytes, the next one holds at least this times X.

The failure says only "more than X" (a censored observation). Growing by a constant factor
bounds the attempts a job can need logarithmically (1.5 per attempt covers 2.25x the first
device in two escalations), where "the next larger profile" can add 1 %.
"""

ESCALATION_MIN_GROWTH = 1.1
"""When nothing in the cluster holds `ESCALATION_GROWTH` x X, a device with at least this
times X is still worth one try (an A100-80GB that failed can go to a 94 GB H100 NVL)."""


class PolicyName(StrEnum):
    """How a DLJob asks to be placed (`spec.placement.policy`)."""

    AUTO = "auto"
    FIXED = "fixed"
    DIPPM = "dippm"


class PlacementError(Exception):
    """Base of every error placement reports to the operator."""


class RequestError(PlacementError, ValueError):
    """A `spec.placement` that cannot be honoured as written (unknown profile, bad bound)."""


class CoverageError(PlacementError):
    """The prediction's upper bound was calibrated for less coverage than the DLJob asks for."""


class NoFitCause(StrEnum):
    """Why nothing can hold a job; each is a different DLJob reason."""

    NOTHING_FITS = "nothing fits"
    PRODUCT_ABSENT = "product absent"
    NO_MATCHING_NODE = "no matching node"
    TOO_MANY_REPLICAS = "too many replicas"


class NoFit(PlacementError):  # noqa: N818 - the issue's name for this outcome
    """Nothing in the cluster can hold the job under the request's constraints.

    `cause` says which constraint; `plan` (when one was made) shows every candidate and why
    it does not fit.
    """

    def __init__(
        self,
        message: str,
        *,
        cause: NoFitCause,
        needed_bytes: int,
        largest_free: str | None,
        plan: plan.Plan | None = None,
    ) -> None:
        super().__init__(message)
        self.cause = cause
        self.needed_bytes = needed_bytes
        self.largest_free = largest_free
        self.plan = plan


@dataclass(frozen=True)
class Request:
    """The DLJob's `spec.placement`, validated, with what else of the spec constrains devices.

    `gpu_products` empty means any product; entries are catalogue keys or product labels.
    `replicas` pods run at once, each on one device of the same kind; `node_selector` is the pod
    template's `nodeSelector` (pairs), which only some GPU nodes may match.
    """

    policy: PolicyName = PolicyName.AUTO
    profile: str | None = None
    coverage: float = 0.95
    max_slowdown: float = 2.0
    gpu_products: tuple[str, ...] = ()
    allow_whole_gpu: bool = True
    replicas: int = 1
    node_selector: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not 0 < self.coverage < 1:
            raise RequestError(f"coverage must be in (0, 1), got {self.coverage}")
        if not (math.isfinite(self.max_slowdown) and self.max_slowdown >= 1):
            raise RequestError(f"maxSlowdown must be a finite number >= 1, got {self.max_slowdown}")
        if self.replicas < 1:
            raise RequestError(f"replicas must be at least 1, got {self.replicas}")
        if self.policy is PolicyName.FIXED and not self.profile:
            raise RequestError("policy 'fixed' needs a profile (e.g. 2g.20gb, or 'gpu')")
        if (
            self.policy is PolicyName.FIXED
            and _is_whole(self.profile or "")
            and not (self.allow_whole_gpu)
        ):
            raise RequestError("policy 'fixed' with profile 'gpu' contradicts allowWholeGPU: false")
        if self.policy is not PolicyName.FIXED and self.profile:
            raise RequestError(f"a profile is only used with policy 'fixed', not {self.policy}")
        for product in self.gpu_products:
            catalogue.resolve_product(product)
        if self.profile and self.policy is PolicyName.FIXED and not _is_whole(self.profile):
            models = self.allowed_models()
            if not any(_has_profile(m, self.profile) for m in models):
                offered = sorted({p.name or "" for m in models for p in m.profiles})
                raise RequestError(
                    f"no allowed GPU offers MIG profile {self.profile!r}; "
                    f"profiles on the allowed GPUs: {', '.join(offered)}"
                )

    def allowed_models(self) -> tuple[catalogue.GpuModel, ...]:
        """Catalogue entries this request may be placed on."""
        if not self.gpu_products:
            return catalogue.MODELS
        chosen = {catalogue.resolve_product(p).key for p in self.gpu_products}
        return tuple(m for m in catalogue.MODELS if m.key in chosen)


@dataclass(frozen=True)
class Placement:
    """Where a job goes: the resource its pods request and why.

    `node_selector` pins the product (`nvidia.com/gpu.product`) so the scheduler cannot put a
    `mig-1g.10gb` request chosen for an H100 on an A100, whose slice of the same name holds less.
    `node_hint` is the node with the most free units now; the scheduler still decides.
    `predicted_slowdown` is None when there is no evidence of one (`slowdown_evidence`);
    `cost_rank` is the chosen rung's place on the plan's ladder (1 = cheapest), None when the
    policy chose a device off the ladder (`fixed`, `dippm`).
    """

    policy: PolicyName
    resource: str
    profile: str | None
    gpu_product: str
    product_label: str
    usable_memory_bytes: int
    compute_share: float
    predicted_slowdown: float | None
    node_hint: str | None
    reason: str
    slowdown_evidence: slowdown.Evidence = slowdown.Evidence.NONE
    cost_rank: int | None = None

    @property
    def node_selector(self) -> dict[str, str]:
        """Labels the pod must select to land on the product this placement was sized for."""
        return {inventory.PRODUCT_LABEL: self.product_label}


@dataclass(frozen=True)
class Decision:
    """A placement and the plan it was chosen from (the plan's chosen row is the placement)."""

    placement: Placement
    plan: plan.Plan


_DIPPM_SHAPES = frozenset({(1, 1), (2, 2), (3, 4), (7, 8)})
"""(compute, memory) slices of DIPPM's ladder: 1g.5gb, 2g.10gb, 3g.20gb, 7g.40gb on an A100-40GB."""


def dippm_profile(memory_bytes: float, model: catalogue.GpuModel) -> catalogue.Profile | None:
    """DIPPM's eq. 2: the first profile of the ladder whose nominal size exceeds the prediction.

    The paper defines it for the A100-40GB ladder 1g.5gb < 2g.10gb < 3g.20gb < 7g.40gb with
    strict inequalities on both sides, which leaves the exact thresholds (and 0) unassigned; we
    close each interval on the right (a prediction of exactly 5 GB gets 1g.5gb). On other GPUs the
    ladder is the profiles of the same slice shapes (1/1, 2/2, 3/4, 7/8 compute/memory slices).
    Note what the rule compares: the *nominal* size in the name, not usable memory.
    """
    if memory_bytes <= 0:
        return None
    ladder = [p for p in model.profiles if (p.compute_slices, p.memory_slices) in _DIPPM_SHAPES]
    for profile in sorted(ladder, key=lambda p: p.nominal_memory_bytes):
        if memory_bytes <= profile.nominal_memory_bytes:
            return profile
    return None


def choose(
    pred: prediction_mod.Prediction,
    inv: inventory.Inventory,
    request: Request,
    *,
    model: slowdown.SlowdownModel = slowdown.from_evidence,
) -> Placement:
    """Place one job: `decide` without the plan."""
    return decide(pred, inv, request, model=model).placement


def decide(
    pred: prediction_mod.Prediction,
    inv: inventory.Inventory,
    request: Request,
    *,
    model: slowdown.SlowdownModel = slowdown.from_evidence,
) -> Decision:
    """Plan every candidate in the cluster and choose one by the request's policy.

    A fitting device that is busy is still a placement (the pods wait in the scheduler's queue,
    its reason says so); `NoFit` means nothing in the cluster could ever hold the job as asked.

    Raises:
        CoverageError: the prediction was calibrated for less coverage than requested.
        NoFit: with the cause and the plan.
    """
    if pred.coverage + 1e-9 < request.coverage:
        raise CoverageError(
            f"the prediction's upper bound covers {pred.coverage:.0%} of cases but the DLJob asks "
            f"for {request.coverage:.0%}; predict again at that coverage"
        )
    candidates = _candidates(inv, request)
    full = _plan(pred, candidates, request, model)
    if request.policy is PolicyName.FIXED:
        return _choose_fixed(pred, inv, request, full)
    if request.policy is PolicyName.DIPPM:
        return _choose_dippm(pred, inv, request, full)
    return _choose_from_ladder(full, inv, request, _auto_reason(pred, full, request))


def escalate(
    current: Placement,
    inv: inventory.Inventory,
    request: Request,
    pred: prediction_mod.Prediction,
    *,
    model: slowdown.SlowdownModel = slowdown.from_evidence,
) -> Decision:
    """The next placement after an out-of-memory failure on `current`.

    The failure says the job needs more than `current`'s usable memory X (a censored
    observation). The next device must hold at least max(upper bound, `ESCALATION_GROWTH` x X),
    or, when the cluster has nothing that large, max(upper bound, `ESCALATION_MIN_GROWTH` x X);
    among those the plan's cost order decides, as for a first placement.
    """
    failed = current.usable_memory_bytes
    candidates = _candidates(inv, request)
    for growth in (ESCALATION_GROWTH, ESCALATION_MIN_GROWTH):
        need = max(pred.memory_bytes.upper, growth * failed)
        basis = (
            f"{growth:g}x the {_gib(failed)} of {current.resource} on {current.gpu_product} "
            "that ran out of memory"
            if need > pred.memory_bytes.upper
            else f"upper bound at {pred.coverage:.0%} coverage"
        )
        grown = _plan(pred, candidates, request, model, need_bytes=need, need_basis=basis)
        if grown.ladder:
            why = (
                f"escalated after running out of memory on {current.resource} "
                f"({_gib(failed)} usable): the next attempt needs at least {_gib(need)} ({basis})"
            )
            return _choose_from_ladder(grown, inv, request, why)
    raise NoFit(
        f"no larger GPU: nothing in the cluster holds clearly more than the {_gib(failed)} of "
        f"{current.resource} on {current.gpu_product} that ran out of memory (at least "
        f"{ESCALATION_MIN_GROWTH:g}x, {_gib(ESCALATION_MIN_GROWTH * failed)}); "
        f"{_largest_phrase(inv, request)}",
        cause=NoFitCause.NOTHING_FITS,
        needed_bytes=math.ceil(ESCALATION_MIN_GROWTH * failed),
        largest_free=_largest_free(inv, request),
        plan=grown,
    )


def _candidates(inv: inventory.Inventory, request: Request) -> tuple[plan.Candidate, ...]:
    return plan.from_inventory(inv, request.allowed_models(), request.node_selector)


def _plan(
    pred: prediction_mod.Prediction,
    candidates: Sequence[plan.Candidate],
    request: Request,
    model: slowdown.SlowdownModel,
    *,
    need_bytes: float | None = None,
    need_basis: str | None = None,
) -> plan.Plan:
    return plan.build(
        pred,
        candidates,
        max_slowdown=request.max_slowdown,
        allow_whole_gpu=request.allow_whole_gpu,
        replicas=request.replicas,
        need_bytes=need_bytes,
        need_basis=need_basis,
        model=model,
    )


def _choose_from_ladder(
    full: plan.Plan, inv: inventory.Inventory, request: Request, why: str
) -> Decision:
    """The cheapest free rung; if none is free, the rung whose queue is shortest."""
    ladder = full.ladder
    if not ladder:
        raise _no_fit(full, inv, request)
    free = [r for r in ladder if (r.candidate.free or 0) >= request.replicas]
    if free:
        row = free[0]
        note = f"chosen: the cheapest free rung (rank {row.rank} of {len(ladder)})"
        reason = f"{why}; {_describe(row, len(ladder))}"
    else:
        row = min(ladder, key=lambda r: (_queue_load(r, request.replicas), r.rank))
        c = row.candidate
        note = f"chosen: nothing on the ladder is free; shortest queue (rank {row.rank})"
        reason = (
            f"{why}; {_describe(row, len(ladder))}; none is free now, the pod waits for one "
            f"(the fitting kind with the shortest queue: {c.pending} pending for "
            f"{c.allocatable} in the cluster)"
        )
    return _decision(full, row, note, request, reason)


def _queue_load(row: plan.Row, replicas: int) -> float:
    c = row.candidate
    return (c.pending + replicas) / max(1, c.allocatable or 0)


def _describe(row: plan.Row, rungs: int) -> str:
    c = row.candidate
    kind = "whole GPU" if c.profile.is_whole_gpu else f"MIG {c.profile.name}"
    s = row.slowdown
    speed = (
        f"≈{s.factor:.2f}x the whole-GPU step time ({s.evidence.value}: {s.basis})"
        if s.factor is not None
        else f"{s.basis}, so memory decides"
    )
    return (
        f"{kind} on {c.gpu.key} ({_gib(c.usable_memory_bytes)} usable, "
        f"{c.profile.share_held:.2f} of the GPU held) is rung {row.rank} of {rungs} by cost; "
        f"{speed}"
    )


def _auto_reason(pred: prediction_mod.Prediction, full: plan.Plan, request: Request) -> str:
    return (
        f"the cheapest device that holds the predicted {_gib(full.need_bytes)} "
        f"({full.need_basis}) within maxSlowdown {request.max_slowdown:g}"
    )


def _decision(full: plan.Plan, row: plan.Row, note: str, request: Request, reason: str) -> Decision:
    c = row.candidate
    return Decision(
        placement=Placement(
            policy=request.policy,
            resource=c.resource,
            profile=c.profile.name,
            gpu_product=c.gpu.key,
            product_label=c.product_label,
            usable_memory_bytes=c.usable_memory_bytes,
            compute_share=c.compute_share,
            predicted_slowdown=row.slowdown.factor,
            node_hint=c.best_node,
            reason=reason,
            slowdown_evidence=row.slowdown.evidence,
            cost_rank=row.rank,
        ),
        plan=full.with_choice(row, note),
    )


def _no_fit(full: plan.Plan, inv: inventory.Inventory, request: Request) -> NoFit:
    """Why the ladder is empty, most specific cause first."""
    need = full.need_bytes
    largest = _largest_free(inv, request)
    if not full.rows:
        in_cluster = {o.model_key for o in inv.offers}
        allowed = {m.key for m in request.allowed_models()}
        if in_cluster & allowed:
            selector = ", ".join(f"{k}={v}" for k, v in request.node_selector)
            gpu_nodes = sorted(inv.node_labels)
            return NoFit(
                f"the pod template's nodeSelector ({selector}) matches no node with an allowed "
                f"GPU; nodes with GPUs: {', '.join(gpu_nodes)}",
                cause=NoFitCause.NO_MATCHING_NODE,
                needed_bytes=need,
                largest_free=largest,
                plan=full,
            )
        have = ", ".join(sorted(in_cluster)) or "none kubeseer knows"
        wanted = ", ".join(request.gpu_products) or "GPU"
        return NoFit(
            f"the cluster has no {wanted} at all (GPUs in the cluster: {have})"
            f"{_skipped_phrase(inv)}",
            cause=NoFitCause.PRODUCT_ABSENT if request.gpu_products else NoFitCause.NOTHING_FITS,
            needed_bytes=need,
            largest_free=largest,
            plan=full,
        )
    too_few = [r for r in full.rows if r.verdict is plan.Verdict.TOO_FEW]
    if too_few:
        most = max(too_few, key=lambda r: (r.candidate.allocatable or 0, -r.cost))
        c = most.candidate
        return NoFit(
            f"replicas: {request.replicas} need {request.replicas} devices of one kind at once, "
            f"and no kind that holds the job has that many: the most is {c.allocatable} x "
            f"{c.resource} on {c.gpu.key}; the job cannot run as a whole (lower replicas, or "
            "add GPUs)",
            cause=NoFitCause.TOO_MANY_REPLICAS,
            needed_bytes=need,
            largest_free=largest,
            plan=full,
        )
    return NoFit(
        f"{_constraint(full, request)}: nothing in the cluster fits"
        f"{'' if request.allow_whole_gpu else ' (whole GPUs not allowed)'}; "
        f"{_largest_phrase(inv, request)}",
        cause=NoFitCause.NOTHING_FITS,
        needed_bytes=need,
        largest_free=largest,
        plan=full,
    )


def _constraint(full: plan.Plan, request: Request) -> str:
    text = f"predicted need {_gib(full.need_bytes)} ({full.need_basis})"
    slow = [r for r in full.rows if r.verdict is plan.Verdict.TOO_SLOW]
    if slow:
        text += (
            f" within maxSlowdown {request.max_slowdown:g} "
            f"({len(slow)} kinds hold the memory but would be slower)"
        )
    return text


def _choose_fixed(
    pred: prediction_mod.Prediction,
    inv: inventory.Inventory,
    request: Request,
    full: plan.Plan,
) -> Decision:
    wanted = request.profile or ""
    if _is_whole(wanted):
        matching = [r for r in full.rows if r.candidate.profile.is_whole_gpu]
    else:
        bare = wanted.removeprefix(catalogue.MIG_RESOURCE_PREFIX)
        matching = [r for r in full.rows if r.candidate.profile.name == bare]
    if not matching:
        raise NoFit(
            f"fixed profile {wanted!r} is not offered by any allowed node in the cluster; "
            f"{_largest_phrase(inv, request)}",
            cause=NoFitCause.NOTHING_FITS,
            needed_bytes=full.need_bytes,
            largest_free=_largest_free(inv, request),
            plan=full,
        )
    enough = [r for r in matching if (r.candidate.allocatable or 0) >= request.replicas]
    if not enough:
        most = max(r.candidate.allocatable or 0 for r in matching)
        raise NoFit(
            f"replicas: {request.replicas} need {request.replicas} x fixed profile {wanted!r} at "
            f"once; the cluster has at most {most} of it on one GPU product",
            cause=NoFitCause.TOO_MANY_REPLICAS,
            needed_bytes=full.need_bytes,
            largest_free=_largest_free(inv, request),
            plan=full,
        )
    free = [r for r in enough if (r.candidate.free or 0) >= request.replicas]
    row = min(free or enough, key=lambda r: _size(r.candidate))
    c = row.candidate
    notes = [f"profile {c.profile.label} fixed by the DLJob"]
    if not free:
        notes.append("none free now, the pod will wait for one")
    if c.usable_memory_bytes < pred.memory_bytes.upper:
        notes.append(
            f"warning: predicted upper bound {_gib(pred.memory_bytes.upper)} exceeds its "
            f"{_gib(c.usable_memory_bytes)} usable memory, an out-of-memory failure is likely"
        )
    return _decision(full, row, "chosen: fixed by the DLJob", request, "; ".join(notes))


def _choose_dippm(
    pred: prediction_mod.Prediction,
    inv: inventory.Inventory,
    request: Request,
    full: plan.Plan,
) -> Decision:
    point = pred.memory_bytes.point
    rule_picks = []
    for r in full.rows:
        c = r.candidate
        if c.profile.is_whole_gpu or (c.allocatable or 0) < request.replicas:
            continue
        picked = dippm_profile(point, c.gpu)
        if picked is not None and picked.name == c.profile.name:
            rule_picks.append(r)
    free = [r for r in rule_picks if (r.candidate.free or 0) >= request.replicas]
    if free:
        row = min(free, key=lambda r: _size(r.candidate))
        c = row.candidate
        return _decision(
            full,
            row,
            "chosen: DIPPM's rule",
            request,
            f"DIPPM rule: point prediction {_gib(point)} is at most the nominal "
            f"{_gib(c.profile.nominal_memory_bytes)} of {c.profile.label} on {c.gpu.key} "
            "(the rule ignores usable memory, the upper bound and compute)",
        )
    mapped = "profiles none of which is free" if rule_picks else "no profile (above the ladder)"
    raise NoFit(
        f"DIPPM rule: point prediction {_gib(point)} maps to {mapped}; "
        f"{_largest_phrase(inv, request)}",
        cause=NoFitCause.NOTHING_FITS,
        needed_bytes=math.ceil(point),
        largest_free=_largest_free(inv, request),
        plan=full,
    )


def _size(c: plan.Candidate) -> tuple[bool, int, float, str, str]:
    """Smallest first: MIG before whole GPUs, then memory, then compute, then names."""
    return (
        c.profile.is_whole_gpu,
        c.usable_memory_bytes,
        c.compute_share,
        c.resource,
        c.product_label,
    )


def _largest_free(inv: inventory.Inventory, request: Request) -> str | None:
    free = [c for c in _candidates(inv, request) if (c.free or 0) > 0]
    if not free:
        return None
    best = max(free, key=lambda c: (c.usable_memory_bytes, c.compute_share, c.resource))
    return f"{best.resource} on {best.gpu.key} ({_gib(best.usable_memory_bytes)} usable)"


def _largest_phrase(inv: inventory.Inventory, request: Request) -> str:
    largest = _largest_free(inv, request)
    scope = "" if not request.gpu_products else f" among {', '.join(request.gpu_products)}"
    text = f"largest free{scope}: {largest}" if largest else f"no GPU is free{scope}"
    return text + _skipped_phrase(inv)


def _skipped_phrase(inv: inventory.Inventory) -> str:
    if not inv.skipped:
        return ""
    return "; skipped nodes: " + "; ".join(f"{s.node} ({s.reason})" for s in inv.skipped)


def _is_whole(name: str) -> bool:
    return name.lower() in {"gpu", "whole", catalogue.GPU_RESOURCE}


def _has_profile(model: catalogue.GpuModel, name: str) -> bool:
    bare = name.removeprefix(catalogue.MIG_RESOURCE_PREFIX)
    return any(p.name == bare for p in model.profiles)


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / catalogue.GIB:.2f} GiB"

"""Turn a `Prediction` and the free GPU inventory into a `Placement`, or say why none fits.

Three policies (docs/placement.md has the reasoning and worked examples):

* ``auto`` (default): the smallest free MIG profile whose usable memory holds the calibrated upper
  bound of the memory prediction and whose compute share keeps the predicted slowdown within
  ``max_slowdown``; else the smallest free whole GPU that holds it, if allowed; else `NoFit`.
* ``fixed``: the profile the user named, validated against the catalogue and the cluster.
* ``dippm``: DIPPM's memory-threshold rule (Panner Selvam & Brorsson, Euro-Par 2023 workshops,
  eq. 2) on the point prediction, kept for comparison with the paper.

Slowdown model. A job that keeps ``u`` percent of a whole GPU's SMs busy needs about ``u/100`` of
the SMs; a slice with compute share ``s`` (its SMs over the GPU's SMs) runs it about
``max(1, (u/100) / s)`` times slower. Keeping that within ``max_slowdown`` means
``s >= (u/100) / max_slowdown``. It is a first-order model: it ignores the bandwidth and L2 a
slice also loses, and assumes SM utilisation measured on the prediction's label GPU carries over
to the placed GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from kubeseer import prediction as prediction_mod
from kubeseer.placement import catalogue, inventory

__all__ = [
    "CoverageError",
    "NoFit",
    "Placement",
    "PlacementError",
    "PolicyName",
    "Request",
    "RequestError",
    "choose",
    "dippm_profile",
    "escalate",
    "required_compute_share",
    "slowdown",
]


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


class NoFit(PlacementError):  # noqa: N818 - the issue's name for this outcome
    """Nothing free in the cluster can hold the job under the request's constraints.

    `transient` is True when some GPU that is busy now would fit: the operator should retry
    later rather than fail the DLJob.
    """

    def __init__(
        self,
        message: str,
        *,
        needed_bytes: int,
        largest_free: str | None,
        transient: bool,
    ) -> None:
        super().__init__(message)
        self.needed_bytes = needed_bytes
        self.largest_free = largest_free
        self.transient = transient


@dataclass(frozen=True)
class Request:
    """The DLJob's `spec.placement`, validated.

    `gpu_products` empty means any product; entries are catalogue keys or product labels.
    """

    policy: PolicyName = PolicyName.AUTO
    profile: str | None = None
    coverage: float = 0.95
    max_slowdown: float = 2.0
    gpu_products: tuple[str, ...] = ()
    allow_whole_gpu: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.coverage < 1:
            raise RequestError(f"coverage must be in (0, 1), got {self.coverage}")
        if not (math.isfinite(self.max_slowdown) and self.max_slowdown >= 1):
            raise RequestError(f"maxSlowdown must be a finite number >= 1, got {self.max_slowdown}")
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
    """Where a job goes: the resource its pod requests and why.

    `node_selector` pins the product (`nvidia.com/gpu.product`) so the scheduler cannot put a
    `mig-1g.10gb` request chosen for an H100 on an A100, whose slice of the same name holds less.
    `node_hint` is the node with the most free units now; the scheduler still decides.
    """

    policy: PolicyName
    resource: str
    profile: str | None
    gpu_product: str
    product_label: str
    usable_memory_bytes: int
    compute_share: float
    predicted_slowdown: float
    node_hint: str | None
    reason: str

    @property
    def node_selector(self) -> dict[str, str]:
        """Labels the pod must select to land on the product this placement was sized for."""
        return {inventory.PRODUCT_LABEL: self.product_label}


def slowdown(compute_share: float, sm_util_percent: float) -> float:
    """Predicted step-time factor on a slice relative to the whole GPU (see module docstring)."""
    if compute_share <= 0:
        raise ValueError(f"compute share must be positive, got {compute_share}")
    demand = min(max(sm_util_percent, 0.0), 100.0) / 100.0
    return max(1.0, demand / compute_share)


def required_compute_share(sm_util_percent: float, max_slowdown: float) -> float:
    """The smallest compute share whose predicted slowdown stays within `max_slowdown`."""
    return min(max(sm_util_percent, 0.0), 100.0) / 100.0 / max_slowdown


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
) -> Placement:
    """Place one job; raises `NoFit` when nothing suitable is free.

    Raises `CoverageError` when the prediction was calibrated for less coverage than requested.
    """
    if pred.coverage + 1e-9 < request.coverage:
        raise CoverageError(
            f"the prediction's upper bound covers {pred.coverage:.0%} of cases but the DLJob asks "
            f"for {request.coverage:.0%}; predict again at that coverage"
        )
    candidates = _candidates(inv, request)
    if request.policy is PolicyName.FIXED:
        return _choose_fixed(pred, inv, request, candidates)
    if request.policy is PolicyName.DIPPM:
        return _choose_dippm(pred, inv, request, candidates)
    return _choose_auto(pred, inv, request, candidates)


def escalate(
    current: Placement,
    inv: inventory.Inventory,
    request: Request,
) -> Placement:
    """The next larger placement after an out-of-memory failure on `current`.

    Next larger means: strictly more usable memory and no less compute share (so the job does
    not get slower in exchange), smallest first among MIG profiles, then whole GPUs if allowed.
    """
    candidates = [
        c
        for c in _candidates(inv, request)
        if c.free > 0
        and c.usable_memory_bytes > current.usable_memory_bytes
        and c.compute_share >= current.compute_share
        and (request.allow_whole_gpu or not c.profile.is_whole_gpu)
    ]
    if not candidates:
        raise NoFit(
            f"no larger GPU than {current.resource} ({_gib(current.usable_memory_bytes)} usable) "
            f"is free to retry on; {_largest_phrase(inv, request)}",
            needed_bytes=current.usable_memory_bytes + 1,
            largest_free=_largest_free(inv, request),
            transient=_any_busy_larger(inv, request, current.usable_memory_bytes),
        )
    best = min(candidates, key=_size_key)
    return _placement(
        best,
        request,
        # The SM demand behind the current slowdown, d = slowdown x share, on the new share.
        slowdown_factor=max(
            1.0, current.predicted_slowdown * current.compute_share / best.compute_share
        ),
        reason=(
            f"escalated after running out of memory on {current.resource} "
            f"({_gib(current.usable_memory_bytes)} usable): {best.resource} on {best.model_key} "
            f"({best.profile.label}) is the next larger free option "
            f"({_gib(best.usable_memory_bytes)} usable)"
        ),
    )


@dataclass(frozen=True)
class _Candidate:
    """One (product label, resource) kind with free units, as the policies compare them."""

    product_label: str
    model_key: str
    resource: str
    profile: catalogue.Profile
    usable_memory_bytes: int
    compute_share: float
    free: int
    allocatable: int
    best_node: str | None


def _candidates(inv: inventory.Inventory, request: Request) -> list[_Candidate]:
    """Group offers by (product label, resource) on allowed products, with free units now."""
    allowed = {m.key for m in request.allowed_models()}
    groups: dict[tuple[str, str], list[inventory.Offer]] = {}
    for offer in inv.offers:
        if offer.model_key in allowed:
            groups.setdefault((offer.product_label, offer.resource), []).append(offer)
    result = []
    for (label, resource), offers in sorted(groups.items()):
        free = inv.free_units(label, resource)
        roomiest = min(offers, key=lambda o: (-o.free, o.node))
        result.append(
            _Candidate(
                product_label=label,
                model_key=offers[0].model_key,
                resource=resource,
                profile=offers[0].profile,
                # Nodes of one product may publish different labels; plan for the tightest.
                usable_memory_bytes=min(o.usable_memory_bytes for o in offers),
                compute_share=min(o.compute_share for o in offers),
                free=free,
                allocatable=sum(o.allocatable for o in offers),
                best_node=roomiest.node if free > 0 and roomiest.free > 0 else None,
            )
        )
    return result


def _size_key(c: _Candidate) -> tuple[bool, int, float, str, str]:
    """Smallest first: MIG before whole GPUs, then memory, then compute, then names."""
    return (
        c.profile.is_whole_gpu,
        c.usable_memory_bytes,
        c.compute_share,
        c.resource,
        c.product_label,
    )


def _choose_auto(
    pred: prediction_mod.Prediction,
    inv: inventory.Inventory,
    request: Request,
    candidates: list[_Candidate],
) -> Placement:
    need = pred.memory_bytes.upper
    util = pred.sm_util_percent.point
    min_share = required_compute_share(util, request.max_slowdown)

    def fits(c: _Candidate) -> bool:
        if c.usable_memory_bytes < need:
            return False
        if c.profile.is_whole_gpu:
            return request.allow_whole_gpu
        return slowdown(c.compute_share, util) <= request.max_slowdown

    free_fits = [c for c in candidates if c.free > 0 and fits(c)]
    if free_fits:
        best = min(free_fits, key=_size_key)
        factor = slowdown(best.compute_share, util)
        kind = "whole GPU" if best.profile.is_whole_gpu else "smallest free MIG profile"
        why_not_mig = (
            "; no free MIG profile holds it within the slowdown limit"
            if best.profile.is_whole_gpu
            else ""
        )
        return _placement(
            best,
            request,
            slowdown_factor=factor,
            reason=(
                f"{kind} that holds the predicted upper bound {_gib(need)} "
                f"({pred.coverage:.0%} coverage) with {_gib(best.usable_memory_bytes)} usable, "
                f"and at {util:.0f}% SM utilisation runs ≈{factor:.2f}x the whole-GPU step time "
                f"(limit {request.max_slowdown:g}x, needs compute share ≥ {min_share:.2f}, "
                f"has {best.compute_share:.2f}){why_not_mig}"
            ),
        )
    busy_fits = [c for c in candidates if c.free == 0 and c.allocatable > 0 and fits(c)]
    constraint = (
        f"predicted need {_gib(need)} (upper bound at {pred.coverage:.0%} coverage) and compute "
        f"share ≥ {min_share:.2f} ({util:.0f}% SM utilisation, "
        f"maxSlowdown {request.max_slowdown:g})"
    )
    if busy_fits:
        first = min(busy_fits, key=_size_key)
        raise NoFit(
            f"{constraint}: {first.resource} on {first.model_key} would fit but none is free now; "
            f"{_largest_phrase(inv, request)}",
            needed_bytes=math.ceil(need),
            largest_free=_largest_free(inv, request),
            transient=True,
        )
    raise NoFit(
        f"{constraint}: nothing in the cluster fits"
        f"{'' if request.allow_whole_gpu else ' (whole GPUs not allowed)'}; "
        f"{_largest_phrase(inv, request)}",
        needed_bytes=math.ceil(need),
        largest_free=_largest_free(inv, request),
        transient=False,
    )


def _choose_fixed(
    pred: prediction_mod.Prediction,
    inv: inventory.Inventory,
    request: Request,
    candidates: list[_Candidate],
) -> Placement:
    wanted = request.profile or ""
    if _is_whole(wanted):
        matching = [c for c in candidates if c.profile.is_whole_gpu]
    else:
        bare = wanted.removeprefix(catalogue.MIG_RESOURCE_PREFIX)
        matching = [c for c in candidates if c.profile.name == bare]
    if not matching:
        raise NoFit(
            f"fixed profile {wanted!r} is not offered by any allowed node in the cluster; "
            f"{_largest_phrase(inv, request)}",
            needed_bytes=math.ceil(pred.memory_bytes.upper),
            largest_free=_largest_free(inv, request),
            transient=False,
        )
    free = [c for c in matching if c.free > 0]
    best = min(free or matching, key=_size_key)
    util = pred.sm_util_percent.point
    notes = [f"profile {best.profile.label} fixed by the DLJob"]
    if not free:
        notes.append("none free now, the pod will wait for one")
    if best.usable_memory_bytes < pred.memory_bytes.upper:
        notes.append(
            f"warning: predicted upper bound {_gib(pred.memory_bytes.upper)} exceeds its "
            f"{_gib(best.usable_memory_bytes)} usable memory, an out-of-memory failure is likely"
        )
    return _placement(
        best, request, slowdown_factor=slowdown(best.compute_share, util), reason="; ".join(notes)
    )


def _choose_dippm(
    pred: prediction_mod.Prediction,
    inv: inventory.Inventory,
    request: Request,
    candidates: list[_Candidate],
) -> Placement:
    point = pred.memory_bytes.point
    rule_picks = []
    for c in candidates:
        if c.profile.is_whole_gpu:
            continue
        picked = dippm_profile(point, catalogue.model_by_key(c.model_key))
        if picked is not None and picked.name == c.profile.name:
            rule_picks.append(c)
    free = [c for c in rule_picks if c.free > 0]
    if free:
        best = min(free, key=_size_key)
        util = pred.sm_util_percent.point
        return _placement(
            best,
            request,
            slowdown_factor=slowdown(best.compute_share, util),
            reason=(
                f"DIPPM rule: point prediction {_gib(point)} is at most the nominal "
                f"{_gib(best.profile.nominal_memory_bytes)} of {best.profile.label} on "
                f"{best.model_key} (the rule ignores usable memory, the upper bound and compute)"
            ),
        )
    mapped = "profiles none of which is free" if rule_picks else "no profile (above the ladder)"
    raise NoFit(
        f"DIPPM rule: point prediction {_gib(point)} maps to {mapped}; "
        f"{_largest_phrase(inv, request)}",
        needed_bytes=math.ceil(point),
        largest_free=_largest_free(inv, request),
        transient=bool(rule_picks),
    )


def _placement(
    c: _Candidate,
    request: Request,
    *,
    slowdown_factor: float,
    reason: str,
) -> Placement:
    return Placement(
        policy=request.policy,
        resource=c.resource,
        profile=c.profile.name,
        gpu_product=c.model_key,
        product_label=c.product_label,
        usable_memory_bytes=c.usable_memory_bytes,
        compute_share=c.compute_share,
        predicted_slowdown=slowdown_factor,
        node_hint=c.best_node,
        reason=reason,
    )


def _largest_free(inv: inventory.Inventory, request: Request) -> str | None:
    free = [c for c in _candidates(inv, request) if c.free > 0]
    if not free:
        return None
    best = max(free, key=lambda c: (c.usable_memory_bytes, c.compute_share, c.resource))
    return f"{best.resource} on {best.model_key} ({_gib(best.usable_memory_bytes)} usable)"


def _largest_phrase(inv: inventory.Inventory, request: Request) -> str:
    largest = _largest_free(inv, request)
    scope = "" if not request.gpu_products else f" among {', '.join(request.gpu_products)}"
    text = f"largest free{scope}: {largest}" if largest else f"no GPU is free{scope}"
    if inv.skipped:
        text += "; skipped nodes: " + "; ".join(f"{s.node} ({s.reason})" for s in inv.skipped)
    return text


def _any_busy_larger(inv: inventory.Inventory, request: Request, than_bytes: int) -> bool:
    return any(
        c.allocatable > 0 and c.usable_memory_bytes > than_bytes
        for c in _candidates(inv, request)
        if request.allow_whole_gpu or not c.profile.is_whole_gpu
    )


def _is_whole(name: str) -> bool:
    return name.lower() in {"gpu", "whole", catalogue.GPU_RESOURCE}


def _has_profile(model: catalogue.GpuModel, name: str) -> bool:
    bare = name.removeprefix(catalogue.MIG_RESOURCE_PREFIX)
    return any(p.name == bare for p in model.profiles)


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / catalogue.GIB:.2f} GiB"

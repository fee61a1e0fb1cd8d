"""What the scheduler allocated to an attempt's claim, as the DLJob's status records it.

Under DRA the operator plans a ladder and the scheduler picks the device. Once a claim of the
attempt is allocated, the status says which device it got (`status.allocation`: node, device,
rung, whether it was the first choice), `status.placement` becomes that device (its usable
memory is what an out-of-memory escalation grows from), and the plan's row of the rung taken is
marked chosen. Pure: the reconcile reads the DLJob, these build the patch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kubeseer import units
from kubeseer.operator.dra import inventory as dra_inventory
from kubeseer.placement import catalogue, claims, policy, slowdown

_RANK = re.compile(r"^r(\d+)-")


@dataclass(frozen=True)
class ClaimAllocation:
    """One allocated claim of an attempt."""

    claim: str
    found: claims.Allocation

    @property
    def rank(self) -> int | None:
        """The rung's place on the plan's ladder."""
        return rank_of(self.found.rung)

    @property
    def device(self) -> str:
        """`<node>/<device>`: the pool of NVIDIA's driver is the node."""
        return f"{self.found.pool}/{self.found.device}"


def rank_of(rung: str) -> int | None:
    """A rung's place on the plan's ladder, from its name (`claims.rung_name`: `r<rank>-...`)."""
    match = _RANK.match(rung)
    return int(match.group(1)) if match else None


def read(claim: Mapping[str, Any]) -> ClaimAllocation | None:
    """The claim's allocation, None while it has none.

    Raises:
        ValueError: the claim is not of the shape kubeseer's templates give.
    """
    found = claims.read_allocation(claim)
    if found is None:
        return None
    return ClaimAllocation(str((claim.get("metadata") or {}).get("name", "")), found)


def recorded_claims(status: Mapping[str, Any], attempt: int) -> tuple[str, ...]:
    """The claims of this attempt whose allocation the status already records."""
    raw = status.get("allocation")
    if not isinstance(raw, Mapping) or raw.get("attempt") != attempt:
        return ()
    return tuple(str(c.get("claim")) for c in raw.get("claims") or () if isinstance(c, Mapping))


def status_fields(
    status: Mapping[str, Any], attempt: int, allocated: ClaimAllocation
) -> dict[str, Any]:
    """`status.allocation` with this claim added; the first claim of an attempt names the
    attempt's device (a Job with replicas has one claim per pod)."""
    raw = status.get("allocation")
    earlier: Sequence[Mapping[str, Any]] = ()
    if isinstance(raw, Mapping) and raw.get("attempt") == attempt:
        earlier = [c for c in raw.get("claims") or () if isinstance(c, Mapping)]
    entry = {
        "claim": allocated.claim,
        "node": allocated.found.pool,
        "device": allocated.found.device,
        "rung": allocated.found.rung,
        "firstChoice": allocated.found.first_choice,
    }
    every = [*earlier, entry]
    first = every[0]
    return {
        "attempt": attempt,
        "device": f"{first['node']}/{first['device']}",
        "driver": allocated.found.driver,
        "rung": first["rung"],
        "rank": rank_of(str(first["rung"])),
        "firstChoice": first["firstChoice"],
        "claims": every,
    }


def placement(
    planned: policy.Placement,
    allocated: ClaimAllocation,
    device: dra_inventory.Device | None,
    plan_status: Mapping[str, Any] | None,
) -> policy.Placement:
    """The placement of the device the scheduler allocated.

    The device itself says what it is (product, profile, usable memory, SMs) where the driver's
    slice is known; otherwise the plan's row of the rung taken does. The slowdown is the plan's
    for that rung.
    """
    row = _row(plan_status, allocated.rank)
    gpu_product, profile = planned.gpu_product, planned.profile
    product_label, memory = planned.product_label, planned.usable_memory_bytes
    share = planned.compute_share
    predicted, evidence = planned.predicted_slowdown, planned.slowdown_evidence
    if row is not None:
        gpu_product, product_label = str(row["gpuProduct"]), str(row["productLabel"])
        profile = None if row["profile"] == "whole" else str(row["profile"])
        memory = int(row["usableMemoryMiB"]) * units.MIB
        model = catalogue.model_by_key(gpu_product)
        share = (model.whole if profile is None else model.profile(profile)).compute_share
        predicted = None if row.get("slowdown") is None else float(row["slowdown"])
        evidence = slowdown.Evidence(row.get("slowdownEvidence", slowdown.Evidence.NONE.value))
    if device is not None:
        gpu_product, product_label = device.model.key, device.product_label
        profile, memory, share = device.profile.name, device.memory_bytes, device.compute_share
    rungs = (plan_status or {}).get("rungs")
    of = f" of {rungs}" if rungs else ""
    choice = (
        "the first choice" if allocated.found.first_choice else "no cheaper rung had a free device"
    )
    return replace(
        planned,
        resource=catalogue.GPU_RESOURCE
        if profile is None
        else catalogue.MIG_RESOURCE_PREFIX + profile,
        profile=profile,
        gpu_product=gpu_product,
        product_label=product_label,
        usable_memory_bytes=memory,
        compute_share=share,
        predicted_slowdown=predicted,
        slowdown_evidence=evidence,
        node_hint=allocated.found.pool,
        cost_rank=allocated.rank,
        reason=(
            f"allocated by the scheduler: {allocated.found.device} on {allocated.found.pool}, "
            f"rung {allocated.rank}{of} ({choice}); planned: {planned.reason}"
        ),
    )


def plan_marked(
    plan_status: Mapping[str, Any] | None, rank: int | None, note: str
) -> dict[str, Any] | None:
    """`status.plan` with the row of the rung taken marked chosen (and no other)."""
    if not isinstance(plan_status, Mapping) or rank is None:
        return None
    rows = []
    for row in plan_status.get("rows") or ():
        if row.get("rank") == rank:
            rows.append({**row, "chosen": True, "note": note})
        elif row.get("chosen"):
            rows.append(
                {**row, "chosen": False, "note": f"planned; the scheduler took rung {rank}"}
            )
        else:
            rows.append(dict(row))
    return {**plan_status, "rows": rows}


def _row(plan_status: Mapping[str, Any] | None, rank: int | None) -> Mapping[str, Any] | None:
    if not isinstance(plan_status, Mapping) or rank is None:
        return None
    for row in plan_status.get("rows") or ():
        if isinstance(row, Mapping) and row.get("rank") == rank:
            return row
    return None

"""The ResourceClaimTemplate of one attempt: the plan's ladder as a `firstAvailable` request.

Under the `auto` policy the claim asks for every rung of the plan's ladder, cheapest first
(`kubeseer.placement.claims.build_claim_template`: CEL on the product, usable memory and SMs,
never profile names), and the scheduler allocates the first rung with a free device. Under
`fixed` and `dippm` the policy already chose one kind of device, so the claim has that one rung.
After an out-of-memory failure the plan is the escalated one (`policy.escalate`: the need grows
to 1.5x the memory that failed), so the rungs that failed and every smaller one are off it.

The template is owned by the attempt's Job (it goes when the Job goes), and every claim made
from it carries the DLJob's labels and full name, so that the claim's allocation finds its way
back to the DLJob's status (`allocation`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, cast

from kubeseer import units
from kubeseer.operator import dljob, workload
from kubeseer.placement import claims, plan, policy
from kubeseer.placement import inventory as placement_inventory
from kubeseer.prediction import Prediction


def for_claim(decided: plan.Plan, placement: policy.Placement) -> plan.Plan:
    """The plan whose ladder the claim asks for: the whole ladder under `auto`, else the one
    device the policy chose (its need capped at that device's memory: `fixed` may knowingly
    choose a device short of the bound)."""
    chosen = decided.chosen
    if placement.policy is policy.PolicyName.AUTO or chosen is None:
        return decided
    rung = replace(chosen, verdict=plan.Verdict.FITS, rank=chosen.rank or 1)
    need = min(decided.need_bytes, chosen.candidate.usable_memory_bytes)
    return replace(decided, need_bytes=need, rows=(rung,))


def recorded(
    prediction: Prediction,
    inv: placement_inventory.Inventory,
    request: policy.Request,
    placement: policy.Placement,
    plan_status: Mapping[str, Any] | None,
) -> plan.Plan:
    """The plan again from the need `status.plan` recorded, for an operator that restarted
    between placing an attempt and creating its claim template (the ladder depends on the kinds
    of device in the cluster and the need, not on which are free)."""
    recorded_need = (plan_status or {}).get("needMiB")
    rebuilt = plan.build(
        prediction,
        plan.from_inventory(inv, request.allowed_models(), request.node_selector),
        max_slowdown=request.max_slowdown,
        allow_whole_gpu=request.allow_whole_gpu,
        replicas=request.replicas,
        need_bytes=None if recorded_need is None else int(recorded_need) * units.MIB,
        need_basis=(plan_status or {}).get("needBasis"),
    )
    same = [
        r
        for r in rebuilt.rows
        if r.candidate.gpu.key == placement.gpu_product
        and r.candidate.profile.name == placement.profile
    ]
    if same:
        rebuilt = rebuilt.with_choice(same[0], "chosen: as recorded before the restart")
    return for_claim(rebuilt, placement)


def build_template(
    ladder: plan.Plan, ref: dljob.DLJobRef, attempt: int, job: Mapping[str, Any]
) -> dict[str, Any]:
    """The attempt's ResourceClaimTemplate, owned by its Job (as stored, with its uid).

    Raises:
        ValueError: the plan has no rung (nothing could ever be allocated).
    """
    labels = {
        workload.LABEL_DLJOB: workload.label_value(ref.name),
        workload.LABEL_ATTEMPT: str(attempt),
    }
    made = claims.build_claim_template(
        ladder, workload.workload_name(ref.name, attempt), ref.namespace, labels=labels
    )
    template = cast(dict[str, Any], copy.deepcopy(made))
    metadata = job.get("metadata") or {}
    template["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": str(metadata.get("name")),
            "uid": str(metadata.get("uid")),
            "controller": True,
        }
    ]
    template["spec"]["metadata"] = {
        "labels": dict(labels),
        "annotations": {workload.ANNOTATION_DLJOB_NAME: ref.name},
    }
    return template

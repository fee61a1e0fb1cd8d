"""Pure builders of DLJob status content, and the readers that turn it back into values.

The status is the operator's memory across restarts: a prediction or placement written here is
read back instead of being recomputed, which is what makes every reconcile step safe to repeat.
`read` turns a stored status into one typed `DLJobStatus`; each reconcile step answers with one
`Patch`, and `Patch.body` is the merge patch that writes it against the status it was made for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NotRequired, TypedDict, cast

from kubeseer import units
from kubeseer.operator import dljob, workload
from kubeseer.placement import policy, slowdown
from kubeseer.prediction import Estimate, Mode, Precision, Prediction, StepWork


class Condition(TypedDict):
    """One entry of `status.conditions`, in the Kubernetes condition shape."""

    type: str
    status: str
    reason: str
    message: str
    lastTransitionTime: str


class Observation(TypedDict):
    """What a failed attempt taught about the job's memory: a censored label.

    An OOM-killed job needed more than the profile's usable memory, by an unknown amount, so the
    label is a lower bound (`censored: true`), which the profiler's dataset records keep as such.
    """

    memoryBytesAtLeast: int
    censored: bool
    source: str


class AttemptRecord(TypedDict):
    """One entry of `status.attempts`: a placement and how it ended."""

    attempt: int
    workload: str
    resource: str
    profile: str
    outcome: str
    message: NotRequired[str]
    observation: NotRequired[Observation]


def timestamp(now: datetime) -> str:
    """RFC 3339 in UTC with a `Z`, as the API server writes times."""
    if now.tzinfo is None:
        raise ValueError("a status timestamp needs a timezone-aware datetime")
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_condition(
    kind: dljob.ConditionType, ok: bool, reason: dljob.Reason, message: str, now: datetime
) -> Condition:
    """A True/False condition stamped with `now`."""
    return {
        "type": kind.value,
        "status": "True" if ok else "False",
        "reason": reason.value,
        "message": message,
        "lastTransitionTime": timestamp(now),
    }


def merge_conditions(
    existing: Sequence[Mapping[str, Any]], new: Condition
) -> list[Mapping[str, Any]]:
    """Replace the condition of the same type; keep its transition time if status is unchanged."""
    merged: list[Mapping[str, Any]] = []
    replaced = False
    for old in existing:
        if old.get("type") != new["type"]:
            merged.append(old)
            continue
        replaced = True
        if old.get("status") == new["status"]:
            merged.append({**new, "lastTransitionTime": old.get("lastTransitionTime", "")})
        else:
            merged.append(new)
    if not replaced:
        merged.append(new)
    return merged


def build_prediction_status(prediction: Prediction) -> dict[str, Any]:
    """`status.prediction`: memory in MiB (with a `point/upper` string for the printer column)."""
    point = round(prediction.memory_bytes.point / units.MIB)
    upper = round(prediction.memory_bytes.upper / units.MIB)
    return {
        "memoryMiB": f"{point}/{upper}",
        "memoryPointBytes": round(prediction.memory_bytes.point),
        "memoryUpperBytes": round(prediction.memory_bytes.upper),
        "smUtilPercent": round(prediction.sm_util_percent.point, 2),
        "smUtilUpperPercent": round(prediction.sm_util_percent.upper, 2),
        "stepTimeSeconds": prediction.step_time_s.point,
        "stepTimeUpperSeconds": prediction.step_time_s.upper,
        "coverage": prediction.coverage,
        "mode": prediction.mode.value,
        "batchSize": prediction.batch_size,
        "precision": prediction.precision.value,
        "modelDigest": prediction.model_digest,
        "predictorVersion": prediction.predictor_version,
        "labelDevice": prediction.label_device,
        "warnings": list(prediction.warnings),
        "unlearned": list(prediction.unlearned),
        "launchLimits": list(prediction.launch_limits),
        **(
            {}
            if prediction.work is None
            else {
                "stepWork": {
                    "flops": prediction.work.flops,
                    "bytesMoved": prediction.work.bytes_moved,
                    "kernels": prediction.work.kernels,
                }
            }
        ),
    }


def read_prediction(status: Mapping[str, Any]) -> Prediction | None:
    """The prediction stored in `status.prediction`, or None if absent or unreadable.

    Byte counts are stored as integers, so a prediction read back equals the one written up to
    sub-byte rounding; SM utilisation is rounded to 0.01 %.
    """
    raw = status.get("prediction")
    if not isinstance(raw, Mapping):
        return None
    try:
        return Prediction(
            mode=Mode(raw["mode"]),
            batch_size=int(raw["batchSize"]),
            precision=Precision(raw["precision"]),
            memory_bytes=Estimate(float(raw["memoryPointBytes"]), float(raw["memoryUpperBytes"])),
            sm_util_percent=Estimate(float(raw["smUtilPercent"]), float(raw["smUtilUpperPercent"])),
            step_time_s=Estimate(float(raw["stepTimeSeconds"]), float(raw["stepTimeUpperSeconds"])),
            coverage=float(raw["coverage"]),
            model_digest=str(raw["modelDigest"]),
            predictor_version=str(raw["predictorVersion"]),
            label_device=str(raw["labelDevice"]),
            warnings=tuple(str(w) for w in raw.get("warnings", ())),
            unlearned=tuple(str(q) for q in raw.get("unlearned", ())),
            launch_limits=tuple(str(q) for q in raw.get("launchLimits", ())),
            work=_read_work(raw.get("stepWork")),
        )
    except (KeyError, TypeError, ValueError):
        return None


def _read_work(raw: Any) -> StepWork | None:
    """`status.prediction.stepWork` (what the slowdown model derives from), absent before it."""
    if not isinstance(raw, Mapping):
        return None
    return StepWork(
        flops=float(raw["flops"]),
        bytes_moved=float(raw["bytesMoved"]),
        kernels=float(raw["kernels"]),
    )


def build_placement_status(placement: policy.Placement, attempt: int) -> dict[str, Any]:
    """`status.placement`: every field of the placement (read back for OOM escalation)."""
    return {
        "resource": placement.resource,
        "profile": workload.profile_label(placement),
        "migProfile": placement.profile,
        "gpuProduct": placement.gpu_product,
        "productLabel": placement.product_label,
        "policy": placement.policy.value,
        "usableMemoryMiB": placement.usable_memory_bytes // units.MIB,
        "usableMemoryBytes": placement.usable_memory_bytes,
        "computeShare": placement.compute_share,
        "predictedSlowdown": placement.predicted_slowdown,
        "slowdownEvidence": placement.slowdown_evidence.value,
        "costRank": placement.cost_rank,
        "nodeHint": placement.node_hint,
        "reason": placement.reason,
        "attempt": attempt,
    }


def read_placement(status: Mapping[str, Any]) -> tuple[policy.Placement, int] | None:
    """The placement and attempt stored in `status.placement`, or None if absent or unreadable."""
    raw = status.get("placement")
    if not isinstance(raw, Mapping):
        return None
    try:
        placement = policy.Placement(
            policy=policy.PolicyName(raw["policy"]),
            resource=str(raw["resource"]),
            profile=str(raw["migProfile"]) if raw.get("migProfile") else None,
            gpu_product=str(raw["gpuProduct"]),
            product_label=str(raw["productLabel"]),
            usable_memory_bytes=int(raw["usableMemoryBytes"]),
            compute_share=float(raw["computeShare"]),
            predicted_slowdown=(
                # A merge patch drops a null, so "no slowdown figure" is stored as no field.
                None if raw.get("predictedSlowdown") is None else float(raw["predictedSlowdown"])
            ),
            node_hint=str(raw["nodeHint"]) if raw.get("nodeHint") else None,
            reason=str(raw["reason"]),
            slowdown_evidence=slowdown.Evidence(
                raw.get("slowdownEvidence", slowdown.Evidence.NONE.value)
            ),
            cost_rank=int(raw["costRank"]) if raw.get("costRank") is not None else None,
        )
        return placement, int(raw["attempt"])
    except (KeyError, TypeError, ValueError):
        return None


def read_phase(status: Mapping[str, Any]) -> dljob.Phase | None:
    """`status.phase`, or None for a DLJob the operator has not touched yet."""
    raw = status.get("phase")
    try:
        return dljob.Phase(raw) if raw else None
    except ValueError:
        return None


def read_attempts(status: Mapping[str, Any]) -> list[AttemptRecord]:
    """`status.attempts` as written by `build_attempt`."""
    raw = status.get("attempts")
    if not isinstance(raw, list):
        return []
    return [cast(AttemptRecord, a) for a in raw if isinstance(a, dict)]


def build_attempt(
    placement: policy.Placement, attempt: int, workload_name: str, outcome: str, message: str = ""
) -> AttemptRecord:
    """An attempt entry; an OOM outcome carries its censored memory observation."""
    entry: AttemptRecord = {
        "attempt": attempt,
        "workload": workload_name,
        "resource": placement.resource,
        "profile": workload.profile_label(placement),
        "outcome": outcome,
    }
    if message:
        entry["message"] = message
    if outcome == OUTCOME_OOM:
        entry["observation"] = {
            "memoryBytesAtLeast": placement.usable_memory_bytes,
            "censored": True,
            "source": "oom",
        }
    return entry


OUTCOME_OOM = "OOMKilled"
OUTCOME_FAILED = "Failed"
OUTCOME_SUCCEEDED = "Succeeded"
OUTCOME_DELETED = "Deleted"


@dataclass(frozen=True)
class PlacedAttempt:
    """The placement of the current attempt (0 first, +1 per OOM escalation or lost workload)."""

    placement: policy.Placement
    attempt: int


@dataclass(frozen=True)
class DLJobStatus:
    """A DLJob's status as values, read once per reconcile or pod event.

    Attributes:
        phase: None for a DLJob the operator has not touched yet.
        prediction: the stored prediction, None until predicted (or if unreadable).
        placed: the current attempt's placement, None until placed (or if unreadable).
        attempts: finished attempts, oldest first.
        conditions: as stored (a patch replaces the whole list, so it starts from these).
        plan: `status.plan` as stored (what the current attempt needed, every candidate).
        allocation: `status.allocation` as stored (the devices DRA allocated to the attempt).
        reason: `status.reason`: why the DLJob failed or what it waits for (None while all
            goes well).
        message: `status.message`, the reason in words.
    """

    phase: dljob.Phase | None = None
    prediction: Prediction | None = None
    placed: PlacedAttempt | None = None
    attempts: tuple[AttemptRecord, ...] = ()
    conditions: tuple[Mapping[str, Any], ...] = ()
    plan: Mapping[str, Any] | None = None
    allocation: Mapping[str, Any] | None = None
    reason: str | None = None
    message: str | None = None


def read(raw: Mapping[str, Any]) -> DLJobStatus:
    """The typed status of a stored `status` mapping (empty for a new DLJob)."""
    placed = read_placement(raw)
    conditions = raw.get("conditions")
    plan, allocation = raw.get("plan"), raw.get("allocation")
    return DLJobStatus(
        phase=read_phase(raw),
        prediction=read_prediction(raw),
        placed=PlacedAttempt(*placed) if placed is not None else None,
        attempts=tuple(read_attempts(raw)),
        conditions=tuple(c for c in conditions if isinstance(c, Mapping))
        if isinstance(conditions, list)
        else (),
        plan=plan if isinstance(plan, Mapping) else None,
        allocation=allocation if isinstance(allocation, Mapping) else None,
        reason=str(raw["reason"]) if raw.get("reason") else None,
        message=str(raw["message"]) if raw.get("message") else None,
    )


@dataclass(frozen=True)
class Patch:
    """One step's change to the status: fields to merge, conditions to set.

    A field set to None is removed (merge-patch semantics). Steps that succeed in one reconcile
    are joined with `then` and written together.
    """

    fields: Mapping[str, Any] = field(default_factory=dict)
    conditions: tuple[Condition, ...] = ()

    def then(self, later: Patch) -> Patch:
        """Both changes; `later` wins where they set the same field or condition type."""
        return Patch({**self.fields, **later.fields}, self.conditions + later.conditions)

    def body(self, current: DLJobStatus) -> dict[str, Any]:
        """The merge patch against `current`: conditions are a list, which a merge patch
        replaces whole, so the new ones are merged into the stored ones here."""
        out = dict(self.fields)
        if self.conditions:
            merged: list[Mapping[str, Any]] = list(current.conditions)
            for c in self.conditions:
                merged = merge_conditions(merged, c)
            out["conditions"] = merged
        return out


def progress(phase: dljob.Phase, **fields: Any) -> Patch:
    """A step forward: the new phase, and no failure reason left over from a retry."""
    return Patch({**fields, "phase": phase.value, "reason": None, "message": None})


def setback(
    phase: dljob.Phase,
    condition_type: dljob.ConditionType,
    reason: dljob.Reason,
    message: str,
    now: datetime,
    **fields: Any,
) -> Patch:
    """A failed step: the phase it leaves the DLJob in, its reason (the printer column) and
    message, and its condition False."""
    return Patch(
        {**fields, "phase": phase.value, "reason": reason.value, "message": message},
        (build_condition(condition_type, False, reason, message, now),),
    )

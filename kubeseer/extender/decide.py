"""The extender's two decisions, as pure functions of a pod's demand and its candidate nodes.

Filter (`judge`): a node fails when it cannot run the pod without an out-of-memory failure or
against the DLJob's wishes: its GPU product is not allowed, one unit of the requested resource
holds less usable memory than the predicted upper bound, or too few units are free. Messages
name no node, because kube-scheduler counts identical messages ("3 kubeseer: ...") in the
FailedScheduling event that `kubectl describe pod` shows.

Prioritize (`scores`): best fit that keeps big slices whole. Candidates are ranked by

1. *stranded memory*: usable memory of the units the pod would take, less what it is predicted
   to use. The smallest device that holds the job wins, leaving larger slices and whole GPUs
   for the jobs that need them;
2. *compute slices taken*: between devices of equal memory (3g.40gb and 4g.40gb, 1g.20gb and
   2g.20gb) the one with fewer SMs, so the larger compute slice stays whole;
3. *free GPU memory left on the node*: the fullest node that fits (best fit in the bin-packing
   sense), so that nodes with many free units keep them together for multi-unit and whole-GPU
   jobs, and idle nodes stay idle (a MIG layout can only change on an idle GPU);
4. the node name, so that the answer is the same on every call.

HAMi's fragmentation-aware MIG scoring (HAMi#2831) ranks placements of a dynamic slice the same
way; here the slices are fixed by the device plugin, so the choice is among nodes, and the
predicted memory replaces a user's declared figure.

Scores are what kube-scheduler can use: integers 0..10, multiplied by the extender's weight.
The best node alone gets 10, so that it wins whenever the weight outweighs the default score
plugins; the others get 9 down to 1 by cost group (equal costs, equal scores).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from kubeseer import units
from kubeseer.extender import nodes, pods, wire
from kubeseer.operator import workload

__all__ = [
    "Candidate",
    "Cost",
    "Decider",
    "Reason",
    "Rejection",
    "Situation",
    "Verdict",
    "cost",
    "judge",
    "scores",
    "situation",
]


class Reason(StrEnum):
    """Why a node fails the filter; the `reason` label of the rejection metric."""

    NO_FREE_CAPACITY = "no_free_capacity"
    PRODUCT_NOT_ALLOWED = "product_not_allowed"
    MEMORY_BELOW_PREDICTION = "memory_below_prediction"
    NO_GPU_INFO = "no_gpu_info"
    NOT_IN_CACHE = "not_in_cache"
    MALFORMED_ANNOTATION = "malformed_annotation"


@dataclass(frozen=True)
class Rejection:
    """One reason a node fails. `unresolvable`: evicting pods would not help (the scheduler then
    skips preemption on that node)."""

    reason: Reason
    message: str
    unresolvable: bool


@dataclass(frozen=True, eq=False)
class Situation:
    """Everything a decision reads of a node: its devices by resource, why they cannot be
    judged (`nodes.NodeGpus.problem`), and the units pods hold of each resource.

    Nodes in the same situation (the same kind of node with the same units held) share one
    object, interned by the cache and compared by identity, so that a call decides once per
    situation: a thousand nodes are a few dozen situations.
    """

    devices: Mapping[str, nodes.Device]
    problem: str | None
    used: Mapping[str, int]

    def free(self, resource: str) -> int:
        """Units of `resource` not held by any pod on the node."""
        device = self.devices.get(resource)
        if device is None:
            return 0
        return max(0, device.allocatable - self.used.get(resource, 0))


class Candidate(NamedTuple):
    """A node by name and its situation (the cache hands out plain `(name, situation)` pairs,
    which every method here takes as well)."""

    name: str
    situation: Situation


@dataclass(frozen=True, eq=False)
class Verdict:
    """Why a node fails the filter: its rejections, joined into the one message
    kube-scheduler shows, and whether preemption could help (it cannot if any rejection is
    unresolvable)."""

    rejections: tuple[Rejection, ...]
    message: str
    unresolvable: bool


Cost = tuple[int, int, int]
"""(stranded bytes, compute slices taken, free bytes left on the node): lower is better."""


class Decider:
    """Filter and prioritize for one pod over many nodes.

    Everything is worked out once per distinct `nodes.Device` (product allowed, memory
    enough, stranded bytes) and once per `Situation` (the verdict, the cost), and reused for
    every node in the same situation: a call at a thousand nodes costs a dictionary look-up per
    node.
    """

    def __init__(self, demand: pods.Demand) -> None:
        self.demand = demand
        self._requests = tuple(demand.requests.items())
        self._device_verdicts: dict[nodes.Device, tuple[Rejection, ...]] = {}
        self._verdicts: dict[Situation, Verdict | None] = {}
        self._costs: dict[Situation, Cost | None] = {}

    def verdict(self, situation: Situation) -> Verdict | None:
        """Why a node in `situation` cannot take the pod; None when it can."""
        try:
            return self._verdicts[situation]
        except KeyError:
            found = self.rejections(situation)
            verdict = (
                Verdict(
                    tuple(found),
                    "; ".join(r.message for r in found),
                    any(r.unresolvable for r in found),
                )
                if found
                else None
            )
            self._verdicts[situation] = verdict
            return verdict

    def rejections(self, situation: Situation) -> list[Rejection]:
        """Every reason a node in `situation` cannot take the pod; empty when it can."""
        found: list[Rejection] = []
        devices = situation.devices
        for resource, count in self._requests:
            device = devices.get(resource)
            if device is None:
                why = situation.problem or f"no {resource} is known on this node"
                found.append(
                    Rejection(Reason.NO_GPU_INFO, f"kubeseer: cannot judge {resource}: {why}", True)
                )
                continue
            found.extend(self._device_verdict(device))
            free = device.allocatable - situation.used.get(resource, 0)
            if free < count:
                found.append(
                    Rejection(
                        Reason.NO_FREE_CAPACITY,
                        f"kubeseer: {max(0, free)} of {device.allocatable} {resource} free, "
                        f"the pod needs {count}",
                        False,
                    )
                )
        return found

    def cost(self, situation: Situation) -> Cost:
        """How much placing the pod on a node in `situation` wastes; only for one that passes."""
        devices = situation.devices
        need = self.demand.predicted_memory_bytes or 0
        stranded = compute = 0
        for resource, count in self._requests:
            device = devices[resource]
            stranded += count * max(0, device.memory_bytes - need)
            compute += count * device.compute_slices
        left = 0
        used = situation.used
        requests = self.demand.requests
        for resource, device in devices.items():
            free = device.allocatable - used.get(resource, 0) - requests.get(resource, 0)
            left += max(0, free) * device.memory_bytes
        return stranded, compute, left

    def scores(self, candidates: Sequence[tuple[str, Situation]]) -> list[tuple[str, int]]:
        """A score per candidate, in the order given: the best 10, failing ones 0."""
        costs = self._costs
        for _, situation in candidates:
            if situation not in costs:
                costs[situation] = None if self.verdict(situation) else self.cost(situation)
        groups = sorted({c for c in costs.values() if c is not None})
        if not groups:
            return [(name, wire.MIN_EXTENDER_PRIORITY) for name, _ in candidates]
        lowest = groups[0]
        best = min(name for name, situation in candidates if costs[situation] == lowest)
        top = wire.MAX_EXTENDER_PRIORITY - 1
        by_cost = {
            value: top - math.floor(top * rank / len(groups)) for rank, value in enumerate(groups)
        }
        by_situation = {
            situation: wire.MIN_EXTENDER_PRIORITY if cost is None else by_cost[cost]
            for situation, cost in costs.items()
        }
        return [
            (name, wire.MAX_EXTENDER_PRIORITY if name == best else by_situation[situation])
            for name, situation in candidates
        ]

    def _device_verdict(self, device: nodes.Device) -> tuple[Rejection, ...]:
        """What rules `device` out whatever its node holds (memoised per device)."""
        verdict = self._device_verdicts.get(device)
        if verdict is None:
            verdict = self._device_verdicts[device] = self._judge_device(device)
        return verdict

    def _judge_device(self, device: nodes.Device) -> tuple[Rejection, ...]:
        found = []
        allowed = self.demand.allowed_models
        if allowed is not None and device.model_key not in allowed:
            found.append(
                Rejection(
                    Reason.PRODUCT_NOT_ALLOWED,
                    f"kubeseer: GPU product {device.model_key} is not among the allowed products "
                    f"({', '.join(allowed)})",
                    True,
                )
            )
        need = self.demand.predicted_memory_bytes
        if need is not None and device.memory_bytes < need:
            found.append(
                Rejection(
                    Reason.MEMORY_BELOW_PREDICTION,
                    f"kubeseer: one {device.resource} ({device.profile or 'whole GPU'} on "
                    f"{device.model_key}) holds {_gib(device.memory_bytes)} "
                    f"({device.memory_source}), less than the predicted peak {_gib(need)} "
                    f"({workload.ANNOTATION_PREDICTED_MEMORY})",
                    True,
                )
            )
        return tuple(found)


def situation(gpus: nodes.NodeGpus, used: Mapping[str, int]) -> Situation:
    """A node's situation, not interned (the cache interns its own)."""
    return Situation(gpus.devices, gpus.problem, used)


def judge(demand: pods.Demand, candidate: Candidate) -> list[Rejection]:
    """Every reason `candidate` cannot take the pod; empty when it can."""
    return Decider(demand).rejections(candidate.situation)


def cost(demand: pods.Demand, candidate: Candidate) -> Cost:
    """How much placing the pod on `candidate` wastes; only for a candidate `judge` passes."""
    return Decider(demand).cost(candidate.situation)


def scores(demand: pods.Demand, candidates: Sequence[Candidate]) -> list[tuple[str, int]]:
    """A score per candidate, in the order given: the best 10, failing ones 0 (see module)."""
    return Decider(demand).scores(candidates)


def _gib(size: float) -> str:
    return f"{size / units.GIB:.2f} GiB"

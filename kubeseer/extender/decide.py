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

__all__ = ["Candidate", "Decider", "Reason", "Rejection", "cost", "judge", "scores"]


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


class Candidate(NamedTuple):
    """A node's GPUs and the units of each resource held by pods on it (a tuple: the cache
    builds one per node per call)."""

    gpus: nodes.NodeGpus
    used: Mapping[str, int]

    @property
    def name(self) -> str:
        """The node's name."""
        return self.gpus.name

    def free(self, resource: str) -> int:
        """Units of `resource` not held by any pod on the node."""
        device = self.gpus.devices.get(resource)
        if device is None:
            return 0
        return max(0, device.allocatable - self.used.get(resource, 0))


Cost = tuple[int, int, int]
"""(stranded bytes, compute slices taken, free bytes left on the node): lower is better."""


class Decider:
    """Filter and prioritize for one pod over many nodes.

    What depends only on a device and the pod (product allowed, memory enough, stranded bytes)
    is worked out once per distinct `Device` and reused: a cluster has a few kinds of node and
    many of each, and a call at a thousand nodes must stay within milliseconds.
    """

    def __init__(self, demand: pods.Demand) -> None:
        self.demand = demand
        self._requests = tuple(demand.requests.items())
        self._verdicts: dict[nodes.Device, tuple[Rejection, ...]] = {}
        self._waste: dict[nodes.Device, tuple[int, int]] = {}

    def rejections(self, candidate: Candidate) -> list[Rejection]:
        """Every reason `candidate` cannot take the pod; empty when it can."""
        found: list[Rejection] = []
        devices = candidate.gpus.devices
        for resource, count in self._requests:
            device = devices.get(resource)
            if device is None:
                why = candidate.gpus.problem or f"no {resource} is known on this node"
                found.append(
                    Rejection(Reason.NO_GPU_INFO, f"kubeseer: cannot judge {resource}: {why}", True)
                )
                continue
            found.extend(self._verdict(device))
            free = device.allocatable - candidate.used.get(resource, 0)
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

    def cost(self, candidate: Candidate) -> Cost:
        """How much placing the pod on `candidate` wastes; only for one that passes."""
        devices = candidate.gpus.devices
        stranded = compute = 0
        for resource, count in self._requests:
            device = devices[resource]
            waste = self._waste.get(device)
            if waste is None:
                need = self.demand.predicted_memory_bytes or 0
                waste = self._waste[device] = (
                    max(0, device.memory_bytes - need),
                    device.compute_slices,
                )
            stranded += count * waste[0]
            compute += count * waste[1]
        left = 0
        used = candidate.used
        requests = self.demand.requests
        for resource, device in devices.items():
            free = device.allocatable - used.get(resource, 0) - requests.get(resource, 0)
            left += max(0, free) * device.memory_bytes
        return stranded, compute, left

    def fits(self, candidate: Candidate) -> bool:
        """Whether `rejections` would be empty (without building a message)."""
        devices = candidate.gpus.devices
        used = candidate.used
        for resource, count in self._requests:
            device = devices.get(resource)
            if device is None or self._verdict(device):
                return False
            if device.allocatable - used.get(resource, 0) < count:
                return False
        return True

    def scores(self, candidates: Sequence[Candidate]) -> list[tuple[str, int]]:
        """A score per candidate, in the order given: the best 10, failing ones 0."""
        costs = {c.gpus.name: self.cost(c) for c in candidates if self.fits(c)}
        if not costs:
            return [(c.gpus.name, wire.MIN_EXTENDER_PRIORITY) for c in candidates]
        groups = sorted(set(costs.values()))
        rank = {value: index for index, value in enumerate(groups)}
        best = min(costs, key=lambda name: (costs[name], name))
        top = wire.MAX_EXTENDER_PRIORITY - 1
        result: list[tuple[str, int]] = []
        for candidate in candidates:
            name = candidate.gpus.name
            value = costs.get(name)
            if value is None:
                score = wire.MIN_EXTENDER_PRIORITY
            elif name == best:
                score = wire.MAX_EXTENDER_PRIORITY
            else:
                score = top - math.floor(top * rank[value] / len(groups))
            result.append((name, score))
        return result

    def _verdict(self, device: nodes.Device) -> tuple[Rejection, ...]:
        """What rules `device` out whatever its node holds (memoised per device)."""
        verdict = self._verdicts.get(device)
        if verdict is None:
            verdict = self._verdicts[device] = self._device_verdict(device)
        return verdict

    def _device_verdict(self, device: nodes.Device) -> tuple[Rejection, ...]:
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


def judge(demand: pods.Demand, candidate: Candidate) -> list[Rejection]:
    """Every reason `candidate` cannot take the pod; empty when it can."""
    return Decider(demand).rejections(candidate)


def cost(demand: pods.Demand, candidate: Candidate) -> Cost:
    """How much placing the pod on `candidate` wastes; only for a candidate `judge` passes."""
    return Decider(demand).cost(candidate)


def scores(demand: pods.Demand, candidates: Sequence[Candidate]) -> list[tuple[str, int]]:
    """A score per candidate, in the order given: the best 10, failing ones 0 (see module)."""
    return Decider(demand).scores(candidates)


def _gib(size: float) -> str:
    return f"{size / units.GIB:.2f} GiB"

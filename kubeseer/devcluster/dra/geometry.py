"""MIG geometry: where on a GPU each instance shape may sit, as NVIDIA's hardware allows.

An A100 or H100 in MIG mode has 8 memory slices and 7 compute slices. A GPU instance takes a
contiguous run of memory slices that must *start* at one of a few offsets fixed per profile;
`nvidia-smi mig -lgipp` lists them, and they are the same on every A100, H100 and H200 (the MIG
user guide's placement tables, and `-lgipp` transcripts of each):

    Profile ID 19 (1g, 1 memory slice)    Placements: {0,1,2,3,4,5,6}:1
    Profile ID 15 (1g, 2 memory slices)   Placements: {0,2,4,6}:2
    Profile ID 14 (2g, 2 memory slices)   Placements: {0,2,4}:2
    Profile ID  9 (3g, 4 memory slices)   Placements: {0,4}:4
    Profile ID  5 (4g, 4 memory slices)   Placement : {0}:4
    Profile ID  0 (7g, 8 memory slices)   Placement : {0}:8

So memory slice 7 is reachable only by a 2-slice profile at 6 or a larger one, and two `3g`
instances must sit at 0 and 4. The profile ID (NVML's GPU-instance profile ID) is what the DRA
driver writes into MIG device names (`gpu-0-mig-1g10gb-19-3`). Media-extension profiles
(`+me`) are not modelled, as elsewhere in kubeseer.

Shapes are `(compute slices, memory slices)`; this module knows no product names, so the
inventory parser and the ResourceSlice builders can both use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "COMPUTE_SLICES",
    "MEMORY_SLICES",
    "Instance",
    "Placement",
    "pack",
    "profile_id",
    "starts",
]

COMPUTE_SLICES = 7
MEMORY_SLICES = 8

_PROFILE_IDS: dict[tuple[int, int], int] = {
    (1, 1): 19,
    (1, 2): 15,
    (2, 2): 14,
    (3, 4): 9,
    (4, 4): 5,
    (7, 8): 0,
}
_STARTS: dict[tuple[int, int], tuple[int, ...]] = {
    (1, 1): (0, 1, 2, 3, 4, 5, 6),
    (1, 2): (0, 2, 4, 6),
    (2, 2): (0, 2, 4),
    (3, 4): (0, 4),
    (4, 4): (0,),
    (7, 8): (0,),
}


@dataclass(frozen=True)
class Instance:
    """One MIG instance to place: its profile name and shape."""

    profile: str
    compute_slices: int
    memory_slices: int

    @property
    def shape(self) -> tuple[int, int]:
        """`(compute slices, memory slices)`."""
        return (self.compute_slices, self.memory_slices)


@dataclass(frozen=True)
class Placement:
    """An instance at a memory-slice offset: it holds slices `start` .. `start + size - 1`."""

    instance: Instance
    start: int

    @property
    def memory_slices(self) -> range:
        """The memory slices this placement holds."""
        return range(self.start, self.start + self.instance.memory_slices)


def profile_id(compute_slices: int, memory_slices: int) -> int:
    """NVML's GPU-instance profile ID of a shape; ValueError for a shape MIG does not have."""
    try:
        return _PROFILE_IDS[(compute_slices, memory_slices)]
    except KeyError:
        raise ValueError(
            f"no MIG profile has {compute_slices} compute and {memory_slices} memory slices"
        ) from None


def starts(compute_slices: int, memory_slices: int) -> tuple[int, ...]:
    """The memory-slice offsets an instance of this shape may start at."""
    profile_id(compute_slices, memory_slices)
    return _STARTS[(compute_slices, memory_slices)]


def pack(instances: Sequence[Instance]) -> tuple[Placement, ...] | None:
    """Offsets for every instance on one GPU, or None when the hardware cannot hold them all.

    What `nvidia-smi mig -cgi` would manage: no two instances share a memory slice, each starts
    where its profile may, and the compute slices add up to at most 7. Larger instances are
    placed first and each at its lowest free offset, backtracking where that blocks a later
    one, so the answer is the same every time. The result is in the order of `instances`.

    Every set of shapes within 7 compute and 8 memory slices has such offsets (the unit tests
    try them all), so a layout that passes the slice counts always packs.
    """
    if sum(i.compute_slices for i in instances) > COMPUTE_SLICES:
        return None
    for instance in instances:
        starts(instance.compute_slices, instance.memory_slices)
    order = sorted(range(len(instances)), key=lambda k: (-instances[k].memory_slices, k))
    chosen: dict[int, int] = {}

    def place(position: int, used: frozenset[int]) -> bool:
        if position == len(order):
            return True
        index = order[position]
        instance = instances[index]
        for start in starts(instance.compute_slices, instance.memory_slices):
            held = frozenset(range(start, start + instance.memory_slices))
            if held & used:
                continue
            chosen[index] = start
            if place(position + 1, used | held):
                return True
        chosen.pop(index, None)
        return False

    if not place(0, frozenset()):
        return None
    return tuple(Placement(instance, chosen[k]) for k, instance in enumerate(instances))

"""What the scheduler allocated, checked against what the slices offer.

`Ledger` reads ResourceSlices as the API returns them (any driver's, in the v1 shape) and
answers, for a set of allocated devices: how much of each counter set they consume, whether
that exceeds what the set has (it must never: the scheduler enforces it), which MIG memory
slices each holds (from the device name, independently of the counters), and how much memory
they hold. The end-to-end tests use it as the oracle for "two claims never overlap" and the
packing benchmark for held and stranded memory.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubeseer.devcluster.dra import geometry

__all__ = ["DeviceKey", "Ledger", "MigPlacement", "parse_mig_name", "quantity"]

DeviceKey = tuple[str, str]
"""`(pool, device name)`: a device is unique by name within its pool."""

_MIG_NAME = re.compile(r"^gpu-(\d+)-mig-(.+)-(\d+)-(\d+)$")
_PROFILE_SHAPES = {19: (1, 1), 15: (1, 2), 14: (2, 2), 9: (3, 4), 5: (4, 4), 0: (7, 8)}
_SUFFIXES = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_SUFFIXES |= {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
_QUANTITY = re.compile(r"^([0-9]+)(Ki|Mi|Gi|Ti|k|M|G|T|)$")


@dataclass(frozen=True)
class MigPlacement:
    """Where a MIG device sits, read from its driver name `gpu-<minor>-mig-<p>-<id>-<start>`."""

    gpu: int
    compute_slices: int
    memory_slices: range


def parse_mig_name(name: str) -> MigPlacement | None:
    """The placement a MIG device name encodes; None for a whole GPU (`gpu-0`)."""
    match = _MIG_NAME.match(name)
    if match is None:
        return None
    shape = _PROFILE_SHAPES.get(int(match.group(3)))
    if shape is None:
        raise ValueError(f"{name}: unknown MIG profile ID {match.group(3)}")
    start = int(match.group(4))
    if start not in geometry.starts(*shape):
        raise ValueError(f"{name}: a {shape[0]}g profile cannot start at memory slice {start}")
    return MigPlacement(int(match.group(1)), shape[0], range(start, start + shape[1]))


def quantity(text: str) -> int:
    """An integer Kubernetes quantity (`81152Mi`, `79Gi`, `16`) as a plain number."""
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise ValueError(f"not an integer quantity: {text!r}")
    return int(match.group(1)) * _SUFFIXES[match.group(2)]


@dataclass(frozen=True)
class _Device:
    capacity: Mapping[str, int]
    consumes: Mapping[tuple[str, str], Mapping[str, int]]
    """(pool, counter set) -> counter -> amount."""


class Ledger:
    """Every device and counter set of some ResourceSlices."""

    def __init__(self, slices: Iterable[Mapping[str, Any]]) -> None:
        self._devices: dict[DeviceKey, _Device] = {}
        self._counter_sets: dict[tuple[str, str], dict[str, int]] = {}
        for item in slices:
            spec = item["spec"]
            pool = spec["pool"]["name"]
            for counter_set in spec.get("sharedCounters") or ():
                self._counter_sets[(pool, counter_set["name"])] = {
                    name: quantity(c["value"]) for name, c in counter_set["counters"].items()
                }
            for device in spec.get("devices") or ():
                self._devices[(pool, device["name"])] = _Device(
                    capacity={
                        name: quantity(c["value"])
                        for name, c in (device.get("capacity") or {}).items()
                    },
                    consumes={
                        (pool, use["counterSet"]): {
                            name: quantity(c["value"]) for name, c in use["counters"].items()
                        }
                        for use in device.get("consumesCounters") or ()
                    },
                )

    @property
    def devices(self) -> tuple[DeviceKey, ...]:
        """Every device, by pool and name."""
        return tuple(self._devices)

    @property
    def counter_sets(self) -> Mapping[tuple[str, str], Mapping[str, int]]:
        """Every counter set's counters, by (pool, set name)."""
        return self._counter_sets

    def capacity(self, key: DeviceKey, name: str) -> int | None:
        """A device's capacity (`memory` in bytes, `multiprocessors` ...), None if it has none."""
        return self._devices[key].capacity.get(name)

    def usage(self, allocated: Iterable[DeviceKey]) -> dict[tuple[str, str], dict[str, int]]:
        """What the allocated devices consume, per counter set and counter."""
        used: dict[tuple[str, str], dict[str, int]] = {}
        for key in allocated:
            for counter_set, counters in self._devices[key].consumes.items():
                into = used.setdefault(counter_set, {})
                for name, amount in counters.items():
                    into[name] = into.get(name, 0) + amount
        return used

    def overcommitted(self, allocated: Iterable[DeviceKey]) -> list[str]:
        """Each counter the allocated devices take beyond its set's value (empty: none)."""
        problems = []
        for counter_set, counters in sorted(self.usage(allocated).items()):
            offered = self._counter_sets.get(counter_set, {})
            for name, amount in sorted(counters.items()):
                if amount > offered.get(name, 0):
                    problems.append(
                        f"{counter_set[0]}/{counter_set[1]} {name}: {amount} used, "
                        f"{offered.get(name, 0)} offered"
                    )
        return problems

    def overlapping(self, allocated: Iterable[DeviceKey]) -> list[str]:
        """Pairs of allocated MIG devices of one GPU sharing a memory slice, or a GPU given
        whole and partitioned at once (by device names and MIG geometry alone)."""
        held: dict[tuple[str, int], dict[int, str]] = {}
        whole: dict[tuple[str, int], str] = {}
        problems = []
        for pool, name in sorted(allocated):
            placement = parse_mig_name(name)
            if placement is None:
                gpu = (pool, int(name.removeprefix("gpu-")))
                whole[gpu] = name
                continue
            slots = held.setdefault((pool, placement.gpu), {})
            for memory_slice in placement.memory_slices:
                if memory_slice in slots:
                    problems.append(
                        f"{pool}: {slots[memory_slice]} and {name} share memory slice "
                        f"{memory_slice} of GPU {placement.gpu}"
                    )
                slots[memory_slice] = name
        for gpu, name in sorted(whole.items()):
            if gpu in held:
                problems.append(f"{gpu[0]}: {name} allocated whole and partitioned")
        return problems

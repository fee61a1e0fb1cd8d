"""What the extender knows about a node's GPUs: one `Device` per NVIDIA resource it offers.

A node object is read once, when the watch delivers it, never per scheduling request. The
arithmetic of what a resource stands for (a whole GPU, a mixed-strategy MIG profile, or under
the single strategy one slice of the profile named in `nvidia.com/gpu.product`) and how much
memory a process can use in it (GPU Feature Discovery's `nvidia.com/gpu.memory` and
`nvidia.com/mig-<profile>.memory` labels, tightened by the catalogue's usable figures) is
`kubeseer.placement.inventory`'s, so the extender judges a node exactly as the operator sized
the job.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubeseer import units
from kubeseer.placement import inventory

__all__ = ["Device", "NodeGpus", "from_node", "memory_label"]

CATALOGUE_SOURCE = "kubeseer catalogue, no GFD memory label"


@dataclass(frozen=True, eq=False)
class Device:
    """Every unit of one NVIDIA resource on one node; the units are interchangeable.

    `memory_bytes` is the usable memory of one unit and `memory_source` the label it came from
    (named in rejection messages). `compute_slices` is the unit's share of the GPU's 7.

    Equal devices are one object (`from_node` interns them), compared by identity: a cluster
    has a few kinds of device on many nodes, and the filter looks each node's up per call.
    """

    resource: str
    model_key: str
    product_label: str
    profile: str | None
    memory_bytes: int
    memory_source: str
    compute_slices: int
    allocatable: int


@dataclass(frozen=True)
class NodeGpus:
    """A node's GPU devices by resource name.

    `problem` says why NVIDIA resources on the node cannot be judged (no product label, an
    unknown product, resources the catalogue does not know); it is None on a healthy GPU node
    and on a node without GPUs.
    """

    name: str
    devices: Mapping[str, Device]
    problem: str | None = None


def from_node(node: Mapping[str, Any]) -> NodeGpus:
    """Read a `v1.Node` (Kubernetes JSON) as it comes from the API server."""
    metadata = _mapping(node.get("metadata"))
    spec = _mapping(node.get("spec"))
    status = _mapping(node.get("status"))
    name = str(metadata.get("name") or "")
    labels = {str(k): str(v) for k, v in _mapping(metadata.get("labels")).items()}
    allocatable = {str(k): str(v) for k, v in _mapping(status.get("allocatable")).items()}
    record: inventory.NodeRecord = {
        "name": name,
        "labels": labels,
        "allocatable": allocatable,
        "schedulable": not spec.get("unschedulable", False),
    }
    try:
        built = inventory.build([record], [])
    except inventory.InventoryError as e:
        return NodeGpus(name=name, devices={}, problem=str(e))
    devices: dict[str, Device] = {}
    for offer in built.offers:
        label = memory_label(offer.resource)
        label_bytes = _mib_label(labels.get(label))
        source = label if label_bytes == offer.usable_memory_bytes else CATALOGUE_SOURCE
        devices[offer.resource] = _device(
            offer.resource,
            offer.model_key,
            offer.product_label,
            offer.profile.name,
            offer.usable_memory_bytes,
            source,
            offer.profile.compute_slices,
            offer.allocatable,
        )
    problem = built.skipped[0].reason if built.skipped else None
    return NodeGpus(name=name, devices=devices, problem=problem)


@functools.lru_cache(maxsize=4096)
def _device(
    resource: str,
    model_key: str,
    product_label: str,
    profile: str | None,
    memory_bytes: int,
    memory_source: str,
    compute_slices: int,
    allocatable: int,
) -> Device:
    """The one `Device` object with these fields (bounded: an unusual cluster only re-creates)."""
    return Device(
        resource,
        model_key,
        product_label,
        profile,
        memory_bytes,
        memory_source,
        compute_slices,
        allocatable,
    )


def memory_label(resource: str) -> str:
    """GFD's per-device memory label (MiB) for a resource: `<resource>.memory` under the mixed
    strategy, `nvidia.com/gpu.memory` for whole GPUs and single-strategy slices."""
    return f"{resource}.memory"


def _mib_label(value: str | None) -> int | None:
    if value is None or not value.isdigit():
        return None
    return int(value) * units.MIB


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}

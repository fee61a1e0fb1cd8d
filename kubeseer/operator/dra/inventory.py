"""The GPUs NVIDIA's DRA driver publishes, minus what claims hold: the `Inventory` placement
plans on when the operator runs on Dynamic Resource Allocation.

Under DRA a node has no `nvidia.com/*` resources: its devices are ResourceSlices of the driver
`gpu.nvidia.com` (one pool per node; `productName`, `type` and `profile` attributes, usable
`memory` and `multiprocessors` capacities) and what is taken is in ResourceClaims'
`status.allocation.devices.results`. A device is free when no claim holds it and, under dynamic
MIG, when what it consumes still fits its GPU's shared counters beside what the allocated
devices consume (a placement overlapping an allocated one needs a memory slice that is gone).
Devices of one kind on one node (product, MIG profile or whole GPU) become one `Offer`:
`allocatable` counts the devices, `free` those that could be allocated now.

The cache follows watch events of slices, claims and nodes, as `operator.inventory` follows
nodes and pods; `assume` counts a device the operator has just asked for until its claim is
allocated, so two DLJobs planned in the same second do not both see the last one free.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from kubeseer.placement import catalogue, claims
from kubeseer.placement import inventory as placement_inventory

DeviceKey = tuple[str, str]
"""`(pool, device name)`, as allocation results name a device."""

ASSUME_TTL_S = 60.0
"""How long an assumed device counts without its claim being allocated."""

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P|m|)$")
_SUFFIXES: dict[str, int | Fraction] = {"": 1, "m": Fraction(1, 1000), "k": 10**3, "M": 10**6}
_SUFFIXES |= {"G": 10**9, "T": 10**12}
_SUFFIXES |= {"P": 10**15, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
_SUFFIXES |= {"Pi": 1 << 50}


def quantity(text: str) -> int:
    """A Kubernetes quantity (`9984Mi`, `40Gi`, `16`, `1.5Gi`) as a whole number, rounded down.

    Raises:
        ValueError: not a quantity.
    """
    match = _QUANTITY.match(str(text).strip())
    if match is None:
        raise ValueError(f"not a quantity: {text!r}")
    return int(Fraction(match.group(1)) * _SUFFIXES[match.group(2)])


@dataclass(frozen=True)
class Device:
    """One device of the driver, as placement sees it."""

    key: DeviceKey
    node: str
    model: catalogue.GpuModel
    product_label: str
    profile: catalogue.Profile
    memory_bytes: int
    compute_share: float
    consumes: Mapping[tuple[str, str], Mapping[str, int]]
    """(pool, counter set) -> counter -> amount taken when allocated."""


@dataclass(frozen=True)
class Published:
    """What some ResourceSlices offer: devices, the counters they share, and what was skipped."""

    devices: tuple[Device, ...]
    counters: Mapping[tuple[str, str], Mapping[str, int]]
    skipped: tuple[placement_inventory.SkippedNode, ...]


def read_slices(slices: Iterable[Mapping[str, Any]]) -> Published:
    """The NVIDIA driver's node-local devices in `resource.k8s.io/v1` ResourceSlices.

    Other drivers' slices are ignored; a device whose product or MIG profile kubeseer does not
    know is skipped and named (shown in NoFit messages), never guessed.
    """
    devices: list[Device] = []
    counters: dict[tuple[str, str], dict[str, int]] = {}
    skipped: dict[str, str] = {}
    for item in slices:
        spec = item.get("spec") or {}
        node = str(spec.get("nodeName") or "")
        if spec.get("driver") != claims.DRIVER or not node:
            continue
        pool = str((spec.get("pool") or {}).get("name", ""))
        for counter_set in spec.get("sharedCounters") or ():
            counters[(pool, str(counter_set["name"]))] = {
                str(k): quantity(v["value"]) for k, v in (counter_set.get("counters") or {}).items()
            }
        for raw in spec.get("devices") or ():
            try:
                devices.append(_device(pool, node, raw))
            except (catalogue.CatalogueError, KeyError, ValueError) as e:
                skipped.setdefault(node, f"device {raw.get('name')} skipped: {e}")
    return Published(
        devices=tuple(sorted(devices, key=lambda d: d.key)),
        counters=counters,
        skipped=tuple(placement_inventory.SkippedNode(n, r) for n, r in sorted(skipped.items())),
    )


def _device(pool: str, node: str, raw: Mapping[str, Any]) -> Device:
    attributes = raw.get("attributes") or {}
    capacity = raw.get("capacity") or {}

    def attribute(name: str) -> str | None:
        value = attributes.get(name) or attributes.get(f"{claims.DRIVER}/{name}")
        return None if value is None else str(value.get("string"))

    def amount(name: str) -> int | None:
        value = capacity.get(name) or capacity.get(f"{claims.DRIVER}/{name}")
        return None if value is None else quantity(value["value"])

    product_name = attribute("productName")
    model = catalogue.find_model(product_name or "")
    if product_name is None or model is None:
        raise ValueError(f"unknown product {product_name!r}")
    kind = attribute("type")
    if kind == "gpu":
        profile = model.whole
    elif kind == "mig":
        profile = model.profile(attribute("profile") or "")
    else:
        raise ValueError(f"device type {kind!r} is neither gpu nor mig")
    memory = amount("memory")
    sms = amount("multiprocessors")
    label = _product_label(model, product_name)
    return Device(
        key=(pool, str(raw["name"])),
        node=node,
        model=model,
        product_label=label,
        profile=profile,
        memory_bytes=memory if memory is not None else profile.usable_memory_bytes,
        compute_share=min(1.0, sms / model.sms) if sms else profile.compute_share,
        consumes={
            (pool, str(use["counterSet"])): {
                str(k): quantity(v["value"]) for k, v in (use.get("counters") or {}).items()
            }
            for use in raw.get("consumesCounters") or ()
        },
    )


def _product_label(model: catalogue.GpuModel, product_name: str) -> str:
    """GPU Feature Discovery's label of an NVML name, as device-plugin nodes carry it, so that a
    DLJob's `gpuProducts` means the same on either backend."""
    for label, name in zip(model.product_labels, model.product_names, strict=True):
        if name.lower() == product_name.lower():
            return label
    return product_name.replace(" ", "-")


def allocated_devices(claim: Mapping[str, Any]) -> list[DeviceKey]:
    """The NVIDIA devices a ResourceClaim holds (none while unallocated)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or ()
    return [
        (str(r.get("pool", "")), str(r.get("device", "")))
        for r in results
        if r.get("driver") == claims.DRIVER
    ]


def build(
    published: Published,
    allocated: Iterable[DeviceKey],
    nodes: Mapping[str, placement_inventory.NodeRecord],
    pending: Mapping[tuple[str, str], int] | None = None,
) -> placement_inventory.Inventory:
    """Free devices per node and kind, as an `Inventory` (kinds keyed like device-plugin
    resources: product label and `nvidia.com/mig-<profile>` or `nvidia.com/gpu`)."""
    taken = set(allocated)
    used: dict[tuple[str, str], dict[str, int]] = {}
    for device in published.devices:
        if device.key in taken:
            for counter_set, amounts in device.consumes.items():
                into = used.setdefault(counter_set, {})
                for name, value in amounts.items():
                    into[name] = into.get(name, 0) + value

    def free(device: Device) -> bool:
        if device.key in taken:
            return False
        for counter_set, amounts in device.consumes.items():
            offered = published.counters.get(counter_set, {})
            already = used.get(counter_set, {})
            if any(already.get(k, 0) + v > offered.get(k, 0) for k, v in amounts.items()):
                return False
        return True

    groups: dict[tuple[str, str, str], list[Device]] = {}
    skipped = list(published.skipped)
    unschedulable: set[str] = set()
    for device in published.devices:
        record = nodes.get(device.node)
        if record is not None and not record["schedulable"]:
            unschedulable.add(device.node)
            continue
        key = (device.node, device.product_label, device.profile.resource_name)
        groups.setdefault(key, []).append(device)
    skipped += [
        placement_inventory.SkippedNode(n, "cordoned or not ready") for n in sorted(unschedulable)
    ]
    offers = []
    for (node, label, resource), members in sorted(groups.items()):
        first = members[0]
        offers.append(
            placement_inventory.Offer(
                node=node,
                product_label=label,
                model_key=first.model.key,
                profile=first.profile,
                resource=resource,
                allocatable=len(members),
                free=sum(1 for d in members if free(d)),
                usable_memory_bytes=min(d.memory_bytes for d in members),
                compute_share=min(d.compute_share for d in members),
            )
        )
    labelled = {o.node: dict(nodes[o.node]["labels"]) if o.node in nodes else {} for o in offers}
    return placement_inventory.Inventory(
        offers=tuple(offers),
        pending=dict(pending or {}),
        skipped=tuple(skipped),
        node_labels=labelled,
    )


class DraInventoryCache:
    """Thread-safe store of the driver's slices, the claims' allocations and the nodes.

    Watch handlers run on kopf's event loop and placements in worker threads, hence the lock.
    An assumption (`assume`) is keyed by the DLJob attempt whose claim it stands for and ends
    when a claim of that attempt is seen allocated (`observe_claim`), or after `ASSUME_TTL_S`.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._slices: dict[str, Mapping[str, Any]] = {}
        self._claims: dict[str, list[DeviceKey]] = {}
        self._nodes: dict[str, placement_inventory.NodeRecord] = {}
        self._assumed: dict[str, tuple[tuple[str, str], int, float]] = {}
        self._published: Published | None = None

    def replace_all(
        self,
        slices: Iterable[Mapping[str, Any]],
        claim_list: Iterable[Mapping[str, Any]],
        nodes: Iterable[placement_inventory.NodeRecord],
    ) -> None:
        """Start over from a full listing."""
        by_name = {str((s.get("metadata") or {}).get("name")): s for s in slices}
        held = {_claim_key(c): allocated_devices(c) for c in claim_list}
        with self._lock:
            self._slices = by_name
            self._claims = {k: v for k, v in held.items() if v}
            self._nodes = {n["name"]: n for n in nodes}
            self._published = None

    def observe_slice(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """Apply one watch event for a ResourceSlice."""
        name = str((body.get("metadata") or {}).get("name"))
        with self._lock:
            if event_type == "DELETED":
                self._slices.pop(name, None)
            else:
                self._slices[name] = body
            self._published = None

    def observe_claim(
        self, event_type: str | None, body: Mapping[str, Any], attempt_key: str | None = None
    ) -> None:
        """Apply one watch event for a ResourceClaim; an allocated claim of an assumed attempt
        (`attempt_key`) ends that assumption."""
        key = _claim_key(body)
        held = [] if event_type == "DELETED" else allocated_devices(body)
        with self._lock:
            if held:
                self._claims[key] = held
                if attempt_key is not None:
                    self._assumed.pop(attempt_key, None)
            else:
                self._claims.pop(key, None)

    def observe_node(self, event_type: str | None, node: placement_inventory.NodeRecord) -> None:
        """Apply one watch event for a node (its labels and whether it is schedulable)."""
        with self._lock:
            if event_type == "DELETED":
                self._nodes.pop(node["name"], None)
            else:
                self._nodes[node["name"]] = node

    def assume(self, attempt_key: str, kind: tuple[str, str], units: int) -> None:
        """Count `units` devices of `kind` (product label, resource) as taken for an attempt
        whose claims are not allocated yet."""
        with self._lock:
            self._assumed[attempt_key] = (kind, units, self._clock() + ASSUME_TTL_S)

    def forget(self, attempt_key: str) -> None:
        """Drop the assumption of an attempt whose workload was not created."""
        with self._lock:
            self._assumed.pop(attempt_key, None)

    def device(self, key: DeviceKey) -> Device | None:
        """The published device of that pool and name, if any."""
        published = self._read()
        return next((d for d in published.devices if d.key == key), None)

    def snapshot(self) -> placement_inventory.Inventory:
        """Free devices now."""
        published = self._read()
        now = self._clock()
        with self._lock:
            self._assumed = {k: v for k, v in self._assumed.items() if v[2] > now}
            allocated = [d for held in self._claims.values() for d in held]
            nodes = dict(self._nodes)
            pending: dict[tuple[str, str], int] = {}
            for kind, units, _ in self._assumed.values():
                pending[kind] = pending.get(kind, 0) + units
        return build(published, allocated, nodes, pending)

    def _read(self) -> Published:
        """The slices read into devices, once per change of the slices."""
        with self._lock:
            if self._published is None:
                self._published = read_slices(list(self._slices.values()))
            return self._published


def _claim_key(claim: Mapping[str, Any]) -> str:
    metadata = claim.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"

"""The ResourceSlices NVIDIA's DRA driver publishes for one node, built from the inventory.

Shapes follow `kubernetes-sigs/dra-driver-nvidia-gpu`'s kubelet plugin (`deviceinfo.go`,
`mig.go`, `partitions.go`, `driver.go`): driver `gpu.nvidia.com`, one pool per node named after
it, device names `gpu-<minor>` and `gpu-<minor>-mig-<profile without dots>-<profile ID>-<start>`,
bare attribute names (`type`, `uuid`, `productName`, `architecture`, `brand`,
`cudaComputeCapability`, `driverVersion`, `cudaDriverVersion`; MIG devices add `profile` and
`parentUUID`) plus the standard `resource.kubernetes.io/pciBusID`, and capacities in bytes or
counts (`memory` is the *usable* memory NVML reports for the instance, `multiprocessors`,
`copyEngines`, `decoders`, `encoders`, `jpegEngines`, `ofaEngines`).

* **Static MIG** (the driver's default): the partitions that exist are discovered and published
  as they are, whole GPUs beside them; one slice per node. Like the driver, a MIG device also
  lists the memory slices it holds as `memorySlice<i>` capacities.
* **Dynamic MIG** (the driver's `DynamicMIG` gate): every profile at every placement
  (`geometry`) and the whole GPU, all consuming from one counter set per GPU named
  `gpu-<minor>-counter-set`: one counter per capacity (names in DNS form: `copy-engines`) with
  the largest profile's figures, plus `memory-slice-0` .. `memory-slice-7` of 1 each. So the
  scheduler itself enforces MIG geometry: two placements that share a memory slice, or more SMs
  than the GPU has, cannot both be allocated, and a partition released out of order fragments
  the GPU as it does on hardware. In `resource.k8s.io/v1` a slice carries either devices or
  shared counters, and at most 64 devices when they consume counters, so the pool is one slice
  of counter sets (at most 8: hence 8 GPUs per node) and one slice of devices per GPU, as the
  driver does on Kubernetes 1.35 and later.

Pure: plain dicts typed as TypedDicts; `publish` creates them.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NotRequired, TypedDict

from kubeseer.devcluster import inventory
from kubeseer.devcluster.dra import geometry

__all__ = [
    "API_VERSION",
    "CUDA_DRIVER_VERSION",
    "DRIVER",
    "DRIVER_VERSION",
    "MAX_COUNTER_DEVICES_PER_SLICE",
    "Device",
    "ResourceSlice",
    "build_slices",
    "counter_set_name",
    "mig_device_name",
]

API_VERSION = "resource.k8s.io/v1"
DRIVER = "gpu.nvidia.com"
DRIVER_VERSION = "580.95.5"
"""The NVIDIA kernel driver the fake node agent reports (a 580 branch, CUDA 13.0)."""
CUDA_DRIVER_VERSION = "13.0.0"
BRAND = "Nvidia"
"""NVML's brand string of data-centre GPUs, as go-nvlib renders it."""
MAX_COUNTER_DEVICES_PER_SLICE = 64
"""`ResourceSliceMaxDevicesWithAdvancedFeatures`: devices per slice when they consume counters."""
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
_UUIDS = uuid.UUID("6b1a0d6e-2f0c-4c52-9a53-8f3c64f0d8a1")
"""Namespace of the name-based UUIDs the fake GPUs and MIG devices get (stable per node)."""


class DeviceAttribute(TypedDict, total=False):
    """`DeviceAttribute`: exactly one of the typed values."""

    string: str
    version: str
    int: int
    bool: bool


class DeviceCapacity(TypedDict):
    """`DeviceCapacity` (quantities as strings)."""

    value: str


class Counter(TypedDict):
    """`Counter`."""

    value: str


class CounterSet(TypedDict):
    """`CounterSet`: one GPU's counters under dynamic MIG."""

    name: str
    counters: dict[str, Counter]


class DeviceCounterConsumption(TypedDict):
    """`DeviceCounterConsumption`: what allocating a device takes from a counter set."""

    counterSet: str
    counters: dict[str, Counter]


class Device(TypedDict):
    """`Device`."""

    name: str
    attributes: dict[str, DeviceAttribute]
    capacity: dict[str, DeviceCapacity]
    consumesCounters: NotRequired[list[DeviceCounterConsumption]]


class ResourcePool(TypedDict):
    """`ResourcePool`."""

    name: str
    generation: int
    resourceSliceCount: int


class ResourceSliceSpec(TypedDict):
    """`ResourceSliceSpec` of a node-local pool: devices or shared counters, never both."""

    driver: str
    pool: ResourcePool
    nodeName: str
    devices: NotRequired[list[Device]]
    sharedCounters: NotRequired[list[CounterSet]]


class OwnerReference(TypedDict):
    """The Node that owns a node-local slice (deleting the node collects its slices)."""

    apiVersion: str
    kind: str
    name: str
    uid: str
    controller: bool


class SliceMeta(TypedDict):
    """The metadata of a slice."""

    name: str
    labels: dict[str, str]
    ownerReferences: NotRequired[list[OwnerReference]]


class ResourceSlice(TypedDict):
    """A `resource.k8s.io/v1` ResourceSlice."""

    apiVersion: str
    kind: str
    metadata: SliceMeta
    spec: ResourceSliceSpec


@dataclass(frozen=True)
class _Gpu:
    """One physical GPU of a node, with the identity NVML would give it."""

    node: inventory.NodeSpec
    model: inventory.GpuModel
    minor: int

    @property
    def uuid(self) -> str:
        return "GPU-" + str(uuid.uuid5(_UUIDS, f"{self.node.name}/gpu-{self.minor}"))

    @property
    def pci_bus_id(self) -> str:
        return f"0000:{0x10 + 0x10 * self.minor:02x}:00.0"

    def attributes(self, device_type: str) -> dict[str, DeviceAttribute]:
        """What every device of this GPU carries (`CommonAttributesMig` / `Attributes`)."""
        assert self.model.product_name is not None  # checked by the inventory parser
        return {
            "type": {"string": device_type},
            "productName": {"string": self.model.product_name},
            "brand": {"string": BRAND},
            "architecture": {"string": self.model.architecture},
            "cudaComputeCapability": {
                "version": f"{self.model.compute_major}.{self.model.compute_minor}.0"
            },
            "driverVersion": {"version": DRIVER_VERSION},
            "cudaDriverVersion": {"version": CUDA_DRIVER_VERSION},
            PCI_BUS_ID: {"string": self.pci_bus_id},
        }


def counter_set_name(minor: int) -> str:
    """The counter set of GPU `minor` under dynamic MIG (`GetSharedCounterSetName`)."""
    return f"gpu-{minor}-counter-set"


def mig_device_name(minor: int, placement: geometry.Placement) -> str:
    """`gpu-<minor>-mig-<profile without dots>-<profile ID>-<start>` (`ToCanonicalName`)."""
    instance = placement.instance
    compact = instance.profile.replace(".", "").lower()
    ident = geometry.profile_id(instance.compute_slices, instance.memory_slices)
    return f"gpu-{minor}-mig-{compact}-{ident}-{placement.start}"


def build_slices(node: inventory.NodeSpec, node_uid: str | None = None) -> list[ResourceSlice]:
    """Every ResourceSlice of `node`'s pool; `node_uid` makes the Node their owner."""
    model = node.gpu_model
    if model is None or not node.gpu_driver.is_dra:
        raise ValueError(f"node {node.name} has no GPUs published by the DRA driver")
    gpus = [_Gpu(node, model, minor) for minor in range(node.gpus)]
    if node.gpu_driver is inventory.GpuDriver.DRA_DYNAMIC:
        specs: list[tuple[list[Device], list[CounterSet]]] = [
            ([], [_counter_set(gpu) for gpu in gpus])
        ]
        specs += [(_dynamic_devices(gpu), []) for gpu in gpus]
    else:
        devices = [d for gpu in gpus for d in _static_devices(gpu)]
        specs = [(sorted(devices, key=lambda d: d["name"]), [])]
    return [
        _slice(node, node_uid, index, len(specs), devices, counters)
        for index, (devices, counters) in enumerate(specs)
    ]


def _slice(
    node: inventory.NodeSpec,
    node_uid: str | None,
    index: int,
    count: int,
    devices: list[Device],
    counters: list[CounterSet],
) -> ResourceSlice:
    """Slice `index` of the `count` in the node's pool (generation 1: published once)."""
    pool: ResourcePool = {"name": node.name, "generation": 1, "resourceSliceCount": count}
    spec: ResourceSliceSpec = {"driver": DRIVER, "pool": pool, "nodeName": node.name}
    if counters:
        spec["sharedCounters"] = counters
    else:
        spec["devices"] = devices
    metadata: SliceMeta = {
        "name": f"{node.name}-{DRIVER}-{index}",
        "labels": {"kubeseer.io/devcluster": "dra"},
    }
    if node_uid:
        owner: OwnerReference = {
            "apiVersion": "v1",
            "kind": "Node",
            "name": node.name,
            "uid": node_uid,
            "controller": True,
        }
        metadata["ownerReferences"] = [owner]
    return {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": metadata, "spec": spec}


def _static_devices(gpu: _Gpu) -> list[Device]:
    """A GPU as the driver finds it without DynamicMIG: whole, or its existing MIG devices."""
    node, model = gpu.node, gpu.model
    if gpu.minor >= len(node.mig_layouts):
        return [
            {
                "name": f"gpu-{gpu.minor}",
                "attributes": gpu.attributes("gpu") | {"uuid": {"string": gpu.uuid}},
                "capacity": {"memory": {"value": f"{model.memory_mib}Mi"}},
            }
        ]
    placements = geometry.pack(inventory.mig_instances(model, node.mig_layouts[gpu.minor]))
    assert placements is not None  # the inventory parser rejects layouts that do not fit
    devices: list[Device] = []
    for placement in placements:
        profile = model.mig_profiles[placement.instance.profile]
        name = mig_device_name(gpu.minor, placement)
        capacity = _capacities(profile)
        capacity |= {f"memorySlice{i}": {"value": "1"} for i in placement.memory_slices}
        mig_uuid = "MIG-" + str(uuid.uuid5(_UUIDS, f"{node.name}/{name}"))
        devices.append(
            {
                "name": name,
                "attributes": gpu.attributes("mig")
                | {
                    "uuid": {"string": mig_uuid},
                    "parentUUID": {"string": gpu.uuid},
                    "profile": {"string": profile.name},
                },
                "capacity": capacity,
            }
        )
    return devices


def _dynamic_devices(gpu: _Gpu) -> list[Device]:
    """The whole GPU and every placement of every profile, each consuming its counters."""
    model = gpu.model
    whole = _max_capacities(model)
    devices: list[Device] = [
        {
            "name": f"gpu-{gpu.minor}",
            "attributes": gpu.attributes("gpu") | {"uuid": {"string": gpu.uuid}},
            "capacity": dict(whole),
            "consumesCounters": [
                _consumption(gpu.minor, whole, range(geometry.MEMORY_SLICES)),
            ],
        }
    ]
    for profile in model.mig_profiles.values():
        instance = geometry.Instance(profile.name, profile.compute_slices, profile.memory_slices)
        for start in geometry.starts(profile.compute_slices, profile.memory_slices):
            placement = geometry.Placement(instance, start)
            capacity = _capacities(profile)
            devices.append(
                {
                    "name": mig_device_name(gpu.minor, placement),
                    "attributes": gpu.attributes("mig")
                    | {
                        "parentUUID": {"string": gpu.uuid},
                        "profile": {"string": profile.name},
                    },
                    "capacity": capacity,
                    "consumesCounters": [
                        _consumption(gpu.minor, capacity, placement.memory_slices)
                    ],
                }
            )
    devices.sort(key=lambda d: d["name"])
    if len(devices) > MAX_COUNTER_DEVICES_PER_SLICE:
        raise ValueError(f"{len(devices)} devices for one GPU exceed one slice's limit")
    return devices


def _counter_set(gpu: _Gpu) -> CounterSet:
    """All of one GPU: the largest profile's capacities and its 8 memory slices."""
    consumed = _consumption(gpu.minor, _max_capacities(gpu.model), range(geometry.MEMORY_SLICES))
    return {"name": consumed["counterSet"], "counters": consumed["counters"]}


def _consumption(
    minor: int, capacity: Mapping[str, DeviceCapacity], memory_slices: range
) -> DeviceCounterConsumption:
    counters: dict[str, Counter] = {_dns(k): {"value": v["value"]} for k, v in capacity.items()}
    counters |= {f"memory-slice-{i}": {"value": "1"} for i in memory_slices}
    return {"counterSet": counter_set_name(minor), "counters": counters}


def _capacities(profile: inventory.MigProfile) -> dict[str, DeviceCapacity]:
    """`CommonCapacitiesMig`: SMs, engines and usable memory of one instance."""
    engines = profile.engines
    assert engines is not None  # checked by the inventory parser for DRA nodes
    counts = {
        "multiprocessors": profile.multiprocessors,
        "copyEngines": engines.copy_engines,
        "decoders": engines.decoders,
        "encoders": engines.encoders,
        "jpegEngines": engines.jpeg_engines,
        "ofaEngines": engines.ofa_engines,
    }
    capacity: dict[str, DeviceCapacity] = {k: {"value": str(v)} for k, v in counts.items()}
    capacity["memory"] = {"value": f"{profile.memory_mib}Mi"}
    return capacity


def _max_capacities(model: inventory.GpuModel) -> dict[str, DeviceCapacity]:
    """Per capacity, the largest value of any profile: the whole GPU under dynamic MIG."""
    best: dict[str, int] = {}
    for profile in model.mig_profiles.values():
        for name, figure in _capacities(profile).items():
            amount = _amount(figure["value"])
            best[name] = max(best.get(name, 0), amount)
    return {
        name: {"value": f"{amount >> 20}Mi" if name == "memory" else str(amount)}
        for name, amount in best.items()
    }


def _amount(quantity: str) -> int:
    """Bytes or a count, from the two forms this module writes (`123` and `123Mi`)."""
    return int(quantity[:-2]) << 20 if quantity.endswith("Mi") else int(quantity)


def _dns(name: str) -> str:
    """A capacity name as a counter name (`copyEngines` -> `copy-engines`, `camelToDNSName`)."""
    return "".join("-" + c.lower() if c.isupper() else c for c in name)

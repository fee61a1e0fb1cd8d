"""GPU devices and processes -> the node's pods, and which of those belong to a DLJob.

Two facts tie a device to a pod. A process on the device belongs to a pod if its cgroup says so
(`cgroup`); that gives per-process memory and works for device-plugin and DRA pods alike. A
device allocated to a pod through a DRA claim belongs to it whether or not a process is
running yet: the claim's `status.allocation.devices.results[]` names (driver, pool, device),
and the node's ResourceSlice gives that device's `uuid` attribute (the NVIDIA DRA driver
publishes the GPU's or MIG device's UUID there). Device identifiers are matched by UUID, and
the legacy MIG form ``MIG-GPU-<gpu uuid>/<gpu instance>/<compute instance>`` by the GPU's UUID
and the GPU instance id.

A pod's memory on a device is the sum of its processes' memory; when NVML cannot list them
(or says "not available" per process) and the pod holds the device alone, the device's used
memory stands in. SM activity is a property of the device (or MIG instance), so it is
attributed only to a pod that holds the device alone; a shared device's activity is nobody's.

Only pods that a DLJob owns are reported: the pod carries the DLJob label and is controlled by
that DLJob (one pod per attempt) or by the Job the operator created for the attempt, whose name
is `workload.workload_name(dljob, attempt)`. A pod that merely copies the label is not
attributed to someone else's DLJob.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from kubeseer.operator import workload
from kubeseer.profiler import cgroup
from kubeseer.profiler import nvml as nvml_facade

_LEGACY_MIG = re.compile(r"^MIG-(GPU-[0-9a-fA-F-]+)/(\d+)/(\d+)$")
_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

PREDICTED_MEMORY_POINT = "memory_point_bytes"
PREDICTED_MEMORY_UPPER = "memory_upper_bytes"
PREDICTED_SM_UTIL = "sm_util_percent"
PREDICTION_ANNOTATIONS = {
    PREDICTED_MEMORY_POINT: workload.ANNOTATION_PREDICTED_MEMORY_POINT,
    PREDICTED_MEMORY_UPPER: workload.ANNOTATION_PREDICTED_MEMORY,
    PREDICTED_SM_UTIL: workload.ANNOTATION_PREDICTED_SM_UTIL,
}
"""`PodInfo.predicted` keys and the pod annotations the operator writes them in."""


@dataclass(frozen=True)
class PodInfo:
    """What the agent needs of one pod on its node.

    Attributes:
        dljob: the owning DLJob's name; None for a pod no DLJob owns.
        attempt: the DLJob attempt the pod runs (its `kubeseer.io/attempt` label).
        containers: container runtime ID (scheme stripped) -> container name.
        claims: names of the ResourceClaims the pod's devices come from (DRA).
        predicted: what the operator predicted for the pod, from its annotations (the point
            and upper memory in bytes, SM utilisation in percent); a figure the pod lacks, or
            that does not parse, is absent.
    """

    uid: str
    namespace: str
    name: str
    phase: str
    dljob: str | None
    attempt: int | None
    containers: Mapping[str, str]
    claims: tuple[str, ...]
    predicted: Mapping[str, float] = field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        """The pod has finished (its containers will not run again)."""
        return self.phase in _TERMINAL_PHASES


def _owned_by_dljob(metadata: Mapping[str, Any], dljob: str, attempt: int | None) -> bool:
    for owner in metadata.get("ownerReferences") or ():
        if not owner.get("controller"):
            continue
        kind, name = owner.get("kind"), owner.get("name")
        if kind == "DLJob" and name == dljob:
            return True
        if kind == "Job" and attempt is not None and name == workload.workload_name(dljob, attempt):
            return True
    return False


def pod_info(pod: Mapping[str, Any]) -> PodInfo:
    """A pod as the API returns it (plain JSON) -> `PodInfo`."""
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    labels = metadata.get("labels") or {}
    dljob = labels.get(workload.LABEL_DLJOB)
    try:
        attempt: int | None = int(labels[workload.LABEL_ATTEMPT])
    except (KeyError, TypeError, ValueError):
        attempt = None
    if dljob is not None and not _owned_by_dljob(metadata, str(dljob), attempt):
        dljob = None
    containers: dict[str, str] = {}
    for entry in (
        *(status.get("containerStatuses") or ()),
        *(status.get("initContainerStatuses") or ()),
    ):
        runtime_id = str(entry.get("containerID") or "")
        if runtime_id:
            containers[runtime_id.rpartition("://")[2]] = str(entry.get("name", ""))
    claims = [
        str(c["resourceClaimName"])
        for c in status.get("resourceClaimStatuses") or ()
        if c.get("resourceClaimName")
    ]
    claims += [
        str(c["resourceClaimName"])
        for c in (pod.get("spec") or {}).get("resourceClaims") or ()
        if c.get("resourceClaimName")
    ]
    annotations = metadata.get("annotations") or {}
    predicted: dict[str, float] = {}
    for key, annotation in PREDICTION_ANNOTATIONS.items():
        try:
            predicted[key] = float(annotations[annotation])
        except (KeyError, TypeError, ValueError):
            continue
    return PodInfo(
        uid=str(metadata.get("uid", "")),
        namespace=str(metadata.get("namespace", "")),
        name=str(metadata.get("name", "")),
        phase=str(status.get("phase", "")),
        dljob=None if dljob is None else str(dljob),
        attempt=attempt,
        containers=containers,
        claims=tuple(dict.fromkeys(claims)),
        predicted=predicted,
    )


def _attribute(device: Mapping[str, Any], name: str) -> str | None:
    """A device attribute's string value, by bare or driver-qualified name."""
    for key, value in (device.get("attributes") or {}).items():
        named = key == name or key.rpartition("/")[2] == name
        if named and isinstance(value, Mapping) and "string" in value:
            return str(value["string"])
    return None


def slice_device_uuids(slices: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], str]:
    """(driver, pool, device name) -> the device's `uuid` attribute, over ResourceSlices.

    Handles `resource.k8s.io/v1` devices (attributes on the device) and v1beta1's `basic`.
    """
    found: dict[tuple[str, str, str], str] = {}
    for item in slices:
        spec = item.get("spec") or {}
        driver = str(spec.get("driver", ""))
        pool = str((spec.get("pool") or {}).get("name", ""))
        for device in spec.get("devices") or ():
            body = device.get("basic") or device
            uuid = _attribute(body, "uuid")
            if uuid is not None:
                found[(driver, pool, str(device.get("name", "")))] = uuid
    return found


def claim_device_ids(
    claim: Mapping[str, Any], uuids: Mapping[tuple[str, str, str], str]
) -> list[str]:
    """The device identifiers (UUIDs) a ResourceClaim was allocated; unknown devices skipped."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or ()
    ids = []
    for result in results:
        key = (
            str(result.get("driver", "")),
            str(result.get("pool", "")),
            str(result.get("device", "")),
        )
        if key in uuids:
            ids.append(uuids[key])
    return ids


def match_device(
    identifier: str, devices: Sequence[nvml_facade.GpuDevice]
) -> nvml_facade.GpuDevice | None:
    """The device an identifier names: by UUID, or a legacy MIG name by GPU UUID and instance."""
    for device in devices:
        if device.uuid == identifier:
            return device
    legacy = _LEGACY_MIG.match(identifier)
    if legacy is not None:
        gpu_uuid, instance = legacy.group(1), int(legacy.group(2))
        for device in devices:
            if device.gpu_uuid == gpu_uuid and device.gpu_instance_id == instance:
                return device
    return None


class Source(StrEnum):
    """Where a pod's memory reading on a device comes from."""

    PROCESSES = "processes"
    DEVICE = "device"


@dataclass(frozen=True)
class PodReading:
    """One DLJob pod on one device at one sample.

    `memory_bytes` None: the pod holds the device but nothing says how much it uses (a shared
    device whose processes NVML would not list). `sm_percent` None: the device has no source,
    is shared, or GPM is priming; `sm_source` says which.
    """

    pod: PodInfo
    device: nvml_facade.GpuDevice
    memory_bytes: int | None
    memory_source: Source | None
    sm_percent: float | None
    sm_source: str
    processes: int


SHARED = "shared"
"""`PodReading.sm_source` of a device that more than one pod holds."""


@dataclass(frozen=True)
class Attribution:
    """The DLJob pods' readings, and GPU processes that belong to no pod the agent knows."""

    readings: tuple[PodReading, ...]
    unattributed_processes: int


def attribute(
    samples: Sequence[nvml_facade.DeviceSample],
    pods: Mapping[str, PodInfo],
    container_of: Callable[[int], cgroup.ContainerRef | None],
    claimed: Mapping[str, Iterable[str]],
) -> Attribution:
    """Readings of every DLJob pod on every device it holds.

    Args:
        samples: one NVML sample of each device.
        pods: the node's pods (all of them: a non-DLJob pod on a device makes it shared), by UID.
        container_of: PID -> pod and container (`cgroup.ProcReader.container_of`).
        claimed: device UUID -> UIDs of the pods whose DRA claims were allocated it.
    """
    readings: list[PodReading] = []
    unattributed = 0
    for sample in samples:
        memory: dict[str, int | None] = {}
        counts: dict[str, int] = {}
        for process in sample.processes or ():
            ref = container_of(process.pid)
            if ref is None or ref.pod_uid not in pods:
                unattributed += 1
                continue
            uid = ref.pod_uid
            counts[uid] = counts.get(uid, 0) + 1
            known = memory.get(uid, 0)
            memory[uid] = (
                None if known is None or process.used_bytes is None else known + process.used_bytes
            )
        owners = list(
            dict.fromkeys([*memory, *(u for u in claimed.get(sample.device.uuid, ()) if u in pods)])
        )
        alone = len(owners) == 1
        for uid in owners:
            pod = pods[uid]
            if pod.dljob is None or pod.terminal:
                # A finished pod's last report is out; a claim not yet released must not
                # reopen its window.
                continue
            bytes_used = memory.get(uid)
            source: Source | None = Source.PROCESSES if bytes_used is not None else None
            if bytes_used is None and alone and sample.memory_used_bytes is not None:
                bytes_used, source = sample.memory_used_bytes, Source.DEVICE
            readings.append(
                PodReading(
                    pod=pod,
                    device=sample.device,
                    memory_bytes=bytes_used,
                    memory_source=source,
                    sm_percent=sample.sm_percent if alone else None,
                    sm_source=sample.device.sm_source.value if alone else SHARED,
                    processes=counts.get(uid, 0),
                )
            )
    return Attribution(tuple(readings), unattributed)


def claimed_devices(
    pods: Iterable[PodInfo],
    claims: Mapping[tuple[str, str], Mapping[str, Any]],
    slices: Iterable[Mapping[str, Any]],
    devices: Sequence[nvml_facade.GpuDevice],
) -> dict[str, list[str]]:
    """Device UUID -> pod UIDs, from the pods' allocated ResourceClaims.

    Args:
        claims: (namespace, claim name) -> ResourceClaim, for the claims the pods name.
        slices: the node's ResourceSlices.
        devices: this node's NVML devices (identifiers are resolved against them).
    """
    uuids = slice_device_uuids(slices)
    owners: dict[str, list[str]] = {}
    for pod in pods:
        for name in pod.claims:
            claim = claims.get((pod.namespace, name))
            if claim is None:
                continue
            for identifier in claim_device_ids(claim, uuids):
                device = match_device(identifier, devices)
                if device is not None:
                    owners.setdefault(device.uuid, []).append(pod.uid)
    return owners

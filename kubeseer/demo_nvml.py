"""The NVML stand-in's view of a demo node: its GPUs as the inventory has them, and each demo
pod's process on a device of the resource kubeseer gave it.

KWOK's fake nodes have no GPU and run no process. For the profiler to attribute what it reads,
a node's scenario (`kubeseer.profiler.standin`) lists the node's GPUs and MIG devices from
deploy/devcluster/nodes.yaml, with stable UUIDs, and one process per pod with the memory
`kubeseer.demo_truth` derived for it; the host's /proc is a directory holding each process's
cgroup file as containerd (systemd driver, cgroup v2) writes it. A device plugin gives each pod
its own device; so does the scenario.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from kubeseer import units
from kubeseer.devcluster import inventory


class ScenarioError(RuntimeError):
    """A pod has no device of its resource on its node."""


NOT_SUPPORTED = {
    "nvmlGpmQueryDeviceSupport": pynvml.NVML_ERROR_NOT_SUPPORTED,
    "nvmlDeviceGetUtilizationRates": pynvml.NVML_ERROR_NOT_SUPPORTED,
}
"""SM activity is not derived: NVML's answer for a reading a device does not have."""
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-")


@dataclass(frozen=True)
class GpuPod:
    """A DLJob pod bound to a GPU node, the GPU resource it got, and its derived memory."""

    namespace: str
    name: str
    uid: str
    node: str
    dljob: str
    resource: str
    used_bytes: int | None
    """What its process shows in NVML; None when the model could not be derived or does not
    fit the device (the pod then has no process)."""


def gpu_resource(pod: Any) -> str:
    """The `nvidia.com/*` limit kubeseer gave the pod's first container that has one."""
    for c in pod.spec.containers:
        for name in (c.resources.limits or {}) if c.resources else {}:
            if name.startswith(GPU_RESOURCES):
                return str(name)
    raise ScenarioError(f"pod {pod.metadata.name} has no GPU resource")


def device_uuid(prefix: str, *parts: object) -> str:
    """A stable NVML-style UUID (`GPU-...`, `MIG-...`) for a device of a fake node."""
    key = "/".join(str(p) for p in ("kubeseer-demo", *parts))
    return f"{prefix}-{uuid.uuid5(uuid.NAMESPACE_URL, key)}"


def node_gpus(node: inventory.NodeSpec) -> list[dict[str, Any]]:
    """The node's GPUs in the stand-in's scenario format: the first `len(mig_layouts)` in MIG
    mode with their layout's devices, the rest whole."""
    model = node.gpu_model
    if model is None:
        return []
    name = model.product_name or model.product.replace("-", " ")
    gpus: list[dict[str, Any]] = []
    for index in range(node.gpus):
        gpu: dict[str, Any] = {
            "uuid": device_uuid("GPU", node.name, index),
            "name": name,
            "memory_total_bytes": model.memory_mib * units.MIB,
            "gpm": model.family in ("hopper", "blackwell"),
            "mig_capable": bool(model.mig_profiles),
        }
        if index < len(node.mig_layouts):
            layout = node.mig_layouts[index]
            devices = [
                profile
                for profile in model.mig_profiles.values()
                for _ in range(layout.get(profile.name, 0))
            ]
            gpu["mig"] = [
                {
                    "uuid": device_uuid("MIG", node.name, index, slot),
                    "profile": profile.name,
                    "gpu_instance_id": slot + 1,
                    "memory_total_bytes": profile.memory_mib * units.MIB,
                    "slot": slot,
                }
                for slot, profile in enumerate(devices)
            ]
        gpus.append(gpu)
    return gpus


def node_scenario(
    node: inventory.NodeSpec, pods: Sequence[GpuPod], first_pid: int
) -> tuple[dict[str, Any], dict[int, GpuPod]]:
    """NVML's view of `node` with each pod's process on a free device of its resource, and the
    PIDs given to the pods (a pod whose memory was not derived has no process)."""
    gpus = node_gpus(node)
    free: dict[str, list[str]] = {}
    for gpu in gpus:
        if "mig" in gpu:
            for mig in gpu["mig"]:
                free.setdefault(f"nvidia.com/mig-{mig['profile']}", []).append(mig["uuid"])
        else:
            free.setdefault("nvidia.com/gpu", []).append(gpu["uuid"])
    processes: list[dict[str, Any]] = []
    pids: dict[int, GpuPod] = {}
    for pod in pods:
        devices = free.get(pod.resource, [])
        if not devices:
            raise ScenarioError(f"node {node.name} has no free {pod.resource} for {pod.name}")
        device = devices.pop(0)
        if pod.used_bytes is None:
            continue
        pid = first_pid + len(pids)
        pids[pid] = pod
        processes.append({"pid": pid, "device": device, "used_bytes": pod.used_bytes})
    return {"gpus": gpus, "processes": processes, "errors": dict(NOT_SUPPORTED)}, pids


def cgroup_line(pod_uid: str, container_id: str) -> str:
    """`/proc/<pid>/cgroup` of a container process: cgroup v2, systemd driver, containerd."""
    slice_uid = pod_uid.replace("-", "_")
    return (
        "0::/kubepods.slice/kubepods-besteffort.slice/"
        f"kubepods-besteffort-pod{slice_uid}.slice/cri-containerd-{container_id}.scope\n"
    )


def write_proc(root: Path, pids: Mapping[int, GpuPod]) -> Path:
    """A /proc holding the cgroup file of each process."""
    for pid, pod in pids.items():
        (root / str(pid)).mkdir(parents=True, exist_ok=True)
        container = uuid.uuid5(uuid.NAMESPACE_URL, pod.uid).hex * 2
        (root / str(pid) / "cgroup").write_text(cgroup_line(pod.uid, container))
    return root


def device_memory(node: inventory.NodeSpec, resource: str) -> int:
    """Bytes of the device behind `resource` on `node` (a MIG profile's, or a whole GPU's)."""
    model = node.gpu_model
    if model is None:
        raise ScenarioError(f"node {node.name} has no GPU")
    profile = resource.removeprefix("nvidia.com/mig-")
    if profile != resource:
        return model.mig_profiles[profile].memory_mib * units.MIB
    return model.memory_mib * units.MIB

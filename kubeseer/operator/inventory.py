"""The cluster's GPU inventory as the operator sees it: nodes and pods kept current by watches.

The cache is seeded by one listing at start-up and then follows kopf's watch events, so a
placement costs no API call. Two DLJobs placed in the same instant must not both count on the
last free slice: a pod the operator has just created is recorded here at once (`assume`), as an
unbound pod, before the watch reports it; the watch event for that pod later replaces the entry.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kubeseer.placement import inventory as placement_inventory

NodeRecord = placement_inventory.NodeRecord
PodRecord = placement_inventory.PodRecord


def node_record(node: Mapping[str, Any]) -> NodeRecord:
    """The parts of a Node placement reads; cordoned or NotReady nodes are not schedulable."""
    metadata = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return {
        "name": str(metadata.get("name", "")),
        "labels": dict(metadata.get("labels") or {}),
        "allocatable": {str(k): str(v) for k, v in (status.get("allocatable") or {}).items()},
        "schedulable": ready and not spec.get("unschedulable", False),
    }


def pod_record(pod: Mapping[str, Any]) -> PodRecord:
    """The parts of a Pod that hold GPU capacity, and the nodes it may land on while unbound."""
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}

    def resources(containers: Iterable[Mapping[str, Any]]) -> list[Any]:
        return [dict(c.get("resources") or {}) for c in containers]

    return {
        "node_name": str(spec.get("nodeName") or ""),
        "phase": str(status.get("phase") or "Pending"),
        "containers": resources(spec.get("containers") or []),
        "init_containers": resources(spec.get("initContainers") or []),
        "node_selector": {str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()},
    }


def _pod_key(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


def requests_gpu(pod: Mapping[str, Any]) -> bool:
    """True if any container of the pod asks for an NVIDIA resource (only those are kept)."""
    spec = pod.get("spec") or {}
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        res = c.get("resources") or {}
        names = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        if any(n == "nvidia.com/gpu" or n.startswith("nvidia.com/mig-") for n in names):
            return True
    return False


JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
ASSUME_TTL_S = 60.0
"""How long an assumed pod counts without its watch event: far longer than a watch lags."""


class InventoryCache:
    """Thread-safe store of GPU nodes and GPU-requesting pods; `snapshot` builds an Inventory.

    Watch handlers run on kopf's event loop and placements in worker threads, hence the lock.
    Assumed pods (see module docstring) are kept apart from observed ones: a bare pod's
    assumption ends when its own watch event arrives, each of a Job's when one of the Job's pods
    arrives, and any of them after `ASSUME_TTL_S` in case the event never comes (creation lost).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeRecord] = {}
        self._pods: dict[str, PodRecord] = {}
        self._assumed: dict[str, tuple[PodRecord, float]] = {}

    def replace_all(
        self, nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
    ) -> None:
        """Start over from a full listing."""
        node_records = {str((n.get("metadata") or {}).get("name")): node_record(n) for n in nodes}
        pod_records = {_pod_key(p): pod_record(p) for p in pods if requests_gpu(p)}
        with self._lock:
            self._nodes = node_records
            self._pods = pod_records

    def observe_node(self, event_type: str | None, node: Mapping[str, Any]) -> None:
        """Apply one watch event for a node."""
        name = str((node.get("metadata") or {}).get("name"))
        with self._lock:
            if event_type == "DELETED":
                self._nodes.pop(name, None)
            else:
                self._nodes[name] = node_record(node)

    def observe_pod(self, event_type: str | None, pod: Mapping[str, Any]) -> None:
        """Apply one watch event for a pod; pods without GPU requests are ignored."""
        key = _pod_key(pod)
        metadata = pod.get("metadata") or {}
        job = (metadata.get("labels") or {}).get(JOB_NAME_LABEL)
        with self._lock:
            first_sighting = key not in self._pods
            if self._assumed.pop(key, None) is None and job and first_sighting:
                prefix = f"{metadata.get('namespace', '')}/{job}#"
                first = next((k for k in self._assumed if k.startswith(prefix)), None)
                if first is not None:
                    del self._assumed[first]
            if event_type == "DELETED" or not requests_gpu(pod):
                self._pods.pop(key, None)
            else:
                self._pods[key] = pod_record(pod)

    def assume(self, workload: Mapping[str, Any]) -> None:
        """Count the pods of a workload this operator is creating now (a Pod or a Job)."""
        for key, record in _assumed_pods(workload):
            with self._lock:
                if key not in self._pods:
                    self._assumed[key] = (record, self._clock() + ASSUME_TTL_S)

    def forget(self, workload: Mapping[str, Any]) -> None:
        """Drop the assumptions of a workload whose creation failed."""
        with self._lock:
            for key, _ in _assumed_pods(workload):
                self._assumed.pop(key, None)

    def snapshot(self) -> placement_inventory.Inventory:
        """Free capacity now."""
        now = self._clock()
        with self._lock:
            self._assumed = {k: v for k, v in self._assumed.items() if v[1] > now}
            nodes = list(self._nodes.values())
            pods = [*self._pods.values(), *(record for record, _ in self._assumed.values())]
        return placement_inventory.build(nodes, pods)


def _assumed_pods(workload: Mapping[str, Any]) -> list[tuple[str, PodRecord]]:
    """Keys and records of the pods a workload will create."""
    metadata = workload.get("metadata") or {}
    key = f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"
    if workload.get("kind") == "Job":
        spec = workload.get("spec") or {}
        pod = {"spec": (spec.get("template") or {}).get("spec") or {}}
        if not requests_gpu(pod):
            return []
        return [(f"{key}#{i}", pod_record(pod)) for i in range(int(spec.get("parallelism", 1)))]
    return [(key, pod_record(workload))] if requests_gpu(workload) else []

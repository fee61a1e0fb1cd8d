"""Reading what became of a workload: pure classification of pod and Job status.

An out-of-memory death shows up in two ways. The kernel's OOM killer (host memory, or a GPU
runtime that maps device memory into the cgroup) gives the container the reason `OOMKilled`;
a CUDA allocation failure usually makes the framework exit with an error, which reaches the pod
only through the termination message (`terminationMessagePolicy: FallbackToLogsOnError` puts the
log tail there). Both count as OOM; any other failure is the job's own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class PodOutcome(StrEnum):
    """What a pod (or a Job's pods) amounts to for its DLJob."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    OOM = "OOMKilled"
    FAILED = "Failed"
    DELETED = "Deleted"


@dataclass(frozen=True)
class Verdict:
    """An outcome and the words that explain it (empty unless the pod failed); for an OOM, the
    node the pod ran on ("" when unknown), whose device is the memory that did not suffice."""

    outcome: PodOutcome
    message: str = ""
    node: str = ""


# Messages PyTorch, TensorFlow, JAX and the CUDA runtime print when device memory runs out.
_CUDA_OOM = re.compile(
    r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|"
    r"CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|RESOURCE_EXHAUSTED: Out of memory|"
    r"cudaErrorMemoryAllocation|RESOURCE_EXHAUSTED.*(?:allocat|OOM)",
    re.IGNORECASE,
)


def is_cuda_oom_message(message: str) -> bool:
    """True if a termination message reads as a GPU out-of-memory failure."""
    return bool(_CUDA_OOM.search(message))


def _terminations(pod: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    """Every terminated state of every container, current and last."""
    status = pod.get("status") or {}
    for cs in (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or []):
        for key in ("state", "lastState"):
            terminated = (cs.get(key) or {}).get("terminated")
            if terminated:
                yield {"container": cs.get("name", ""), **terminated}


def find_oom(pod: Mapping[str, Any]) -> str | None:
    """A sentence naming the container that ran out of memory, or None."""
    for t in _terminations(pod):
        reason = str(t.get("reason") or "")
        message = str(t.get("message") or "")
        if reason == "OOMKilled":
            return f"container {t['container']} was OOMKilled (exit code {t.get('exitCode')})"
        if is_cuda_oom_message(message):
            first = next((ln for ln in message.splitlines() if is_cuda_oom_message(ln)), message)
            return f"container {t['container']} ran out of GPU memory: {first.strip()[:300]}"
    return None


def deleted(kind: str, name: str, body: Mapping[str, Any]) -> Verdict:
    """A workload removed before it finished (by hand, an eviction, a drain); one that had
    already finished keeps the outcome it finished with."""
    finished = classify_pod(body) if kind == "Pod" else classify_job(body, ())
    if finished.outcome is PodOutcome.DELETED:
        return Verdict(PodOutcome.DELETED, f"{kind} {name} was deleted before it finished")
    if finished.outcome in (PodOutcome.SUCCEEDED, PodOutcome.FAILED, PodOutcome.OOM):
        return finished
    return Verdict(PodOutcome.DELETED, f"{kind} {name} was deleted before it finished")


def classify_pod(pod: Mapping[str, Any]) -> Verdict:
    """The outcome of one pod. An OOM is recognised even before the pod phase says Failed,
    because a container with `restartPolicy: Always` keeps restarting instead."""
    oom = find_oom(pod)
    if oom is not None:
        return Verdict(PodOutcome.OOM, oom, _node(pod))
    status = pod.get("status") or {}
    phase = status.get("phase")
    if phase == "Running":
        return Verdict(PodOutcome.RUNNING)
    if phase == "Succeeded":
        return Verdict(PodOutcome.SUCCEEDED)
    if phase == "Failed":
        return Verdict(PodOutcome.FAILED, _failure_message(pod))
    return Verdict(PodOutcome.PENDING)


def _failure_message(pod: Mapping[str, Any]) -> str:
    status = pod.get("status") or {}
    for t in _terminations(pod):
        if t.get("exitCode") not in (None, 0):
            detail = str(t.get("message") or t.get("reason") or "").strip()[:300]
            return f"container {t['container']} exited with code {t.get('exitCode')}" + (
                f": {detail}" if detail else ""
            )
    return str(status.get("message") or status.get("reason") or "pod failed")


def classify_job(job: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> Verdict:
    """The outcome of a Job attempt, from its conditions and, for failures, its pods.

    A Job with `backoffLimit: 0` fails as soon as one pod fails, and also when a pod is deleted
    before it finished (the Job controller counts it as failed): a failure whose pods show no
    failure of their own is a deleted pod, which deserves another attempt, not a failed DLJob.
    """
    conditions = {c.get("type"): c for c in (job.get("status") or {}).get("conditions") or [] if c}
    pods = list(pods)
    for pod in pods:
        oom = find_oom(pod)
        if oom is not None:
            return Verdict(PodOutcome.OOM, oom, _node(pod))
    if _true(conditions.get("Complete")):
        return Verdict(PodOutcome.SUCCEEDED)
    failed = conditions.get("Failed")
    if _true(failed):
        assert failed is not None
        own = [v for v in map(classify_pod, pods) if v.outcome is PodOutcome.FAILED]
        if own:
            return own[0]
        if failed.get("reason") == "BackoffLimitExceeded":
            name = (job.get("metadata") or {}).get("name")
            why = f"a pod of Job {name} was deleted before it finished"
            return Verdict(PodOutcome.DELETED, why)
        return Verdict(PodOutcome.FAILED, str(failed.get("message") or failed.get("reason")))
    if (job.get("status") or {}).get("ready") or any(
        classify_pod(p).outcome is PodOutcome.RUNNING for p in pods
    ):
        return Verdict(PodOutcome.RUNNING)
    return Verdict(PodOutcome.PENDING)


def _node(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def _true(c: Mapping[str, Any] | None) -> bool:
    return c is not None and c.get("status") == "True"

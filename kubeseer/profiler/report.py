"""The DLJob's `status.observed`: what the profiler saw each of its pods use, built and read back.

Each agent writes only its own pods' entries, under `status.observed.pods.<pod name>`, with a
JSON merge patch, so agents on different nodes (a DLJob with several replicas) and the operator
(which writes other status fields) never overwrite each other. An entry is rewritten while the
pod runs and a last time, with `final: true`, when it ends. Pod names carry the attempt
(`<dljob>-<attempt>`), so the entries of earlier attempts stay.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NotRequired, TypedDict

from kubeseer.profiler import window as window_mod

SOURCE_NVML = "nvml"
"""`source` of observations read from the NVIDIA driver."""
SOURCE_STANDIN = "nvml-standin"
"""`source` of observations from the NVML stand-in (machines without a GPU: tests, the demo)."""


class ObservedWindow(TypedDict):
    """When the pod was seen, and the warm-up left out of the means."""

    start: str
    end: str
    warmupSeconds: float
    warmedUp: bool


class ObservedGpu(TypedDict):
    """One device the pod held."""

    uuid: str
    modelName: str
    migProfile: str | None
    gpuInstanceId: int | None
    peakMemoryBytes: int | None
    meanMemoryBytes: int | None
    memorySource: str | None
    smActivityPercent: float | None
    smActivitySource: str


class PodObserved(TypedDict):
    """`status.observed.pods.<pod>`: one pod's observation (aggregates over its devices)."""

    attempt: int | None
    node: str
    source: str
    final: bool
    updatedAt: str
    peakMemoryBytes: int | None
    meanMemoryBytes: int | None
    smActivityPercent: float | None
    smActivityPeakPercent: float | None
    smActivitySource: str
    samples: int
    window: ObservedWindow
    gpus: list[ObservedGpu]
    note: NotRequired[str]


def timestamp(at: datetime) -> str:
    """RFC 3339 in UTC, as the API server writes times."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _round(value: float | None) -> int | None:
    return None if value is None else round(value)


def _percent(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def build_pod_observed(
    windows: Sequence[window_mod.Window], *, node: str, source: str, final: bool, now: datetime
) -> PodObserved:
    """One pod's entry from its windows (one per device; at least one)."""
    if not windows:
        raise ValueError("a pod observation needs at least one window")
    gpus: list[ObservedGpu] = [
        {
            "uuid": w.device_uuid,
            "modelName": w.model_name,
            "migProfile": w.mig_profile,
            "gpuInstanceId": w.gpu_instance_id,
            "peakMemoryBytes": w.peak_memory_bytes,
            "meanMemoryBytes": _round(w.mean_memory_bytes),
            "memorySource": w.memory_source,
            "smActivityPercent": _percent(w.mean_sm_percent),
            "smActivitySource": w.sm_source,
        }
        for w in windows
    ]
    peaks = [w.peak_memory_bytes for w in windows if w.peak_memory_bytes is not None]
    means = [w.mean_memory_bytes for w in windows if w.mean_memory_bytes is not None]
    sms = [w.mean_sm_percent for w in windows if w.mean_sm_percent is not None]
    sm_peaks = [w.peak_sm_percent for w in windows if w.peak_sm_percent is not None]
    start = min(w.started_at for w in windows)
    end = max(w.last_at or w.started_at for w in windows)
    return {
        "attempt": windows[0].pod.attempt,
        "node": node,
        "source": source,
        "final": final,
        "updatedAt": timestamp(now),
        "peakMemoryBytes": max(peaks) if peaks else None,
        "meanMemoryBytes": _round(max(means)) if means else None,
        "smActivityPercent": _percent(sum(sms) / len(sms)) if sms else None,
        "smActivityPeakPercent": _percent(max(sm_peaks)) if sm_peaks else None,
        "smActivitySource": "/".join(sorted({w.sm_source for w in windows})),
        "samples": max(w.samples for w in windows),
        "window": {
            "start": timestamp(start),
            "end": timestamp(end),
            "warmupSeconds": windows[0].warmup_s,
            "warmedUp": all(w.warmed_up for w in windows),
        },
        "gpus": gpus,
    }


def build_patch(pod_name: str, observed: PodObserved) -> dict[str, Any]:
    """The merge patch of `status` that writes one pod's entry and nothing else."""
    return {"observed": {"pods": {pod_name: dict(observed)}}}


def read_pods(status: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """`status.observed.pods` as written by `build_patch` (entries that are not objects are
    skipped)."""
    observed = status.get("observed")
    if not isinstance(observed, Mapping):
        return {}
    pods = observed.get("pods")
    if not isinstance(pods, Mapping):
        return {}
    return {str(k): v for k, v in pods.items() if isinstance(v, Mapping)}


def attempt_entries(status: Mapping[str, Any], attempt: int) -> list[Mapping[str, Any]]:
    """The entries of one attempt's pods."""
    return [e for e in read_pods(status).values() if e.get("attempt") == attempt]

"""The demo's last act: a GPU profiler per node beside the demo's jobs, and each job's
prediction against its observation.

A local control plane has fake GPU nodes and no GPU. What happens on a real node is kept,
except at its two outermost edges: a real `kubeseer profiler` process runs per GPU node, as the
DaemonSet would, with NVML answered by the stand-in from a scenario file and the host's /proc
replaced by a directory of cgroup files (`kubeseer.demo_nvml`); each pod's process uses the
memory `kubeseer.demo_truth` derived for the job's model, never its prediction. SM activity has
no source without a GPU, and the profiler says `unavailable`.

The profilers patch each DLJob's `status.observed`; the demo then ends the pods as a kubelet
reports containers that exited 0 (or OOMKilled where the derivation does not fit the device),
and the operator compares the observations with its predictions (feedback metrics) and records
every attempt in its observation store, which the demo reads back.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubeseer import demo_nvml
from kubeseer.devcluster import inventory

PROCESS_PID_BASE = 41000
"""Host PIDs given to the demo pods' processes (any unused numbers; the /proc is the demo's)."""
SETTINGS = ("--period", "0.5", "--warmup", "2", "--report-interval", "1", "--pods-refresh", "1")
"""Profiler settings for a demo: sample twice a second, a warm-up of 2 s, reports every second."""
KWOK_HOLD = {
    "pod-complete.stage.kwok.x-k8s.io/delay": "24h",
    "pod-complete.stage.kwok.x-k8s.io/jitter-delay": "24h",
}
"""Pod annotations that keep KWOK from completing a pod, so the profilers see it running."""


class ObserveError(RuntimeError):
    """A pod, a device or a profiler report the demo waited for did not come."""


ProfilerCommand = Callable[[str, list[str]], tuple[list[str], Mapping[str, str] | None]]
"""(node, the demo's arguments) -> the profiler's argv and environment (None: this one's)."""


@contextmanager
def profilers(
    nodes: Sequence[inventory.NodeSpec],
    pods: Sequence[demo_nvml.GpuPod],
    run_dir: Path,
    command: ProfilerCommand,
    start: Callable[[str, list[str], Mapping[str, str] | None], object],
) -> Iterator[list[str]]:
    """One profiler per GPU node, each with its node's scenario and /proc; yields their names.

    `start(name, argv, env)` runs a process (the demo's `Processes.start`), which is stopped by
    whoever owns it.
    """
    names: list[str] = []
    first_pid = PROCESS_PID_BASE
    for node in nodes:
        if node.gpu_model is None:
            continue
        scenario, pids = demo_nvml.node_scenario(
            node, [p for p in pods if p.node == node.name], first_pid
        )
        first_pid += len(pids)
        scenario_path = run_dir / f"nvml-{node.name}.json"
        scenario_path.write_text(json.dumps(scenario, indent=1))
        proc = demo_nvml.write_proc(run_dir / f"proc-{node.name}", pids)
        argv, env = command(
            node.name,
            ["--nvml-standin", str(scenario_path), "--proc-root", str(proc), *SETTINGS],
        )
        start(f"profiler-{node.name}", argv, env)
        names.append(f"profiler-{node.name}")
    yield names


def observed_entry(job: Mapping[str, Any], pod: str) -> Mapping[str, Any] | None:
    """The profiler's entry for `pod` in the DLJob's `status.observed`, if any."""
    entry = (((job.get("status") or {}).get("observed") or {}).get("pods") or {}).get(pod)
    return entry if isinstance(entry, Mapping) else None


def wait(what: str, probe: Callable[[], Any], timeout_s: float, interval_s: float = 0.5) -> Any:
    """Poll until `probe()` is truthy and return it."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ObserveError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


def end_pod(core: Any, namespace: str, name: str, *, out_of_memory: bool = False) -> None:
    """End a running pod as a kubelet reports its containers: exited 0, or killed by the
    kernel's OOM killer (KWOK runs no container)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    terminated = {
        "exitCode": 137 if out_of_memory else 0,
        "reason": "OOMKilled" if out_of_memory else "Completed",
        "startedAt": now,
        "finishedAt": now,
    }
    statuses = [
        {
            "name": c.name,
            "image": c.image,
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "state": {"terminated": terminated},
        }
        for c in core.read_namespaced_pod(name, namespace).spec.containers
    ]
    phase = "Failed" if out_of_memory else "Succeeded"
    core.patch_namespaced_pod_status(
        name, namespace, {"status": {"phase": phase, "containerStatuses": statuses}}
    )


def scrape(url: str) -> str:
    """A `/metrics` page."""
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


@dataclass(frozen=True)
class JobObservation:
    """One DLJob's prediction, what the profiler reported for its pods, and the operator's
    record of its first attempt.

    Attributes:
        dljob: the DLJob's name.
        resource: the GPU resource its pods got.
        predicted_bytes, upper_bytes: the prediction's point and calibrated upper bound.
        observed_bytes: the profiler's peak over the job's pods (`status.observed`).
        required_bytes: the least the job runs in, derived (not what NVML shows).
        out_of_memory: the derivation says the job does not fit its device; the demo ended
            its pod as the OOM killer would.
        observed_source: where the profiler's figures came from (`nvml-standin` here).
        sm_source: the SM activity reading (`unavailable` without a GPU).
        record: the operator's observation of the attempt, from its store.
        not_derived: why the job's memory was not derived (its pods then had no process).
    """

    dljob: str
    resource: str
    predicted_bytes: int
    upper_bytes: int
    observed_bytes: int | None
    required_bytes: int | None
    out_of_memory: bool
    observed_source: str | None
    sm_source: str | None
    record: Any
    not_derived: str = ""


@dataclass
class _Derivations:
    """The demo pods with their derived memory, and what is known per DLJob."""

    pods: list[demo_nvml.GpuPod]
    required: dict[str, int]
    out_of_memory: set[str]
    not_derived: dict[str, str]


def observe(
    api: Any,
    namespace: str,
    nodes: Sequence[inventory.NodeSpec],
    run_dir: Path,
    store_dir: Path,
    command: ProfilerCommand,
    start: Callable[[str, list[str], Mapping[str, str] | None], object],
    *,
    timeout_s: float = 120.0,
) -> list[JobObservation]:
    """Derive every DLJob pod's memory, profile the GPU nodes, end the pods once the profilers
    have watched them past their warm-up, and collect what the operator recorded."""
    from kubernetes import client

    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    known = _derive_pods(core, _dljobs(custom, namespace), namespace, nodes)
    watched = [p for p in known.pods if p.used_bytes is not None]
    with profilers(nodes, known.pods, run_dir, command, start):

        def warmed_up() -> bool:
            now = {j["metadata"]["name"]: j for j in _dljobs(custom, namespace)}
            entries = [observed_entry(now[p.dljob], p.name) for p in watched]
            return all(e and (e.get("window") or {}).get("warmedUp") for e in entries)

        wait("every profiled pod reported past its warm-up", warmed_up, timeout_s)
        for pod in known.pods:
            end_pod(core, namespace, pod.name, out_of_memory=pod.dljob in known.out_of_memory)

        def finished() -> list[dict[str, Any]] | None:
            now = _dljobs(custom, namespace)
            by_job = {j["metadata"]["name"]: j for j in now}
            done = all(_first_attempt_ended(j) for j in now)
            final = all(
                (observed_entry(by_job[p.dljob], p.name) or {}).get("final") for p in watched
            )
            return now if done and final else None

        settled = wait("every DLJob's first attempt ended and reported", finished, timeout_s)
        found = wait(
            "the operator's record of every first attempt",
            lambda: _recorded(store_dir, namespace, settled, known),
            timeout_s,
        )
    return [_result(j, found.get(j["metadata"]["name"]), known) for j in settled]


def _derive_pods(
    core: Any,
    jobs: Sequence[Mapping[str, Any]],
    namespace: str,
    nodes: Sequence[inventory.NodeSpec],
) -> _Derivations:
    from kubeseer import demo_truth

    by_name = {n.name: n for n in nodes}
    known = _Derivations([], {}, set(), {})
    for job in jobs:
        name, spec = job["metadata"]["name"], job["spec"]
        model = _model(core, namespace, spec)
        listed: Any = core.list_namespaced_pod(
            namespace, label_selector=f"kubeseer.io/dljob={name},kubeseer.io/attempt=0"
        )
        for pod in listed.items:
            node = by_name.get(pod.spec.node_name or "")
            if node is None or node.gpu_model is None:
                raise ObserveError(f"pod {pod.metadata.name} is not on a GPU node of the demo")
            resource = demo_nvml.gpu_resource(pod)
            used = None
            try:
                derived = demo_truth.derive(
                    model, spec, node.gpu_model.product, demo_nvml.device_memory(node, resource)
                )
            except demo_truth.NotDerivableError as e:
                known.not_derived[name] = str(e)
            else:
                used = derived.observed_bytes
                known.required[name] = max(known.required.get(name, 0), derived.required_bytes)
                if derived.out_of_memory:
                    known.out_of_memory.add(name)
            known.pods.append(
                demo_nvml.GpuPod(namespace, pod.metadata.name, pod.metadata.uid, node.name, name,
                       resource, used)
            )  # fmt: skip
    return known


def _first_attempt_ended(job: Mapping[str, Any]) -> bool:
    """The DLJob finished, or its first attempt ended (an out-of-memory escalates)."""
    status = job.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    return any(a.get("attempt") == 0 for a in status.get("attempts") or [])


def _recorded(
    store_dir: Path,
    namespace: str,
    jobs: Sequence[Mapping[str, Any]],
    known: _Derivations,
) -> dict[str, Any] | None:
    """Each DLJob's record of its first attempt, once every one is there (with the profiler's
    observation, where its pods had a process)."""
    from kubeseer.observations import store

    first = {
        o.dljob: o
        for o in store.open_store(str(store_dir)).read().observations
        if o.namespace == namespace and o.attempt == 0
    }
    for job in jobs:
        name = job["metadata"]["name"]
        observed = name in known.not_derived or name in known.out_of_memory
        if name not in first or not (observed or first[name].observed_peak_memory_bytes):
            return None
    return first


def _dljobs(custom: Any, namespace: str) -> list[dict[str, Any]]:
    body = custom.list_namespaced_custom_object("kubeseer.io", "v1alpha1", namespace, "dljobs")
    return sorted((dict(i) for i in body["items"]), key=lambda j: str(j["metadata"]["name"]))


def _model(core: Any, namespace: str, spec: Mapping[str, Any]) -> Any:
    """The DLJob's ONNX model from its ConfigMap (the examples keep theirs there)."""
    import base64

    import onnx

    ref = (spec.get("model") or {}).get("configMapRef")
    if not ref:
        raise ObserveError("the demo derives the memory of ConfigMap models only")
    config_map = core.read_namespaced_config_map(ref["name"], namespace)
    data = (config_map.binary_data or {}).get(ref["key"])
    if data is None:
        raise ObserveError(f"ConfigMap {ref['name']} has no binary key {ref['key']}")
    return onnx.load_from_string(base64.b64decode(data))


def _result(job: Mapping[str, Any], observation: Any, known: _Derivations) -> JobObservation:
    name = job["metadata"]["name"]
    status = job.get("status") or {}
    prediction = status.get("prediction") or {}
    entries = [e for e in ((status.get("observed") or {}).get("pods") or {}).values() if e]
    peaks = [int(e["peakMemoryBytes"]) for e in entries if e.get("peakMemoryBytes")]
    first: Mapping[str, Any] = next(
        (a for a in status.get("attempts") or [] if a.get("attempt") == 0), {}
    )
    return JobObservation(
        dljob=name,
        resource=str(first.get("resource") or (status.get("placement") or {}).get("resource")),
        predicted_bytes=int(prediction.get("memoryPointBytes", 0)),
        upper_bytes=int(prediction.get("memoryUpperBytes", 0)),
        observed_bytes=max(peaks) if peaks else None,
        required_bytes=known.required.get(name),
        out_of_memory=name in known.out_of_memory,
        observed_source=entries[0].get("source") if entries else None,
        sm_source=entries[0].get("smActivitySource") if entries else None,
        record=observation,
        not_derived=known.not_derived.get(name, ""),
    )

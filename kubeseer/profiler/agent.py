"""The sampling loop: NVML every period, attribution, windows, metrics and status reports.

One round reads every device once (`nvml.Nvml.sample`), attributes the readings to the node's
DLJob pods, folds them into the pods' windows and sets the per-pod gauges. The node's pod list
is refreshed every `pods_refresh_s`, and at once (at most once a round) when a GPU process
belongs to a pod the agent has not seen yet, so a new pod is attributed from its first sample
without listing pods every second. Each DLJob pod's `status.observed` entry is patched every
`report_interval_s` while it runs, and a last time when it ends (its phase is terminal or it
left the node); then its windows and series are dropped.

A failed report is retried on the next round; a DLJob that no longer exists is forgotten. NVML
errors are counted and sampling carries on: one bad query never stops the agent.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from kubeseer import metrics
from kubeseer.profiler import attribution, cgroup, kube, report, window
from kubeseer.profiler import nvml as nvml_facade

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentConfig:
    """How the agent samples and reports (`kubeseer profiler --help` names the flags).

    Attributes:
        node: the node the agent runs on (its pods are the ones it attributes).
        period_s: seconds between sampling rounds.
        warmup_s: seconds after a pod is first seen on a device left out of the means.
        report_interval_s: seconds between status reports of a running pod.
        pods_refresh_s: seconds between listings of the node's pods.
        rediscover_s: seconds between enumerations of the node's GPUs and MIG devices.
        proc_root: the host's /proc.
        source: what `status.observed.*.source` says the readings come from.
    """

    node: str
    period_s: float = 1.0
    warmup_s: float = 30.0
    report_interval_s: float = 15.0
    pods_refresh_s: float = 10.0
    rediscover_s: float = 60.0
    proc_root: Path = Path("/proc")
    source: str = report.SOURCE_NVML

    def __post_init__(self) -> None:
        if not self.node:
            raise ValueError("the node name is required (set NODE_NAME from spec.nodeName)")
        for name in ("period_s", "report_interval_s", "pods_refresh_s", "rediscover_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.warmup_s < 0:
            raise ValueError(f"warmup_s must be >= 0, got {self.warmup_s}")


class Api(Protocol):
    """The API calls the agent makes (`kube.ProfilerApi`)."""

    def node_pods(self, node: str) -> list[Mapping[str, Any]]: ...

    def node_resource_slices(self, node: str) -> list[Mapping[str, Any]]: ...

    def resource_claim(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...

    def patch_dljob_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> bool: ...


class Agent:
    """Samples one node's GPUs and reports what its DLJob pods use.

    Args:
        config: settings.
        nvml: the node's GPUs (its error sink should be `Agent.nvml_error`).
        api: the API server.
        profiler_metrics: where the series go.
        clock: monotonic seconds (windows and intervals).
        wall: wall-clock time (timestamps in reports).
    """

    def __init__(
        self,
        config: AgentConfig,
        nvml: nvml_facade.Nvml,
        api: Api,
        profiler_metrics: metrics.ProfilerMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.config = config
        self.nvml = nvml
        self.api = api
        self.metrics = profiler_metrics
        self.clock = clock
        self.wall = wall
        self.procs = cgroup.ProcReader(config.proc_root)
        self.windows = window.Windows(config.warmup_s)
        self.pods: dict[str, attribution.PodInfo] = {}
        self._slices: list[Mapping[str, Any]] = []
        self._claims: dict[tuple[str, str], Mapping[str, Any]] = {}
        self._pods_listed = -float("inf")
        self._discovered = clock()
        self._reported: dict[str, float] = {}
        self._left_node: set[str] = set()
        self._listed: set[str] = set()
        self._series: dict[str, set[tuple[str, ...]]] = {}
        self.metrics.devices.set(len(nvml.devices))

    def nvml_error(self, error: nvml_facade.NvmlCallError) -> None:
        """Count an NVML error (the `Nvml` error sink)."""
        log.debug("NVML: %s", error)
        self.metrics.nvml_errors.labels(error=error.kind).inc()

    # -- one round ------------------------------------------------------------------------------

    def step(self) -> None:
        """One sampling round, then the reports that are due."""
        start = time.perf_counter()
        now, now_at = self.clock(), self.wall()
        if now - self._discovered >= self.config.rediscover_s:
            self._rediscover(now)
        if now - self._pods_listed >= self.config.pods_refresh_s:
            self._list_pods(now)
        samples = self.nvml.sample()
        if self._unknown_pod_seen(samples) and self._pods_listed < now:
            self._list_pods(now)
        claimed = attribution.claimed_devices(
            self.pods.values(), self._claims, self._slices, self.nvml.devices
        )
        found = attribution.attribute(samples, self.pods, self.procs.container_of, claimed)
        self.windows.add(found.readings, now, now_at)
        self._export(found)
        self.metrics.samples.inc()
        self.metrics.sample_duration.observe(time.perf_counter() - start)
        self._report(now, now_at)

    def run(self, stop: threading.Event) -> None:
        """Rounds every `period_s` until `stop` is set; pods still open get a last report."""
        try:
            while not stop.is_set():
                began = self.clock()
                try:
                    self.step()
                except Exception:  # one bad round must not end the DaemonSet's pod
                    log.exception("sampling round failed")
                stop.wait(max(0.0, self.config.period_s - (self.clock() - began)))
        finally:
            self.nvml.close()

    # -- inputs ---------------------------------------------------------------------------------

    def _rediscover(self, now: float) -> None:
        self._discovered = now
        try:
            self.nvml.discover()
        except nvml_facade.NvmlCallError as e:
            self.nvml_error(e)
        self.metrics.devices.set(len(self.nvml.devices))

    def _list_pods(self, now: float) -> None:
        """Refresh the node's pods, ResourceSlices and the claims the pods name."""
        self._pods_listed = now
        try:
            listed = [attribution.pod_info(p) for p in self.api.node_pods(self.config.node)]
            self._slices = self.api.node_resource_slices(self.config.node)
        except kube.ApiError as e:
            log.warning("%s", e)
            return
        # A pod that left the node is kept until its final report goes out.
        fresh = {p.uid: p for p in listed}
        self._listed = set(fresh)
        gone = {uid: p for uid, p in self.pods.items() if uid not in fresh}
        self.pods = {**gone, **fresh}
        for uid in gone:
            if uid not in self.windows.pods():
                del self.pods[uid]
        wanted = {(p.namespace, c) for p in fresh.values() for c in p.claims}
        self._claims = {k: v for k, v in self._claims.items() if k in wanted}
        for namespace, name in wanted - set(self._claims):
            try:
                claim = self.api.resource_claim(namespace, name)
            except kube.ApiError as e:
                log.warning("%s", e)
                continue
            if claim is not None and (claim.get("status") or {}).get("allocation"):
                self._claims[(namespace, name)] = claim
        self._left_node = set(gone)

    def _unknown_pod_seen(self, samples: list[nvml_facade.DeviceSample]) -> bool:
        for sample in samples:
            for process in sample.processes or ():
                ref = self.procs.container_of(process.pid)
                if ref is not None and ref.pod_uid not in self.pods:
                    return True
        return False

    # -- outputs --------------------------------------------------------------------------------

    @staticmethod
    def _labels(pod: attribution.PodInfo, w: window.Window) -> tuple[str, ...]:
        return (
            pod.namespace,
            pod.name,
            pod.dljob or "",
            w.device_uuid,
            w.model_name,
            w.mig_profile or "",
            "" if w.gpu_instance_id is None else str(w.gpu_instance_id),
        )

    def _export(self, found: attribution.Attribution) -> None:
        self.metrics.unattributed_processes.set(found.unattributed_processes)
        for reading in found.readings:
            for w in self.windows.of_pod(reading.pod.uid):
                if w.device_uuid != reading.device.uuid:
                    continue
                labels = self._labels(reading.pod, w)
                self._series.setdefault(reading.pod.uid, set()).add(labels)
                if reading.memory_bytes is not None:
                    self.metrics.pod_memory.labels(*labels).set(reading.memory_bytes)
                if w.peak_memory_bytes is not None:
                    self.metrics.pod_memory_peak.labels(*labels).set(w.peak_memory_bytes)
                if reading.sm_percent is not None:
                    self.metrics.pod_sm_activity.labels(*labels).set(reading.sm_percent)
                self._export_prediction(reading.pod, labels, reading.device.memory_total_bytes)

    def _export_prediction(
        self, pod: attribution.PodInfo, labels: tuple[str, ...], device_memory_bytes: int
    ) -> None:
        """The operator's prediction beside the observation, on the same labels, so that a
        dashboard or an alert compares them without joins."""
        self.metrics.pod_device_memory.labels(*labels).set(device_memory_bytes)
        for bound, key in (
            (metrics.PredictedBound.POINT, attribution.PREDICTED_MEMORY_POINT),
            (metrics.PredictedBound.UPPER, attribution.PREDICTED_MEMORY_UPPER),
        ):
            if key in pod.predicted:
                self.metrics.pod_predicted_memory.labels(*labels, bound).set(pod.predicted[key])
        if attribution.PREDICTED_SM_UTIL in pod.predicted:
            self.metrics.pod_predicted_sm_activity.labels(*labels).set(
                pod.predicted[attribution.PREDICTED_SM_UTIL]
            )

    def _report(self, now: float, now_at: datetime) -> None:
        for uid in sorted(self.windows.pods()):
            pod = self.pods.get(uid)
            windows = self.windows.of_pod(uid)
            if pod is None or pod.dljob is None or not windows:
                continue
            final = pod.terminal or uid in self._left_node
            due = now - self._reported.get(uid, -float("inf")) >= self.config.report_interval_s
            if not (final or due):
                continue
            entry = report.build_pod_observed(
                windows, node=self.config.node, source=self.config.source, final=final, now=now_at
            )
            outcome = self._patch(pod.namespace, pod.dljob, pod.name, entry)
            if outcome is metrics.ReportOutcome.GONE or (
                final and outcome is metrics.ReportOutcome.PATCHED
            ):
                self._forget(uid)
            elif outcome is metrics.ReportOutcome.PATCHED or not final:
                # A failed final report is retried next round; a running pod's at the interval.
                self._reported[uid] = now

    def _patch(
        self, namespace: str, dljob: str, pod_name: str, entry: report.PodObserved
    ) -> metrics.ReportOutcome:
        try:
            patched = self.api.patch_dljob_status(
                namespace, dljob, report.build_patch(pod_name, entry)
            )
        except kube.ApiError as e:
            log.warning("%s", e)
            outcome = metrics.ReportOutcome.FAILED
        else:
            outcome = metrics.ReportOutcome.PATCHED if patched else metrics.ReportOutcome.GONE
        self.metrics.reports.labels(outcome=outcome).inc()
        return outcome

    def _forget(self, uid: str) -> None:
        self.windows.close(uid)
        self._reported.pop(uid, None)
        for labels in self._series.pop(uid, set()):
            for gauge in (
                self.metrics.pod_memory,
                self.metrics.pod_memory_peak,
                self.metrics.pod_sm_activity,
                self.metrics.pod_device_memory,
                self.metrics.pod_predicted_sm_activity,
            ):
                with contextlib.suppress(KeyError):  # never set (no reading of that kind)
                    gauge.remove(*labels)
            for bound in metrics.PredictedBound:
                with contextlib.suppress(KeyError):
                    self.metrics.pod_predicted_memory.remove(*labels, bound)
        self._left_node.discard(uid)
        if uid not in self._listed:
            self.pods.pop(uid, None)

"""A pynvml stand-in for machines without a GPU: NVML's documented answers over a scenario.

The profiler reaches NVML through one module attribute (`kubeseer.profiler.nvml.pynvml`);
`install` puts a `StandIn` there. It implements exactly the pynvml functions the profiler calls,
returning what NVML documents for each: pynvml's own structures (`c_nvmlMemory_t`,
`c_nvmlUtilization_t`, `c_nvmlGpmSupport_t`, process records with ``usedGpuMemory = None`` where
NVML says "not available"), `NVMLError_NotFound` for an empty MIG slot,
`NVMLError_NotSupported` for utilisation on a MIG device or a GPU in MIG mode and for MIG queries
on a GPU without MIG, `isSupportedDevice = 0` from GPM on GPUs older than Hopper, and GPM
metrics computed between two samples. Errors can be forced per function (`Scenario.errors`),
for example `NVMLError_NoPermission` from the process listing.

It exists for the end-to-end tests and the demo on machines without a GPU; everything it
reports is labelled as coming from the stand-in (`source` in `status.observed`). The answers
are NVML's documented ones, not recorded from a driver: recorded fixtures need a GPU session.
A scenario is plain data (`Scenario.from_dict`), so a JSON file drives `kubeseer profiler
--nvml-standin FILE`.
"""

# ruff: noqa: N802, N815  (the stand-in mirrors pynvml's camel-case names)

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml

from kubeseer.profiler import nvml as profiler_nvml


@dataclass(frozen=True)
class MigDevice:
    """A MIG device of a GPU in MIG mode."""

    uuid: str
    profile: str
    gpu_instance_id: int
    memory_total_bytes: int
    slot: int


@dataclass(frozen=True)
class Gpu:
    """A physical GPU.

    Attributes:
        gpm: GPM present (Hopper and later); `isSupportedDevice` answers it.
        mig_capable: the GPU supports MIG at all (A100, H100); else MIG queries are unsupported.
        mig: the MIG devices when MIG mode is on (empty tuple: MIG mode on, no devices yet);
            None when MIG mode is off.
        max_mig_devices: `nvmlDeviceGetMaxMigDeviceCount` (7 on A100 and H100).
    """

    uuid: str
    name: str
    memory_total_bytes: int
    gpm: bool = False
    mig_capable: bool = False
    mig: tuple[MigDevice, ...] | None = None
    max_mig_devices: int = 7


@dataclass(frozen=True)
class Process:
    """A process with a compute context on a device (GPU or MIG UUID), live in [start, end).

    `used_bytes` is what NVML reports for it (None: NVML_VALUE_NOT_AVAILABLE); `profile`, if
    given, is a list of (seconds since start, bytes) steps that replaces it over time.
    `sm_activity_percent` is the share of the device's SMs it keeps busy.
    """

    pid: int
    device: str
    used_bytes: int | None
    sm_activity_percent: float = 0.0
    start_s: float = 0.0
    end_s: float | None = None
    profile: tuple[tuple[float, int], ...] = ()

    def alive(self, t: float) -> bool:
        return self.start_s <= t and (self.end_s is None or t < self.end_s)

    def memory(self, t: float) -> int | None:
        used = self.used_bytes
        for at, value in self.profile:
            if t - self.start_s >= at:
                used = value
        return used


@dataclass(frozen=True)
class Scenario:
    """GPUs, processes and forced errors (function name -> NVML error code)."""

    gpus: tuple[Gpu, ...]
    processes: tuple[Process, ...] = ()
    errors: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Scenario:
        """A scenario from plain data (the JSON file format, documented in docs/profiler.md)."""
        gpus = []
        for g in data["gpus"]:
            mig = g.get("mig")
            gpus.append(
                Gpu(
                    uuid=str(g["uuid"]),
                    name=str(g["name"]),
                    memory_total_bytes=int(g["memory_total_bytes"]),
                    gpm=bool(g.get("gpm", False)),
                    mig_capable=bool(g.get("mig_capable", mig is not None)),
                    mig=None
                    if mig is None
                    else tuple(
                        MigDevice(
                            uuid=str(m["uuid"]),
                            profile=str(m["profile"]),
                            gpu_instance_id=int(m["gpu_instance_id"]),
                            memory_total_bytes=int(m["memory_total_bytes"]),
                            slot=int(m.get("slot", i)),
                        )
                        for i, m in enumerate(mig)
                    ),
                )
            )
        processes = tuple(
            Process(
                pid=int(p["pid"]),
                device=str(p["device"]),
                used_bytes=None if p.get("used_bytes") is None else int(p["used_bytes"]),
                sm_activity_percent=float(p.get("sm_activity_percent", 0.0)),
                start_s=float(p.get("start_s", 0.0)),
                end_s=None if p.get("end_s") is None else float(p["end_s"]),
                profile=tuple((float(a), int(b)) for a, b in p.get("profile", ())),
            )
            for p in data.get("processes", ())
        )
        errors = {str(k): int(v) for k, v in (data.get("errors") or {}).items()}
        return cls(tuple(gpus), processes, errors)


@dataclass(frozen=True)
class _Handle:
    gpu: Gpu
    mig: MigDevice | None = None

    @property
    def uuid(self) -> str:
        return self.mig.uuid if self.mig else self.gpu.uuid


class _GpmSample:
    def __init__(self) -> None:
        self.at: float | None = None
        self.busy: float = 0.0
        self.freed = False


class _Metric:
    def __init__(self) -> None:
        self.metricId = 0
        self.nvmlReturn = 0
        self.value = 0.0


class GpmMetricsGet:
    """The fields of pynvml's `c_nvmlGpmMetricsGet_t` the profiler sets and reads."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [_Metric() for _ in range(pynvml.NVML_GPM_METRIC_MAX)]


class StandIn:
    """pynvml's functions, answering from a `Scenario` on a clock.

    Args:
        scenario: what the node has and runs.
        clock: seconds since the scenario started (default: wall time since construction).
    """

    NVMLError = pynvml.NVMLError
    c_nvmlGpmMetricsGet_t = GpmMetricsGet
    NVML_GPM_METRICS_GET_VERSION = pynvml.NVML_GPM_METRICS_GET_VERSION
    NVML_GPM_METRIC_SM_UTIL = pynvml.NVML_GPM_METRIC_SM_UTIL

    def __init__(self, scenario: Scenario, clock: Callable[[], float] | None = None) -> None:
        self.scenario = scenario
        started = time.monotonic()
        self._clock = clock or (lambda: time.monotonic() - started)
        self.initialised = 0
        self.calls: list[str] = []
        self.live_gpm_samples = 0
        # Cumulative SM busy-seconds per device, integrated at every call that reads it.
        self._busy: dict[str, float] = {}
        self._busy_at: dict[str, float] = {}

    # -- plumbing -------------------------------------------------------------------------------

    def _enter(self, name: str) -> None:
        self.calls.append(name)
        code = self.scenario.errors.get(name)
        if code is not None:
            raise pynvml.NVMLError(code)
        if name != "nvmlInit" and self.initialised <= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    @staticmethod
    def _error(code: int) -> pynvml.NVMLError:
        return pynvml.NVMLError(code)

    def _processes_on(self, uuid: str, t: float) -> list[Process]:
        return [p for p in self.scenario.processes if p.device == uuid and p.alive(t)]

    def _children(self, gpu: Gpu) -> Sequence[str]:
        return [m.uuid for m in gpu.mig or ()]

    def _activity(self, uuid: str, t: float) -> float:
        return min(100.0, sum(p.sm_activity_percent for p in self._processes_on(uuid, t)))

    def _busy_seconds(self, uuid: str) -> float:
        """SM busy time of a device since the start, integrated at the calls' times."""
        t = self._clock()
        last = self._busy_at.get(uuid, 0.0)
        self._busy[uuid] = self._busy.get(uuid, 0.0) + (t - last) * self._activity(uuid, last) / 100
        self._busy_at[uuid] = t
        return self._busy[uuid]

    # -- library --------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.scenario.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.scenario.gpus):
            raise self._error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(self.scenario.gpus[index])

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        self._enter("nvmlDeviceGetUUID")
        return handle.uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        self._enter("nvmlDeviceGetName")
        if handle.mig is not None:
            return f"{handle.gpu.name} MIG {handle.mig.profile}"
        return handle.gpu.name

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle) -> pynvml.c_nvmlMemory_t:
        self._enter("nvmlDeviceGetMemoryInfo")
        t = self._clock()
        uuids = [handle.uuid] if handle.mig or handle.gpu.mig is None else []
        if handle.mig is None and handle.gpu.mig is not None:
            uuids = list(self._children(handle.gpu))
        used = sum(p.memory(t) or 0 for uuid in uuids for p in self._processes_on(uuid, t))
        total = handle.mig.memory_total_bytes if handle.mig else handle.gpu.memory_total_bytes
        return pynvml.c_nvmlMemory_t(total=total, free=max(0, total - used), used=used)

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        self._enter("nvmlDeviceGetMigMode")
        if handle.mig is not None or not handle.gpu.mig_capable:
            raise self._error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if handle.gpu.mig is not None else 0
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount")
        if not handle.gpu.mig_capable:
            raise self._error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return handle.gpu.max_mig_devices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex")
        for mig in handle.gpu.mig or ():
            if mig.slot == index:
                return _Handle(handle.gpu, mig)
        raise self._error(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceIsMigDeviceHandle(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceIsMigDeviceHandle")
        return int(handle.mig is not None)

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId")
        if handle.mig is None:
            raise self._error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return handle.mig.gpu_instance_id

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses")
        if handle.mig is None and handle.gpu.mig is not None:
            # Aggregated over MIG devices only with privileges the agent does not hold.
            raise self._error(pynvml.NVML_ERROR_NO_PERMISSION)
        t = self._clock()
        records = []
        for p in self._processes_on(handle.uuid, t):
            used = p.memory(t)
            info = pynvml.c_nvmlProcessInfo_v3_t(
                pid=p.pid,
                usedGpuMemory=pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
                if used is None
                else used,
                gpuInstanceId=handle.mig.gpu_instance_id
                if handle.mig
                else pynvml.NVML_VALUE_NOT_AVAILABLE_uint.value,
                computeInstanceId=0 if handle.mig else pynvml.NVML_VALUE_NOT_AVAILABLE_uint.value,
            )
            record = pynvml.nvmlStructToFriendlyObject(info)
            if record.usedGpuMemory == pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
                record.usedGpuMemory = None  # as pynvml itself rewrites it
            records.append(record)
        return records

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> pynvml.c_nvmlUtilization_t:
        self._enter("nvmlDeviceGetUtilizationRates")
        if handle.mig is not None or handle.gpu.mig is not None:
            raise self._error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        busy = self._activity(handle.uuid, self._clock())
        return pynvml.c_nvmlUtilization_t(gpu=round(busy), memory=0)

    def nvmlGpmQueryDeviceSupport(self, handle: _Handle) -> pynvml.c_nvmlGpmSupport_t:
        self._enter("nvmlGpmQueryDeviceSupport")
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(handle.gpu.gpm)
        return support

    def nvmlGpmSampleAlloc(self) -> _GpmSample:
        self._enter("nvmlGpmSampleAlloc")
        self.live_gpm_samples += 1
        return _GpmSample()

    def nvmlGpmSampleFree(self, sample: _GpmSample) -> None:
        self._enter("nvmlGpmSampleFree")
        if sample.freed:
            raise self._error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        sample.freed = True
        self.live_gpm_samples -= 1

    def nvmlGpmSampleGet(self, handle: _Handle, sample: _GpmSample) -> _GpmSample:
        self._enter("nvmlGpmSampleGet")
        if not handle.gpu.gpm or handle.gpu.mig is not None:
            raise self._error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        sample.at, sample.busy = self._clock(), self._busy_seconds(handle.uuid)
        return sample

    def nvmlGpmMigSampleGet(
        self, handle: _Handle, gpu_instance_id: int, sample: _GpmSample
    ) -> _GpmSample:
        self._enter("nvmlGpmMigSampleGet")
        if not handle.gpu.gpm:
            raise self._error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        for mig in handle.gpu.mig or ():
            if mig.gpu_instance_id == gpu_instance_id:
                sample.at, sample.busy = self._clock(), self._busy_seconds(mig.uuid)
                return sample
        raise self._error(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlGpmMetricsGet(self, query: GpmMetricsGet) -> GpmMetricsGet:
        self._enter("nvmlGpmMetricsGet")
        first, second = query.sample1, query.sample2
        if first.at is None or second.at is None or second.at <= first.at:
            raise self._error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for metric in query.metrics[: query.numMetrics]:
            if metric.metricId == pynvml.NVML_GPM_METRIC_SM_UTIL:
                metric.value = 100.0 * (second.busy - first.busy) / (second.at - first.at)
                metric.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return query


def install(standin: StandIn) -> None:
    """Make the profiler's NVML module answer from `standin` (until `uninstall`)."""
    profiler_nvml.pynvml = standin  # type: ignore[assignment]


def uninstall() -> None:
    """Give the profiler back the real pynvml."""
    profiler_nvml.pynvml = pynvml

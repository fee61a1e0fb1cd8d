"""Every NVML call the profiler makes, behind one small typed facade.

The agent needs what the measurement harness (`kubeseer.measure.nvml`) never asks for: the GPUs
of a node and their MIG devices, the processes on each device with their memory, and SM activity
of a MIG instance. It follows the harness's conventions: pynvml is one module attribute here
(`pynvml`), which tests on machines without a GPU replace with a stand-in answering these calls
as NVML documents them, and failures are `kubeseer.measure.nvml.NvmlError`, with the NVML return
code kept so that "not supported" can be told apart from a real error.

What NVML can report, and therefore what the agent reports:

- memory: per process on a whole GPU (`nvmlDeviceGetComputeRunningProcesses`); on a GPU in MIG
  mode, per process of each MIG device, queried on the MIG device's own handle (the parent's
  handle answers only with privileges the agent should not need);
- SM activity: GPM's SM utilisation (`NVML_GPM_METRIC_SM_UTIL`, Hopper and later) for a whole
  GPU (`nvmlGpmSampleGet`) or a MIG instance (`nvmlGpmMigSampleGet` on the parent with the GPU
  instance id); else NVML's "GPU busy" utilisation on a whole GPU; on a MIG device of a GPU
  without GPM (A100) nothing at all, which is reported as `SmSource.UNAVAILABLE`, never as 0.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

import pynvml as _real_pynvml

from kubeseer.measure import nvml as harness_nvml

# Tests swap this for a stand-in module exposing the same functions.
pynvml: types.ModuleType = _real_pynvml

_MIG_ENABLED: Final[int] = 1  # NVML_DEVICE_MIG_ENABLE
_ERROR_NAMES: Final[dict[int, str]] = {
    1: "uninitialized",
    2: "invalid_argument",
    3: "not_supported",
    4: "no_permission",
    6: "not_found",
    9: "driver_not_loaded",
    12: "library_not_found",
    13: "function_not_found",
    15: "gpu_lost",
}
ERROR_KINDS: Final[tuple[str, ...]] = (*_ERROR_NAMES.values(), "other")
"""Every value `NvmlCallError.kind` takes (the agent's error metric is labelled by it)."""


class NvmlCallError(harness_nvml.NvmlError):
    """One NVML call failed; `function` is the pynvml function, `kind` its error in words."""

    def __init__(self, function: str, code: int | None, message: str) -> None:
        super().__init__(f"{function}: {message}")
        self.function = function
        self.code = code
        self.kind = _ERROR_NAMES.get(code, "other") if code is not None else "other"

    @property
    def not_supported(self) -> bool:
        """NVML says the device cannot answer this query at all (not an agent fault)."""
        return self.kind in ("not_supported", "function_not_found")


def _call(function: str, *args: Any) -> Any:
    try:
        return getattr(pynvml, function)(*args)
    except pynvml.NVMLError as e:
        raise NvmlCallError(function, getattr(e, "value", None), str(e)) from e


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class SmSource(StrEnum):
    """Where a device's SM activity comes from."""

    GPM = "gpm-sm-activity"
    NVML_UTILIZATION = "nvml-utilization"
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class GpuDevice:
    """One device a pod can be given: a whole GPU, or a MIG device of one.

    Attributes:
        uuid: ``GPU-...`` for a whole GPU, ``MIG-...`` for a MIG device (what the device plugin
            and the DRA driver hand to containers).
        gpu_uuid: the physical GPU's UUID (the same as `uuid` for a whole GPU).
        index: NVML index of the physical GPU.
        model_name: the GPU's product name as NVML reports it (``NVIDIA A100-SXM4-80GB``).
        mig_profile: the MIG profile (``1g.10gb``), None for a whole GPU.
        gpu_instance_id: the MIG device's GPU instance id (dcgm-exporter's ``GPU_I_ID``).
        memory_total_bytes: the device's memory (a MIG device's own share).
        sm_source: how SM activity is read for it.
    """

    uuid: str
    gpu_uuid: str
    index: int
    model_name: str
    mig_profile: str | None
    gpu_instance_id: int | None
    memory_total_bytes: int
    sm_source: SmSource


@dataclass(frozen=True)
class ProcessUsage:
    """A process with a compute context on a device; `used_bytes` None where NVML cannot say."""

    pid: int
    used_bytes: int | None


@dataclass(frozen=True)
class DeviceSample:
    """One reading of one device.

    `processes` is None when NVML would not list them (an error, counted); `sm_percent` is None
    when the device has no SM activity source or this is GPM's first, priming sample.
    """

    device: GpuDevice
    memory_used_bytes: int | None
    processes: tuple[ProcessUsage, ...] | None
    sm_percent: float | None


ErrorSink = Callable[[NvmlCallError], None]


class Nvml:
    """The node's GPUs through NVML: discovery once (and again on demand), then samples.

    Args:
        on_error: called with every failed call that is not a plain "not supported" answer, so
            the agent can count them; sampling carries on with what the other calls returned.
    """

    def __init__(self, on_error: ErrorSink = lambda _e: None) -> None:
        self._on_error = on_error
        _call("nvmlInit")
        self._handles: dict[str, Any] = {}
        self._parents: dict[str, Any] = {}
        self._gpm: dict[str, Any] = {}
        self.devices: tuple[GpuDevice, ...] = ()
        self.discover()

    def close(self) -> None:
        """Free GPM samples and release NVML."""
        for uuid in list(self._gpm):
            self._free_gpm(uuid)
        _call("nvmlShutdown")

    # -- discovery ------------------------------------------------------------------------------

    def discover(self) -> tuple[GpuDevice, ...]:
        """Enumerate the node's GPUs and, on GPUs in MIG mode, their MIG devices.

        A MIG layout can change while the agent runs (the MIG manager reconfigures a node), so
        the agent calls this again from time to time; GPM state of devices that vanished is
        freed.

        Raises:
            NvmlCallError: the GPUs cannot be counted or a GPU's handle cannot be had.
        """
        devices: list[GpuDevice] = []
        handles: dict[str, Any] = {}
        parents: dict[str, Any] = {}
        for index in range(int(_call("nvmlDeviceGetCount"))):
            handle = _call("nvmlDeviceGetHandleByIndex", index)
            gpu_uuid = _text(_call("nvmlDeviceGetUUID", handle))
            model_name = _text(_call("nvmlDeviceGetName", handle))
            gpm = self._gpm_supported(handle)
            if self._mig_enabled(handle):
                for mig in self._mig_handles(handle):
                    device = self._mig_device(mig, gpu_uuid, index, model_name, gpm)
                    devices.append(device)
                    handles[device.uuid] = mig
                    parents[device.uuid] = handle
                continue
            source = (
                SmSource.GPM
                if gpm
                else SmSource.NVML_UTILIZATION
                if self._utilisation_supported(handle)
                else SmSource.UNAVAILABLE
            )
            total = int(_call("nvmlDeviceGetMemoryInfo", handle).total)
            devices.append(
                GpuDevice(gpu_uuid, gpu_uuid, index, model_name, None, None, total, source)
            )
            handles[gpu_uuid] = handle
            parents[gpu_uuid] = handle
        for uuid in set(self._gpm) - set(handles):
            self._free_gpm(uuid)
        self._handles, self._parents = handles, parents
        self.devices = tuple(devices)
        return self.devices

    def _mig_enabled(self, handle: Any) -> bool:
        try:
            current, _pending = _call("nvmlDeviceGetMigMode", handle)
        except NvmlCallError as e:
            if not e.not_supported:
                self._on_error(e)
            return False
        return int(current) == _MIG_ENABLED

    def _mig_handles(self, handle: Any) -> list[Any]:
        found = []
        for slot in range(int(_call("nvmlDeviceGetMaxMigDeviceCount", handle))):
            try:
                found.append(_call("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot))
            except NvmlCallError as e:
                # NVML answers NOT_FOUND for a slot without a MIG device: the normal case.
                if e.kind != "not_found":
                    self._on_error(e)
        return found

    def _mig_device(
        self, mig: Any, gpu_uuid: str, index: int, model_name: str, gpm: bool
    ) -> GpuDevice:
        # MIG device names end in their profile: "NVIDIA A100-SXM4-80GB MIG 1g.10gb".
        name = _text(_call("nvmlDeviceGetName", mig))
        profile = name.partition(" MIG ")[2] or None
        return GpuDevice(
            uuid=_text(_call("nvmlDeviceGetUUID", mig)),
            gpu_uuid=gpu_uuid,
            index=index,
            model_name=model_name,
            mig_profile=profile,
            gpu_instance_id=int(_call("nvmlDeviceGetGpuInstanceId", mig)),
            memory_total_bytes=int(_call("nvmlDeviceGetMemoryInfo", mig).total),
            sm_source=SmSource.GPM if gpm else SmSource.UNAVAILABLE,
        )

    def _gpm_supported(self, handle: Any) -> bool:
        try:
            return bool(_call("nvmlGpmQueryDeviceSupport", handle).isSupportedDevice)
        except NvmlCallError as e:
            if not e.not_supported:
                self._on_error(e)
            return False

    def _utilisation_supported(self, handle: Any) -> bool:
        try:
            _call("nvmlDeviceGetUtilizationRates", handle)
        except NvmlCallError as e:
            if not e.not_supported:
                self._on_error(e)
            return False
        return True

    # -- sampling -------------------------------------------------------------------------------

    def sample(self) -> list[DeviceSample]:
        """Read every known device once; a failed call leaves its field None and is reported."""
        return [self._sample(device) for device in self.devices]

    def _sample(self, device: GpuDevice) -> DeviceSample:
        handle = self._handles[device.uuid]
        used: int | None = None
        processes: tuple[ProcessUsage, ...] | None = None
        try:
            used = int(_call("nvmlDeviceGetMemoryInfo", handle).used)
        except NvmlCallError as e:
            self._on_error(e)
        try:
            processes = tuple(
                ProcessUsage(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory))
                for p in _call("nvmlDeviceGetComputeRunningProcesses", handle)
            )
        except NvmlCallError as e:
            self._on_error(e)
        return DeviceSample(device, used, processes, self._sm_percent(device, handle))

    def _sm_percent(self, device: GpuDevice, handle: Any) -> float | None:
        try:
            if device.sm_source is SmSource.GPM:
                return self._gpm_sm_activity(device)
            if device.sm_source is SmSource.NVML_UTILIZATION:
                return float(_call("nvmlDeviceGetUtilizationRates", handle).gpu)
        except NvmlCallError as e:
            self._on_error(e)
        return None

    def _gpm_sm_activity(self, device: GpuDevice) -> float | None:
        """GPM SM activity since the previous sample of this device (None on the first).

        GPM computes a metric between two samples, so each call takes a new one and keeps it
        for the next; the harness primes its window the same way.
        """
        sample = _call("nvmlGpmSampleAlloc")
        try:
            if device.gpu_instance_id is None:
                _call("nvmlGpmSampleGet", self._parents[device.uuid], sample)
            else:
                _call(
                    "nvmlGpmMigSampleGet",
                    self._parents[device.uuid],
                    device.gpu_instance_id,
                    sample,
                )
        except NvmlCallError:
            _call("nvmlGpmSampleFree", sample)
            self._free_gpm(device.uuid)
            raise
        previous = self._gpm.get(device.uuid)
        self._gpm[device.uuid] = sample
        if previous is None:
            return None
        query = pynvml.c_nvmlGpmMetricsGet_t()
        query.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        query.numMetrics = 1
        query.sample1 = previous
        query.sample2 = sample
        query.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
        try:
            result = _call("nvmlGpmMetricsGet", query)
        finally:
            _call("nvmlGpmSampleFree", previous)
        metric = result.metrics[0]
        if int(metric.nvmlReturn) != 0:
            raise NvmlCallError("nvmlGpmMetricsGet", int(metric.nvmlReturn), "SM utilisation")
        return float(metric.value)

    def _free_gpm(self, uuid: str) -> None:
        sample = self._gpm.pop(uuid, None)
        if sample is not None:
            try:
                _call("nvmlGpmSampleFree", sample)
            except NvmlCallError as e:
                self._on_error(e)

"""Every NVML call the harness makes, behind one small typed facade.

Keeping pynvml in one module does two things: the rest of the harness reads as plain Python
(bytes, percent, joules), and tests on machines without a GPU can replace the `pynvml` module
object here with a fake that implements just these calls, exercising the GPU bookkeeping
without pretending anything above this boundary.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import pynvml as _real_pynvml

# Tests swap this for a fake module exposing the same functions.
pynvml: types.ModuleType = _real_pynvml


class NvmlError(RuntimeError):
    """NVML is missing, the device cannot be found, or a query failed."""


def _call(name: str, *args: Any) -> Any:
    try:
        return getattr(pynvml, name)(*args)
    except pynvml.NVMLError as e:
        raise NvmlError(f"{name}: {e}") from e


@dataclass(frozen=True)
class DeviceInfo:
    """Static facts about the device a handle names."""

    name: str
    memory_total_bytes: int
    sm_count: int | None
    mig_profile: str | None
    driver_version: str
    cuda_driver_version: str


class Device:
    """One NVML device (a whole GPU or a MIG instance), found by the UUID CUDA reports.

    Matching on the UUID rather than an index keeps NVML and CUDA looking at the same device
    even when `CUDA_VISIBLE_DEVICES` reorders or hides GPUs.
    """

    def __init__(self, uuid: str) -> None:
        _call("nvmlInit")
        # torch reports the bare UUID; NVML wants it prefixed, "GPU-" or (MIG instances) "MIG-".
        prefixed = [uuid] if uuid.startswith(("GPU-", "MIG-")) else [f"GPU-{uuid}", f"MIG-{uuid}"]
        self.handle = None
        for text in prefixed:
            try:
                self.handle = _call("nvmlDeviceGetHandleByUUID", text)
                break
            except NvmlError:
                if text == prefixed[-1]:
                    raise
        self._is_mig = bool(_call("nvmlDeviceIsMigDeviceHandle", self.handle))
        self._gpm_sample: Any = None

    def close(self) -> None:
        """Release GPM buffers and NVML."""
        if self._gpm_sample is not None:
            _call("nvmlGpmSampleFree", self._gpm_sample)
            self._gpm_sample = None
        _call("nvmlShutdown")

    def info(self) -> DeviceInfo:
        """Name, memory, SM count, MIG profile and driver versions of the device."""
        name = _call("nvmlDeviceGetName", self.handle)
        name = name.decode() if isinstance(name, bytes) else str(name)
        try:
            sm_count: int | None = int(
                _call("nvmlDeviceGetAttributes", self.handle).multiprocessorCount
            )
        except NvmlError:
            sm_count = None
        mig_profile = None
        if self._is_mig:
            # MIG device names end in the profile ("NVIDIA A100-SXM4-80GB MIG 1g.10gb").
            name, _, mig_profile = name.partition(" MIG ")
            mig_profile = mig_profile or None
        driver = _call("nvmlSystemGetDriverVersion")
        cuda = int(_call("nvmlSystemGetCudaDriverVersion"))
        return DeviceInfo(
            name=name,
            memory_total_bytes=int(_call("nvmlDeviceGetMemoryInfo", self.handle).total),
            sm_count=sm_count,
            mig_profile=mig_profile,
            driver_version=driver.decode() if isinstance(driver, bytes) else str(driver),
            cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}",
        )

    def memory_used_bytes(self) -> int:
        """Device memory in use by every process (what a MIG slice must have room for)."""
        return int(_call("nvmlDeviceGetMemoryInfo", self.handle).used)

    def utilisation_percent(self) -> float | None:
        """NVML's GPU utilisation: share of the last sample period with a kernel running.

        None on MIG instances, where NVML does not report it.
        """
        try:
            return float(_call("nvmlDeviceGetUtilizationRates", self.handle).gpu)
        except NvmlError:
            return None

    def energy_mj(self) -> int | None:
        """The total-energy counter in millijoules since driver load (Volta and later)."""
        try:
            return int(_call("nvmlDeviceGetTotalEnergyConsumption", self.handle))
        except NvmlError:
            return None

    def gpm_supported(self) -> bool:
        """Whether GPM metrics (Hopper and later, whole GPUs only here) can be read."""
        if self._is_mig or not hasattr(pynvml, "nvmlGpmQueryDeviceSupport"):
            return False
        try:
            return bool(_call("nvmlGpmQueryDeviceSupport", self.handle).isSupportedDevice)
        except NvmlError:
            return False

    def gpm_sm_activity_percent(self) -> float | None:
        """GPM SM activity (share of SM cycles busy) since the previous call.

        GPM reports a metric between two samples, so the first call only takes a sample and
        returns None.
        """
        sample = _call("nvmlGpmSampleAlloc")
        _call("nvmlGpmSampleGet", self.handle, sample)
        previous, self._gpm_sample = self._gpm_sample, sample
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
        return float(result.metrics[0].value)

"""The GPU path's bookkeeping with NVML faked at the pynvml call boundary (no GPU needed)."""

# ruff: noqa: N802  (the fake mirrors pynvml's camel-case function names)

import threading
import time
import types

import pytest

from kubeseer.measure import cuda, nvml


class FakeNvmlError(Exception):
    pass


class FakePynvml:
    """Implements just the pynvml functions `kubeseer.measure.nvml` calls, over settable state."""

    NVMLError = FakeNvmlError
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_SM_UTIL = 2

    def __init__(self, *, name="NVIDIA H100 80GB HBM3", mig=False, gpm=True):
        self.name = name
        self.mig = mig
        self.gpm = gpm
        self.used = 600 * 2**20
        self.total = 81559 * 2**20
        self.busy = 40.0
        self.energy = 1_000_000
        self.gpm_values = iter([55.0, 65.0, 75.0] + [70.0] * 10_000)
        self.calls = []
        self.lock = threading.Lock()
        self.initialised = 0

    def _log(self, name):
        with self.lock:
            self.calls.append(name)

    def nvmlInit(self):
        self.initialised += 1

    def nvmlShutdown(self):
        self.initialised -= 1

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if not uuid.startswith(("GPU-", "MIG-")):
            raise FakeNvmlError("not found")
        return ("handle", uuid)

    def nvmlDeviceIsMigDeviceHandle(self, handle):
        return self.mig

    def nvmlDeviceGetName(self, handle):
        return (self.name + (" MIG 1g.10gb" if self.mig else "")).encode()

    def nvmlDeviceGetAttributes(self, handle):
        return types.SimpleNamespace(multiprocessorCount=16 if self.mig else 132)

    def nvmlSystemGetDriverVersion(self):
        return "580.65.06"

    def nvmlSystemGetCudaDriverVersion(self):
        return 13000

    def nvmlDeviceGetMemoryInfo(self, handle):
        self._log("memory")
        return types.SimpleNamespace(used=self.used, total=self.total)

    def nvmlDeviceGetUtilizationRates(self, handle):
        if self.mig:
            raise FakeNvmlError("Not Supported")
        self._log("utilisation")
        return types.SimpleNamespace(gpu=self.busy)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return self.energy

    def nvmlGpmQueryDeviceSupport(self, handle):
        return types.SimpleNamespace(isSupportedDevice=int(self.gpm))

    def nvmlGpmSampleAlloc(self):
        return types.SimpleNamespace(taken=False)

    def nvmlGpmSampleGet(self, handle, sample):
        sample.taken = True
        return sample

    def nvmlGpmSampleFree(self, sample):
        pass

    def c_nvmlGpmMetricsGet_t(self):
        metric = types.SimpleNamespace(metricId=None, value=None)
        return types.SimpleNamespace(
            version=None, numMetrics=0, sample1=None, sample2=None, metrics=[metric]
        )

    def nvmlGpmMetricsGet(self, query):
        assert query.sample1.taken and query.sample2.taken
        assert query.metrics[0].metricId == self.NVML_GPM_METRIC_SM_UTIL
        self._log("gpm")
        query.metrics[0].value = next(self.gpm_values)
        return query


@pytest.fixture
def fake(monkeypatch):
    fake = FakePynvml()
    monkeypatch.setattr(nvml, "pynvml", fake)
    return fake


def test_device_info_reads_name_memory_sms_and_driver(fake):
    info = nvml.Device("0f2c").info()
    assert info == nvml.DeviceInfo(
        name="NVIDIA H100 80GB HBM3",
        memory_total_bytes=81559 * 2**20,
        sm_count=132,
        mig_profile=None,
        driver_version="580.65.06",
        cuda_driver_version="13.0",
    )


def test_a_mig_instance_reports_its_profile_apart_from_the_gpu_name(fake):
    fake.mig = True
    info = nvml.Device("MIG-1234").info()
    assert (info.name, info.mig_profile, info.sm_count) == ("NVIDIA H100 80GB HBM3", "1g.10gb", 16)


def test_nvml_failures_surface_as_typed_errors(fake):
    def gone(uuid):
        raise FakeNvmlError("GPU has fallen off the bus")

    fake.nvmlDeviceGetHandleByUUID = gone
    with pytest.raises(nvml.NvmlError, match="nvmlDeviceGetHandleByUUID: GPU has fallen"):
        nvml.Device("abc")


def test_close_releases_nvml(fake):
    device = nvml.Device("abc")
    device.close()
    assert fake.initialised == 0


def test_the_sampler_polls_at_fifty_hertz_or_more_and_keeps_the_memory_peak(fake):
    device = nvml.Device("abc")
    fake.gpm = False
    with cuda.Sampler(device, hz=100) as sampler:
        time.sleep(0.05)
        fake.used = 5 * 2**30
        time.sleep(0.05)
        fake.used = 1 * 2**30
        sampler.open_window()
        time.sleep(0.3)
        sampler.close_window()
    readings = sampler.readings
    assert readings.peak_used_bytes == 5 * 2**30
    assert readings.source == "nvml-utilization"
    assert len(readings.utilisation) >= 0.3 * 50
    assert readings.mean_percent == readings.peak_percent == 40.0


def test_utilisation_is_only_sampled_inside_the_timed_window(fake):
    fake.gpm = False
    with cuda.Sampler(nvml.Device("abc"), hz=200) as sampler:
        time.sleep(0.1)
    assert sampler.readings.utilisation == []
    assert sampler.readings.mean_percent is None
    assert "utilisation" not in fake.calls


def test_hopper_utilisation_comes_from_gpm_sm_activity(fake):
    with cuda.Sampler(nvml.Device("abc"), hz=100) as sampler:
        sampler.open_window()
        time.sleep(0.1)
        sampler.close_window()
    readings = sampler.readings
    assert readings.source == "gpm-sm-activity"
    # The first GPM call in open_window only takes a sample; values follow in order.
    assert readings.utilisation[:3] == [55.0, 65.0, 75.0]
    assert readings.peak_percent == 75.0


def test_mig_instances_fall_back_to_no_utilisation(fake):
    fake.mig = True
    with cuda.Sampler(nvml.Device("MIG-1"), hz=100) as sampler:
        sampler.open_window()
        time.sleep(0.05)
        sampler.close_window()
    assert sampler.readings.mean_percent is None


def test_a_sampler_failure_is_kept_for_the_caller(fake):
    fake.gpm = False

    def broken(handle):
        raise FakeNvmlError("GPU is lost")

    with cuda.Sampler(nvml.Device("abc"), hz=100) as sampler:
        fake.nvmlDeviceGetMemoryInfo = broken
        time.sleep(0.05)
        fake.nvmlDeviceGetMemoryInfo = FakePynvml.nvmlDeviceGetMemoryInfo.__get__(fake)
    assert isinstance(sampler.error, nvml.NvmlError)


def test_energy_is_the_counter_difference_in_joules(fake):
    device = nvml.Device("abc")
    before = device.energy_mj()
    fake.energy += 12_500
    assert cuda.energy_joules(before, device.energy_mj()) == 12.5
    assert cuda.energy_joules(None, 5) is None
    assert cuda.energy_joules(10, 5) is None


def test_the_memory_target_counts_the_context_and_the_larger_of_sampled_and_reserved():
    # Sampled peak over the idle baseline: 3 GiB; context + reserved: 2.5 GiB.
    assert cuda.memory_target(4 * 2**30, 2**30, 2**29, 2 * 2**30) == 3 * 2**30
    # A peak shorter than a sampling period: the allocator's reserved peak wins.
    assert cuda.memory_target(2**30 + 2**20, 2**30, 2**29, 2 * 2**30) == 2**29 + 2 * 2**30


def test_sampling_below_fifty_hertz_is_refused():
    with pytest.raises(ValueError, match="50"):
        cuda.CudaSettings(sample_hz=10)


def test_a_bare_uuid_from_torch_finds_a_mig_instance_too(fake):
    def mig_only(uuid):
        if not uuid.startswith("MIG-"):
            raise FakeNvmlError("Not Found")
        return ("handle", uuid)

    fake.nvmlDeviceGetHandleByUUID = mig_only
    assert nvml.Device("5f2b").handle == ("handle", "MIG-5f2b")

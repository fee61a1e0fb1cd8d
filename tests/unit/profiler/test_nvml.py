"""The profiler's NVML facade against NVML's documented answers (pynvml replaced at its calls).

The stand-in answers with pynvml's own structures and errors: NOT_FOUND for an empty MIG slot,
NOT_SUPPORTED for utilisation on MIG and for MIG queries on a GPU without MIG,
isSupportedDevice = 0 from GPM before Hopper, NO_PERMISSION for the aggregated process list of
a GPU in MIG mode. The answers follow NVML's documentation, not a recording from a driver.
"""

import pynvml
import pytest

from kubeseer.profiler import nvml, standin

GIB = 1 << 30
H100 = "GPU-5f1e1c3e-8a57-4f52-9a1b-0c6a8b2d3e4f"
A100 = "GPU-0e8d2a3b-6c4f-4b1a-8e2d-9f7c6b5a4d3e"
MIG_A = "MIG-1a2b3c4d-5e6f-5a7b-8c9d-0e1f2a3b4c5d"
MIG_B = "MIG-2b3c4d5e-6f7a-5b8c-9d0e-1f2a3b4c5d6e"


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


@pytest.fixture
def clock():
    return Clock()


def install(scenario, clock):
    fake = standin.StandIn(scenario, clock)
    standin.install(fake)
    return fake


@pytest.fixture(autouse=True)
def _restore():
    yield
    standin.uninstall()


def h100(gpm=True, **kw):
    return standin.Gpu(H100, "NVIDIA H100 80GB HBM3", 80 * GIB, gpm=gpm, mig_capable=True, **kw)


def a100_mig(gpm=False):
    return standin.Gpu(
        A100,
        "NVIDIA A100-SXM4-80GB",
        80 * GIB,
        gpm=gpm,
        mig_capable=True,
        mig=(
            standin.MigDevice(
                MIG_A, "1g.10gb", gpu_instance_id=9, memory_total_bytes=9856 << 20, slot=0
            ),
            standin.MigDevice(
                MIG_B, "3g.40gb", gpu_instance_id=2, memory_total_bytes=39 * GIB, slot=3
            ),
        ),
    )


def test_a_whole_hopper_gpu_reports_process_memory_and_gpm_sm_activity(clock):
    fake = install(
        standin.Scenario(
            (h100(),),
            (standin.Process(4242, H100, 3 * GIB, sm_activity_percent=60.0),),
        ),
        clock,
    )
    errors = []
    gpus = nvml.Nvml(on_error=errors.append)
    (device,) = gpus.devices
    assert (device.uuid, device.gpu_uuid, device.mig_profile, device.gpu_instance_id) == (
        H100,
        H100,
        None,
        None,
    )
    assert device.model_name == "NVIDIA H100 80GB HBM3"
    assert device.sm_source is nvml.SmSource.GPM
    (first,) = gpus.sample()
    assert first.processes == (nvml.ProcessUsage(4242, 3 * GIB),)
    assert first.memory_used_bytes == 3 * GIB
    assert first.sm_percent is None  # GPM needs two samples
    clock.t = 1.0
    (second,) = gpus.sample()
    assert second.sm_percent == pytest.approx(60.0)
    gpus.close()
    assert fake.live_gpm_samples == 0
    assert fake.initialised == 0
    assert errors == []


def test_an_a100_in_mig_mode_lists_its_mig_devices_and_states_sm_activity_unavailable(clock):
    install(
        standin.Scenario(
            (a100_mig(),),
            (
                standin.Process(100, MIG_A, 2 * GIB, sm_activity_percent=50.0),
                standin.Process(200, MIG_B, 7 * GIB),
            ),
        ),
        clock,
    )
    errors = []
    gpus = nvml.Nvml(on_error=errors.append)
    assert [(d.uuid, d.mig_profile, d.gpu_instance_id, d.gpu_uuid) for d in gpus.devices] == [
        (MIG_A, "1g.10gb", 9, A100),
        (MIG_B, "3g.40gb", 2, A100),
    ]
    assert all(d.model_name == "NVIDIA A100-SXM4-80GB" for d in gpus.devices)
    assert all(d.sm_source is nvml.SmSource.UNAVAILABLE for d in gpus.devices)
    assert gpus.devices[0].memory_total_bytes == 9856 << 20
    clock.t = 1.0
    by_uuid = {s.device.uuid: s for s in gpus.sample()}
    assert by_uuid[MIG_A].processes == (nvml.ProcessUsage(100, 2 * GIB),)
    assert by_uuid[MIG_B].processes == (nvml.ProcessUsage(200, 7 * GIB),)
    assert by_uuid[MIG_A].sm_percent is None
    # Empty MIG slots (NOT_FOUND) and unsupported utilisation are answers, not errors.
    assert errors == []


def test_a_hopper_mig_instance_gets_sm_activity_from_gpm_on_its_gpu_instance(clock):
    install(
        standin.Scenario(
            (a100_mig(gpm=True),),
            (
                standin.Process(100, MIG_A, GIB, sm_activity_percent=80.0),
                standin.Process(200, MIG_B, GIB, sm_activity_percent=20.0),
            ),
        ),
        clock,
    )
    gpus = nvml.Nvml()
    assert all(d.sm_source is nvml.SmSource.GPM for d in gpus.devices)
    gpus.sample()
    clock.t = 2.0
    by_uuid = {s.device.uuid: s.sm_percent for s in gpus.sample()}
    assert by_uuid == {MIG_A: pytest.approx(80.0), MIG_B: pytest.approx(20.0)}


def test_a_gpu_without_gpm_falls_back_to_nvml_utilisation(clock):
    gpu = standin.Gpu(A100, "NVIDIA A100-SXM4-80GB", 80 * GIB, gpm=False, mig_capable=True)
    install(
        standin.Scenario((gpu,), (standin.Process(7, A100, GIB, sm_activity_percent=42.0),)), clock
    )
    gpus = nvml.Nvml()
    (device,) = gpus.devices
    assert device.sm_source is nvml.SmSource.NVML_UTILIZATION
    (sample,) = gpus.sample()
    assert sample.sm_percent == 42.0  # NVML answers whole percent


def test_a_gpu_without_mig_support_is_a_whole_gpu_and_not_an_error(clock):
    gpu = standin.Gpu("GPU-11111111-2222-3333-4444-555555555555", "Tesla T4", 16 * GIB)
    install(standin.Scenario((gpu,)), clock)
    errors = []
    gpus = nvml.Nvml(on_error=errors.append)
    assert [d.mig_profile for d in gpus.devices] == [None]
    assert errors == []


def test_memory_nvml_cannot_attribute_to_a_process_is_none_not_zero(clock):
    install(standin.Scenario((h100(),), (standin.Process(5, H100, None),)), clock)
    (sample,) = nvml.Nvml().sample()
    assert sample.processes == (nvml.ProcessUsage(5, None),)


def test_a_refused_process_listing_is_counted_and_leaves_the_other_readings(clock):
    install(
        standin.Scenario(
            (h100(),),
            (standin.Process(5, H100, GIB),),
            errors={"nvmlDeviceGetComputeRunningProcesses": pynvml.NVML_ERROR_NO_PERMISSION},
        ),
        clock,
    )
    errors = []
    (sample,) = nvml.Nvml(on_error=errors.append).sample()
    assert sample.processes is None
    assert sample.memory_used_bytes == GIB
    assert [(e.function, e.kind) for e in errors] == [
        ("nvmlDeviceGetComputeRunningProcesses", "no_permission")
    ]


def test_a_lost_gpu_is_an_error_of_that_kind(clock):
    install(
        standin.Scenario(
            (h100(),), errors={"nvmlDeviceGetMemoryInfo": pynvml.NVML_ERROR_GPU_IS_LOST}
        ),
        clock,
    )
    with pytest.raises(nvml.NvmlCallError) as caught:
        nvml.Nvml()  # discovery reads the total memory
    assert caught.value.kind == "gpu_lost"


def test_gpm_state_of_a_vanished_mig_device_is_freed_on_rediscovery(clock):
    fake = install(standin.Scenario((a100_mig(gpm=True),)), clock)
    gpus = nvml.Nvml()
    gpus.sample()
    assert fake.live_gpm_samples == 2
    fake.scenario = standin.Scenario((h100(gpm=False),))
    gpus.discover()
    assert fake.live_gpm_samples == 0
    assert [d.uuid for d in gpus.devices] == [H100]


def test_a_scenario_file_round_trips_through_plain_data():
    scenario = standin.Scenario.from_dict(
        {
            "gpus": [
                {
                    "uuid": A100,
                    "name": "NVIDIA A100-SXM4-80GB",
                    "memory_total_bytes": 80 * GIB,
                    "mig": [
                        {
                            "uuid": MIG_A,
                            "profile": "1g.10gb",
                            "gpu_instance_id": 9,
                            "memory_total_bytes": 9856 << 20,
                        }
                    ],
                }
            ],
            "processes": [
                {"pid": 1, "device": MIG_A, "used_bytes": GIB, "profile": [[5, 2 * GIB]]}
            ],
            "errors": {"nvmlDeviceGetCount": 999},
        }
    )
    assert scenario.gpus[0].mig_capable
    assert scenario.gpus[0].mig[0].slot == 0
    assert scenario.processes[0].memory(4.0) == GIB
    assert scenario.processes[0].memory(5.0) == 2 * GIB
    assert scenario.errors == {"nvmlDeviceGetCount": 999}

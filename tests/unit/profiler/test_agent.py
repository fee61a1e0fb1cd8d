"""The agent's rounds: windows with the warm-up left out, reports, metrics, endings."""

from datetime import UTC, datetime, timedelta

import pynvml
import pytest
from prometheus_client import CollectorRegistry

from kubeseer import metrics
from kubeseer.profiler import agent, kube, nvml, standin

GIB = 1 << 30
GPU = "GPU-5f1e1c3e-8a57-4f52-9a1b-0c6a8b2d3e4f"
UID = "4f8a3c41-1d3b-4d0e-9f43-2b7c6a2e8d11"
CID = "8c1c2f6a0b5e3d7f9a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f6a7b"
T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def wall(self):
        return T0 + timedelta(seconds=self.t)


class FakeApi:
    def __init__(self, pods):
        self.pods = pods
        self.patches = []
        self.listings = 0
        self.dljob_exists = True
        self.fail_patches = 0

    def node_pods(self, node):
        self.listings += 1
        return list(self.pods)

    def node_resource_slices(self, node):
        return []

    def resource_claim(self, namespace, name):
        return None

    def patch_dljob_status(self, namespace, name, patch):
        if self.fail_patches:
            self.fail_patches -= 1
            raise kube.ApiError("503 Service Unavailable", transient=True, status=503)
        self.patches.append((namespace, name, patch))
        return self.dljob_exists


def dljob_pod(phase="Running"):
    return {
        "metadata": {
            "name": "resnet-0",
            "namespace": "team-a",
            "uid": UID,
            "labels": {"kubeseer.io/dljob": "resnet", "kubeseer.io/attempt": "0"},
            "ownerReferences": [
                {
                    "apiVersion": "kubeseer.io/v1alpha1",
                    "kind": "DLJob",
                    "name": "resnet",
                    "uid": "d",
                    "controller": True,
                }
            ],
        },
        "status": {
            "phase": phase,
            "containerStatuses": [{"name": "t", "containerID": f"containerd://{CID}"}],
        },
    }


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def proc(tmp_path):
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n"
    )
    return tmp_path


@pytest.fixture(autouse=True)
def _restore():
    yield
    standin.uninstall()


def build(clock, proc, api, *, processes, warmup=10.0, report_interval=5.0, errors=None):
    scenario = standin.Scenario(
        (standin.Gpu(GPU, "NVIDIA H100 80GB HBM3", 80 * GIB, gpm=True, mig_capable=True),),
        processes,
        errors or {},
    )
    standin.install(standin.StandIn(scenario, clock))
    registry = CollectorRegistry()
    m = metrics.ProfilerMetrics(registry, nvml_errors=nvml.ERROR_KINDS)
    holder = []
    gpus = nvml.Nvml(on_error=lambda e: holder[0].nvml_error(e))
    config = agent.AgentConfig(
        node="node-a",
        warmup_s=warmup,
        report_interval_s=report_interval,
        proc_root=proc,
        source="nvml-standin",
    )
    runner = agent.Agent(config, gpus, api, m, clock=clock, wall=clock.wall)
    holder.append(runner)
    return runner, registry


def run(runner, clock, until, period=1.0):
    while clock.t <= until:
        runner.step()
        clock.t += period


POD_LABELS = {
    "namespace": "team-a",
    "pod": "resnet-0",
    "dljob": "resnet",
    "UUID": GPU,
    "modelName": "NVIDIA H100 80GB HBM3",
    "GPU_I_PROFILE": "",
    "GPU_I_ID": "",
}


def test_peak_covers_the_whole_life_and_means_leave_out_the_warm_up(clock, proc):
    # 6 GiB while building the model (first 3 s), then 4 GiB; SM activity 70 % throughout.
    process = standin.Process(
        4242, GPU, 6 * GIB, sm_activity_percent=70.0, profile=((3.0, 4 * GIB),)
    )
    api = FakeApi([dljob_pod()])
    runner, registry = build(clock, proc, api, processes=(process,))
    run(runner, clock, until=20.0)
    ((namespace, name, _), *_), last = api.patches, api.patches[-1][2]
    assert (namespace, name) == ("team-a", "resnet")
    entry = last["observed"]["pods"]["resnet-0"]
    assert entry["peakMemoryBytes"] == 6 * GIB
    assert entry["meanMemoryBytes"] == 4 * GIB  # the 6 GiB samples fell in the warm-up
    assert entry["smActivityPercent"] == pytest.approx(70.0)
    assert entry["smActivitySource"] == "gpm-sm-activity"
    assert entry["window"]["warmedUp"] and entry["window"]["warmupSeconds"] == 10.0
    assert entry["window"]["start"] == "2026-11-25T12:00:00Z"
    assert (entry["final"], entry["source"], entry["node"], entry["attempt"]) == (
        False,
        "nvml-standin",
        "node-a",
        0,
    )
    assert entry["gpus"][0]["uuid"] == GPU
    assert len(api.patches) == 5  # at 0, 5, 10, 15 and 20 s
    assert registry.get_sample_value("kubeseer_profiler_pod_memory_bytes", POD_LABELS) == 4 * GIB
    assert (
        registry.get_sample_value("kubeseer_profiler_pod_memory_peak_bytes", POD_LABELS) == 6 * GIB
    )
    assert registry.get_sample_value("kubeseer_profiler_samples_total") == 21


def test_a_pod_that_ends_inside_its_warm_up_reports_a_peak_and_no_means(clock, proc):
    process = standin.Process(4242, GPU, 2 * GIB, sm_activity_percent=50.0, end_s=3.0)
    api = FakeApi([dljob_pod()])
    runner, registry = build(clock, proc, api, processes=(process,))
    run(runner, clock, until=3.0)
    api.pods = [dljob_pod(phase="Succeeded")]
    clock.t = 20.0  # the next listing sees the pod finished
    runner.step()
    entry = api.patches[-1][2]["observed"]["pods"]["resnet-0"]
    assert entry["final"] is True
    assert entry["peakMemoryBytes"] == 2 * GIB
    assert entry["meanMemoryBytes"] is None and entry["smActivityPercent"] is None
    assert entry["window"]["warmedUp"] is False
    # The series of a finished pod are dropped, and nothing more is reported for it.
    assert registry.get_sample_value("kubeseer_profiler_pod_memory_peak_bytes", POD_LABELS) is None
    patches = len(api.patches)
    clock.t = 40.0
    runner.step()
    assert len(api.patches) == patches


def test_a_pod_deleted_from_the_node_gets_its_final_report(clock, proc):
    api = FakeApi([dljob_pod()])
    runner, _ = build(clock, proc, api, processes=(standin.Process(4242, GPU, GIB, end_s=2.0),))
    run(runner, clock, until=2.0)
    api.pods = []
    clock.t = 15.0
    runner.step()
    assert api.patches[-1][2]["observed"]["pods"]["resnet-0"]["final"] is True


def test_a_failed_final_report_is_retried_and_a_deleted_dljob_is_forgotten(clock, proc):
    api = FakeApi([dljob_pod()])
    runner, registry = build(
        clock, proc, api, processes=(standin.Process(4242, GPU, GIB, end_s=2.0),)
    )
    run(runner, clock, until=2.0)
    api.pods = [dljob_pod(phase="Failed")]
    api.fail_patches = 1
    clock.t = 15.0
    runner.step()  # the final patch fails
    api.dljob_exists = False
    clock.t = 16.0
    runner.step()  # retried: the DLJob is gone
    assert registry.get_sample_value("kubeseer_profiler_reports_total", {"outcome": "failed"}) == 1
    assert registry.get_sample_value("kubeseer_profiler_reports_total", {"outcome": "gone"}) == 1
    assert runner.windows.pods() == set()


def test_a_process_of_a_new_pod_makes_the_agent_list_pods_at_once(clock, proc):
    api = FakeApi([])
    runner, _ = build(clock, proc, api, processes=(standin.Process(4242, GPU, GIB, start_s=2.0),))
    run(runner, clock, until=1.0)
    listings = api.listings
    api.pods = [dljob_pod()]
    run(runner, clock, until=2.0)
    assert api.listings == listings + 1  # well before the 10 s refresh
    assert api.patches[-1][2]["observed"]["pods"]["resnet-0"]["peakMemoryBytes"] == GIB


def test_nvml_errors_are_counted_by_kind_and_sampling_goes_on(clock, proc):
    api = FakeApi([dljob_pod()])
    runner, registry = build(
        clock,
        proc,
        api,
        processes=(standin.Process(4242, GPU, GIB),),
        errors={"nvmlDeviceGetComputeRunningProcesses": pynvml.NVML_ERROR_NO_PERMISSION},
    )
    run(runner, clock, until=2.0)
    assert (
        registry.get_sample_value("kubeseer_profiler_nvml_errors_total", {"error": "no_permission"})
        == 3
    )
    assert registry.get_sample_value("kubeseer_profiler_samples_total") == 3
    # Without a process or a DRA claim nothing ties the device to the pod: no guess is reported.
    assert api.patches == []

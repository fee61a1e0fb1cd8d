"""A record of NVML's answers replays through the profiler as the recorded session saw them.

The device under the record is the stand-in here (no GPU on this machine); on a GPU it is the
driver. Either way the profiler's `Nvml` must read the same devices and samples from the
replay as it did while the record was taken, for whole GPUs with GPM, MIG devices without it,
processes that come and go, and NVML's errors.
"""

import json

import pynvml
import pytest

from kubeseer.profiler import nvml, recording, standin

GIB = 1 << 30
H100 = "GPU-5f1e1c3e-8a57-4f52-9a1b-0c6a8b2d3e4f"
A100 = "GPU-0e8d2a3b-6c4f-4b1a-8e2d-9f7c6b5a4d3e"
MIG_A = "MIG-1a2b3c4d-5e6f-5a7b-8c9d-0e1f2a3b4c5d"


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


@pytest.fixture(autouse=True)
def _restore():
    yield
    standin.uninstall()


def scenario(errors=None):
    return standin.Scenario(
        (
            standin.Gpu(H100, "NVIDIA H100 80GB HBM3", 80 * GIB, gpm=True, mig_capable=True),
            standin.Gpu(
                A100,
                "NVIDIA A100-SXM4-80GB",
                80 * GIB,
                mig_capable=True,
                mig=(standin.MigDevice(MIG_A, "1g.10gb", 9, 9856 << 20, 0),),
            ),
        ),
        (
            standin.Process(4242, H100, 3 * GIB, sm_activity_percent=60.0, end_s=2.5),
            standin.Process(4343, MIG_A, None, start_s=1.0, profile=((1.0, 2 * GIB),)),
        ),
        errors or {},
    )


def session(clock):
    """Discovery and four samples, the stand-in's clock one second on before each."""
    errors = []
    node = nvml.Nvml(on_error=lambda e: errors.append(e.kind))
    read = []
    for _ in range(4):
        clock.t += 1.0
        read.append(node.sample())
    node.close()
    return node.devices, read, errors


def record(errors=None):
    clock = Clock()
    recorder = recording.Recorder(standin.StandIn(scenario(errors), clock))
    nvml.pynvml = recorder
    try:
        seen = session(clock)
    finally:
        standin.uninstall()
    return recorder.calls, seen


def replay(calls):
    nvml.pynvml = recording.Replay(json.loads(json.dumps(calls)))
    try:
        return session(Clock())
    finally:
        standin.uninstall()


def test_a_replayed_record_gives_the_profiler_what_the_recorded_session_read():
    calls, (devices, samples, errors) = record()
    assert [d.uuid for d in devices] == [H100, MIG_A]
    # the H100's process ends after 2.5 s, the MIG one appears at 1 s: the record holds both
    assert [len(s[0].processes) for s in samples] == [1, 1, 0, 0]
    assert samples[1][0].sm_percent == pytest.approx(60.0)
    assert replay(calls) == (devices, samples, errors)


def test_an_error_nvml_answered_is_replayed_with_its_code():
    forced = {"nvmlDeviceGetComputeRunningProcesses": pynvml.NVML_ERROR_NO_PERMISSION}
    calls, seen = record(forced)
    assert seen[2] and set(seen[2]) == {"no_permission"}
    assert any(c.get("error") == pynvml.NVML_ERROR_NO_PERMISSION for c in calls)
    assert replay(calls) == seen


def test_a_question_the_record_never_heard_is_not_answered():
    calls, _ = record()
    replayed = recording.Replay([c for c in calls if c["function"] != "nvmlDeviceGetCount"])
    with pytest.raises(LookupError, match="nvmlDeviceGetCount"):
        replayed.nvmlDeviceGetCount()


def test_a_node_is_recorded_beside_a_training_process_of_its_own(monkeypatch, tmp_path):
    # the stand-in in place of the driver, a CPU process in place of the CUDA training one
    standin.install(standin.StandIn(scenario()))
    monkeypatch.setattr(
        recording,
        "LOAD",
        "import json, sys, time\n"
        "open(sys.argv[1], 'w').close()\n"
        "time.sleep(float(sys.argv[3]))\n"
        "json.dump({'max_memory_reserved': 1}, open(sys.argv[2], 'w'))\n",
    )
    found = recording.record_node(samples=2, interval_s=0.01, load_seconds=0.2)
    assert found["load"]["torch"] == {"max_memory_reserved": 1}
    assert found["agent_errors"] == []
    assert nvml.pynvml.__class__ is standin.StandIn  # the profiler's NVML is given back
    counts = [c["function"] for c in found["calls"]].count("nvmlDeviceGetMemoryInfo")
    assert counts == 2 + 2 * 2  # discovery of both devices, then two samples of each
    path = tmp_path / "record.json"
    path.write_text(json.dumps(found))
    assert recording.Replay.load(path).nvmlDeviceGetCount() == 2

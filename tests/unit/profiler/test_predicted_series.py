"""The operator's prediction exported beside the observation, on the pod's own labels."""

import pytest
import test_agent
from test_agent import GIB, POD_LABELS, FakeApi, build, dljob_pod, run

from kubeseer.profiler import standin


@pytest.fixture
def clock():
    return test_agent.Clock()


@pytest.fixture
def proc(tmp_path):
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        f"{test_agent.UID.replace('-', '_')}.slice/cri-containerd-{test_agent.CID}.scope\n"
    )
    yield tmp_path
    standin.uninstall()


def annotated_pod(**annotations):
    pod = dljob_pod()
    pod["metadata"]["annotations"] = annotations
    return pod


def running_job():
    return (standin.Process(4242, "GPU-5f1e1c3e-8a57-4f52-9a1b-0c6a8b2d3e4f", 3 * GIB),)


def test_predicted_memory_and_sm_util_sit_beside_the_observed_series(clock, proc):
    api = FakeApi(
        [
            annotated_pod(
                **{
                    "kubeseer.io/predicted-memory-point-bytes": str(2 * GIB),
                    "kubeseer.io/predicted-memory-bytes": str(int(2.5 * GIB)),
                    "kubeseer.io/predicted-sm-util-percent": "41.5",
                }
            )
        ]
    )
    runner, registry = build(clock, proc, api, processes=running_job())
    run(runner, clock, until=3)

    def value(name, **extra):
        return registry.get_sample_value(name, {**POD_LABELS, **extra})

    assert value("kubeseer_profiler_pod_predicted_memory_bytes", bound="point") == 2 * GIB
    assert value("kubeseer_profiler_pod_predicted_memory_bytes", bound="upper") == 2.5 * GIB
    assert value("kubeseer_profiler_pod_predicted_sm_activity_percent") == 41.5
    assert value("kubeseer_profiler_pod_device_memory_bytes") == 80 * GIB
    # The observation exceeds the bound: the two series compare label for label.
    assert value("kubeseer_profiler_pod_memory_peak_bytes") > value(
        "kubeseer_profiler_pod_predicted_memory_bytes", bound="upper"
    )


def test_a_pod_without_or_with_unreadable_annotations_gets_no_predicted_series(clock, proc):
    api = FakeApi([annotated_pod(**{"kubeseer.io/predicted-memory-bytes": "lots"})])
    runner, registry = build(clock, proc, api, processes=running_job())
    run(runner, clock, until=3)
    for bound in ("point", "upper"):
        assert (
            registry.get_sample_value(
                "kubeseer_profiler_pod_predicted_memory_bytes", {**POD_LABELS, "bound": bound}
            )
            is None
        )
    assert registry.get_sample_value("kubeseer_profiler_pod_memory_bytes", POD_LABELS) == 3 * GIB


def test_the_predicted_series_go_with_the_pod(clock, proc):
    pod = annotated_pod(**{"kubeseer.io/predicted-memory-bytes": str(4 * GIB)})
    api = FakeApi([pod])
    runner, registry = build(clock, proc, api, processes=running_job(), warmup=1.0)
    run(runner, clock, until=3)
    pod["status"]["phase"] = "Succeeded"
    run(runner, clock, until=20)
    labels = {**POD_LABELS, "bound": "upper"}
    assert registry.get_sample_value("kubeseer_profiler_pod_predicted_memory_bytes", labels) is None
    assert (
        registry.get_sample_value("kubeseer_profiler_pod_device_memory_bytes", POD_LABELS) is None
    )

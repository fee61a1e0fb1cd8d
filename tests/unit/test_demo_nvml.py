"""The demo's NVML scenarios: each fake node's GPUs as the inventory has them, each pod's
process on a device of the resource it got, read through the profiler's own NVML facade."""

import re
import uuid

import pytest

from kubeseer import demo_nvml, resources
from kubeseer.devcluster import inventory
from kubeseer.profiler import cgroup, nvml, standin

MIB = 1 << 20
NODES = {
    n.name: n for n in inventory.load(resources.path("deploy") / "devcluster" / "nodes.yaml").nodes
}


def uid(name):
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, name))


def pod(name, node, resource, used=3000 * MIB):
    return demo_nvml.GpuPod("demo", name, uid(name), node, "job", resource, used)


@pytest.fixture(autouse=True)
def _restore():
    yield
    standin.uninstall()


def read_nodes(scenario):
    standin.install(standin.StandIn(standin.Scenario.from_dict(scenario), clock=lambda: 1.0))
    facade = nvml.Nvml()
    return facade.discover(), facade.sample()


def test_a_mig_node_has_its_inventory_layout_and_each_pod_a_device_of_its_own():
    node = NODES["gpu-a100-80-mig-0"]
    pods = [
        pod("a", node.name, "nvidia.com/mig-2g.20gb"),
        pod("b", node.name, "nvidia.com/mig-2g.20gb", used=5000 * MIB),
        pod("c", node.name, "nvidia.com/gpu"),
    ]
    scenario, pids = demo_nvml.node_scenario(node, pods, first_pid=100)
    devices, samples = read_nodes(scenario)
    profiles = sorted(d.mig_profile or "whole" for d in devices)
    # {1g.10gb: 2, 2g.20gb: 1, 3g.40gb: 1} and {2g.20gb: 3} on two GPUs, two GPUs whole.
    assert profiles == ["1g.10gb"] * 2 + ["2g.20gb"] * 4 + ["3g.40gb"] + ["whole"] * 2
    assert len({d.uuid for d in devices}) == len(devices)
    assert {d.sm_source for d in devices} == {nvml.SmSource.UNAVAILABLE}
    used = {
        p.pid: (s.device.mig_profile, s.device.memory_total_bytes, p.used_bytes)
        for s in samples
        for p in s.processes or ()
    }
    assert {pids[pid].name: value for pid, value in used.items()} == {
        "a": ("2g.20gb", 19968 * MIB, 3000 * MIB),
        "b": ("2g.20gb", 19968 * MIB, 5000 * MIB),
        "c": (None, 81920 * MIB, 3000 * MIB),
    }
    assert len({s.device.uuid for s in samples if s.processes}) == 3


def test_the_scenario_is_the_same_for_the_same_node_and_pods():
    node = NODES["gpu-h100-0"]
    pods = [pod("a", node.name, "nvidia.com/gpu")]
    first, _ = demo_nvml.node_scenario(node, pods, first_pid=7)
    again, _ = demo_nvml.node_scenario(node, pods, first_pid=7)
    assert first == again
    assert {g["gpm"] for g in first["gpus"]} == {True}  # Hopper; SM activity still not derived


def test_a_pod_whose_memory_was_not_derived_has_no_process_but_keeps_its_device():
    node = NODES["gpu-a100-40-mig-0"]
    pods = [pod("a", node.name, "nvidia.com/mig-3g.20gb", used=None)]
    pods.append(pod("b", node.name, "nvidia.com/mig-3g.20gb"))
    with pytest.raises(
        demo_nvml.ScenarioError, match=re.escape("no free nvidia.com/mig-3g.20gb for b")
    ):
        demo_nvml.node_scenario(node, pods, first_pid=1)
    scenario, pids = demo_nvml.node_scenario(node, pods[:1], first_pid=1)
    assert (scenario["processes"], pids) == ([], {})


def test_each_process_belongs_to_its_pod_by_its_cgroup_file(tmp_path):
    pids = {41000: pod("a", "gpu-h100-0", "nvidia.com/gpu")}
    root = demo_nvml.write_proc(tmp_path / "proc", pids)
    ref = cgroup.parse_file((root / "41000" / "cgroup").read_text())
    assert ref is not None and ref.pod_uid == uid("a")


def test_a_device_memory_is_its_mig_profile_or_its_whole_gpu():
    node = NODES["gpu-a100-40-mig-0"]
    assert demo_nvml.device_memory(node, "nvidia.com/mig-1g.5gb") == 4864 * MIB
    assert demo_nvml.device_memory(node, "nvidia.com/gpu") == 40960 * MIB

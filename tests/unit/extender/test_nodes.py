"""Reading a node: one device per NVIDIA resource, memory from GFD's labels, named problems."""

from __future__ import annotations

import copy

from extender_fixtures import node_objects

from kubeseer.extender import nodes

MIB = 1 << 20
OBJECTS = node_objects()


def test_single_strategy_gpus_are_slices_of_the_profile_in_the_product_label():
    gpus = nodes.from_node(OBJECTS["a100-1g"])
    (device,) = gpus.devices.values()
    assert device.resource == "nvidia.com/gpu"
    assert device.profile == "1g.10gb"
    assert device.model_key == "A100-80GB"
    assert device.memory_bytes == 9728 * MIB
    assert device.memory_source == "nvidia.com/gpu.memory"
    assert device.compute_slices == 1
    assert device.allocatable == 14
    assert gpus.problem is None


def test_mixed_strategy_offers_each_profile_with_its_own_memory_label():
    gpus = nodes.from_node(OBJECTS["a100-mixed-a"])
    assert sorted(gpus.devices) == [
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-2g.20gb",
        "nvidia.com/mig-3g.40gb",
    ]
    two = gpus.devices["nvidia.com/mig-2g.20gb"]
    assert (two.memory_bytes, two.memory_source) == (19968 * MIB, "nvidia.com/mig-2g.20gb.memory")
    assert two.compute_slices == 2


def test_whole_gpus_use_the_gpu_memory_label():
    (device,) = nodes.from_node(OBJECTS["h100-whole"]).devices.values()
    assert device.profile is None
    assert device.memory_bytes == 81559 * MIB
    assert device.compute_slices == 7


def test_a_lower_label_wins_over_the_catalogue():
    node = copy.deepcopy(OBJECTS["a100-3g"])
    node["metadata"]["labels"]["nvidia.com/gpu.memory"] = "30000"
    (device,) = nodes.from_node(node).devices.values()
    assert device.memory_bytes == 30000 * MIB
    assert device.memory_source == "nvidia.com/gpu.memory"


def test_without_a_memory_label_the_catalogue_figure_is_used_and_said():
    node = copy.deepcopy(OBJECTS["a100-3g"])
    del node["metadata"]["labels"]["nvidia.com/gpu.memory"]
    (device,) = nodes.from_node(node).devices.values()
    assert device.memory_bytes == round(39.25 * (1 << 30))
    assert device.memory_source == nodes.CATALOGUE_SOURCE


def test_a_node_without_gpus_has_no_devices_and_no_problem():
    gpus = nodes.from_node(OBJECTS["cpu-0"])
    assert gpus.devices == {} and gpus.problem is None


def test_gpus_without_a_product_label_are_a_problem():
    node = copy.deepcopy(OBJECTS["h100-whole"])
    del node["metadata"]["labels"]["nvidia.com/gpu.product"]
    gpus = nodes.from_node(node)
    assert gpus.devices == {}
    assert gpus.problem is not None and "GPU Feature Discovery" in gpus.problem


def test_an_unknown_product_is_a_problem_naming_it():
    node = copy.deepcopy(OBJECTS["h100-whole"])
    node["metadata"]["labels"]["nvidia.com/gpu.product"] = "Tesla-K80"
    gpus = nodes.from_node(node)
    assert gpus.devices == {}
    assert gpus.problem is not None and "Tesla-K80" in gpus.problem


def test_a_malformed_quantity_is_a_problem_not_a_crash():
    node = copy.deepcopy(OBJECTS["h100-whole"])
    node["status"]["allocatable"]["nvidia.com/gpu"] = "two"
    gpus = nodes.from_node(node)
    assert gpus.devices == {}
    assert gpus.problem is not None and "'two'" in gpus.problem


def test_a_cordoned_node_offers_nothing():
    node = copy.deepcopy(OBJECTS["h100-whole"])
    node["spec"] = {"unschedulable": True}
    gpus = nodes.from_node(node)
    assert gpus.devices == {}
    assert gpus.problem == "cordoned or not ready"


def test_the_memory_label_of_a_resource():
    assert nodes.memory_label("nvidia.com/gpu") == "nvidia.com/gpu.memory"
    assert nodes.memory_label("nvidia.com/mig-1g.10gb") == "nvidia.com/mig-1g.10gb.memory"

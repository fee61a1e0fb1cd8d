"""The fake GPU inventory: parsing, validation of impossible hardware, and the Node manifests
with the labels and resources NVIDIA's GPU Operator publishes."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from kubeseer.devcluster import errors, inventory
from kubeseer.devcluster.cluster import DEFAULT_INVENTORY

A100_80 = {
    "product": "NVIDIA-A100-SXM4-80GB",
    "memoryMiB": 81920,
    "family": "ampere",
    "computeCapability": "8.0",
    "multiprocessors": 108,
    "migProfiles": {
        "1g.10gb": {
            "memoryMiB": 9728,
            "multiprocessors": 14,
            "computeSlices": 1,
            "memorySlices": 1,
            "maxPerGpu": 7,
        },
        "2g.20gb": {
            "memoryMiB": 19968,
            "multiprocessors": 28,
            "computeSlices": 2,
            "memorySlices": 2,
            "maxPerGpu": 3,
        },
        "3g.40gb": {
            "memoryMiB": 40192,
            "multiprocessors": 42,
            "computeSlices": 3,
            "memorySlices": 4,
            "maxPerGpu": 2,
        },
    },
}


def document(*nodes: dict[str, Any]) -> dict[str, Any]:
    return {"gpuModels": {"A100-80": copy.deepcopy(A100_80)}, "nodes": list(nodes)}


def mig_node(**overrides: Any) -> dict[str, Any]:
    node = {
        "name": "gpu-0",
        "gpuModel": "A100-80",
        "gpus": 4,
        "migStrategy": "mixed",
        "migLayouts": [{"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, {"2g.20gb": 3}],
        "cpu": "64",
        "memory": "512Gi",
    }
    node.update(overrides)
    return node


def test_shipped_inventory_has_whole_h100s_two_mig_nodes_and_a_cpu_node():
    inv = inventory.load(DEFAULT_INVENTORY)
    by_name = {n.name: n for n in inv.nodes}
    assert by_name["gpu-h100-0"].extended_resources() == {"nvidia.com/gpu": 4}
    assert by_name["cpu-0"].extended_resources() == {}
    assert by_name["gpu-a100-80-mig-0"].extended_resources()["nvidia.com/mig-2g.20gb"] == 4
    assert by_name["gpu-a100-40-mig-0"].extended_resources()["nvidia.com/mig-1g.5gb"] == 9
    products = {n.labels().get("nvidia.com/gpu.product") for n in inv.nodes}
    assert products == {
        "NVIDIA-H100-80GB-HBM3",
        "NVIDIA-A100-SXM4-80GB",
        "NVIDIA-A100-SXM4-40GB",
        None,
    }


def test_shipped_inventory_offers_mig_2g_20gb_on_exactly_one_node_and_no_7g_80gb():
    inv = inventory.load(DEFAULT_INVENTORY)
    holders = [n.name for n in inv.nodes if "nvidia.com/mig-2g.20gb" in n.extended_resources()]
    assert holders == ["gpu-a100-80-mig-0"]
    assert "nvidia.com/mig-7g.80gb" not in inv.extended_resources()


def test_mixed_strategy_counts_whole_gpus_as_gpu_and_sums_mig_instances_over_gpus():
    node = inventory.parse(document(mig_node())).nodes[0]
    assert node.extended_resources() == {
        "nvidia.com/gpu": 2,
        "nvidia.com/mig-1g.10gb": 2,
        "nvidia.com/mig-2g.20gb": 4,
        "nvidia.com/mig-3g.40gb": 1,
    }


def test_mixed_strategy_labels_follow_gfd_with_usable_memory_per_profile():
    labels = inventory.parse(document(mig_node())).nodes[0].labels()
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert labels["nvidia.com/gpu.memory"] == "81920"
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig.capable"] == "true"
    assert labels["nvidia.com/mig-2g.20gb.count"] == "4"
    assert labels["nvidia.com/mig-2g.20gb.memory"] == "19968"
    assert labels["nvidia.com/mig-2g.20gb.multiprocessors"] == "28"
    assert labels["nvidia.com/mig-2g.20gb.product"] == "NVIDIA-A100-SXM4-80GB-MIG-2g.20gb"
    assert labels["nvidia.com/mig-3g.40gb.slices.gi"] == "3"


def test_single_strategy_advertises_mig_devices_as_gpu_and_rewrites_product_label():
    node_doc = mig_node(migStrategy="single", gpus=2, migLayouts=[{"2g.20gb": 3}] * 2)
    node = inventory.parse(document(node_doc)).nodes[0]
    assert node.extended_resources() == {"nvidia.com/gpu": 6}
    labels = node.labels()
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB-MIG-2g.20gb"
    assert labels["nvidia.com/gpu.memory"] == "19968"
    assert labels["nvidia.com/gpu.count"] == "6"


def test_strategy_none_exposes_every_gpu_whole():
    node_doc = mig_node(migStrategy="none", migLayouts=[])
    node = inventory.parse(document(node_doc)).nodes[0]
    assert node.extended_resources() == {"nvidia.com/gpu": 4}
    assert node.labels()["nvidia.com/mig.strategy"] == "none"


def test_cpu_node_carries_no_nvidia_labels_or_resources():
    node = inventory.parse(document({"name": "cpu-0", "cpu": 8, "memory": "32Gi"})).nodes[0]
    assert node.extended_resources() == {}
    assert not [k for k in node.labels() if k.startswith("nvidia.com/")]
    assert node.labels()["kubernetes.io/hostname"] == "cpu-0"


def test_node_manifest_has_equal_capacity_and_allocatable_and_the_kwok_annotation():
    manifest = inventory.build_node(inventory.parse(document(mig_node())).nodes[0])
    assert manifest["kind"] == "Node"
    assert manifest["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake"}
    status = manifest["status"]
    assert status["capacity"] == status["allocatable"]
    assert status["capacity"]["nvidia.com/mig-2g.20gb"] == "4"
    assert status["capacity"]["cpu"] == "64"
    assert status["capacity"]["pods"] == "110"


def test_extended_resources_lists_every_gpu_resource_once_sorted():
    inv = inventory.parse(document(mig_node(), mig_node(name="gpu-1", migLayouts=[])))
    assert inv.extended_resources() == (
        "nvidia.com/gpu",
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-2g.20gb",
        "nvidia.com/mig-3g.40gb",
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"migLayouts": [{"3g.40gb": 2, "1g.10gb": 1}]}, "memory slices"),
        ({"migLayouts": [{"2g.20gb": 3, "1g.10gb": 2}]}, "compute"),
        ({"migLayouts": [{"1g.10gb": 8}]}, "at most 7"),
        ({"migLayouts": [{"1g.5gb": 1}]}, "no MIG profile '1g.5gb'"),
        ({"migLayouts": [{"2g.20gb": 0}]}, "positive integer"),
        ({"migLayouts": [{}]}, "empty MIG layout"),
        ({"gpus": 1}, "2 MIG layouts for 1 GPUs"),
        ({"migStrategy": "none"}, "exposes no MIG layouts"),
        ({"migStrategy": "single"}, "one profile"),
        ({"migStrategy": "dynamic"}, "migStrategy must be one of"),
        ({"gpuModel": "V100"}, "unknown gpuModel 'V100'"),
        ({"gpus": 0}, "`gpus` must be a positive integer"),
        ({"cpu": "lots"}, "Kubernetes quantity"),
        ({"name": "GPU_0"}, "not a valid node name"),
        ({"gpuCount": 4}, "unknown keys ['gpuCount']"),
    ],
)
def test_rejects_hardware_that_cannot_exist_or_malformed_entries(overrides, message):
    with pytest.raises(
        errors.InventoryError, match=message.replace("[", r"\[").replace("(", r"\(")
    ):
        inventory.parse(document(mig_node(**overrides)))


def test_rejects_gpu_fields_on_a_node_without_gpu_model():
    node = {"name": "cpu-0", "cpu": "8", "memory": "1Gi", "gpus": 2}
    with pytest.raises(errors.InventoryError, match="without a gpuModel"):
        inventory.parse(document(node))


def test_rejects_duplicate_node_names():
    with pytest.raises(errors.InventoryError, match=r"duplicate node names \['gpu-0'\]"):
        inventory.parse(document(mig_node(), mig_node()))


def test_rejects_a_profile_whose_compute_slices_disagree_with_its_name():
    doc = document(mig_node(migLayouts=[]))
    doc["gpuModels"]["A100-80"]["migProfiles"]["2g.20gb"]["computeSlices"] = 3
    with pytest.raises(errors.InventoryError, match="computeSlices must match"):
        inventory.parse(doc)


def test_rejects_an_inventory_without_nodes():
    with pytest.raises(errors.InventoryError, match="non-empty list"):
        inventory.parse({"gpuModels": {}, "nodes": []})


def test_load_reports_yaml_errors_with_the_file_name(tmp_path: Path):
    bad = tmp_path / "nodes.yaml"
    bad.write_text("nodes: [unclosed\n")
    with pytest.raises(errors.InventoryError, match=r"nodes\.yaml: not valid YAML"):
        inventory.load(bad)


def test_shipped_mig_figures_agree_with_the_placement_catalogue():
    """The fake nodes' GFD labels and placement's usable-memory table describe the same GPUs,
    so a placement decision tested on the dev cluster is the one a real node would get."""
    from kubeseer.placement import catalogue

    for model in inventory.load(DEFAULT_INVENTORY).models.values():
        placed, _ = catalogue.parse_product_label(model.product)
        assert placed.sms == model.multiprocessors, model.key
        for name, profile in model.mig_profiles.items():
            expected = placed.profile(name)
            assert profile.memory_mib * 2**20 == expected.usable_memory_bytes, (model.key, name)
            assert profile.multiprocessors == expected.sms, (model.key, name)
            assert (profile.compute_slices, profile.memory_slices) == (
                expected.compute_slices,
                expected.memory_slices,
            ), (model.key, name)

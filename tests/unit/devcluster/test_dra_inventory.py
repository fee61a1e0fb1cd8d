"""Inventory nodes whose GPUs the DRA driver publishes: what they carry, what is refused."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kubeseer.devcluster import errors, inventory

ENGINES = {"copyEngines": 1, "decoders": 0, "encoders": 0, "jpegEngines": 0, "ofaEngines": 0}
A100_40 = {
    "product": "NVIDIA-A100-SXM4-40GB",
    "productName": "NVIDIA A100-SXM4-40GB",
    "memoryMiB": 40960,
    "family": "ampere",
    "computeCapability": "8.0",
    "multiprocessors": 108,
    "migProfiles": {
        "1g.5gb": {
            "memoryMiB": 4864,
            "multiprocessors": 14,
            "computeSlices": 1,
            "memorySlices": 1,
            "maxPerGpu": 7,
            "engines": ENGINES,
        },
        "3g.20gb": {
            "memoryMiB": 19968,
            "multiprocessors": 42,
            "computeSlices": 3,
            "memorySlices": 4,
            "maxPerGpu": 2,
            "engines": ENGINES | {"copyEngines": 3, "decoders": 2},
        },
    },
}


def document(*nodes: dict[str, Any], model: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"gpuModels": {"A100": copy.deepcopy(model or A100_40)}, "nodes": list(nodes)}


def dra_node(**overrides: Any) -> dict[str, Any]:
    node = {
        "name": "gpu-0",
        "gpuModel": "A100",
        "gpus": 2,
        "gpuDriver": "draStatic",
        "migLayouts": [{"1g.5gb": 4, "3g.20gb": 1}],
        "cpu": "32",
        "memory": "256Gi",
    }
    return {k: v for k, v in (node | overrides).items() if v is not None}


def test_a_dra_node_has_gfds_labels_but_no_extended_resources_or_mig_strategy():
    parsed = inventory.parse(document(dra_node()))
    (node,) = parsed.nodes
    assert node.gpu_driver is inventory.GpuDriver.DRA_STATIC
    assert node.extended_resources() == {}
    manifest = inventory.build_node(node)
    assert not [r for r in manifest["status"]["allocatable"] if r.startswith("nvidia.com/")]
    labels = node.labels()
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert labels["nvidia.com/gpu.count"] == "2"
    assert "nvidia.com/mig.strategy" not in labels
    assert not [k for k in labels if k.startswith("nvidia.com/mig-")]
    assert parsed.dra_nodes() == (node,)
    assert parsed.extended_resources() == ()
    assert node.gpu_model is not None
    assert node.gpu_model.product_name == "NVIDIA A100-SXM4-40GB"
    assert node.gpu_model.architecture == "Ampere"
    engines = node.gpu_model.mig_profiles["3g.20gb"].engines
    assert engines == inventory.Engines(3, 2, 0, 0, 0)


def test_device_plugin_stays_the_default_and_keeps_its_resources():
    plugin = dra_node(gpuDriver=None, migStrategy="mixed")
    (node,) = inventory.parse(document(plugin)).nodes
    assert node.gpu_driver is inventory.GpuDriver.DEVICE_PLUGIN
    assert node.extended_resources() == {
        "nvidia.com/gpu": 1,
        "nvidia.com/mig-1g.5gb": 4,
        "nvidia.com/mig-3g.20gb": 1,
    }


def test_a_dynamic_node_takes_no_layouts():
    (node,) = inventory.parse(document(dra_node(gpuDriver="draDynamic", migLayouts=None))).nodes
    assert node.gpu_driver is inventory.GpuDriver.DRA_DYNAMIC
    assert node.mig_layouts == ()


@pytest.mark.parametrize(
    ("node", "model", "message"),
    [
        (dra_node(gpuDriver="dra"), None, "gpuDriver must be one of"),
        (dra_node(migStrategy="mixed"), None, "migStrategy is the device plugin's setting"),
        (dra_node(gpuDriver="draDynamic"), None, "migLayouts are for draStatic"),
        (
            dra_node(gpuDriver="draDynamic", migLayouts=None, gpus=9),
            None,
            "at most 8 GPUs per node",
        ),
        (
            dra_node(gpuDriver="draDynamic", migLayouts=None),
            A100_40 | {"migProfiles": {}},
            "needs a MIG-capable gpuModel",
        ),
        (
            dra_node(),
            {k: v for k, v in A100_40.items() if k != "productName"},
            "needs `productName`",
        ),
        (
            dra_node(),
            A100_40
            | {
                "migProfiles": {
                    n: {k: v for k, v in p.items() if k != "engines"}
                    for n, p in A100_40["migProfiles"].items()
                }
            },
            r"profiles \['1g.5gb', '3g.20gb'\] have no `engines`",
        ),
        (
            dra_node(),
            A100_40
            | {
                "migProfiles": {
                    "1g.5gb": A100_40["migProfiles"]["1g.5gb"]
                    | {"engines": ENGINES | {"decoders": -1}},
                }
            },
            "`decoders` must be a non-negative integer",
        ),
        (
            dra_node(migLayouts=None),
            A100_40
            | {
                "migProfiles": {
                    "2g.20gb": A100_40["migProfiles"]["3g.20gb"]
                    | {"computeSlices": 2, "memorySlices": 4},
                }
            },
            "no MIG profile has 2 compute and 4 memory slices",
        ),
    ],
)
def test_impossible_dra_nodes_are_refused_with_the_reason(node, model, message):
    with pytest.raises(errors.InventoryError, match=message):
        inventory.parse(document(node, model=model))


def test_gpu_driver_without_a_gpu_model_is_refused():
    cpu = {"name": "cpu-0", "cpu": "4", "memory": "8Gi", "gpuDriver": "draStatic"}
    with pytest.raises(errors.InventoryError, match=r"\['gpuDriver'\] given without a gpuModel"):
        inventory.parse(document(cpu))

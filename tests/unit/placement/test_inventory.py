from __future__ import annotations

import pytest
from placement_cases import GIB, MIB, build, node, pod

from kubeseer.placement import inventory


def offers_by(inv):
    return {(o.node, o.resource): o for o in inv.offers}


def test_free_is_allocatable_minus_requests_of_live_pods_on_the_node():
    inv = build(
        [node("n1", "NVIDIA-H100-80GB-HBM3", {"nvidia.com/mig-1g.10gb": 7})],
        [
            pod("n1", {"nvidia.com/mig-1g.10gb": 2}),
            pod("n1", {"nvidia.com/mig-1g.10gb": 1}, phase="Pending"),
            pod("n1", {"nvidia.com/mig-1g.10gb": 3}, phase="Succeeded"),
            pod("n1", {"nvidia.com/mig-1g.10gb": 3}, phase="Failed"),
            pod("other", {"nvidia.com/mig-1g.10gb": 5}),
        ],
    )
    offer = offers_by(inv)[("n1", "nvidia.com/mig-1g.10gb")]
    assert (offer.allocatable, offer.free) == (7, 4)
    assert offer.model_key == "H100-80GB-SXM"
    assert offer.usable_memory_bytes == 9.75 * GIB


def test_free_never_goes_negative_when_pods_overcommit_a_stale_node():
    inv = build(
        [node("n1", "NVIDIA-A100-SXM4-80GB", {"nvidia.com/gpu": 1})],
        [pod("n1", {"nvidia.com/gpu": 1}), pod("n1", {"nvidia.com/gpu": 1})],
    )
    assert offers_by(inv)[("n1", "nvidia.com/gpu")].free == 0


def test_unbound_pods_are_charged_to_the_cluster_not_to_a_node():
    inv = build(
        [node("n1", "NVIDIA-H100-80GB-HBM3", {"nvidia.com/mig-2g.20gb": 3})],
        [pod("", {"nvidia.com/mig-2g.20gb": 2})],
    )
    assert offers_by(inv)[("n1", "nvidia.com/mig-2g.20gb")].free == 3
    assert inv.free_units("NVIDIA-H100-80GB-HBM3", "nvidia.com/mig-2g.20gb") == 1


H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"
BOTH = [node("h", H100, {"nvidia.com/gpu": 2}), node("a", A100, {"nvidia.com/gpu": 2})]


def test_an_unbound_pod_pinned_to_a_product_is_charged_to_that_product_only():
    # Issue 17: charged to every product offering the resource, a burst pinned to H100s made
    # the idle A100s look busy.
    inv = build(
        BOTH, [pod("", {"nvidia.com/gpu": 2}, node_selector={inventory.PRODUCT_LABEL: H100})]
    )
    assert inv.free_units(H100, "nvidia.com/gpu") == 0
    assert inv.free_units(A100, "nvidia.com/gpu") == 2
    assert inv.pending_units(H100, "nvidia.com/gpu") == 2


def test_an_unbound_pod_without_a_selector_is_charged_to_every_product_it_could_use():
    inv = build(BOTH, [pod("", {"nvidia.com/gpu": 1})])
    assert inv.free_units(H100, "nvidia.com/gpu") == inv.free_units(A100, "nvidia.com/gpu") == 1


def test_an_unbound_pod_whose_selector_matches_no_gpu_node_is_charged_nowhere():
    inv = build(BOTH, [pod("", {"nvidia.com/gpu": 1}, node_selector={"zone": "mars"})])
    assert inv.pending == {}


def test_other_selector_labels_narrow_the_products_an_unbound_pod_is_charged_to():
    nodes = [*BOTH, node("a2", A100, {"nvidia.com/gpu": 1}, labels={"zone": "b"})]
    inv = build(nodes, [pod("", {"nvidia.com/gpu": 1}, node_selector={"zone": "b"})])
    assert inv.pending == {(A100, "nvidia.com/gpu"): 1}
    # Counting only the nodes a selector matches.
    assert inv.free_units(A100, "nvidia.com/gpu", {"a2"}) == 0
    assert inv.free_units(A100, "nvidia.com/gpu", {"a"}) == 1
    assert inv.node_labels["a2"]["zone"] == "b"


def test_effective_request_takes_limits_and_the_larger_of_init_and_app_containers():
    record: inventory.PodRecord = {
        "node_name": "n1",
        "phase": "Running",
        "containers": [
            {"limits": {"nvidia.com/gpu": "1"}},
            {"requests": {"nvidia.com/gpu": "1", "cpu": "500m"}},
        ],
        "init_containers": [{"limits": {"nvidia.com/gpu": "3"}}],
    }
    inv = build([node("n1", "NVIDIA-H200", {"nvidia.com/gpu": 4})], [record])
    assert offers_by(inv)[("n1", "nvidia.com/gpu")].free == 1


def test_single_strategy_nodes_offer_their_slice_as_nvidia_com_gpu():
    inv = build([node("n1", "NVIDIA-A100-SXM4-40GB-MIG-2g.10gb", {"nvidia.com/gpu": 3})])
    offer = offers_by(inv)[("n1", "nvidia.com/gpu")]
    assert offer.profile.name == "2g.10gb"
    assert offer.usable_memory_bytes == round(9.625 * GIB)


def test_gfd_labels_tighten_memory_but_never_raise_it():
    inv = build(
        [
            node(
                "tight",
                "NVIDIA-H100-NVL",
                {"nvidia.com/mig-1g.12gb": 7},
                labels={"nvidia.com/mig-1g.12gb.memory": "10240"},
            ),
            node(
                "nominal",
                "NVIDIA-H100-NVL",
                {"nvidia.com/mig-1g.12gb": 7},
                labels={"nvidia.com/mig-1g.12gb.memory": "12288"},
            ),
        ]
    )
    offers = offers_by(inv)
    assert offers[("tight", "nvidia.com/mig-1g.12gb")].usable_memory_bytes == 10240 * MIB
    assert offers[("nominal", "nvidia.com/mig-1g.12gb")].usable_memory_bytes == round(10.625 * GIB)


def test_gfd_multiprocessors_label_replaces_a_derived_compute_share():
    inv = build(
        [
            node(
                "pcie",
                "NVIDIA-H100-PCIe",
                {"nvidia.com/mig-1g.10gb": 7},
                labels={"nvidia.com/mig-1g.10gb.multiprocessors": "14"},
            )
        ]
    )
    assert offers_by(inv)[("pcie", "nvidia.com/mig-1g.10gb")].compute_share == pytest.approx(
        14 / 114
    )


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (node("n1", "Tesla-T4", {"nvidia.com/gpu": 1}), "unknown GPU product 'Tesla-T4'"),
        (
            {
                "name": "n1",
                "labels": {},
                "allocatable": {"nvidia.com/gpu": "1"},
                "schedulable": True,
            },
            "no nvidia.com/gpu.product label",
        ),
        (node("n1", "NVIDIA-H200", {"nvidia.com/gpu": 1}, schedulable=False), "cordoned"),
        (
            node("n1", "NVIDIA-A100-SXM4-80GB", {"nvidia.com/mig-1g.10gb.me": 1}),
            "not in the catalogue ignored: nvidia.com/mig-1g.10gb.me",
        ),
    ],
)
def test_nodes_placement_cannot_use_are_skipped_with_a_reason(record, reason):
    inv = build([record, node("good", "NVIDIA-H200", {"nvidia.com/gpu": 1})])
    assert [o.node for o in inv.offers] == ["good"]
    assert len(inv.skipped) == 1
    assert reason in inv.skipped[0].reason


def test_nodes_without_gpus_are_neither_offers_nor_skipped():
    inv = build([{"name": "cpu", "labels": {}, "allocatable": {"cpu": "8"}, "schedulable": True}])
    assert inv.offers == () and inv.skipped == ()


def test_fractional_gpu_quantity_is_a_typed_error():
    with pytest.raises(inventory.InventoryError, match="'500m' is not a whole number"):
        build(
            [node("n1", "NVIDIA-H200", {"nvidia.com/gpu": 1})],
            [
                {
                    "node_name": "n1",
                    "phase": "Running",
                    "containers": [{"requests": {"nvidia.com/gpu": "500m"}}],
                }
            ],
        )

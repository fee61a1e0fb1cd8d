"""The DRA inventory: the driver's slices (as the dev cluster publishes them, shaped like NVIDIA's
DRA driver's) minus what claims hold, shared counters included."""

from __future__ import annotations

from typing import Any

import pytest

from kubeseer import resources
from kubeseer.devcluster import inventory as devcluster_inventory
from kubeseer.devcluster.dra import slices
from kubeseer.operator.dra import inventory as dra_inventory
from kubeseer.operator.inventory import node_record
from kubeseer.placement import catalogue, claims

NODES = devcluster_inventory.load(resources.path("deploy", "devcluster", "dra-nodes.yaml"))
STATIC = "gpu-h100-dra-static-0"
H100_DYNAMIC = "gpu-h100-dra-dynamic-0"
A100_DYNAMIC = "gpu-a100-40-dra-dynamic-0"
H100_LABEL = "NVIDIA-H100-80GB-HBM3"
A100_LABEL = "NVIDIA-A100-SXM4-40GB"
MIG_1G5 = "nvidia.com/mig-1g.5gb"


def published() -> list[dict[str, Any]]:
    return [dict(s) for node in NODES.dra_nodes() for s in slices.build_slices(node)]


def ready(name: str, *, schedulable: bool = True, **labels: str) -> Any:
    node = {
        "metadata": {"name": name, "labels": labels},
        "spec": {"unschedulable": not schedulable},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    return node_record(node)


def offers(inv: Any, node: str) -> dict[tuple[str, str], tuple[int, int]]:
    """(product label, resource) -> (allocatable, free) on one node."""
    return {
        (o.product_label, o.resource): (o.allocatable, o.free) for o in inv.offers if o.node == node
    }


def claim(name: str, *devices: tuple[str, str], namespace: str = "ml") -> dict[str, Any]:
    results = [
        {"request": "gpu/r1", "driver": claims.DRIVER, "pool": pool, "device": device}
        for pool, device in devices
    ]
    return {
        "metadata": {"name": name, "namespace": namespace},
        "status": {"allocation": {"devices": {"results": results}}},
    }


@pytest.mark.parametrize(
    ("text", "value"),
    [("9984Mi", 9984 << 20), ("40Gi", 40 << 30), ("16", 16), ("1.5Gi", 3 << 29), ("2k", 2000)],
)
def test_quantities_are_read_as_kubernetes_writes_them(text: str, value: int) -> None:
    assert dra_inventory.quantity(text) == value


def test_a_malformed_quantity_is_an_error_not_a_guess() -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        dra_inventory.quantity("lots")


def test_static_mig_offers_the_partitions_that_exist_with_their_usable_memory() -> None:
    inv = dra_inventory.build(dra_inventory.read_slices(published()), [], {})
    assert offers(inv, STATIC) == {
        (H100_LABEL, "nvidia.com/mig-1g.10gb"): (2, 2),
        (H100_LABEL, "nvidia.com/mig-2g.20gb"): (1, 1),
        (H100_LABEL, "nvidia.com/mig-3g.40gb"): (1, 1),
        (H100_LABEL, "nvidia.com/gpu"): (1, 1),
    }
    small = next(
        o for o in inv.offers if o.node == STATIC and o.resource == "nvidia.com/mig-1g.10gb"
    )
    # The driver's `memory` capacity is the usable amount; the plan reads it, not the name.
    assert small.usable_memory_bytes == 9984 << 20
    assert small.compute_share == pytest.approx(16 / 132)
    assert small.model_key == catalogue.model_by_key("H100-80GB-SXM").key


def test_dynamic_mig_offers_every_placement_and_counts_what_the_counters_still_allow() -> None:
    found = dra_inventory.read_slices(published())
    free = offers(dra_inventory.build(found, [], {}), A100_DYNAMIC)
    assert free[(A100_LABEL, MIG_1G5)] == (7, 7)
    assert free[(A100_LABEL, "nvidia.com/gpu")] == (1, 1)
    # A 1g.5gb at memory slice 0 takes what the whole GPU and every placement on slice 0 need.
    held = [(A100_DYNAMIC, "gpu-0-mig-1g5gb-19-0")]
    after = offers(dra_inventory.build(found, held, {}), A100_DYNAMIC)
    assert after[(A100_LABEL, MIG_1G5)] == (7, 6)
    assert after[(A100_LABEL, "nvidia.com/gpu")] == (1, 0)
    assert after[(A100_LABEL, "nvidia.com/mig-7g.40gb")] == (1, 0)
    assert after[(A100_LABEL, "nvidia.com/mig-4g.20gb")] == (1, 0)  # starts at slice 0 only
    assert after[(A100_LABEL, "nvidia.com/mig-3g.20gb")] == (2, 1)  # the one at slice 4
    # Seven 1g.5gb placements use all 98 SMs the counters hold: nothing else is free.
    every = [(A100_DYNAMIC, f"gpu-0-mig-1g5gb-19-{s}") for s in range(7)]
    full = offers(dra_inventory.build(found, every, {}), A100_DYNAMIC)
    assert {free for _, free in full.values()} == {0}


def test_unknown_products_and_other_drivers_are_left_out_and_named() -> None:
    odd = {
        "metadata": {"name": "odd"},
        "spec": {
            "driver": claims.DRIVER,
            "nodeName": "odd-node",
            "pool": {"name": "odd-node", "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": "gpu-0",
                    "attributes": {"type": {"string": "gpu"}, "productName": {"string": "X9000"}},
                    "capacity": {"memory": {"value": "8Gi"}},
                }
            ],
        },
    }
    other = {"metadata": {"name": "nic"}, "spec": {"driver": "nic.example.com", "nodeName": "n"}}
    found = dra_inventory.read_slices([odd, other])
    assert found.devices == ()
    (skipped,) = found.skipped
    assert skipped.node == "odd-node" and "X9000" in skipped.reason


def test_a_cordoned_node_offers_nothing_and_node_labels_come_along() -> None:
    found = dra_inventory.read_slices(published())
    nodes = {
        STATIC: ready(STATIC, schedulable=False),
        H100_DYNAMIC: ready(H100_DYNAMIC, zone="a"),
    }
    inv = dra_inventory.build(found, [], nodes)
    assert offers(inv, STATIC) == {}
    assert any(s.node == STATIC for s in inv.skipped)
    assert inv.node_labels[H100_DYNAMIC] == {"zone": "a"}


def test_the_cache_follows_slices_claims_and_assumptions() -> None:
    now = [0.0]
    cache = dra_inventory.DraInventoryCache(clock=lambda: now[0])
    cache.replace_all(published(), [], [ready(A100_DYNAMIC)])

    def free_small() -> int:
        return cache.snapshot().free_units(A100_LABEL, MIG_1G5)

    assert free_small() == 7
    cache.assume("ml/job#0", (A100_LABEL, MIG_1G5), 2)
    assert free_small() == 5
    # The attempt's claim allocated: the device is held, the assumption ends.
    allocated = claim("job-0-gpu-x", (A100_DYNAMIC, "gpu-0-mig-1g5gb-19-3"))
    cache.observe_claim("ADDED", allocated, "ml/job#0")
    assert free_small() == 6
    cache.observe_claim("DELETED", allocated)
    assert free_small() == 7
    cache.assume("ml/other#0", (A100_LABEL, MIG_1G5), 1)
    now[0] += dra_inventory.ASSUME_TTL_S + 1
    assert free_small() == 7
    cache.assume("ml/third#0", (A100_LABEL, MIG_1G5), 1)
    cache.forget("ml/third#0")
    assert free_small() == 7
    for item in published():
        if item["spec"]["nodeName"] == A100_DYNAMIC:
            cache.observe_slice("DELETED", item)
    assert free_small() == 0
    assert cache.device((H100_DYNAMIC, "gpu-1")) is not None
    assert cache.device((A100_DYNAMIC, "gpu-0")) is None

"""Reading allocations back: a claim's chosen rung and device (`claims.read_allocation`), and the
ledger that checks allocated devices against the slices' counters and MIG geometry."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kubeseer import resources
from kubeseer.devcluster import inventory
from kubeseer.devcluster.dra import allocation, slices
from kubeseer.placement import claims

NODES = inventory.load(resources.path("deploy", "devcluster", "dra-nodes.yaml"))
DYNAMIC = next(n for n in NODES.nodes if n.name == "gpu-h100-dra-dynamic-0")
POOL = DYNAMIC.name


def claim(result_request: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": "job-0-gpu-x"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "firstAvailable": [
                            {"name": "r1-h100-80gb-sxm-1g-20gb"},
                            {"name": "r2-h100-80gb-sxm-2g-20gb"},
                        ],
                    }
                ]
            }
        },
        "status": {},
    }
    if result_request is not None:
        body["status"]["allocation"] = {
            "devices": {
                "results": [
                    {
                        "request": result_request,
                        "driver": "gpu.nvidia.com",
                        "pool": POOL,
                        "device": "gpu-0-mig-2g20gb-14-2",
                    }
                ]
            }
        }
    return body


def test_an_unallocated_claim_has_no_allocation():
    assert claims.read_allocation(claim(None)) is None
    assert claims.read_allocation({"spec": {}}) is None


def test_the_allocation_names_the_rung_the_device_and_whether_it_was_the_first_choice():
    second = claims.read_allocation(claim("gpu/r2-h100-80gb-sxm-2g-20gb"))
    assert second == claims.Allocation(
        rung="r2-h100-80gb-sxm-2g-20gb",
        driver="gpu.nvidia.com",
        pool=POOL,
        device="gpu-0-mig-2g20gb-14-2",
        first_choice=False,
    )
    first = claims.read_allocation(claim("gpu/r1-h100-80gb-sxm-1g-20gb"))
    assert first is not None
    assert first.first_choice


@pytest.mark.parametrize("request_name", ["gpu", "other/r1-h100-80gb-sxm-1g-20gb"])
def test_a_result_that_names_no_rung_of_the_request_is_an_error(request_name):
    with pytest.raises(ValueError, match="names no rung"):
        claims.read_allocation(claim(request_name))


def test_a_claim_not_shaped_as_a_ladder_is_an_error():
    body = claim("gpu/r1-h100-80gb-sxm-1g-20gb")
    exact = copy.deepcopy(body)
    exact["spec"]["devices"]["requests"][0] = {"name": "gpu", "exactly": {}}
    with pytest.raises(ValueError, match="firstAvailable ladder"):
        claims.read_allocation(exact)


@pytest.mark.parametrize(
    ("text", "value"),
    [("16", 16), ("81152Mi", 81152 << 20), ("80Gi", 80 << 30), ("1k", 1000), ("4Ki", 4096)],
)
def test_quantities(text, value):
    assert allocation.quantity(text) == value


def test_a_fractional_quantity_is_refused():
    with pytest.raises(ValueError, match="not an integer quantity"):
        allocation.quantity("1.5Gi")


def test_mig_names_parse_to_their_placement_and_impossible_ones_are_refused():
    placed = allocation.parse_mig_name("gpu-1-mig-3g40gb-9-4")
    assert placed == allocation.MigPlacement(gpu=1, compute_slices=3, memory_slices=range(4, 8))
    assert allocation.parse_mig_name("gpu-3") is None
    with pytest.raises(ValueError, match="cannot start at memory slice 2"):
        allocation.parse_mig_name("gpu-0-mig-3g40gb-9-2")
    with pytest.raises(ValueError, match="unknown MIG profile ID 7"):
        allocation.parse_mig_name("gpu-0-mig-xx-7-0")


def test_the_ledger_sums_what_allocated_devices_consume_per_gpu():
    ledger = allocation.Ledger(slices.build_slices(DYNAMIC))
    held = [(POOL, "gpu-0-mig-3g40gb-9-0"), (POOL, "gpu-0-mig-1g20gb-15-4"), (POOL, "gpu-1")]
    usage = ledger.usage(held)
    gpu0 = usage[(POOL, "gpu-0-counter-set")]
    assert gpu0["multiprocessors"] == 60 + 26
    assert gpu0["memory"] == (40448 + 20096) << 20
    assert {k: v for k, v in gpu0.items() if k.startswith("memory-slice-")} == {
        f"memory-slice-{i}": 1 for i in range(6)
    }
    assert usage[(POOL, "gpu-1-counter-set")]["multiprocessors"] == 132
    assert ledger.overcommitted(held) == []
    assert ledger.overlapping(held) == []
    assert ledger.capacity((POOL, "gpu-0-mig-1g20gb-15-4"), "memory") == 20096 << 20


def test_the_ledger_reports_overlaps_and_overcommitted_counters():
    ledger = allocation.Ledger(slices.build_slices(DYNAMIC))
    clash = [(POOL, "gpu-0-mig-3g40gb-9-4"), (POOL, "gpu-0-mig-1g10gb-19-6")]
    assert ledger.overcommitted(clash) == [
        f"{POOL}/gpu-0-counter-set memory-slice-6: 2 used, 1 offered"
    ]
    assert ledger.overlapping(clash) == [
        f"{POOL}: gpu-0-mig-1g10gb-19-6 and gpu-0-mig-3g40gb-9-4 share memory slice 6 of GPU 0"
    ]
    both = [(POOL, "gpu-1"), (POOL, "gpu-1-mig-1g10gb-19-0")]
    assert ledger.overlapping(both) == [f"{POOL}: gpu-1 allocated whole and partitioned"]

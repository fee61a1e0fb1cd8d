"""The ResourceSlices of DRA nodes: shaped as NVIDIA's DRA driver publishes them, within the
limits of resource.k8s.io/v1, and with counters that encode exactly MIG's geometry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from kubeseer import resources
from kubeseer.devcluster import inventory
from kubeseer.devcluster.dra import allocation, geometry, publish, slices
from kubeseer.placement import catalogue, claims

DRA_INVENTORY = resources.path("deploy", "devcluster", "dra-nodes.yaml")
SHIPPED = sorted(resources.path("deploy", "devcluster").glob("dra*.yaml"))
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DRIVER_ATTRIBUTES = {
    "type",
    "productName",
    "brand",
    "architecture",
    "cudaComputeCapability",
    "driverVersion",
    "cudaDriverVersion",
    "resource.kubernetes.io/pciBusID",
}
ENGINES = {"copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines"}


def node(name: str) -> inventory.NodeSpec:
    (found,) = [n for n in inventory.load(DRA_INVENTORY).nodes if n.name == name]
    return found


STATIC = node("gpu-h100-dra-static-0")
DYNAMIC = node("gpu-h100-dra-dynamic-0")
A100_DYNAMIC = node("gpu-a100-40-dra-dynamic-0")


def devices(made: list[slices.ResourceSlice]) -> dict[str, slices.Device]:
    return {d["name"]: d for s in made for d in s["spec"].get("devices", [])}


def test_a_static_node_publishes_its_existing_partitions_and_whole_gpus_in_one_slice():
    made = slices.build_slices(STATIC, "uid-7")
    (only,) = made
    assert only["apiVersion"] == "resource.k8s.io/v1"
    assert only["spec"]["driver"] == "gpu.nvidia.com" == claims.DRIVER
    assert only["spec"]["nodeName"] == STATIC.name
    assert only["spec"]["pool"] == {
        "name": STATIC.name,
        "generation": 1,
        "resourceSliceCount": 1,
    }
    assert only["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "name": STATIC.name,
            "uid": "uid-7",
            "controller": True,
        }
    ]
    by_name = devices(made)
    # GPU0 carries {1g.10gb: 2, 2g.20gb: 1, 3g.40gb: 1}: the 3g must sit at 4 (two 1g and a 2g
    # cannot all follow a 3g at 0); GPU1 is whole.
    assert sorted(by_name) == [
        "gpu-0-mig-1g10gb-19-2",
        "gpu-0-mig-1g10gb-19-3",
        "gpu-0-mig-2g20gb-14-0",
        "gpu-0-mig-3g40gb-9-4",
        "gpu-1",
    ]
    assert list(by_name) == sorted(by_name)
    whole = by_name["gpu-1"]
    assert whole["capacity"] == {"memory": {"value": "81559Mi"}}
    assert whole["attributes"]["type"] == {"string": "gpu"}
    assert "consumesCounters" not in whole
    mig = by_name["gpu-0-mig-3g40gb-9-4"]
    assert mig["attributes"]["type"] == {"string": "mig"}
    assert mig["attributes"]["profile"] == {"string": "3g.40gb"}
    assert (
        mig["attributes"]["parentUUID"]
        == by_name["gpu-0-mig-1g10gb-19-2"]["attributes"]["parentUUID"]
    )
    assert mig["attributes"]["uuid"]["string"].startswith("MIG-")
    # The usable memory NVML reports for the instance, not the 40 GiB of the name.
    assert mig["capacity"]["memory"] == {"value": "40448Mi"}
    assert mig["capacity"]["multiprocessors"] == {"value": "60"}
    assert {f"memorySlice{i}" for i in range(4, 8)} <= set(mig["capacity"])


def test_static_uuids_are_stable_and_distinct():
    first = devices(slices.build_slices(STATIC))
    again = devices(slices.build_slices(STATIC))
    uuids = [d["attributes"]["uuid"]["string"] for d in first.values()]
    assert len(set(uuids)) == len(uuids)
    assert uuids == [d["attributes"]["uuid"]["string"] for d in again.values()]


def test_a_dynamic_node_is_one_slice_of_counter_sets_and_one_slice_of_devices_per_gpu():
    made = slices.build_slices(DYNAMIC)
    assert len(made) == DYNAMIC.gpus + 1
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in made} == {len(made)}
    counters, *per_gpu = made
    assert "devices" not in counters["spec"]
    assert [c["name"] for c in counters["spec"]["sharedCounters"]] == [
        "gpu-0-counter-set",
        "gpu-1-counter-set",
    ]
    gpu0 = counters["spec"]["sharedCounters"][0]["counters"]
    # The largest profile's figures (7g.80gb) and one counter per memory slice.
    assert gpu0["memory"] == {"value": "81152Mi"}
    assert gpu0["multiprocessors"] == {"value": "132"}
    assert gpu0["copy-engines"] == {"value": "8"}
    assert {f"memory-slice-{i}" for i in range(8)} <= set(gpu0)
    for minor, part in enumerate(per_gpu):
        assert "sharedCounters" not in part["spec"]
        names = [d["name"] for d in part["spec"]["devices"]]
        assert len(names) <= slices.MAX_COUNTER_DEVICES_PER_SLICE
        # The whole GPU and every profile at every placement NVIDIA allows.
        expected = {f"gpu-{minor}"} | {
            f"gpu-{minor}-mig-{p.replace('.', '')}-{geometry.profile_id(c, m)}-{s}"
            for p, (c, m) in {
                "1g.10gb": (1, 1),
                "1g.20gb": (1, 2),
                "2g.20gb": (2, 2),
                "3g.40gb": (3, 4),
                "4g.40gb": (4, 4),
                "7g.80gb": (7, 8),
            }.items()
            for s in geometry.starts(c, m)
        }
        assert set(names) == expected
        assert len(names) == 19
        for device in part["spec"]["devices"]:
            (use,) = device["consumesCounters"]
            assert use["counterSet"] == f"gpu-{minor}-counter-set"


def test_dynamic_mig_devices_do_not_exist_yet_so_they_have_no_uuid_but_name_their_parent():
    by_name = devices(slices.build_slices(DYNAMIC))
    whole = by_name["gpu-0"]
    for name, device in by_name.items():
        if name.startswith("gpu-0-mig-"):
            assert "uuid" not in device["attributes"]
            assert device["attributes"]["parentUUID"] == whole["attributes"]["uuid"]


def test_each_dynamic_placement_consumes_its_own_memory_slices_and_its_capacities():
    by_name = devices(slices.build_slices(DYNAMIC))
    device = by_name["gpu-1-mig-1g20gb-15-6"]
    (use,) = device["consumesCounters"]
    assert use["counters"] == {
        "multiprocessors": {"value": "26"},
        "copy-engines": {"value": "1"},
        "decoders": {"value": "1"},
        "encoders": {"value": "0"},
        "jpeg-engines": {"value": "1"},
        "ofa-engines": {"value": "0"},
        "memory": {"value": "20096Mi"},
        "memory-slice-6": {"value": "1"},
        "memory-slice-7": {"value": "1"},
    }
    assert device["capacity"]["memory"] == {"value": "20096Mi"}
    whole = by_name["gpu-1"]["consumesCounters"][0]["counters"]
    assert {f"memory-slice-{i}" for i in range(8)} <= set(whole)


@pytest.mark.parametrize("spec", [DYNAMIC, A100_DYNAMIC], ids=lambda n: n.name)
def test_the_counters_admit_exactly_the_placements_mig_allows(spec):
    """Any set of placements on one GPU with disjoint memory slices fits the counters (even
    the SM and engine counters never refuse what the hardware allows); any overlapping pair
    exceeds them; the whole GPU excludes every partition."""
    ledger = allocation.Ledger(slices.build_slices(spec))
    pool = spec.name
    mig = sorted(name for p, name in ledger.devices if name.startswith("gpu-0-mig-") and p == pool)
    placements = {name: allocation.parse_mig_name(name) for name in mig}
    disjoint_sets = 0

    def extend(chosen: list[str], used: frozenset[int], rest: list[str]) -> None:
        nonlocal disjoint_sets
        if chosen:
            keys = [(pool, n) for n in chosen]
            assert ledger.overcommitted(keys) == [], chosen
            assert ledger.overlapping(keys) == []
            disjoint_sets += 1
        for i, name in enumerate(rest):
            held = frozenset(placements[name].memory_slices)
            if not held & used:
                extend([*chosen, name], used | held, rest[i + 1 :])

    extend([], frozenset(), mig)
    assert disjoint_sets > 500
    for a in mig:
        assert ledger.overcommitted([(pool, a), (pool, "gpu-0")]) != []
        for b in mig:
            if a < b and set(placements[a].memory_slices) & set(placements[b].memory_slices):
                assert ledger.overcommitted([(pool, a), (pool, b)]) != [], (a, b)
                assert ledger.overlapping([(pool, a), (pool, b)]) != []


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_dra_inventory_builds_within_the_v1_limits(path: Path):
    for spec in inventory.load(path).dra_nodes():
        made = slices.build_slices(spec)
        assert spec.extended_resources() == {}
        for item in made:
            assert len(item["metadata"]["name"]) <= 253
            sets = item["spec"].get("sharedCounters", [])
            assert len(sets) <= 8
            assert all(len(s["counters"]) <= 32 for s in sets)
            for device in item["spec"].get("devices", []):
                assert DNS_LABEL.match(device["name"])
                assert len(device["attributes"]) + len(device["capacity"]) <= 32
                assert set(device["attributes"]) >= DRIVER_ATTRIBUTES
            limit = (
                64 if any("consumesCounters" in d for d in item["spec"].get("devices", [])) else 128
            )
            assert len(item["spec"].get("devices", [])) <= limit


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_product_names_are_the_ones_kubeseers_claims_select_on(path: Path):
    """The claims' CEL selects `productName in [...]` from the placement catalogue."""
    for spec in inventory.load(path).dra_nodes():
        assert spec.gpu_model is not None
        gpu, _ = catalogue.parse_product_label(spec.gpu_model.product)
        assert spec.gpu_model.product_name == gpu.product_name(spec.gpu_model.product)


def test_mig_capacities_carry_the_engines_of_nvidia_smi_lgip():
    by_name = devices(slices.build_slices(A100_DYNAMIC))
    small = by_name["gpu-0-mig-1g5gb-19-6"]["capacity"]
    assert set(small) == ENGINES | {"memory", "multiprocessors"}
    assert small["memory"] == {"value": "4864Mi"}
    assert small["multiprocessors"] == {"value": "14"}
    assert small["decoders"] == {"value": "0"}
    # Under dynamic MIG the whole GPU offers what the largest profile does (7g.40gb: 98 SMs).
    assert by_name["gpu-0"]["capacity"]["multiprocessors"] == {"value": "98"}
    assert by_name["gpu-0"]["capacity"]["memory"] == {"value": "40192Mi"}


def test_a_node_without_dra_has_no_slices():
    plugin = inventory.parse({"nodes": [{"name": "cpu-0", "cpu": "1", "memory": "1Gi"}]}).nodes[0]
    with pytest.raises(ValueError, match="no GPUs published by the DRA driver"):
        slices.build_slices(plugin)


def test_the_device_classes_are_the_drivers_and_the_ones_claims_name():
    docs = list(yaml.safe_load_all(publish.DEVICE_CLASSES.read_text()))
    by_name = {d["metadata"]["name"]: d for d in docs}
    assert set(by_name) == {claims.GPU_DEVICE_CLASS, claims.MIG_DEVICE_CLASS}
    assert all(d["apiVersion"] == "resource.k8s.io/v1" for d in docs)
    gpu = by_name[claims.GPU_DEVICE_CLASS]["spec"]
    assert gpu["extendedResourceName"] == "nvidia.com/gpu"
    assert gpu["selectors"] == [
        {
            "cel": {
                "expression": "device.driver == 'gpu.nvidia.com' && "
                "device.attributes['gpu.nvidia.com'].type == 'gpu'"
            }
        }
    ]
    mig = by_name[claims.MIG_DEVICE_CLASS]["spec"]
    assert "extendedResourceName" not in mig
    assert "type == 'mig'" in mig["selectors"][0]["cel"]["expression"]
    assert publish.device_class_files(inventory.load(DRA_INVENTORY)) == (publish.DEVICE_CLASSES,)
    assert (
        publish.device_class_files(
            inventory.load(resources.path("deploy", "devcluster", "nodes.yaml"))
        )
        == ()
    )

"""Choosing the GPU backend: the setting, or auto-detection from DeviceClasses and nodes."""

from __future__ import annotations

from typing import Any

import pytest

from kubeseer.operator import backends
from kubeseer.operator.config import GpuBackend

DRIVER_CLASSES = ["gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com"]


def node(name: str, **allocatable: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"allocatable": {"cpu": "64", **allocatable}}}


DRA_NODE = node("dra-0")
PLUGIN_NODE = node("a100-0", **{"nvidia.com/mig-1g.10gb": "7"})


@pytest.mark.parametrize(
    ("classes", "nodes", "chosen", "why"),
    [
        (DRIVER_CLASSES, [DRA_NODE, node("cpu-0")], GpuBackend.DRA, "no device plugin"),
        ([], [DRA_NODE], GpuBackend.EXTENDED, "no DeviceClass gpu.nvidia.com, mig.nvidia.com"),
        (["gpu.nvidia.com"], [DRA_NODE], GpuBackend.EXTENDED, "no DeviceClass mig.nvidia.com"),
        (DRIVER_CLASSES, [DRA_NODE, PLUGIN_NODE], GpuBackend.EXTENDED, "a100-0"),
    ],
    ids=["driver only", "no driver", "half a driver", "mixed: a device plugin too"],
)
def test_auto_picks_dra_where_only_the_dra_driver_serves_gpus(
    classes: list[str], nodes: list[dict[str, Any]], chosen: GpuBackend, why: str
) -> None:
    kind, reason = backends.resolve(GpuBackend.AUTO, classes, nodes)
    assert kind is chosen
    assert why in reason


@pytest.mark.parametrize("setting", [GpuBackend.EXTENDED, GpuBackend.DRA])
def test_an_explicit_setting_is_taken_as_it_is(setting: GpuBackend) -> None:
    assert backends.resolve(setting, [], [PLUGIN_NODE])[0] is setting


def test_an_unresolved_setting_builds_no_backend(make_world: Any) -> None:
    world = make_world()
    with pytest.raises(ValueError, match="resolve"):
        backends.build(GpuBackend.AUTO, world.inventory, world.devices)
    built = backends.build(GpuBackend.DRA, world.inventory, world.devices)
    assert built.kind is GpuBackend.DRA

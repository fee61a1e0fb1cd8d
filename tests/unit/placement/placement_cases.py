"""Builders for placement tests: predictions and cluster inventories as plain data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kubeseer.placement import catalogue, inventory
from kubeseer.prediction import Estimate, Mode, Precision, Prediction

GIB = catalogue.GIB
MIB = catalogue.MIB


def prediction(
    *,
    upper_bytes: float,
    point_bytes: float | None = None,
    sm_util: float = 10.0,
    coverage: float = 0.95,
) -> Prediction:
    point = upper_bytes if point_bytes is None else point_bytes
    return Prediction(
        mode=Mode.INFER,
        batch_size=8,
        precision=Precision.FP32,
        memory_bytes=Estimate(point=point, upper=max(point, upper_bytes)),
        sm_util_percent=Estimate(point=sm_util, upper=min(100.0, sm_util + 5)),
        step_time_s=Estimate(point=0.05, upper=0.06),
        coverage=coverage,
        model_digest="sha256:" + "0" * 64,
        predictor_version="test",
        label_device="A100-SXM4-40GB",
    )


def node(
    name: str,
    product: str,
    allocatable: Mapping[str, int],
    *,
    labels: Mapping[str, str] | None = None,
    schedulable: bool = True,
) -> inventory.NodeRecord:
    return {
        "name": name,
        "labels": {inventory.PRODUCT_LABEL: product, **(labels or {})},
        "allocatable": {
            "cpu": "64",
            "memory": "512Gi",
            **{r: str(q) for r, q in allocatable.items()},
        },
        "schedulable": schedulable,
    }


def pod(node_name: str, requests: Mapping[str, int], phase: str = "Running") -> inventory.PodRecord:
    return {
        "node_name": node_name,
        "phase": phase,
        "containers": [{"requests": {r: str(q) for r, q in requests.items()}}],
    }


def a100_40_mixed(name: str = "a100-40") -> inventory.NodeRecord:
    """One A100-40GB with every DIPPM ladder profile carved out (as a mixed-strategy node)."""
    return node(
        name,
        "NVIDIA-A100-SXM4-40GB",
        {
            "nvidia.com/mig-1g.5gb": 1,
            "nvidia.com/mig-1g.10gb": 1,
            "nvidia.com/mig-2g.10gb": 1,
            "nvidia.com/mig-3g.20gb": 1,
            "nvidia.com/mig-7g.40gb": 1,
        },
    )


def build(
    nodes: Sequence[inventory.NodeRecord], pods: Sequence[inventory.PodRecord] = ()
) -> inventory.Inventory:
    return inventory.build(nodes, pods)

"""Builders for placement tests: predictions and cluster inventories as plain data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

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
    label_device: str = "A100-SXM4-40GB",
    step_time_s: float = 0.05,
) -> Prediction:
    """A prediction whose SM utilisation was learned on `label_device`."""
    point = upper_bytes if point_bytes is None else point_bytes
    return Prediction(
        mode=Mode.INFER,
        batch_size=8,
        precision=Precision.FP32,
        memory_bytes=Estimate(point=point, upper=max(point, upper_bytes)),
        sm_util_percent=Estimate(point=sm_util, upper=min(100.0, sm_util + 5)),
        step_time_s=Estimate(point=step_time_s, upper=step_time_s * 1.2),
        coverage=coverage,
        model_digest="sha256:" + "0" * 64,
        predictor_version="test",
        label_device=label_device,
    )


def shipped_prediction(*, upper_bytes: float) -> Prediction:
    """What the shipped checkpoint serves: CPU labels and the 100 % utilisation stand-in."""
    return prediction(upper_bytes=upper_bytes, sm_util=100.0, label_device="AMD EPYC")


def unlearned_prediction(*, upper_bytes: float, label_device: str) -> Prediction:
    """A GPU-labelled prediction whose utilisation is the predictor's stand-in."""
    made = prediction(upper_bytes=upper_bytes, sm_util=100.0, label_device=label_device)
    return replace(made, unlearned=("sm_util_percent",))


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


def pod(
    node_name: str,
    requests: Mapping[str, int],
    phase: str = "Running",
    *,
    node_selector: Mapping[str, str] | None = None,
) -> inventory.PodRecord:
    record: inventory.PodRecord = {
        "node_name": node_name,
        "phase": phase,
        "containers": [{"requests": {r: str(q) for r, q in requests.items()}}],
    }
    if node_selector is not None:
        record["node_selector"] = node_selector
    return record


def devcluster_nodes() -> list[inventory.NodeRecord]:
    """The local control plane's GPU nodes (deploy/devcluster/nodes.yaml) as placement sees them.

    4 whole H100s; an A100-80GB with two whole GPUs and two partitioned ones; an A100-40GB with
    both GPUs partitioned: 6 whole GPUs and 18 slices.
    """
    return [
        node("gpu-h100-0", "NVIDIA-H100-80GB-HBM3", {"nvidia.com/gpu": 4}),
        node(
            "gpu-a100-80-mig-0",
            "NVIDIA-A100-SXM4-80GB",
            {
                "nvidia.com/gpu": 2,
                "nvidia.com/mig-1g.10gb": 2,
                "nvidia.com/mig-2g.20gb": 4,
                "nvidia.com/mig-3g.40gb": 1,
            },
        ),
        node(
            "gpu-a100-40-mig-0",
            "NVIDIA-A100-SXM4-40GB",
            {
                "nvidia.com/mig-1g.5gb": 9,
                "nvidia.com/mig-2g.10gb": 1,
                "nvidia.com/mig-3g.20gb": 1,
            },
        ),
    ]


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

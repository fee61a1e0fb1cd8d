"""Builders of DLJob specs, nodes, pods and predictions shared by the operator's unit tests."""

from __future__ import annotations

import copy
from typing import Any

from kubeseer.prediction import Estimate, Mode, Precision, Prediction

GIB = 1 << 30


def dljob_spec(**overrides: Any) -> dict[str, Any]:
    """A valid DLJob spec as the API server would store it (defaults applied)."""
    spec: dict[str, Any] = {
        "model": {"configMapRef": {"name": "resnet", "key": "model.onnx"}},
        "mode": "infer",
        "batchSize": 8,
        "precision": "fp32",
        "replicas": 1,
        "template": {
            "metadata": {"labels": {"team": "vision"}},
            "spec": {
                "containers": [
                    {"name": "main", "image": "example.org/infer:1", "command": ["python"]},
                    {"name": "sidecar", "image": "example.org/log:1"},
                ]
            },
        },
        "placement": {"policy": "auto", "coverage": 0.95, "maxSlowdown": 2.0},
    }
    spec.update(copy.deepcopy(overrides))
    return spec


def prediction(
    memory_gib: float = 3.0, upper_gib: float = 4.0, sm_util: float = 20.0
) -> Prediction:
    """A prediction with the given memory (GiB) and SM utilisation (percent)."""
    return Prediction(
        mode=Mode.INFER,
        batch_size=8,
        precision=Precision.FP32,
        memory_bytes=Estimate(memory_gib * GIB, upper_gib * GIB),
        sm_util_percent=Estimate(sm_util, sm_util + 10),
        step_time_s=Estimate(0.010, 0.015),
        coverage=0.95,
        model_digest="ab" * 32,
        predictor_version="test-1",
        label_device="A100-80GB",
    )


def node(
    name: str, product: str, allocatable: dict[str, str], *, ready: bool = True
) -> dict[str, Any]:
    """A Node object as the API returns it."""
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "64", **allocatable},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(
    name: str,
    resource: str,
    *,
    node_name: str = "",
    phase: str = "Running",
    namespace: str = "default",
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Pod requesting one unit of `resource`."""
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "c", "resources": {"limits": {resource: "1"}}}],
        },
        "status": {"phase": phase},
    }


A100_80 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"


def cluster_nodes() -> list[dict[str, Any]]:
    """An A100-80GB with two 1g.10gb and one 3g.40gb slice, and an H100 with two whole GPUs."""
    return [
        node(
            "a100",
            A100_80,
            {"nvidia.com/mig-1g.10gb": "2", "nvidia.com/mig-3g.40gb": "1"},
        ),
        node("h100", H100, {"nvidia.com/gpu": "2"}),
    ]

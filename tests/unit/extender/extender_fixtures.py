"""Nodes and pods as the API server returns them, for the extender's unit tests.

Nodes come from fixtures/nodes.yaml through the dev cluster's own builder, so they carry exactly
the GFD labels and device-plugin resources the e2e tests' KWOK nodes carry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubeseer.devcluster import inventory
from kubeseer.extender import stanza
from kubeseer.operator import workload

FIXTURES = Path(__file__).parent / "fixtures"
GIB = 1 << 30


def node_objects() -> dict[str, dict[str, Any]]:
    """Every fixture node as a v1.Node JSON object, by name."""
    loaded = inventory.load(FIXTURES / "nodes.yaml")
    return {n.name: dict(inventory.build_node(n)) for n in loaded.nodes}


def gpu_pod(
    name: str = "job-0",
    *,
    resource: str = "nvidia.com/gpu",
    units: int = 1,
    predicted: int | None = 8 * GIB,
    annotations: dict[str, str] | None = None,
    scheduler: str = stanza.SCHEDULER_NAME,
    node: str | None = None,
    phase: str = "Pending",
    uid: str | None = None,
) -> dict[str, Any]:
    """A pod as the API server returns it, with kubeseer's annotations when `predicted` is set."""
    notes = dict(annotations or {})
    if predicted is not None:
        notes[workload.ANNOTATION_PREDICTED_MEMORY] = str(predicted)
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [
            {
                "name": "main",
                "image": "registry.example/train:1",
                "resources": {
                    "limits": {resource: str(units)},
                    "requests": {resource: str(units)},
                },
            }
        ],
    }
    if node is not None:
        spec["nodeName"] = node
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": uid or f"uid-{name}",
            "annotations": notes,
        },
        "spec": spec,
        "status": {"phase": phase},
    }

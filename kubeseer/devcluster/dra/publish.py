"""Put the DRA driver's side of the fake nodes into a running cluster: its DeviceClasses and each
node's ResourceSlices, as the driver's Helm chart and kubelet plugin would.

Only the local cluster calls this, right after it creates the Nodes (the slices name their Node
as owner, so they need its UID). Slices go in as plain JSON through the custom-objects API: the
generated client's models lag the API (they would drop `sharedCounters` and `consumesCounters`),
and what the apiserver accepts is the test of the builders.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubeseer import resources
from kubeseer.devcluster import errors, inventory
from kubeseer.devcluster.dra import slices

__all__ = ["DEVICE_CLASSES", "device_class_files", "publish_slices"]

DEVICE_CLASSES = resources.path("deploy", "dra", "deviceclasses.yaml")
"""The driver's DeviceClasses (`gpu.nvidia.com`, `mig.nvidia.com`), applied with the CRDs."""


def publish_slices(
    api: Any, nodes: inventory.Inventory, node_uids: Mapping[str, str]
) -> list[slices.ResourceSlice]:
    """Create the ResourceSlices of every DRA node; `api` is a `kubernetes.client.ApiClient`.

    A slice the apiserver refuses fails with the node and the apiserver's message: a builder
    that drifts from what `resource.k8s.io/v1` accepts must not leave a node without devices.
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    custom = client.CustomObjectsApi(api)
    group, version = slices.API_VERSION.split("/")
    created = []
    for node in nodes.dra_nodes():
        for made in slices.build_slices(node, node_uids.get(node.name)):
            body: dict[str, Any] = dict(made)
            try:
                custom.create_cluster_custom_object(group, version, "resourceslices", body)
            except ApiException as e:
                raise errors.ClusterStartError(
                    f"the apiserver rejected ResourceSlice {made['metadata']['name']} of node "
                    f"{node.name}: {e.status} {e.body}"
                ) from e
            created.append(made)
    return created


def device_class_files(nodes: inventory.Inventory) -> tuple[Path, ...]:
    """The DeviceClass manifests to apply: the driver's, where some node runs it."""
    return (DEVICE_CLASSES,) if nodes.dra_nodes() else ()

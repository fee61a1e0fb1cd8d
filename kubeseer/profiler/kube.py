"""The agent's only door to the API server.

It reads the pods of its own node (field selector `spec.nodeName`), the node's ResourceSlices
and the ResourceClaims its pods name, and patches `dljobs/status`; deploy/rbac/50-profiler.yaml
grants exactly that. Responses are read as plain JSON, as the operator does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, cast

import kubernetes.client
import kubernetes.config
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from kubeseer import credentials

DLJOB_GROUP = "kubeseer.io"
DLJOB_VERSION = "v1alpha1"
DLJOB_PLURAL = "dljobs"
RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_VERSION = "v1"

_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_TIMEOUT_S = 10.0


class ApiError(Exception):
    """An API call failed; `transient` when worth retrying, `status` the HTTP status if any."""

    def __init__(self, message: str, *, transient: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.status = status


@contextmanager
def _errors(what: str) -> Iterator[None]:
    try:
        yield
    except ApiException as e:
        raise ApiError(
            f"{what}: {e.status} {e.reason}",
            transient=e.status in _TRANSIENT_STATUS,
            status=e.status,
        ) from e
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise ApiError(f"{what}: {type(e).__name__}: {e}", transient=True) from e


def _json(response: Any) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads(response.data))


def api_client(kubeconfig: str | None) -> kubernetes.client.ApiClient:
    """A client for the given kubeconfig, else the in-cluster service account.

    Raises:
        ApiError: no usable credentials.
    """
    try:
        configuration = credentials.configuration(kubeconfig, fall_back=False)
    except credentials.CredentialsError as e:
        raise ApiError(str(e), transient=False) from e
    return kubernetes.client.ApiClient(configuration)


class ProfilerApi:
    """The reads and the one write the agent makes.

    Args:
        client: an authenticated API client.
    """

    def __init__(self, client: kubernetes.client.ApiClient) -> None:
        self.core = kubernetes.client.CoreV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)

    def node_pods(self, node: str) -> list[Mapping[str, Any]]:
        """Every pod bound to `node`."""
        with _errors(f"listing the pods of node {node}"):
            response = self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node}",
                _preload_content=False,
                _request_timeout=_TIMEOUT_S,
            )
        return list(_json(response).get("items") or [])

    def node_resource_slices(self, node: str) -> list[Mapping[str, Any]]:
        """The ResourceSlices published for `node`; none where DRA is not served."""
        try:
            with _errors(f"listing the ResourceSlices of node {node}"):
                response = self.custom.list_cluster_custom_object(
                    RESOURCE_GROUP,
                    RESOURCE_VERSION,
                    "resourceslices",
                    field_selector=f"spec.nodeName={node}",
                    _preload_content=False,
                    _request_timeout=_TIMEOUT_S,
                )
        except ApiError as e:
            if e.status == 404:
                return []
            raise
        return list(_json(response).get("items") or [])

    def resource_claim(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """A ResourceClaim, or None if it does not exist (any more)."""
        try:
            with _errors(f"reading ResourceClaim {namespace}/{name}"):
                response = self.custom.get_namespaced_custom_object(
                    RESOURCE_GROUP,
                    RESOURCE_VERSION,
                    namespace,
                    "resourceclaims",
                    name,
                    _preload_content=False,
                    _request_timeout=_TIMEOUT_S,
                )
        except ApiError as e:
            if e.status == 404:
                return None
            raise
        return _json(response)

    def patch_dljob_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> bool:
        """Merge-patch the DLJob's status; False if the DLJob no longer exists.

        Raises:
            ApiError: any other failure.
        """
        try:
            with _errors(f"patching the status of DLJob {namespace}/{name}"):
                self.custom.patch_namespaced_custom_object_status(
                    DLJOB_GROUP,
                    DLJOB_VERSION,
                    namespace,
                    DLJOB_PLURAL,
                    name,
                    {"status": dict(patch)},
                    _preload_content=False,
                    _request_timeout=_TIMEOUT_S,
                )
        except ApiError as e:
            if e.status == 404:
                return False
            raise
        return True

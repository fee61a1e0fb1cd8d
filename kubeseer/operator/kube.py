"""The operator's only door to the API server: the `Cluster` calls over the kubernetes client.

Responses are read as plain JSON (`_preload_content=False`) rather than the client's generated
model classes: the state machine works on mappings, and skipping the model layer keeps a
reconcile cheap. API errors become `ClusterError`, transient or not by status code.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, cast

import kubernetes.client
import kubernetes.config
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from kubeseer.operator import dljob
from kubeseer.operator.config import ConfigError
from kubeseer.operator.reconcile import ClusterError, DLJobRef

_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_CREATE_TRIES = 3
_CREATE_BACKOFF_S = 0.5


def api_client(kubeconfig: str | None, *, pool_size: int) -> kubernetes.client.ApiClient:
    """A client for the given kubeconfig, else in-cluster, else the default kubeconfig.

    Raises:
        ConfigError: no usable credentials (the message says which source was tried).
    """
    configuration = kubernetes.client.Configuration()
    try:
        if kubeconfig:
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=configuration
            )
        else:
            try:
                kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=configuration
                )
            except kubernetes.config.ConfigException:
                kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                    client_configuration=configuration
                )
    except (kubernetes.config.ConfigException, OSError) as e:
        where = kubeconfig or "the in-cluster service account or ~/.kube/config"
        raise ConfigError(f"cannot use {where} to reach the API server: {e}") from e
    configuration.connection_pool_maxsize = pool_size
    return kubernetes.client.ApiClient(configuration)


@contextmanager
def _api_errors(what: str) -> Iterator[None]:
    try:
        yield
    except ApiException as e:
        detail = _api_message(e)
        raise ClusterError(
            f"{what}: {e.status} {detail}", transient=e.status in _TRANSIENT_STATUS
        ) from e
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise ClusterError(f"{what}: {type(e).__name__}: {e}", transient=True) from e


def _api_message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "{}").get("message") or e.reason)
    except (ValueError, AttributeError):
        return str(e.reason)


def _json(response: Any) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads(response.data))


class KubeCluster:
    """`reconcile.Cluster` plus the reads the operator needs around it.

    Args:
        client: an authenticated API client (`api_client`).
    """

    def __init__(self, client: kubernetes.client.ApiClient) -> None:
        self.client = client
        self.core = kubernetes.client.CoreV1Api(client)
        self.batch = kubernetes.client.BatchV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)

    def patch_status(self, ref: DLJobRef, patch: Mapping[str, Any]) -> Mapping[str, Any]:
        """Merge-patch `status` of the DLJob; returns the status as stored."""
        with _api_errors(f"patching the status of DLJob {ref.namespace}/{ref.name}"):
            response = self.custom.patch_namespaced_custom_object_status(
                dljob.GROUP,
                dljob.VERSION,
                ref.namespace,
                dljob.PLURAL,
                ref.name,
                {"status": dict(patch)},
                _preload_content=False,
            )
        return cast(Mapping[str, Any], _json(response).get("status") or {})

    def get_dljob(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The DLJob, or None if it no longer exists."""
        try:
            with _api_errors(f"reading DLJob {namespace}/{name}"):
                response = self.custom.get_namespaced_custom_object(
                    dljob.GROUP,
                    dljob.VERSION,
                    namespace,
                    dljob.PLURAL,
                    name,
                    _preload_content=False,
                )
        except ClusterError as e:
            if isinstance(e.__cause__, ApiException) and e.__cause__.status == 404:
                return None
            raise
        return _json(response)

    def create_workload(self, manifest: Mapping[str, Any]) -> bool:
        """Create the Pod or Job; False if it already exists. Transient errors are retried."""
        namespace = str(manifest["metadata"]["namespace"])
        name = str(manifest["metadata"]["name"])
        kind = str(manifest["kind"])
        body: Any = dict(manifest)  # the client accepts plain dicts where it types its models
        for attempt in range(_CREATE_TRIES):
            try:
                with _api_errors(f"creating {kind} {namespace}/{name}"):
                    if kind == "Job":
                        self.batch.create_namespaced_job(namespace, body, _preload_content=False)
                    else:
                        self.core.create_namespaced_pod(namespace, body, _preload_content=False)
                return True
            except ClusterError as e:
                cause = e.__cause__
                if isinstance(cause, ApiException) and cause.status == 409:
                    return False
                if not e.transient or attempt == _CREATE_TRIES - 1:
                    raise
                time.sleep(_CREATE_BACKOFF_S * 2**attempt)
        raise AssertionError("unreachable: the loop returns or raises")

    def list_job_pods(self, namespace: str, job_name: str) -> list[Mapping[str, Any]]:
        """The pods a Job created (selected by the Job controller's own label)."""
        with _api_errors(f"listing the pods of Job {namespace}/{job_name}"):
            response = self.core.list_namespaced_pod(
                namespace,
                label_selector=f"batch.kubernetes.io/job-name={job_name}",
                _preload_content=False,
            )
        return list(_json(response).get("items") or [])

    def list_nodes(self) -> list[Mapping[str, Any]]:
        """Every node (the inventory's seed)."""
        with _api_errors("listing nodes"):
            response = self.core.list_node(_preload_content=False)
        return list(_json(response).get("items") or [])

    def list_pods(self) -> list[Mapping[str, Any]]:
        """Every pod in the cluster (the inventory's seed)."""
        with _api_errors("listing pods"):
            response = self.core.list_pod_for_all_namespaces(_preload_content=False)
        return list(_json(response).get("items") or [])

    def read_secret(self, namespace: str, name: str) -> dict[str, bytes]:
        """A Secret's data, decoded."""
        with _api_errors(f"reading Secret {namespace}/{name}"):
            response = self.core.read_namespaced_secret(name, namespace, _preload_content=False)
        data = _json(response).get("data") or {}
        return {str(k): base64.b64decode(v) for k, v in data.items()}

    def read_config_map_key(self, namespace: str, name: str, key: str) -> bytes | None:
        """The bytes under `key` of a ConfigMap (binaryData, else data); None if either is absent.

        Raises:
            ClusterError: the ConfigMap could not be read (404 included, with transient False).
        """
        with _api_errors(f"reading ConfigMap {namespace}/{name}"):
            response = self.core.read_namespaced_config_map(name, namespace, _preload_content=False)
        body = _json(response)
        binary = (body.get("binaryData") or {}).get(key)
        if binary is not None:
            return base64.b64decode(binary)
        text = (body.get("data") or {}).get(key)
        return None if text is None else str(text).encode()

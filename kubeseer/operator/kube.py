"""The operator's only door to the API server: the `Cluster` calls over the kubernetes client.

Responses are read as plain JSON (`_preload_content=False`) rather than the client's generated
model classes: the state machine works on mappings, and skipping the model layer keeps a
reconcile cheap. Workloads are posted as JSON the same way, past the client's own model
validation: the API server is the one judge of a pod (it reads `cpu: 2` as the quantity "2",
where the client's models refuse the integer), and what it refuses comes back as its message.

Every failure becomes one class of `errors`, chosen here from the HTTP status and message.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, cast

import kubernetes.client
import kubernetes.config
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from kubeseer import credentials
from kubeseer.operator import backoff, dljob, errors, ports
from kubeseer.operator.config import ConfigError

log = logging.getLogger(__name__)

_CREATE_BACKOFF = backoff.Backoff(tries=3, base_s=0.5, max_s=2.0)
_JOBS = "/apis/batch/v1/namespaces/{namespace}/jobs"
_EVENTS = "/api/v1/namespaces/{namespace}/events"
_EVENT_SOURCE = "kubeseer-operator"
_LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
_DRA = "/apis/resource.k8s.io/v1"
_CLAIM_TEMPLATES = _DRA + "/namespaces/{namespace}/resourceclaimtemplates"
_JSON_MERGE = "application/merge-patch+json"
_STRATEGIC_MERGE = "application/strategic-merge-patch+json"


def api_client(kubeconfig: str | None, *, pool_size: int) -> kubernetes.client.ApiClient:
    """A client for the given kubeconfig, else in-cluster, else the default kubeconfig.

    Raises:
        ConfigError: no usable credentials (the message says which source was tried).
    """
    try:
        configuration = credentials.configuration(kubeconfig)
    except credentials.CredentialsError as e:
        raise ConfigError(str(e)) from e
    configuration.connection_pool_maxsize = pool_size
    return kubernetes.client.ApiClient(configuration)


@contextmanager
def api_errors(what: str) -> Iterator[None]:
    """Turn what the client raises inside the block into the `errors` class it amounts to."""
    try:
        yield
    except ApiException as e:
        detail = _api_message(e)
        kind = errors.classify(e.status, detail)
        raise kind(f"{what}: {e.status} {detail}", status=e.status) from e
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise errors.UnavailableError(f"{what}: {type(e).__name__}: {e}") from e


def _api_message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "{}").get("message") or e.reason)
    except (ValueError, AttributeError):
        return str(e.reason)


def _json(response: Any) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads(response.data))


class KubeCluster:
    """`ports.Cluster` plus the reads the operator needs around it.

    Args:
        client: an authenticated API client (`api_client`).
    """

    def __init__(self, client: kubernetes.client.ApiClient) -> None:
        self.client = client
        self.core = kubernetes.client.CoreV1Api(client)
        self.batch = kubernetes.client.BatchV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)

    def patch_status(self, ref: dljob.DLJobRef, patch: Mapping[str, Any]) -> Mapping[str, Any]:
        """Merge-patch `status` of the DLJob; returns the status as stored."""
        with api_errors(f"patching the status of DLJob {ref.namespace}/{ref.name}"):
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
            with api_errors(f"reading DLJob {namespace}/{name}"):
                response = self.custom.get_namespaced_custom_object(
                    dljob.GROUP,
                    dljob.VERSION,
                    namespace,
                    dljob.PLURAL,
                    name,
                    _preload_content=False,
                )
        except errors.NotFoundError:
            return None
        return _json(response)

    def create_job(self, manifest: Mapping[str, Any]) -> tuple[bool, Mapping[str, Any]]:
        """Create the Job: (True, it as stored), or (False, the Job of that name that exists).
        Transient errors are retried."""
        namespace = str(manifest["metadata"]["namespace"])
        name = str(manifest["metadata"]["name"])

        def create() -> tuple[bool, Mapping[str, Any]]:
            try:
                with api_errors(f"creating Job {namespace}/{name}"):
                    return True, self._send("POST", _JOBS, namespace, manifest)
            except errors.ConflictError:
                with api_errors(f"reading Job {namespace}/{name}"):
                    return False, self._send("GET", f"{_JOBS}/{name}", namespace)

        return backoff.retrying(create, _CREATE_BACKOFF)

    def patch_job(
        self, namespace: str, name: str, patch: Mapping[str, Any], *, strategic: bool
    ) -> Mapping[str, Any]:
        """Patch a Job (a strategic merge patch merges containers by name); transient errors
        are retried. Returns the Job as stored."""

        def send() -> Mapping[str, Any]:
            with api_errors(f"patching Job {namespace}/{name}"):
                return self._send(
                    "PATCH",
                    f"{_JOBS}/{name}",
                    namespace,
                    patch,
                    content_type=_STRATEGIC_MERGE if strategic else _JSON_MERGE,
                )

        return backoff.retrying(send, _CREATE_BACKOFF)

    def job_exists(self, namespace: str, name: str) -> bool:
        """Whether the Job of that name exists."""
        try:
            with api_errors(f"reading Job {namespace}/{name}"):
                self.batch.read_namespaced_job(name, namespace, _preload_content=False)
        except errors.NotFoundError:
            return False
        return True

    def create_claim_template(self, manifest: Mapping[str, Any]) -> bool:
        """Create a ResourceClaimTemplate; False if one of that name exists. Transient errors
        are retried."""
        namespace = str(manifest["metadata"]["namespace"])
        name = str(manifest["metadata"]["name"])

        def create() -> bool:
            try:
                with api_errors(f"creating ResourceClaimTemplate {namespace}/{name}"):
                    self._send("POST", _CLAIM_TEMPLATES, namespace, manifest)
            except errors.ConflictError:
                return False
            return True

        return backoff.retrying(create, _CREATE_BACKOFF)

    def list_events(
        self, namespace: str, involved_uid: str, reason: str
    ) -> list[Mapping[str, Any]]:
        """The events of one reason about the object with this uid (selected by the API
        server: the Job controller's `FailedCreate` events of one Job)."""
        selector = f"involvedObject.uid={involved_uid},reason={reason}"
        with api_errors(f"listing {reason} events in {namespace}"):
            response = self.core.list_namespaced_event(
                namespace, field_selector=selector, _preload_content=False
            )
        return list(_json(response).get("items") or [])

    def post_event(
        self, ref: dljob.DLJobRef, kind: ports.EventType, reason: dljob.Reason, message: str
    ) -> None:
        """One core/v1 Event about the DLJob, posted now; never raises (a failure is logged).

        For the steps that run outside kopf's handlers (`waiting`), whose events kopf cannot
        post: kopf queues an event only from inside the handling of a watched object.
        """
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{ref.name}.", "namespace": ref.namespace},
            "involvedObject": {
                "apiVersion": dljob.API_VERSION,
                "kind": dljob.KIND,
                "name": ref.name,
                "namespace": ref.namespace,
                "uid": ref.uid,
            },
            "type": kind.value,
            "reason": reason.value,
            "message": message[:1024],
            "source": {"component": _EVENT_SOURCE},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            with api_errors(f"posting event {reason.value} on DLJob {ref.namespace}/{ref.name}"):
                self._send("POST", _EVENTS, ref.namespace, event)
        except errors.ApiError as e:
            log.warning("%s", e)

    def list_device_classes(self) -> list[str]:
        """The names of the cluster's DeviceClasses (none where DRA is not served)."""
        try:
            with api_errors("listing DeviceClasses"):
                listed = self._send("GET", f"{_DRA}/deviceclasses", "")
        except errors.NotFoundError:
            return []
        return [str(c["metadata"]["name"]) for c in listed.get("items") or ()]

    def list_resource_slices(self) -> list[Mapping[str, Any]]:
        """Every ResourceSlice (the DRA inventory's seed)."""
        with api_errors("listing ResourceSlices"):
            return list(self._send("GET", f"{_DRA}/resourceslices", "").get("items") or ())

    def list_resource_claims(self) -> list[Mapping[str, Any]]:
        """Every ResourceClaim in the cluster (the DRA inventory's seed)."""
        with api_errors("listing ResourceClaims"):
            return list(self._send("GET", f"{_DRA}/resourceclaims", "").get("items") or ())

    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Lease, or None if there is none of that name."""
        try:
            with api_errors(f"reading Lease {namespace}/{name}"):
                return self._send("GET", f"{_LEASES}/{name}", namespace)
        except errors.NotFoundError:
            return None

    def write_lease(self, namespace: str, lease: Mapping[str, Any]) -> dict[str, Any]:
        """Create the Lease, or replace it when it carries a `resourceVersion` (which makes the
        write fail with `ConflictError` if anyone wrote it since it was read)."""
        name = str(lease["metadata"]["name"])
        with api_errors(f"writing Lease {namespace}/{name}"):
            if lease["metadata"].get("resourceVersion"):
                return self._send("PUT", f"{_LEASES}/{name}", namespace, lease)
            return self._send("POST", _LEASES, namespace, lease)

    def _send(
        self,
        method: str,
        path: str,
        namespace: str,
        body: Mapping[str, Any] | None = None,
        *,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """One request with a JSON body; the API server, not the client's models, validates it."""
        try:
            params = self.client.param_serialize(
                method=method,
                resource_path=path,
                path_params={"namespace": namespace},
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                body=None if body is None else dict(body),
                auth_settings=["BearerToken"],
            )
        except (TypeError, ValueError) as e:
            raise errors.InvalidObjectError(f"cannot serialise the object as JSON: {e}") from e
        response = self.client.call_api(*params)
        response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status <= 299:
            raise ApiException(http_resp=response)
        return _json(response)

    def list_job_pods(self, namespace: str, job_name: str) -> list[Mapping[str, Any]]:
        """The pods a Job created (selected by the Job controller's own label)."""
        with api_errors(f"listing the pods of Job {namespace}/{job_name}"):
            response = self.core.list_namespaced_pod(
                namespace,
                label_selector=f"batch.kubernetes.io/job-name={job_name}",
                _preload_content=False,
            )
        return list(_json(response).get("items") or [])

    def list_nodes(self) -> list[Mapping[str, Any]]:
        """Every node (the inventory's seed)."""
        with api_errors("listing nodes"):
            response = self.core.list_node(_preload_content=False)
        return list(_json(response).get("items") or [])

    def list_pods(self) -> list[Mapping[str, Any]]:
        """Every pod in the cluster (the inventory's seed)."""
        with api_errors("listing pods"):
            response = self.core.list_pod_for_all_namespaces(_preload_content=False)
        return list(_json(response).get("items") or [])

    def read_secret(self, namespace: str, name: str) -> dict[str, bytes]:
        """A Secret's data, decoded."""
        with api_errors(f"reading Secret {namespace}/{name}"):
            response = self.core.read_namespaced_secret(name, namespace, _preload_content=False)
        data = _json(response).get("data") or {}
        return {str(k): base64.b64decode(v) for k, v in data.items()}

    def read_config_map_key(self, namespace: str, name: str, key: str) -> bytes | None:
        """The bytes under `key` of a ConfigMap (binaryData, else data); None if either is absent.

        Raises:
            errors.ApiError: the ConfigMap could not be read (`NotFoundError` if it is absent).
        """
        with api_errors(f"reading ConfigMap {namespace}/{name}"):
            response = self.core.read_namespaced_config_map(name, namespace, _preload_content=False)
        body = _json(response)
        binary = (body.get("binaryData") or {}).get(key)
        if binary is not None:
            return base64.b64decode(binary)
        text = (body.get("data") or {}).get(key)
        return None if text is None else str(text).encode()

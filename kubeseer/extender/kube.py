"""The list and watch calls the informers make, on the Kubernetes client.

Bodies are read as plain JSON (`_preload_content=False`) rather than the client's model
classes: the cache needs a few fields of each object, and building models for a thousand nodes
costs more than the scheduling calls they serve. Pods are watched only once bound to a node
and while not finished (a field selector), which is all the capacity arithmetic needs; a pod
that finishes leaves the selection and arrives as a DELETED event.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from kubeseer.extender import informer

__all__ = ["BOUND_LIVE_PODS", "node_calls", "pod_calls"]

BOUND_LIVE_PODS = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
"""Field selector of the pods that can hold GPU units: bound, neither succeeded nor failed."""

_PAGE = 500
_CONNECT_TIMEOUT_S = 10.0
_LIST_TIMEOUT_S = 60.0


def node_calls(api: client.ApiClient) -> tuple[informer.ListFn, informer.WatchFn]:
    """List and watch every node."""
    core = client.CoreV1Api(api)
    return _calls(core.list_node, {})


def pod_calls(api: client.ApiClient) -> tuple[informer.ListFn, informer.WatchFn]:
    """List and watch bound, unfinished pods in every namespace."""
    core = client.CoreV1Api(api)
    return _calls(core.list_pod_for_all_namespaces, {"field_selector": BOUND_LIVE_PODS})


def _calls(
    method: Callable[..., Any], selectors: Mapping[str, str]
) -> tuple[informer.ListFn, informer.WatchFn]:
    def list_all() -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": _PAGE, **selectors}
            if token:
                kwargs["_continue"] = token
            response = method(
                **kwargs,
                _preload_content=False,
                _request_timeout=(_CONNECT_TIMEOUT_S, _LIST_TIMEOUT_S),
            )
            body = json.loads(response.data)
            items.extend(body.get("items") or [])
            metadata = body.get("metadata") or {}
            token = metadata.get("continue")
            if not token:
                return items, str(metadata.get("resourceVersion", ""))

    def watch_from(version: str, timeout_s: int) -> Iterator[Mapping[str, Any]]:
        watcher = watch.Watch()  # type: ignore[no-untyped-call]
        stream = watcher.stream(  # type: ignore[no-untyped-call]
            method,
            resource_version=version,
            timeout_seconds=timeout_s,
            allow_watch_bookmarks=True,
            deserialize=False,
            # The server ends the watch after timeout_s; a silent connection ends a bit later.
            _request_timeout=(_CONNECT_TIMEOUT_S, timeout_s + 30),
            **selectors,
        )
        try:
            yield from stream
        except ApiException as e:
            if e.status == 410:
                raise informer.Expired(str(e.reason)) from e
            raise

    return list_all, watch_from

"""The list and watch calls on the Kubernetes client, against a stand-in for one API method (the
outermost edge: what the generated client method returns or raises)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from kubeseer.extender import informer, kube


class Method:
    """Answers `list_*` calls page by page, like the API server with `limit`/`continue`."""

    def __init__(self, pages: list[dict[str, Any]]) -> None:
        self.pages = pages
        self.calls: list[dict[str, Any]] = []

    def __call__(self, **kwargs: Any) -> SimpleNamespace:
        self.calls.append(kwargs)
        return SimpleNamespace(data=json.dumps(self.pages[len(self.calls) - 1]).encode())


def test_list_follows_continue_tokens_and_returns_the_version():
    method = Method(
        [
            {"metadata": {"continue": "t1", "resourceVersion": "7"}, "items": [{"a": 1}]},
            {"metadata": {"resourceVersion": "7"}, "items": [{"b": 2}]},
        ]
    )
    list_all, _ = kube._calls(method, {"field_selector": kube.BOUND_LIVE_PODS})
    assert list_all() == ([{"a": 1}, {"b": 2}], "7")
    assert "_continue" not in method.calls[0]
    assert method.calls[1]["_continue"] == "t1"
    assert all(c["field_selector"] == kube.BOUND_LIVE_PODS for c in method.calls)
    assert all(c["_preload_content"] is False for c in method.calls)


def test_a_410_from_the_api_server_becomes_expired():
    def gone(**_: Any) -> None:
        raise ApiException(status=410, reason="Gone: too old resource version")

    _, watch_from = kube._calls(gone, {})
    with pytest.raises(informer.Expired, match="too old"):
        list(watch_from("1", 5))


def test_other_api_errors_pass_through():
    def forbidden(**_: Any) -> None:
        raise ApiException(status=403, reason="Forbidden")

    _, watch_from = kube._calls(forbidden, {})
    with pytest.raises(ApiException) as raised:
        list(watch_from("1", 5))
    assert raised.value.status == 403


def test_the_pods_watched_are_bound_and_unfinished():
    assert kube.BOUND_LIVE_PODS == "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"

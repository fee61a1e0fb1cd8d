"""The list-then-watch loop against scripted API answers: resume, 410 relist, errors, stop."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kubeseer import metrics
from kubeseer.extender import informer


def obj(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version}}


class Script:
    """Answers list and watch calls from queues, stops the loop when a queue runs out, and
    records what the loop did."""

    def __init__(self, lists: list[Any], watches: list[Any]) -> None:
        self.lists = lists
        self.watches = watches
        self.calls: list[tuple[str, str]] = []
        self.replaced: list[list[str]] = []
        self.applied: list[tuple[str, str]] = []
        self.loop: informer.Informer | None = None

    def list_fn(self) -> tuple[list[dict[str, Any]], str]:
        self.calls.append(("list", ""))
        if not self.lists:
            return self._end()
        answer = self.lists.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def watch_fn(self, version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        self.calls.append(("watch", version))
        if not self.watches:
            self._end()
        answer = self.watches.pop(0)
        if isinstance(answer, Exception):
            raise answer
        yield from answer

    def replace(self, items: list[dict[str, Any]]) -> None:
        self.replaced.append([i["metadata"]["name"] for i in items])

    def apply(self, kind: str, item: Any) -> None:
        self.applied.append((kind, item["metadata"]["name"]))

    def _end(self) -> Any:
        assert self.loop is not None
        self.loop.stop(timeout_s=0)
        raise RuntimeError("end of script")


def run(script: Script) -> tuple[informer.Informer, CollectorRegistry]:
    registry = CollectorRegistry()
    loop = informer.Informer(
        "node",
        script.list_fn,
        script.watch_fn,
        script.replace,
        script.apply,
        metrics.ExtenderMetrics(registry),
        backoff_s=0.001,
    )
    script.loop = loop
    loop.run()
    return loop, registry


def relists(registry: CollectorRegistry, cause: str) -> float | None:
    return registry.get_sample_value(
        "kubeseer_extender_relists_total", {"kind": "node", "cause": cause}
    )


def test_lists_then_applies_events_and_resumes_from_the_last_version():
    script = Script(
        lists=[([obj("a", "5")], "10")],
        watches=[
            [
                {"type": "ADDED", "object": obj("b", "11")},
                {"type": "MODIFIED", "object": obj("a", "12")},
            ],
            [{"type": "DELETED", "object": obj("b", "13")}],
        ],
    )
    loop, registry = run(script)
    assert loop.synced.is_set()
    assert script.replaced == [["a"]]
    assert script.applied == [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]
    assert script.calls == [("list", ""), ("watch", "10"), ("watch", "12"), ("watch", "13")]
    assert relists(registry, "start") == 1


def test_bookmarks_move_the_version_without_an_event():
    script = Script(
        lists=[([], "1")],
        watches=[[{"type": "BOOKMARK", "object": obj("", "40")}], []],
    )
    run(script)
    assert script.applied == []
    assert script.calls[-1] == ("watch", "40")


def test_an_expired_version_lists_again():
    script = Script(
        lists=[([obj("a", "1")], "1"), ([obj("a", "1"), obj("b", "90")], "95")],
        watches=[
            [{"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}]
        ],
    )
    _, registry = run(script)
    assert script.calls == [("list", ""), ("watch", "1"), ("list", ""), ("watch", "95")]
    assert script.replaced == [["a"], ["a", "b"]]
    assert relists(registry, "expired") == 1


def test_the_client_raising_expired_lists_again_too():
    script = Script(
        lists=[([], "1"), ([], "7")],
        watches=[informer.Expired("410")],
    )
    run(script)
    assert script.calls == [("list", ""), ("watch", "1"), ("list", ""), ("watch", "7")]


def test_an_error_backs_off_and_lists_again():
    script = Script(
        lists=[ConnectionRefusedError("apiserver down"), ([obj("a", "3")], "3")],
        watches=[RuntimeError("stream cut")],
    )
    loop, registry = run(script)
    assert script.calls == [("list", ""), ("list", ""), ("watch", "3"), ("list", "")]
    assert relists(registry, "error") == 1
    assert loop.synced.is_set()


def test_other_watch_errors_are_errors():
    script = Script(
        lists=[([], "1"), ([], "2")],
        watches=[[{"type": "ERROR", "object": {"code": 500, "message": "internal"}}]],
    )
    _, registry = run(script)
    assert relists(registry, "error") == 1


def test_not_synced_until_the_first_list_succeeds():
    script = Script(lists=[RuntimeError("no")], watches=[])
    registry = CollectorRegistry()
    loop = informer.Informer(
        "pod",
        script.list_fn,
        script.watch_fn,
        script.replace,
        script.apply,
        metrics.ExtenderMetrics(registry),
        backoff_s=5,
    )
    loop.start()
    loop.stop(timeout_s=2)
    assert not loop.synced.is_set()
    assert script.calls == [("list", "")]


@pytest.mark.parametrize("event", [{"type": "ADDED"}, {"type": "ADDED", "object": "x"}])
def test_events_without_an_object_are_skipped(event):
    script = Script(lists=[([], "1")], watches=[[event]])
    run(script)
    assert script.applied == []

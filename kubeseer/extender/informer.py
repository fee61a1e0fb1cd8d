"""List once, then watch: the informer pattern of client-go, for one resource, in a thread.

The loop is the one client-go's reflector runs: list everything (paginated) and hand the list to
the cache, then watch from the list's resource version and apply each event. A watch that ends
normally (the server's timeout) is resumed from the last resource version seen, bookmarks
included; one that fails with HTTP 410 Gone (the version fell out of the API server's window)
is followed by a fresh list, as is any other error once the backoff has passed. The list and
watch calls are injected so that the loop is tested with scripted answers; `kube.py` makes them
from the Kubernetes client.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kubeseer import metrics

__all__ = ["Expired", "Informer", "ListFn", "WatchFn"]

log = logging.getLogger(__name__)

ListFn = Callable[[], tuple[list[dict[str, Any]], str]]
"""Every object of the resource and the list's resourceVersion."""
WatchFn = Callable[[str, int], Iterable[Mapping[str, Any]]]
"""Watch events (`{"type", "object"}`) from a resource version, for at most so many seconds."""


class Expired(Exception):  # noqa: N818 - the API server's word for HTTP 410
    """The watch's resource version is too old (HTTP 410 Gone): list again."""


class Informer:
    """Keeps one resource's objects flowing into `replace` and `apply`.

    Args:
        kind: `node` or `pod`, for logs and metrics.
        list_fn, watch_fn: the API calls.
        replace: receives the full list after each list.
        apply: receives each watch event's type and object.
        extender_metrics: relists are counted here.
        watch_timeout_s: how long one watch request may stay open.
        backoff_s: first wait after an error, doubled per error up to `max_backoff_s`.
    """

    def __init__(
        self,
        kind: str,
        list_fn: ListFn,
        watch_fn: WatchFn,
        replace: Callable[[list[dict[str, Any]]], None],
        apply: Callable[[str, Mapping[str, Any]], None],
        extender_metrics: metrics.ExtenderMetrics,
        *,
        watch_timeout_s: int = 300,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
    ) -> None:
        self.kind = kind
        self._list = list_fn
        self._watch = watch_fn
        self._replace = replace
        self._apply = apply
        self._metrics = extender_metrics
        self.watch_timeout_s = watch_timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Run the loop in a daemon thread."""
        self._thread = threading.Thread(target=self.run, name=f"informer-{self.kind}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 1.0) -> None:
        """Ask the loop to end; it does at the next event, error or watch timeout."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def run(self) -> None:
        """List, then watch until stopped."""
        version: str | None = None
        cause = metrics.RelistCause.START
        delay = self.backoff_s
        while not self._stop.is_set():
            try:
                if version is None:
                    items, version = self._list()
                    self._replace(items)
                    self._metrics.relists.labels(kind=self.kind, cause=cause).inc()
                    self.synced.set()
                    log.info("%s cache: %d objects at version %s", self.kind, len(items), version)
                version = self._follow(version)
                delay = self.backoff_s
            except Expired:
                log.info("%s watch expired at version %s; listing again", self.kind, version)
                version, cause = None, metrics.RelistCause.EXPIRED
            except Exception as e:  # the API server went away, a proxy cut the stream ...
                log.warning("%s watch failed (%s); listing again in %.1f s", self.kind, e, delay)
                version, cause = None, metrics.RelistCause.ERROR
                self._stop.wait(delay)
                delay = min(delay * 2, self.max_backoff_s)

    def _follow(self, version: str) -> str:
        """Apply events from `version` until the watch ends; returns the last version seen."""
        for event in self._watch(version, self.watch_timeout_s):
            if self._stop.is_set():
                break
            kind = str(event.get("type", ""))
            obj = event.get("object")
            if not isinstance(obj, dict):
                continue
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise Expired(str(obj.get("message", "")))
                raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
            metadata = obj.get("metadata")
            seen = metadata.get("resourceVersion") if isinstance(metadata, dict) else None
            if kind != "BOOKMARK":
                self._apply(kind, obj)
            if isinstance(seen, str) and seen:
                version = seen
        return version

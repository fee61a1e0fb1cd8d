"""The composition root: API client, watch caches, metrics and the HTTP server in one object.

`Service` is what `kubeseer extender` runs and what tests and benchmarks start in-process:
`start()` begins watching and serving and returns at once; `wait_synced()` blocks until both
caches have listed; `stop()` ends everything it started.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any

import kubernetes
from prometheus_client import CollectorRegistry

from kubeseer import credentials, metrics
from kubeseer.extender import cache, decide, informer, kube, server, stanza

__all__ = ["ConfigError", "Service", "Settings", "api_client"]

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """Settings the extender cannot start with (no credentials, a bad address)."""


@dataclass(frozen=True)
class Settings:
    """How the extender runs (`kubeseer extender --help` documents each)."""

    host: str = "127.0.0.1"
    port: int = 8888
    metrics_address: tuple[str, int] | None = None
    scheduler_name: str = stanza.SCHEDULER_NAME
    kubeconfig: str | None = None
    watch_timeout_s: int = 300
    max_body_bytes: int = server.DEFAULT_MAX_BODY_BYTES
    assume_ttl_s: float = 30.0

    def __post_init__(self) -> None:
        ports = [self.port] + ([self.metrics_address[1]] if self.metrics_address else [])
        for port in ports:
            if not 0 <= port <= 65535:
                raise ConfigError(f"port {port} is not a TCP port")
        if self.watch_timeout_s < 1 or self.max_body_bytes < 1 or self.assume_ttl_s <= 0:
            raise ConfigError("timeouts and the body limit must be positive")


def api_client(kubeconfig: str | None) -> kubernetes.client.ApiClient:
    """A client for `kubeconfig`, else the in-cluster service account, else ~/.kube/config."""
    try:
        return kubernetes.client.ApiClient(credentials.configuration(kubeconfig))
    except credentials.CredentialsError as e:
        raise ConfigError(str(e)) from e


class Service:
    """The running extender. `url` is the `urlPrefix` to give kube-scheduler."""

    def __init__(self, settings: Settings, *, registry: CollectorRegistry | None = None) -> None:
        self.settings = settings
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = metrics.ExtenderMetrics(self.registry, reasons=list(decide.Reason))
        self.cache = cache.ClusterCache(assume_ttl_s=settings.assume_ttl_s)
        self._api = api_client(settings.kubeconfig)
        self._informers = (
            self._informer(
                "node", kube.node_calls, self.cache.replace_nodes, self.cache.apply_node
            ),
            self._informer("pod", kube.pod_calls, self.cache.replace_pods, self.cache.apply_pod),
        )
        self.metrics.cached.labels(kind="node").set_function(lambda: self.cache.counts()[0])
        self.metrics.cached.labels(kind="pod").set_function(lambda: self.cache.counts()[1])
        self.handlers = server.Handlers(
            self.cache, self.metrics, scheduler_name=settings.scheduler_name, ready=self.synced
        )
        self._servers: list[ThreadingHTTPServer] = []
        self._serving: list[threading.Thread] = []
        listeners = [((settings.host, settings.port), True)]
        if settings.metrics_address is not None:
            listeners.append((settings.metrics_address, False))
        for address, protocol in listeners:
            try:
                self._servers.append(
                    server.serve(
                        self.handlers,
                        address,
                        max_body_bytes=settings.max_body_bytes,
                        protocol=protocol,
                    )
                )
            except OSError as e:
                self.stop()
                raise ConfigError(f"cannot listen on {address[0]}:{address[1]}: {e}") from e

    @property
    def url(self) -> str:
        """`http://host:port` of the protocol listener, with the port actually bound."""
        host, port = self._servers[0].server_address[:2]
        return f"http://{host!s}:{port}"

    def synced(self) -> bool:
        """Whether both caches have listed their resource."""
        return all(i.synced.is_set() for i in self._informers)

    def wait_synced(self, timeout_s: float) -> bool:
        """Block until synced or `timeout_s` passes; returns `synced()`."""
        for i in self._informers:
            i.synced.wait(timeout_s)
        return self.synced()

    def start(self) -> None:
        """Begin watching and serving (threads); returns at once."""
        for i in self._informers:
            i.start()
        for httpd in self._servers:
            # shutdown() waits up to one poll interval; stop() should be quick.
            thread = threading.Thread(
                target=httpd.serve_forever,
                kwargs={"poll_interval": 0.1},
                name="extender-http",
                daemon=True,
            )
            thread.start()
            self._serving.append(thread)
        log.info("kubeseer extender on %s (profile %s)", self.url, self.settings.scheduler_name)

    def stop(self) -> None:
        """Stop serving and watching; idempotent."""
        for httpd, thread in zip(self._servers, self._serving, strict=False):
            httpd.shutdown()
            thread.join(5)
        self._serving = []
        for httpd in self._servers:
            httpd.server_close()
        for i in self._informers:
            i.stop()
        self._api.close()  # type: ignore[no-untyped-call]

    def __enter__(self) -> Service:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _informer(
        self,
        kind: str,
        calls: Callable[[kubernetes.client.ApiClient], tuple[informer.ListFn, informer.WatchFn]],
        replace: Callable[[list[dict[str, Any]]], None],
        apply: Callable[[str, Mapping[str, Any]], None],
    ) -> informer.Informer:
        list_fn, watch_fn = calls(self._api)
        return informer.Informer(
            kind,
            list_fn,
            watch_fn,
            replace,
            apply,
            self.metrics,
            watch_timeout_s=self.settings.watch_timeout_s,
        )

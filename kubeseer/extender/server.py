"""The extender's HTTP service: `POST .../filter`, `POST .../prioritize`, `/healthz`, `/metrics`.

Built on the standard library's threading HTTP server rather than aiohttp: the cache is fed by
blocking watch threads of the Kubernetes client, kube-scheduler sends one call at a time per
scheduling cycle over a kept-alive connection, and each call is a few milliseconds of pure
computation under one lock, so an event loop would add a dependency to the extender's image
and buy no concurrency. One thread per connection, HTTP/1.1 keep-alive, bodies bounded.

`Handlers` holds the protocol logic and returns `(status, body)`; the HTTP layer only frames
it. A request that is not an `ExtenderArgs` gets 400 and an error; before both caches have
listed their resource every call gets 503, which kube-scheduler treats as an error of an
ignorable extender (it schedules without us) rather than as an answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kubeseer import metrics
from kubeseer.extender import cache, decide, pods, wire

__all__ = ["DEFAULT_MAX_BODY_BYTES", "Handlers", "Response", "serve"]

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 32 << 20
"""A nodeCacheCapable call is a pod and node names (kilobytes); one with full `Nodes` at 5,000
nodes is tens of megabytes. Anything larger is refused with 413 before it is read."""

_JSON = "application/json"


@dataclass(frozen=True)
class Response:
    """What to answer: HTTP status, body and its content type."""

    status: int
    body: bytes
    content_type: str = _JSON


@dataclass(frozen=True)
class _Call:
    """A readable call: the pod's demand when the extender decides for it, or the problem with
    its kubeseer annotations (every node then fails with it)."""

    args: wire.ExtenderArgs
    demand: pods.Demand | None
    problem: str | None


class Handlers:
    """filter and prioritize over a `ClusterCache`.

    Args:
        state: the watch-fed cache.
        extender_metrics: where calls, decisions and rejections are counted.
        scheduler_name: pods of other schedulers pass through (the extenders stanza of a
            KubeSchedulerConfiguration applies to all its profiles).
        ready: whether the caches have listed their resources.
    """

    def __init__(
        self,
        state: cache.ClusterCache,
        extender_metrics: metrics.ExtenderMetrics,
        *,
        scheduler_name: str,
        ready: Callable[[], bool],
    ) -> None:
        self.state = state
        self.metrics = extender_metrics
        self.scheduler_name = scheduler_name
        self.ready = ready

    def filter(self, body: bytes) -> Response:
        """Answer `filter` with an `ExtenderFilterResult`."""
        verb = metrics.ExtenderVerb.FILTER
        call = self._read(verb, body)
        if isinstance(call, Response):
            return call
        names = wire.candidate_names(call.args)
        if call.problem is not None:
            self.metrics.rejections.labels(reason=decide.Reason.MALFORMED_ANNOTATION).inc(
                len(names)
            )
            every = dict.fromkeys(names, f"kubeseer: {call.problem}")
            return self._answer(verb, wire.filter_result(call.args, [], {}, every))
        if call.demand is None:
            return self._answer(verb, wire.filter_result(call.args, names, {}, {}))
        candidates, missing = self.state.candidates(names, with_assumed=False)
        failed = dict.fromkeys(missing, "kubeseer: node not in the extender's cache yet")
        decider = decide.Decider(call.demand)
        verdicts = {s: decider.verdict(s) for s in {s for _, s in candidates}}
        passed = [name for name, s in candidates if verdicts[s] is None]
        unresolvable: dict[str, str] = {}
        tally: dict[decide.Verdict, int] = {}
        if len(passed) < len(candidates):
            for name, situation in candidates:
                verdict = verdicts[situation]
                if verdict is not None:
                    tally[verdict] = tally.get(verdict, 0) + 1
                    (unresolvable if verdict.unresolvable else failed)[name] = verdict.message
        counts = {decide.Reason.NOT_IN_CACHE: len(missing)}
        for verdict, nodes_failed in tally.items():
            for rejection in verdict.rejections:
                counts[rejection.reason] = counts.get(rejection.reason, 0) + nodes_failed
        for reason, count in counts.items():
            if count:
                self.metrics.rejections.labels(reason=reason).inc(count)
        return self._answer(verb, wire.filter_result(call.args, passed, failed, unresolvable))

    def prioritize(self, body: bytes) -> Response:
        """Answer `prioritize` with a `HostPriorityList`, and assume the pod on the best node."""
        verb = metrics.ExtenderVerb.PRIORITIZE
        call = self._read(verb, body)
        if isinstance(call, Response):
            return call
        names = wire.candidate_names(call.args)
        if call.demand is None:
            return self._answer(verb, wire.host_priorities((n, 0) for n in names))
        candidates, missing = self.state.candidates(names, with_assumed=True)
        scored = decide.Decider(call.demand).scores(candidates)
        best = next((n for n, s in scored if s == wire.MAX_EXTENDER_PRIORITY), None)
        if best is not None:
            self.state.assume(call.demand, best)
        if missing:  # answered in the order sent, unknown nodes 0
            known = dict(scored)
            scored = [(n, known.get(n, wire.MIN_EXTENDER_PRIORITY)) for n in names]
        return self._answer(verb, wire.host_priorities(scored))

    def _read(self, verb: metrics.ExtenderVerb, body: bytes) -> _Call | Response:
        """The call's arguments and the pod's demand, or the refusal to answer with."""
        try:
            args = wire.parse_args(body)
            demand = pods.read(args["Pod"])
        except (wire.WireError, pods.QuantityError) as e:
            log.warning("%s: malformed request: %s", verb, e)
            return self._refuse(verb, HTTPStatus.BAD_REQUEST, str(e))
        if not self.ready():
            return self._refuse(
                verb, HTTPStatus.SERVICE_UNAVAILABLE, "node and pod caches not synced yet"
            )
        if demand.scheduler_name != self.scheduler_name:
            decision = metrics.ExtenderDecision.OTHER_SCHEDULER
        elif not demand.kubeseer or not demand.requests:
            decision = metrics.ExtenderDecision.NOT_KUBESEER
        elif demand.problem is not None:
            decision = metrics.ExtenderDecision.MALFORMED_ANNOTATION
        else:
            decision = metrics.ExtenderDecision.DECIDED
        self.metrics.decisions.labels(verb=verb, decision=decision).inc()
        if decision is metrics.ExtenderDecision.DECIDED:
            return _Call(args, demand, None)
        if decision is metrics.ExtenderDecision.MALFORMED_ANNOTATION:
            return _Call(args, None, demand.problem)
        return _Call(args, None, None)

    def _answer(
        self,
        verb: metrics.ExtenderVerb,
        answer: wire.ExtenderFilterResult | wire.HostPriorityList,
    ) -> Response:
        self.metrics.requests.labels(verb=verb, code="200").inc()
        return Response(HTTPStatus.OK, wire.encode(answer))

    def _refuse(self, verb: metrics.ExtenderVerb, status: HTTPStatus, message: str) -> Response:
        self.metrics.requests.labels(verb=verb, code=str(status.value)).inc()
        return Response(status, wire.encode({"Error": message}))


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        handlers: Handlers,
        max_body_bytes: int,
        protocol: bool,
    ) -> None:
        super().__init__(address, _RequestHandler)
        self.handlers = handlers
        self.max_body_bytes = max_body_bytes
        self.protocol = protocol


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "kubeseer-extender"
    # Headers and body leave in one write (buffered, flushed after each request) with Nagle
    # off: as two small writes, the body waited for the client's delayed ACK, 40 ms a call.
    wbufsize = -1
    disable_nagle_algorithm = True
    # An idle kept-alive connection is closed after this long; its thread ends with it.
    timeout = 120

    def do_POST(self) -> None:
        server = self._server()
        began = time.perf_counter()
        verb = self.path.rstrip("/").rsplit("/", 1)[-1]
        routes: dict[str, Callable[[bytes], Response]] = {
            metrics.ExtenderVerb.FILTER: server.handlers.filter,
            metrics.ExtenderVerb.PRIORITIZE: server.handlers.prioritize,
        }
        route = routes.get(verb) if server.protocol else None
        if route is None:
            self._refuse(HTTPStatus.NOT_FOUND, "no such verb here")
            return
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self._refuse(HTTPStatus.LENGTH_REQUIRED, "Content-Length required", verb)
            return
        if int(length) > server.max_body_bytes:
            self._refuse(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "body too large", verb)
            return
        self._send(route(self.rfile.read(int(length))))
        server.handlers.metrics.request_duration.labels(verb=verb).observe(
            time.perf_counter() - began
        )

    def _refuse(self, status: HTTPStatus, message: str, verb: str | None = None) -> None:
        """Answer without reading the body, and close: the connection's framing is lost."""
        if verb is not None:
            self._server().handlers.metrics.requests.labels(verb=verb, code=str(status.value)).inc()
        self.close_connection = True
        self._send(Response(status, wire.encode({"Error": message})))

    def do_GET(self) -> None:
        server = self._server()
        if self.path == "/healthz":
            ok = server.handlers.ready()
            status = HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE
            text = b"ok\n" if ok else b"caches not synced\n"
            self._send(Response(status, text, "text/plain; charset=utf-8"))
        elif self.path == "/metrics":
            body = generate_latest(server.handlers.metrics.registry)
            self._send(Response(HTTPStatus.OK, body, CONTENT_TYPE_LATEST))
        else:
            self._send(Response(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain"))

    def log_message(self, format: str, *args: Any) -> None:
        """Access logs at DEBUG: kube-scheduler calls for every GPU pod."""
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, response: Response) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        self.wfile.write(response.body)

    def _server(self) -> _Server:
        assert isinstance(self.server, _Server)
        return self.server


def serve(
    handlers: Handlers,
    address: tuple[str, int],
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    protocol: bool = True,
) -> ThreadingHTTPServer:
    """A bound server; the caller runs `serve_forever()` (in a thread, or the main one).

    With `protocol=False` it serves `/healthz` and `/metrics` only: the listener for probes
    and Prometheus, while the extender protocol stays on loopback beside kube-scheduler.
    """
    return _Server(address, handlers, max_body_bytes, protocol)

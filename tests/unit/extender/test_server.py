"""The HTTP service on a real socket: answers, refusals, health, metrics and what it counts."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from extender_fixtures import GIB, gpu_pod, node_objects
from prometheus_client import CollectorRegistry

from kubeseer import metrics
from kubeseer.extender import cache, decide, pods, server, stanza
from kubeseer.operator import workload

CANDIDATES = ["a100-1g", "a100-3g", "h100-whole"]


class Running:
    """A served `Handlers` on a free loopback port, with a keep-alive client."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.state = cache.ClusterCache()
        self.state.replace_nodes(node_objects().values())
        self.state.replace_pods([])
        self.ready = True
        self.handlers = server.Handlers(
            self.state,
            metrics.ExtenderMetrics(self.registry, reasons=list(decide.Reason)),
            scheduler_name=stanza.SCHEDULER_NAME,
            ready=lambda: self.ready,
        )
        self.httpd = server.serve(self.handlers, ("127.0.0.1", 0), max_body_bytes=1 << 20)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self.thread.start()
        self.client = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)

    def post(self, path: str, body: bytes) -> tuple[int, Any]:
        self.client.request("POST", path, body, {"Content-Type": "application/json"})
        response = self.client.getresponse()
        return response.status, json.loads(response.read())

    def get(self, path: str) -> tuple[int, str]:
        self.client.request("GET", path)
        response = self.client.getresponse()
        return response.status, response.read().decode()

    def value(self, name: str, labels: dict[str, str]) -> float | None:
        return self.registry.get_sample_value(name, labels)

    def close(self) -> None:
        self.client.close()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture
def running() -> Iterator[Running]:
    served = Running()
    yield served
    served.close()


def args(pod: dict[str, Any], names: list[str] = CANDIDATES) -> bytes:
    return json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode()


def test_filter_passes_nodes_that_hold_the_prediction(running: Running):
    status, answer = running.post("/scheduler/filter", args(gpu_pod(predicted=8 * GIB)))
    assert status == 200
    assert answer == {
        "Nodes": None,
        "NodeNames": CANDIDATES,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }


def test_filter_fails_a_slice_too_small_with_a_reason_for_describe(running: Running):
    _, answer = running.post("/filter", args(gpu_pod(predicted=12 * GIB)))
    assert answer["NodeNames"] == ["a100-3g", "h100-whole"]
    assert list(answer["FailedAndUnresolvableNodes"]) == ["a100-1g"]
    assert (
        "less than the predicted peak 12.00 GiB" in answer["FailedAndUnresolvableNodes"]["a100-1g"]
    )
    reason = {"reason": "memory_below_prediction"}
    assert running.value("kubeseer_extender_node_rejections_total", reason) == 1


def test_a_full_node_is_failed_resolvably(running: Running):
    running.state.replace_pods([gpu_pod(f"p{i}", node="h100-whole", uid=f"u{i}") for i in range(2)])
    _, answer = running.post("/filter", args(gpu_pod(predicted=60 * GIB)))
    assert answer["NodeNames"] == []
    assert answer["FailedNodes"] == {
        "h100-whole": "kubeseer: 0 of 2 nvidia.com/gpu free, the pod needs 1"
    }
    assert set(answer["FailedAndUnresolvableNodes"]) == {"a100-1g", "a100-3g"}


def test_prioritize_gives_the_best_fit_the_top_score(running: Running):
    status, answer = running.post("/prioritize", args(gpu_pod(predicted=8 * GIB)))
    assert status == 200
    assert answer == [
        {"Host": "a100-1g", "Score": 10},
        {"Host": "a100-3g", "Score": 6},
        {"Host": "h100-whole", "Score": 3},
    ]


def test_a_prioritized_pod_is_assumed_on_the_best_node_until_bound(running: Running):
    body = args(gpu_pod("a", predicted=60 * GIB), ["h100-whole"])
    running.post("/prioritize", body)
    ((_, assumed),), _ = running.state.candidates(["h100-whole"], with_assumed=True)
    assert assumed.used == {"nvidia.com/gpu": 1}


def test_pods_of_other_schedulers_pass_through_untouched(running: Running):
    pod = gpu_pod(predicted=90 * GIB, scheduler="default-scheduler")
    _, filtered = running.post("/filter", args(pod))
    assert filtered["NodeNames"] == CANDIDATES and filtered["FailedAndUnresolvableNodes"] == {}
    _, scored = running.post("/prioritize", args(pod))
    assert {s["Score"] for s in scored} == {0}
    labels = {"verb": "filter", "decision": "other_scheduler"}
    assert running.value("kubeseer_extender_decisions_total", labels) == 1


def test_pods_without_kubeseer_annotations_pass_through_untouched(running: Running):
    _, filtered = running.post("/filter", args(gpu_pod(predicted=None)))
    assert filtered["NodeNames"] == CANDIDATES
    _, scored = running.post("/prioritize", args(gpu_pod(predicted=None)))
    assert {s["Score"] for s in scored} == {0}
    labels = {"verb": "prioritize", "decision": "not_kubeseer"}
    assert running.value("kubeseer_extender_decisions_total", labels) == 1


def test_an_unreadable_annotation_fails_every_node_with_what_to_fix(running: Running):
    pod = gpu_pod(predicted=None, annotations={workload.ANNOTATION_PREDICTED_MEMORY: "12GiB"})
    _, filtered = running.post("/filter", args(pod))
    assert filtered["NodeNames"] == []
    messages = set(filtered["FailedAndUnresolvableNodes"].values())
    assert messages == {
        f"kubeseer: annotation {workload.ANNOTATION_PREDICTED_MEMORY}='12GiB' must be a positive "
        "whole number of bytes"
    }
    _, scored = running.post("/prioritize", args(pod))
    assert {s["Score"] for s in scored} == {0}


def test_a_node_the_cache_has_not_seen_fails_resolvably(running: Running):
    _, answer = running.post("/filter", args(gpu_pod(), ["a100-1g", "new-node"]))
    assert answer["NodeNames"] == ["a100-1g"]
    assert answer["FailedNodes"] == {"new-node": "kubeseer: node not in the extender's cache yet"}


def test_allowed_products_from_the_annotation_are_enforced(running: Running):
    pod = gpu_pod(predicted=8 * GIB, annotations={pods.ANNOTATION_GPU_PRODUCTS: "H100-80GB-SXM"})
    _, answer = running.post("/filter", args(pod))
    assert answer["NodeNames"] == ["h100-whole"]


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b'{"Pod": {}}',
        b"null",
        json.dumps({"Pod": gpu_pod(units=0.5), "NodeNames": []}).encode(),
    ],
)
def test_malformed_requests_get_400_and_the_service_keeps_serving(running: Running, body: bytes):
    status, answer = running.post("/filter", body)
    assert status == 400
    assert answer["Error"]
    status, _ = running.post("/filter", args(gpu_pod()))
    assert status == 200
    assert running.value("kubeseer_extender_requests_total", {"verb": "filter", "code": "400"}) == 1


def test_before_the_caches_sync_every_call_is_refused_with_503(running: Running):
    running.ready = False
    status, answer = running.post("/prioritize", args(gpu_pod()))
    assert (status, answer) == (503, {"Error": "node and pod caches not synced yet"})
    assert running.get("/healthz") == (503, "caches not synced\n")
    running.ready = True
    assert running.get("/healthz") == (200, "ok\n")


def test_unknown_paths_are_404(running: Running):
    status, _ = running.post("/bind", args(gpu_pod()))
    assert status == 404
    running.client.close()
    assert running.get("/nope")[0] == 404


def test_a_metrics_only_listener_never_answers_the_protocol():
    served = Running()
    metrics_only = server.serve(served.handlers, ("127.0.0.1", 0), protocol=False)
    thread = threading.Thread(target=metrics_only.serve_forever, kwargs={"poll_interval": 0.01})
    thread.start()
    try:
        connection = http.client.HTTPConnection("127.0.0.1", metrics_only.server_address[1])
        connection.request("POST", "/filter", args(gpu_pod()))
        assert connection.getresponse().status == 404
        connection.close()
        connection = http.client.HTTPConnection("127.0.0.1", metrics_only.server_address[1])
        connection.request("GET", "/healthz")
        assert connection.getresponse().status == 200
        connection.close()
    finally:
        metrics_only.shutdown()
        metrics_only.server_close()
        thread.join()
        served.close()


def test_metrics_are_served_and_count_latency(running: Running):
    running.post("/filter", args(gpu_pod()))
    status, text = running.get("/metrics")
    assert status == 200
    assert 'kubeseer_extender_requests_total{code="200",verb="filter"} 1.0' in text
    count = running.value("kubeseer_extender_request_duration_seconds_count", {"verb": "filter"})
    assert count == 1


def test_a_body_over_the_limit_is_refused_before_it_is_read(running: Running):
    with socket.create_connection(("127.0.0.1", running.port), timeout=5) as raw:
        raw.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n")
        assert raw.recv(200).startswith(b"HTTP/1.1 413")
    assert running.value("kubeseer_extender_requests_total", {"verb": "filter", "code": "413"}) == 1


def test_a_body_without_a_length_is_refused(running: Running):
    with socket.create_connection(("127.0.0.1", running.port), timeout=5) as raw:
        raw.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\n\r\n")
        assert raw.recv(200).startswith(b"HTTP/1.1 411")


def test_one_connection_serves_many_calls(running: Running):
    for _ in range(20):
        assert running.post("/filter", args(gpu_pod()))[0] == 200
    assert (
        running.value("kubeseer_extender_requests_total", {"verb": "filter", "code": "200"}) == 20
    )

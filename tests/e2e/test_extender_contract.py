"""The extender protocol as the real kube-scheduler speaks it, recorded.

A recording stand-in (the outermost edge: it only stores bodies and passes every node) sits where
the extender would, with kubeseer's own stanza (node names only, ignorable). The request bodies
kube-scheduler sends for a kubeseer pod must have the shape of the fixtures the unit tests read
(tests/unit/extender/fixtures/*-request.json), and `wire.parse_args` must read them. Run with
`KUBESEER_RECORD_FIXTURES=1` to rewrite the fixtures from this cluster's scheduler.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from kubernetes import client
from kubernetes import config as kube_config

from kubeseer.devcluster import binaries, cluster
from kubeseer.extender import stanza, wire
from kubeseer.operator import workload

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FIXTURES = Path(__file__).parents[1] / "unit" / "extender" / "fixtures"
INVENTORY = FIXTURES / "nodes.yaml"


class _Recorder(BaseHTTPRequestHandler):
    """Passes every node, scores every node 0, keeps each body by verb."""

    bodies: ClassVar[dict[str, bytes]] = {}

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        verb = self.path.rsplit("/", 1)[-1]
        self.bodies.setdefault(verb, body)
        names = json.loads(body)["NodeNames"]
        if verb == "filter":
            answer: Any = {"NodeNames": names, "FailedNodes": {}, "Error": ""}
        else:
            answer = [{"Host": n, "Score": 0} for n in names]
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Keep the test output quiet."""


@pytest.fixture
def recorder() -> Iterator[str]:
    _Recorder.bodies = {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/kubeseer"
    server.shutdown()
    server.server_close()
    thread.join()


def _shape(value: Any) -> Any:
    """The JSON's structure without its values: keys of objects, element shape of lists."""
    if isinstance(value, dict):
        return {key: _shape(v) for key, v in sorted(value.items())}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__


def test_scheduler_requests_match_the_recorded_fixtures(
    recorder: str, control_plane: binaries.Binaries, tmp_path: Path, wait_for
):
    with cluster.LocalCluster(
        run_dir=tmp_path, inventory_file=INVENTORY, extender_url=recorder, bins=control_plane
    ) as local:
        api = kube_config.new_client_from_config(config_file=str(local.admin_kubeconfig))
        core = client.CoreV1Api(api)
        core.create_namespaced_pod(
            "default",
            {
                "metadata": {
                    "name": "train-resnet50-0",
                    "labels": {workload.LABEL_DLJOB: "train-resnet50", workload.LABEL_ATTEMPT: "0"},
                    "annotations": {
                        workload.ANNOTATION_PREDICTED_MEMORY: str(8 << 30),
                        workload.ANNOTATION_PROFILE: "A100-80GB/1g.10gb",
                        workload.ANNOTATION_GPU_PRODUCT: "A100-80GB",
                    },
                },
                "spec": {
                    "schedulerName": stanza.SCHEDULER_NAME,
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.example/train:1",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        )
        wait_for(
            "the pod to be bound",
            lambda: core.read_namespaced_pod("train-resnet50-0", "default").spec.node_name,
        )
        api.close()
    assert set(_Recorder.bodies) == {"filter", "prioritize"}
    for verb, body in _Recorder.bodies.items():
        live = json.loads(body)
        fixture = FIXTURES / f"{verb}-request.json"
        if os.environ.get("KUBESEER_RECORD_FIXTURES") == "1":
            fixture.write_bytes(body)  # byte for byte as kube-scheduler sent it
        recorded = json.loads(fixture.read_text())
        assert list(live) == ["Pod", "Nodes", "NodeNames"], "Go encodes fields in struct order"
        assert live["Nodes"] is None
        assert sorted(live["NodeNames"]) == ["a100-1g", "a100-3g", "h100-whole"]
        assert _shape(live) == _shape(recorded)
        args = wire.parse_args(body)
        assert args["Pod"]["metadata"]["annotations"][workload.ANNOTATION_PREDICTED_MEMORY] == str(
            8 << 30
        )

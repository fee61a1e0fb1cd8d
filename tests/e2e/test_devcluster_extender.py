"""With an extender URL, the real kube-scheduler accepts the rendered extender stanza and asks
the extender before binding GPU pods. The extender here is a stand-in at the very edge (the real
one is `kubeseer.extender`): it keeps only one node, so the pod's placement proves the call."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from kubernetes import client
from kubernetes import config as kube_config

from kubeseer.devcluster import binaries, cluster, config

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CHOSEN = "gpu-a100-80-mig-0"


class _OneNodeExtender(BaseHTTPRequestHandler):
    """Answers `filter` by keeping only `CHOSEN`, records every request body."""

    calls: ClassVar[list[tuple[str, dict[str, Any]]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.calls.append((self.path, body))
        names = body["NodeNames"]
        keep = [n for n in names if n == CHOSEN]
        failed = {n: "not the chosen one" for n in names if n not in keep}
        answer = {"NodeNames": keep, "FailedNodes": failed, "Error": ""}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Keep the test output quiet."""


@pytest.fixture
def extender() -> Iterator[str]:
    _OneNodeExtender.calls = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OneNodeExtender)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/scheduler"
    server.shutdown()
    server.server_close()
    thread.join()


def test_scheduler_consults_the_extender_for_gpu_pods(
    extender: str, control_plane: binaries.Binaries, tmp_path: Path, wait_for
):
    with cluster.LocalCluster(run_dir=tmp_path, extender_url=extender, bins=control_plane) as local:
        stanza = (tmp_path / "scheduler.yaml").read_text()
        assert "urlPrefix: " + extender in stanza
        api = kube_config.new_client_from_config(config_file=str(local.admin_kubeconfig))
        core = client.CoreV1Api(api)
        core.create_namespaced_pod(
            "default",
            {
                "metadata": {"name": "gpu"},
                "spec": {
                    "schedulerName": config.KUBESEER_SCHEDULER,
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        )
        pod = wait_for(
            "the pod to be bound",
            lambda: (p := core.read_namespaced_pod("gpu", "default")).spec.node_name and p,
        )
        api.close()
    assert pod.spec.node_name == CHOSEN
    paths = {path for path, _ in _OneNodeExtender.calls}
    assert paths == {"/scheduler/filter"}
    _, request = _OneNodeExtender.calls[0]
    assert request["Pod"]["metadata"]["name"] == "gpu"
    # Both whole-GPU nodes passed the scheduler's own filters before the extender was asked;
    # the stanza is nodeCacheCapable, so they come as names only.
    assert request["Nodes"] is None
    assert set(request["NodeNames"]) == {"gpu-h100-0", CHOSEN}

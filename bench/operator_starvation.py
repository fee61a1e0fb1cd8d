"""Do slow model servers starve other DLJobs? Time for an ordinary DLJob to be placed while N
DLJobs are fetching from a server that sends one byte every 2 s.

The operator runs as a child process with its shipped defaults (16 fetch workers, of which one
namespace may hold 4; a minimum rate of 256 KiB/s after a 10 s grace; 16 reconcile workers).
For each N, N slow DLJobs are submitted to one namespace and the bench waits until the operator
has opened their downloads (at most 4); then three ordinary DLJobs are submitted and timed from
create to `Placed`: a URL model in another namespace, a URL model in the slow DLJobs' own
namespace (it queues behind them: a tenant's slow sources delay its own downloads), and a
ConfigMap model in that namespace. Then the slow DLJobs are deleted and the time until the slow
server sees every download hung up is measured.

The peer, measured in the same run: the same ordinary DLJobs with no slow source (N = 0). The
model was predicted once in a warm-up, so the figures measure waiting, not predicting.

    .venv/bin/python bench/operator_starvation.py [--slow 0 4 16 64]
"""

from __future__ import annotations

import argparse
import base64
import http.server
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client, config
from onnx import TensorProto, helper

from kubeseer import resources
from kubeseer.devcluster import binaries, cluster
from kubeseer.operator import local

GROUP, VERSION, PLURAL = "kubeseer.io", "v1alpha1", "dljobs"
TRICKLE_S = 2.0


def model() -> bytes:
    nodes = [helper.make_node("Gemm", ["x", "w"], ["y"], transB=0)]
    weight = helper.make_tensor("w", TensorProto.FLOAT, [256, 256], [0.0] * (256 * 256))
    graph = helper.make_graph(
        nodes,
        "ordinary",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 256])],
        [weight],
    )
    return bytes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    )


MODEL = model()


class Sources(http.server.BaseHTTPRequestHandler):
    """`/fast.onnx` at once; `/slow/*` one byte every TRICKLE_S, counting open downloads."""

    protocol_version = "HTTP/1.1"
    lock = threading.Lock()
    open_slow = 0
    stop = threading.Event()

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(MODEL)))
        self.end_headers()
        if not self.path.startswith("/slow/"):
            self.wfile.write(MODEL)
            return
        with Sources.lock:
            Sources.open_slow += 1
        try:
            for byte in MODEL:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                if Sources.stop.wait(TRICKLE_S):
                    break
        except OSError:
            pass
        finally:
            with Sources.lock:
                Sources.open_slow -= 1


@contextmanager
def sources() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sources)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        Sources.stop.set()
        server.shutdown()
        server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dljob(name: str, source: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DLJob",
        "metadata": {"name": name},
        "spec": {
            "model": source,
            "mode": "infer",
            "batchSize": 8,
            "template": {"spec": {"containers": [{"name": "main", "image": "example/job:1"}]}},
        },
    }


def wait(what: str, probe: Callable[[], bool], timeout_s: float) -> float:
    """Seconds until `probe()` holds."""
    start = time.monotonic()
    while not probe():
        if time.monotonic() - start > timeout_s:
            raise SystemExit(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - start


def wait_each(
    probes: dict[str, Callable[[], bool]], start: float, timeout_s: float
) -> dict[str, float]:
    """Seconds from `start` until each probe first holds."""
    reached: dict[str, float] = {}
    while len(reached) < len(probes):
        for name, probe in probes.items():
            if name not in reached and probe():
                reached[name] = time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise SystemExit(f"timed out after {timeout_s:g} s; placed only {sorted(reached)}")
        time.sleep(0.05)
    return reached


def run(slow_counts: list[int]) -> None:
    with (
        tempfile.TemporaryDirectory() as tmp,
        sources() as server,
        cluster.LocalCluster(
            run_dir=Path(tmp) / "cluster",
            crd_files=sorted(resources.path("deploy", "crds").glob("*.yaml")),
            rbac_files=sorted(resources.path("deploy", "rbac").glob("*.yaml")),
            bins=binaries.locate(),
        ) as local_cluster,
    ):
        api = config.new_client_from_config(config_file=str(local_cluster.admin_kubeconfig))
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        env = {
            "KUBESEER_HEALTH_PORT": str(free_port()),
            "KUBESEER_METRICS_PORT": "0",
            "KUBESEER_FETCH_CACHE_DIR": str(Path(tmp) / "models"),
            "KUBESEER_FETCH_ALLOWED_HOSTS": "127.0.0.1",
        }
        operator = local.OperatorProcess(
            local_cluster.operator_kubeconfig, env, Path(tmp) / "operator.log"
        )
        operator.start()

        def phase(namespace: str, name: str) -> str | None:
            body = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            return (body.get("status") or {}).get("phase")

        def placed(namespace: str, name: str) -> Callable[[], bool]:
            return lambda: phase(namespace, name) in ("Placed", "Running")

        try:
            core.create_namespace({"metadata": {"name": "warm"}})
            custom.create_namespaced_custom_object(
                GROUP, VERSION, "warm", PLURAL, dljob("warm", {"url": f"{server}/fast.onnx"})
            )
            wait("the warm-up DLJob", placed("warm", "warm"), 300)
            print(f"slow server: one byte every {TRICKLE_S:g} s; load average before: "
                  f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")  # fmt: skip
            print()
            print("| slow DLJobs | downloads open | URL, other namespace | URL, same namespace "
                  "| ConfigMap, same namespace | slow ones hung up after delete |")  # fmt: skip
            print("|---:|---:|---:|---:|---:|---:|")
            for n in slow_counts:
                namespace, other = f"slow-{n}", f"other-{n}"
                core.create_namespace({"metadata": {"name": namespace}})
                core.create_namespace({"metadata": {"name": other}})
                core.create_namespaced_config_map(
                    namespace,
                    {
                        "metadata": {"name": "m"},
                        "binaryData": {"model.onnx": base64.b64encode(MODEL).decode()},
                    },
                )
                slow = [f"slow-{i}" for i in range(n)]
                for name in slow:
                    custom.create_namespaced_custom_object(
                        GROUP, VERSION, namespace, PLURAL,
                        dljob(name, {"url": f"{server}/slow/{namespace}/{name}"}),
                    )  # fmt: skip
                opened = min(n, 4)
                wait("the slow downloads", lambda k=opened: Sources.open_slow >= k, 120)
                start = time.monotonic()
                fast = {"url": f"{server}/fast.onnx"}
                for ns in (other, namespace):
                    custom.create_namespaced_custom_object(
                        GROUP, VERSION, ns, PLURAL, dljob("url", fast)
                    )
                reference = {"configMapRef": {"name": "m", "key": "model.onnx"}}
                custom.create_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, dljob("configmap", reference)
                )
                reached = wait_each(
                    {
                        "other": placed(other, "url"),
                        "same": placed(namespace, "url"),
                        "configmap": placed(namespace, "configmap"),
                    },
                    start,
                    900,
                )
                open_now = Sources.open_slow
                for name in slow:
                    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
                gone = wait("every slow download hung up", lambda: Sources.open_slow == 0, 120)
                print(
                    f"| {n} | {open_now} | {reached['other']:.2f} s | {reached['same']:.2f} s "
                    f"| {reached['configmap']:.2f} s | {gone:.1f} s |"
                )
                core.delete_namespace(namespace)
                core.delete_namespace(other)
        finally:
            operator.stop()
    print()
    print(f"load average after: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow", type=int, nargs="+", default=[0, 4, 16, 64])
    run(parser.parse_args().slow)


if __name__ == "__main__":
    main()

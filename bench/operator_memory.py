"""How much memory does the operator hold while it fetches and predicts large models at once?

Rounds of k DLJobs (k = 1, 2, 4, 6, 8 by default) are submitted at once to the local control
plane, each naming its own large ONNX model (about 448 MiB of inline fp32 weights, under the
512 MiB fetch limit) on an HTTP server on 127.0.0.1; the operator runs as a child process. While
the round runs, the operator's anonymous resident memory (heap: what a container's memory limit
holds, as file-backed pages are reclaimable) is sampled every 20 ms, and its peak resident set
(VmHWM, reset before each round) read at the end.

The peer, measured in the same run: the bytes of the models the round fetched (k x model size),
what an operator that held each model in memory while predicting it would add at least. The
ratio "added anonymous memory / model bytes fetched" says whether memory follows the models.

    .venv/bin/python bench/operator_memory.py [--concurrency 1 2 4 6 8] [--layers 7]
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import http.server
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kubernetes import client, config
from onnx import TensorProto, helper

from kubeseer import resources, units
from kubeseer.devcluster import binaries, cluster
from kubeseer.operator import local

GROUP, VERSION, PLURAL = "kubeseer.io", "v1alpha1", "dljobs"
WIDTH = 4096
SETTLED = ("Placed", "Running", "Succeeded", "Failed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_model(path: Path, layers: int) -> int:
    """An MLP of `layers` WIDTH x WIDTH fp32 Gemms with inline weights; returns its size."""
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        weight = TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=[WIDTH, WIDTH])
        weight.raw_data = bytes(4 * WIDTH * WIDTH)
        inits.append(weight)
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}"], [f"g{i}"]))
        nodes.append(helper.make_node("Relu", [f"g{i}"], [f"r{i}"]))
        prev = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["batch", WIDTH])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    data = model.SerializeToString()
    path.write_bytes(data)
    return len(data)


def doc_string(text: str) -> bytes:
    """ModelProto field 6 (doc_string): appended to a serialised model, it makes another model
    with the same graph (a different sha256, so nothing is served from a cache)."""
    raw = text.encode()
    return b"\x32" + bytes([len(raw)]) + raw


@contextmanager
def model_server(base: Path) -> Iterator[str]:
    """`/<tag>.onnx`: the base model with its own doc_string, streamed from disk."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            """Quiet."""

        def do_GET(self) -> None:
            suffix = doc_string(self.path.strip("/"))
            self.send_response(200)
            self.send_header("Content-Length", str(base.stat().st_size + len(suffix)))
            self.end_headers()
            with base.open("rb") as source:
                while chunk := source.read(units.MIB):
                    self.wfile.write(chunk)
            self.wfile.write(suffix)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class Sampler:
    """Peak anonymous RSS of a process, sampled from /proc every 20 ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_anon = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def anon(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no RssAnon in /proc status")

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak_anon = max(self.peak_anon, self.anon())

    def __enter__(self) -> Sampler:
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")  # VmHWM starts again from VmRSS
        self.peak_anon = self.anon()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def dljob(name: str, model: dict[str, object]) -> dict[str, object]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DLJob",
        "metadata": {"name": name},
        "spec": {
            "model": model,
            "mode": "infer",
            "batchSize": 8,
            "template": {"spec": {"containers": [{"name": "main", "image": "example/job:1"}]}},
        },
    }


def wait_settled(
    custom: client.CustomObjectsApi, namespace: str, names: list[str]
) -> dict[str, str]:
    deadline = time.monotonic() + 900
    while True:
        phases = {}
        for name in names:
            body = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            status = body.get("status") or {}
            phases[name] = f"{status.get('phase')} {status.get('reason') or ''}".strip()
        if all(p.split()[0] in SETTLED for p in phases.values()):
            return phases
        if time.monotonic() > deadline:
            raise SystemExit(f"round did not settle: {phases}")
        time.sleep(0.2)


def run(concurrency: list[int], layers: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.onnx"
        size = build_model(base, layers)
        print(f"model: {layers} Gemm layers of {WIDTH}x{WIDTH} fp32, {size / units.MIB:.0f} MiB")
        with (
            model_server(base) as server,
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
            try:
                core.create_namespace({"metadata": {"name": "warm"}})
                small = base64.b64encode(_small_model()).decode()
                core.create_namespaced_config_map(
                    "warm", {"metadata": {"name": "m"}, "binaryData": {"model.onnx": small}}
                )
                custom.create_namespaced_custom_object(
                    GROUP, VERSION, "warm", PLURAL,
                    dljob("warmup", {"configMapRef": {"name": "m", "key": "model.onnx"}}),
                )  # fmt: skip
                wait_settled(custom, "warm", ["warmup"])
                time.sleep(2)
                idle = Sampler(operator.pid).anon()
                rss, _ = operator.memory_bytes()
                print(f"operator after warm-up: RSS {rss / units.MIB:.0f} MiB, "
                      f"anonymous {idle / units.MIB:.0f} MiB")  # fmt: skip
                print()
                print("| concurrent models | bytes fetched | peak RSS (VmHWM) | peak anonymous "
                      "| added anonymous | added / fetched | round |")  # fmt: skip
                print("|---:|---:|---:|---:|---:|---:|---:|")
                worst = 0
                for k in concurrency:
                    namespace = f"round-{k}"
                    core.create_namespace({"metadata": {"name": namespace}})
                    names = [f"big-{i}" for i in range(k)]
                    start = time.monotonic()
                    with Sampler(operator.pid) as sampler:
                        with concurrent.futures.ThreadPoolExecutor(k) as pool:
                            list(
                                pool.map(
                                    lambda n, ns=namespace: custom.create_namespaced_custom_object(
                                        GROUP, VERSION, ns, PLURAL,
                                        dljob(n, {"url": f"{server}/{ns}-{n}.onnx"}),
                                    ),
                                    names,
                                )
                            )  # fmt: skip
                        phases = wait_settled(custom, namespace, names)
                    elapsed = time.monotonic() - start
                    _, hwm = operator.memory_bytes()
                    failed = {n: p for n, p in phases.items() if p.startswith("Failed")}
                    if failed:
                        raise SystemExit(f"round {k}: {failed}")
                    added = sampler.peak_anon - idle
                    worst = max(worst, sampler.peak_anon)
                    mib = [x / units.MIB for x in (k * size, hwm, sampler.peak_anon, added)]
                    print(
                        f"| {k} | {mib[0]:,.0f} MiB | {mib[1]:,.0f} MiB | {mib[2]:,.0f} MiB "
                        f"| {mib[3]:,.0f} MiB | {added / (k * size):.3f} | {elapsed:.1f} s |"
                    )
            finally:
                operator.stop()
    print()
    print(
        f"largest anonymous peak {worst / units.MIB:,.0f} MiB; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )


def _small_model() -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "warm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 256])],
    )
    return bytes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 6, 8])
    parser.add_argument("--layers", type=int, default=7)
    args = parser.parse_args()
    run(args.concurrency, args.layers)


if __name__ == "__main__":
    main()

"""How fast does the operator turn DLJobs into pods, and how much memory does it hold?

100 DLJobs are submitted at once to the local control plane (real etcd, kube-apiserver,
kube-scheduler, KWOK) with the operator running as a child process under its least-privilege
identity. Latency is DLJob create request sent -> pod seen by a watch, both on this process's
clock (object timestamps have one-second resolution). The model is cached first by one warm-up
DLJob, so the figures measure the operator, not the predictor. Goal: p50 <= 1 s, p99 <= 3 s.

    .venv/bin/python bench/operator.py [--jobs 100]
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import hashlib
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from kubernetes import client, config, watch

from kubeseer.devcluster import binaries, cluster
from kubeseer.operator import local

REPO = Path(__file__).resolve().parents[1]
GROUP, VERSION, PLURAL = "kubeseer.io", "v1alpha1", "dljobs"
sys.path.insert(0, str(REPO / "examples"))
import generate  # noqa: E402 - the samples' model builder, one directory over

SUBMITTERS = 16
MODEL = generate.build_mlp(generate.SAMPLES[0]).SerializeToString()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dljob(name: str) -> dict:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DLJob",
        "metadata": {"name": name},
        "spec": {
            # Pinned by digest, as production DLJobs should be: with the prediction cached, the
            # operator does not read the model again.
            "model": {
                "configMapRef": {"name": "model", "key": "model.onnx"},
                "sha256": hashlib.sha256(MODEL).hexdigest(),
            },
            "mode": "infer",
            "batchSize": 64,
            "template": {"spec": {"containers": [{"name": "main", "image": "example/job:1"}]}},
        },
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(jobs: int) -> None:
    with (
        tempfile.TemporaryDirectory() as tmp,
        cluster.LocalCluster(
            run_dir=Path(tmp) / "cluster",
            crd_files=sorted((REPO / "deploy" / "crds").glob("*.yaml")),
            rbac_files=sorted((REPO / "deploy" / "rbac").glob("*.yaml")),
            bins=binaries.locate(),
        ) as local_cluster,
    ):
        api = config.new_client_from_config(config_file=str(local_cluster.admin_kubeconfig))
        api.configuration.connection_pool_maxsize = SUBMITTERS
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        namespace = "bench"
        core.create_namespace({"metadata": {"name": namespace}})
        core.create_namespaced_config_map(
            namespace,
            {
                "metadata": {"name": "model"},
                "binaryData": {"model.onnx": base64.b64encode(MODEL).decode()},
            },
        )
        env = {
            "KUBESEER_HEALTH_PORT": str(free_port()),
            "KUBESEER_METRICS_PORT": "0",
            "KUBESEER_FETCH_CACHE_DIR": str(Path(tmp) / "models"),
        }
        operator = local.OperatorProcess(
            local_cluster.operator_kubeconfig, env, Path(tmp) / "operator.log"
        )
        operator.start()
        try:
            seen: dict[str, float] = {}
            stop = threading.Event()
            watching = threading.Event()

            def watch_pods() -> None:
                w = watch.Watch()
                watching.set()
                for event in w.stream(core.list_namespaced_pod, namespace, timeout_seconds=120):
                    name = event["object"].metadata.name
                    seen.setdefault(name, time.perf_counter())
                    if stop.is_set():
                        w.stop()

            watcher = threading.Thread(target=watch_pods, daemon=True)
            watcher.start()
            watching.wait()
            time.sleep(0.5)

            warm_start = time.perf_counter()
            custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, dljob("warmup")
            )
            while "warmup-0" not in seen:
                time.sleep(0.005)
            print(f"warm-up (fetch + predict + place): {seen['warmup-0'] - warm_start:.2f} s")

            sent: dict[str, float] = {}
            cpu_before = operator.cpu_seconds()

            def create(name: str) -> None:
                sent[f"{name}-0"] = time.perf_counter()
                custom.create_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, dljob(name)
                )

            # "At once": as many concurrent creates as the client's connection pool allows.
            with concurrent.futures.ThreadPoolExecutor(SUBMITTERS) as pool:
                list(pool.map(create, [f"job-{i:03d}" for i in range(jobs)]))
            submit_s = time.perf_counter() - min(sent.values())
            deadline = time.monotonic() + 120
            while not all(p in seen for p in sent) and time.monotonic() < deadline:
                time.sleep(0.01)
            stop.set()
            missing = [p for p in sent if p not in seen]
            latencies = [seen[p] - sent[p] for p in sent if p in seen]
            rss, peak = operator.memory_bytes()
            cpu = operator.cpu_seconds() - cpu_before
        finally:
            operator.stop()

    print(f"{jobs} DLJobs submitted in {submit_s:.2f} s; pods created: {len(latencies)}")
    if missing:
        print(f"no pod within 120 s for {len(missing)}: {missing[:5]}")
    print(
        f"DLJob created -> pod created: p50 {statistics.median(latencies):.3f} s, "
        f"p99 {percentile(latencies, 0.99):.3f} s, max {max(latencies):.3f} s "
        "(goal: p50 <= 1 s, p99 <= 3 s)"
    )
    print(f"operator RSS {rss / 2**20:.0f} MiB (peak {peak / 2**20:.0f} MiB)")
    print(
        f"operator CPU for the burst: {cpu:.2f} s ({cpu / jobs * 1e3:.0f} ms per DLJob; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    run(parser.parse_args().jobs)


if __name__ == "__main__":
    main()

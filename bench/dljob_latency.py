"""How fast does the operator turn DLJobs into pods, and how much memory does it hold?

100 DLJobs are submitted at once to the local control plane (real etcd, kube-apiserver,
kube-scheduler, KWOK) with the operator running as a child process under its least-privilege
identity. Latency is DLJob create request sent -> pod seen by a watch, both on this process's
clock (object timestamps have one-second resolution): the operator places the DLJob, creates
its Job suspended, gives it its GPU and resumes it, and the Job controller creates the pod. The
model is cached first by one warm-up DLJob, so the figures measure the operator, not the
predictor. Goal: p50 <= 1 s, p99 <= 3 s.

Two peers, measured in the same run: the same 100 Jobs created directly by this process (what the
API server and the Job controller take: the part of the latency that is not the operator's),
and the same 100 pods created directly (the API server alone). The operator's own part is also
timed, DLJob created -> its Job resumed (seen by a watch of Jobs). The operator's CPU time per
DLJob is the figure that does not depend on how busy the machine is.

    .venv/bin/python bench/dljob_latency.py [--jobs 100]
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import contextlib
import hashlib
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import urllib3
from kubernetes import client, config, watch

from kubeseer import resources
from kubeseer.devcluster import binaries, cluster
from kubeseer.operator import local

GROUP, VERSION, PLURAL = "kubeseer.io", "v1alpha1", "dljobs"
sys.path.insert(0, str(resources.path("examples")))
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
            crd_files=sorted(resources.path("deploy", "crds").glob("*.yaml")),
            rbac_files=sorted(resources.path("deploy", "rbac").glob("*.yaml")),
            bins=binaries.locate(),
        ) as local_cluster,
    ):
        api = config.new_client_from_config(config_file=str(local_cluster.admin_kubeconfig))
        api.configuration.connection_pool_maxsize = SUBMITTERS
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        batch = client.BatchV1Api(api)
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
            watching = threading.Event()

            def watch_pods() -> None:
                w = watch.Watch()
                watching.set()
                stream = w.stream(core.list_namespaced_pod, namespace, timeout_seconds=600)
                # The stream ends abruptly when the cluster stops at the end of the run.
                with contextlib.suppress(urllib3.exceptions.ProtocolError):
                    for event in stream:
                        # A DLJob's pod is its Job's (named `<dljob>-<attempt>-xxxxx`).
                        pod = event["object"].metadata
                        key = (pod.labels or {}).get("batch.kubernetes.io/job-name", pod.name)
                        seen.setdefault(key, time.perf_counter())

            resumed: dict[str, float] = {}
            watching_jobs = threading.Event()

            def watch_jobs() -> None:
                w = watch.Watch()
                watching_jobs.set()
                stream = w.stream(batch.list_namespaced_job, namespace, timeout_seconds=600)
                with contextlib.suppress(urllib3.exceptions.ProtocolError):
                    for event in stream:
                        job = event["object"]
                        if not job.spec.suspend:
                            resumed.setdefault(job.metadata.name, time.perf_counter())

            threading.Thread(target=watch_pods, daemon=True).start()
            threading.Thread(target=watch_jobs, daemon=True).start()
            watching.wait()
            watching_jobs.wait()
            time.sleep(0.5)

            warm_start = time.perf_counter()
            custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, dljob("warmup")
            )
            wait_seen(seen, ["warmup-0"])
            print(f"warm-up (fetch + predict + place): {seen['warmup-0'] - warm_start:.2f} s")

            cpu_before = operator.cpu_seconds()
            sent = burst(
                lambda name: custom.create_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, dljob(name)
                ),
                [f"job-{i:03d}" for i in range(jobs)],
                seen,
                pod_of=lambda name: f"{name}-0",
            )
            cpu = operator.cpu_seconds() - cpu_before
            rss, peak = operator.memory_bytes()
            dljobs = [seen[k] - at for k, at in sent.items()]
            operator_part = [resumed[k] - at for k, at in sent.items()]

            # The first peer: the same Jobs created directly (running, not suspended).
            template = api.sanitize_for_serialization(
                batch.read_namespaced_job("warmup-0", namespace).spec.template
            )
            # Without the Job controller's labels of that Job, and kubeseer's (no DLJob owns it).
            template["metadata"]["labels"] = {
                k: v
                for k, v in template["metadata"]["labels"].items()
                if not k.startswith(("kubeseer.io/", "batch.kubernetes.io/", "controller-uid"))
                and k != "job-name"
            }
            sent_jobs = burst(
                lambda name: batch.create_namespaced_job(
                    namespace,
                    {
                        "metadata": {"name": name},
                        "spec": {"backoffLimit": 0, "template": template},
                    },
                ),
                [f"peerjob-{i:03d}" for i in range(jobs)],
                seen,
                pod_of=lambda name: name,
            )
            direct_jobs = [seen[k] - at for k, at in sent_jobs.items()]

            # The peer: the same pods created directly, so the figure above can be read against
            # what the API server, scheduler and KWOK alone take on this machine right now.
            (warm_pod,) = core.list_namespaced_pod(
                namespace, label_selector="batch.kubernetes.io/job-name=warmup-0"
            ).items
            pod_spec = api.sanitize_for_serialization(warm_pod.spec)
            pod_spec.pop("nodeName", None)
            sent_pods = burst(
                lambda name: core.create_namespaced_pod(
                    namespace, {"metadata": {"name": name}, "spec": pod_spec}
                ),
                [f"peer-{i:03d}" for i in range(jobs)],
                seen,
                pod_of=lambda name: name,
            )
            direct = [seen[k] - at for k, at in sent_pods.items()]
        finally:
            operator.stop()

    report("DLJob created -> pod created", dljobs, goal=" (goal: p50 <= 1 s, p99 <= 3 s)")
    report("  of which the operator: DLJob created -> its Job resumed", operator_part)
    report("peer: Job created directly -> pod seen", direct_jobs)
    report("peer: pod created directly -> pod seen", direct)
    print(
        f"ratio DLJob / Job created directly: p50 "
        f"{statistics.median(dljobs) / statistics.median(direct_jobs):.1f}x, p99 "
        f"{percentile(dljobs, 0.99) / percentile(direct_jobs, 0.99):.1f}x"
    )
    print(f"operator RSS {rss / 2**20:.0f} MiB (peak {peak / 2**20:.0f} MiB)")
    print(
        f"operator CPU for the burst: {cpu:.2f} s ({cpu / jobs * 1e3:.0f} ms per DLJob); "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )


def wait_seen(seen: dict[str, float], names: list[str], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(n in seen for n in names):
        if time.monotonic() > deadline:
            missing = [n for n in names if n not in seen]
            raise SystemExit(f"no pod within {timeout_s:g} s for {len(missing)}: {missing[:5]}")
        time.sleep(0.005)


def burst(
    create: Callable[[str], object],
    names: list[str],
    seen: dict[str, float],
    *,
    pod_of: Callable[[str], str],
) -> dict[str, float]:
    """Create everything at once (SUBMITTERS concurrent requests), wait until each pod shows;
    when each was sent, by the key its pod is seen under."""
    sent: dict[str, float] = {}

    def one(name: str) -> None:
        sent[pod_of(name)] = time.perf_counter()
        create(name)

    with concurrent.futures.ThreadPoolExecutor(SUBMITTERS) as pool:
        list(pool.map(one, names))
    wait_seen(seen, list(sent))
    return sent


def report(what: str, latencies: list[float], goal: str = "") -> None:
    print(
        f"{what}: n {len(latencies)}, p50 {statistics.median(latencies):.3f} s, "
        f"p99 {percentile(latencies, 0.99):.3f} s, max {max(latencies):.3f} s{goal}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    run(parser.parse_args().jobs)


if __name__ == "__main__":
    main()

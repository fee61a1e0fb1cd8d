"""The GPU profiler end to end on the local control plane.

The real operator places a DLJob and creates its pod, kube-scheduler binds it to a fake GPU
node and KWOK runs it. A real `kubeseer profiler` process, with the profiler service account's
own token (deploy/rbac/60-profiler.yaml), samples that node. Two things are stand-ins, at the
outermost edge and nowhere else: NVML answers from `kubeseer.profiler.standin` (no GPU here),
and the host's /proc is a directory holding the cgroup files the pod's and a system process's
PIDs would have under containerd with the systemd driver (KWOK runs no processes).
"""

from __future__ import annotations

import base64
import contextlib
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from onnx import TensorProto, helper
from operator_support import finish
from prometheus_client.parser import text_string_to_metric_families

from kubeseer.devcluster import cluster
from kubeseer.observations import record, store
from kubeseer.operator import local, main
from kubeseer.operator.config import OperatorConfig

pytestmark = pytest.mark.e2e

GROUP, VERSION, PLURAL = "kubeseer.io", "v1alpha1", "dljobs"
GIB = 1 << 30
POD_PID, SYSTEM_PID, STRANGER_PID = 4242, 77, 5151
NODES = Path(__file__).resolve().parents[2] / "deploy" / "devcluster" / "nodes.yaml"


def small_model() -> bytes:
    """A two-layer Gemm/Relu MLP with a symbolic batch."""
    nodes, inits, prev, fan_in = [], [], "x", 64
    for i in range(2):
        inits += [
            helper.make_tensor(f"w{i}", TensorProto.FLOAT, [fan_in, 256], [0.0] * (fan_in * 256)),
            helper.make_tensor(f"b{i}", TensorProto.FLOAT, [256], [0.0] * 256),
        ]
        nodes += [
            helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [f"g{i}"]),
            helper.make_node("Relu", [f"g{i}"], [f"r{i}"]),
        ]
        prev, fan_in = f"r{i}", 256
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["batch", 256])],
        inits,
    )
    return bytes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def operator(devcluster: cluster.LocalCluster, tmp_path: Path) -> Iterator[main.Operator]:
    """The operator in a thread with its own least-privilege identity."""
    settings = OperatorConfig(
        retry_delay_s=0.5,
        max_retries=1,
        metrics_port=free_port(),
        health_port=free_port(),
        fetch_cache_dir=tmp_path / "models",
        observation_store=str(tmp_path / "observations"),
    )
    built = main.build(settings, kubeconfig=str(devcluster.operator_kubeconfig))
    try:
        with local.OperatorThread(built):
            yield built
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()


def profiler_kubeconfig(
    devcluster: cluster.LocalCluster, admin: client.ApiClient, path: Path
) -> Path:
    """A kubeconfig holding a token of the profiler's service account (TokenRequest)."""
    token = (
        client.CoreV1Api(admin)
        .create_namespaced_service_account_token(
            "kubeseer-profiler", "kubeseer-system", {"spec": {"expirationSeconds": 3600}}
        )
        .status.token
    )
    admin_config = yaml.safe_load(devcluster.admin_kubeconfig.read_text())
    entry = admin_config["clusters"][0]
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [entry],
        "users": [{"name": "profiler", "user": {"token": token}}],
        "contexts": [
            {"name": "profiler", "context": {"cluster": entry["name"], "user": "profiler"}}
        ],
        "current-context": "profiler",
    }
    path.write_text(yaml.safe_dump(document))
    path.chmod(0o600)
    return path


def cgroup_of(pod_uid: str, container: str) -> str:
    """What /proc/<pid>/cgroup says for a container process: cgroup v2, systemd, containerd."""
    slice_uid = pod_uid.replace("-", "_")
    return (
        "0::/kubepods.slice/kubepods-besteffort.slice/"
        f"kubepods-besteffort-pod{slice_uid}.slice/cri-containerd-{container}.scope\n"
    )


def nvml_name(product_label: str) -> str:
    """GFD's product label (dashes for spaces, `-MIG-...` for single-strategy slices) -> NVML's
    device name."""
    return product_label.split("-MIG-")[0].replace("-", " ")


def scenario_for(placement: dict[str, Any], pod_uid: str) -> tuple[dict[str, Any], str]:
    """The node's GPU as NVML would describe it for this placement, and the pod's device UUID."""
    gpu_uuid = "GPU-5f1e1c3e-8a57-4f52-9a1b-0c6a8b2d3e4f"
    name = nvml_name(placement["productLabel"])
    total = 80 * GIB
    gpu: dict[str, Any] = {"uuid": gpu_uuid, "name": name, "memory_total_bytes": total}
    gpu["gpm"] = "H100" in name or "H200" in name
    device = gpu_uuid
    if placement.get("migProfile"):
        device = "MIG-1a2b3c4d-5e6f-5a7b-8c9d-0e1f2a3b4c5d"
        gpu["mig"] = [
            {
                "uuid": device,
                "profile": placement["migProfile"],
                "gpu_instance_id": 9,
                "memory_total_bytes": placement["usableMemoryBytes"],
            }
        ]
    processes = [
        # The job: 3.5 GiB while it builds its model (its first 5 s, which the agent's first
        # sample falls in however slowly it starts), then 3 GiB.
        {
            "pid": POD_PID,
            "device": device,
            "used_bytes": int(3.5 * GIB),
            "profile": [[5.0, 3 * GIB]],
            "sm_activity_percent": 65.0,
        },
        # A process of no pod (a node daemon with a CUDA context).
        {"pid": SYSTEM_PID, "device": device, "used_bytes": 300 << 20},
    ]
    return {"gpus": [gpu], "processes": processes}, device


@contextlib.contextmanager
def profiler(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`kubeseer profiler` as its own process; stopped with SIGTERM as a DaemonSet pod is."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "kubeseer.cli", "profiler", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            yield process
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def metrics_text(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_profiler_reports_what_a_dljob_pod_uses_in_its_status_and_metrics(
    devcluster: cluster.LocalCluster,
    admin_api: client.ApiClient,
    operator: main.Operator,
    namespace: str,
    tmp_path: Path,
    wait_for: Any,
) -> None:
    custom = client.CustomObjectsApi(admin_api)
    core = client.CoreV1Api(admin_api)
    core.create_namespaced_config_map(
        namespace,
        {
            "metadata": {"name": "model"},
            "binaryData": {"model.onnx": base64.b64encode(small_model()).decode()},
        },
    )
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DLJob",
        "metadata": {"name": "profiled", "labels": {"kubeseer.io/model-family": "mlp"}},
        "spec": {
            "model": {"configMapRef": {"name": "model", "key": "model.onnx"}},
            "mode": "infer",
            "batchSize": 8,
            "template": {
                # KWOK keeps the Job's pod running until the test ends it.
                "metadata": {
                    "annotations": {
                        "pod-complete.stage.kwok.x-k8s.io/delay": "24h",
                        "pod-complete.stage.kwok.x-k8s.io/jitter-delay": "24h",
                    }
                },
                "spec": {"containers": [{"name": "main", "image": "example/job:1"}]},
            },
        },
    }
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    def running() -> dict[str, Any] | None:
        got = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "profiled")
        return got if got.get("status", {}).get("phase") == "Running" else None

    placed = wait_for("the DLJob Running", running, 90)
    (pod,) = core.list_namespaced_pod(namespace, label_selector="kubeseer.io/dljob=profiled").items
    pod_name = pod.metadata.name  # the pod of Job profiled-0
    node = pod.spec.node_name
    assert node, "the pod was bound"

    # A pod that copies the DLJob's label but is not the operator's, on the same node.
    stranger = core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "stranger", "labels": {"kubeseer.io/dljob": "profiled"}},
            "spec": {
                "nodeName": node,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "main", "image": "example/other:1"}],
            },
        },
    )
    proc = tmp_path / "proc"
    for pid, text in (
        (POD_PID, cgroup_of(pod.metadata.uid, "a" * 64)),
        (STRANGER_PID, cgroup_of(stranger.metadata.uid, "b" * 64)),
        (SYSTEM_PID, "0::/system.slice/nvidia-persistenced.service\n"),
    ):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(text)
    scenario, device = scenario_for(placed["status"]["placement"], pod.metadata.uid)
    # The stranger runs on the node's second GPU (on the job's own device it would make the
    # device shared, whose SM activity is then nobody's).
    other = "GPU-0e8d2a3b-6c4f-4b1a-8e2d-9f7c6b5a4d3e"
    scenario["gpus"].append(
        {"uuid": other, "name": scenario["gpus"][0]["name"], "memory_total_bytes": 80 * GIB}
    )
    scenario["processes"].append({"pid": STRANGER_PID, "device": other, "used_bytes": GIB})
    (tmp_path / "scenario.json").write_text(json.dumps(scenario))
    kubeconfig = profiler_kubeconfig(devcluster, admin_api, tmp_path / "profiler.kubeconfig")
    port = free_port()
    argv = [
        "--node", node,
        "--kubeconfig", str(kubeconfig),
        "--nvml-standin", str(tmp_path / "scenario.json"),
        "--proc-root", str(proc),
        "--period", "0.2",
        "--warmup", "6",  # past the first 5 s, whatever the first sample's time
        "--report-interval", "1",
        "--pods-refresh", "1",
        "--metrics-port", str(port),
    ]  # fmt: skip

    def observed() -> dict[str, Any] | None:
        got = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "profiled")
        entry = got.get("status", {}).get("observed", {}).get("pods", {}).get(pod_name)
        return entry if entry and entry["window"]["warmedUp"] else None

    with profiler(argv, tmp_path / "profiler.log"):
        entry = wait_for("status.observed after the warm-up", observed, 60)
        assert entry["peakMemoryBytes"] == int(3.5 * GIB)  # the warm-up's peak counts
        assert entry["meanMemoryBytes"] == 3 * GIB  # the mean leaves the warm-up out
        assert (entry["source"], entry["node"], entry["attempt"], entry["final"]) == (
            "nvml-standin",
            node,
            0,
            False,
        )
        (gpu,) = entry["gpus"]
        assert gpu["uuid"] == device
        assert gpu["memorySource"] == "processes"
        if placed["status"]["placement"].get("migProfile") and not scenario["gpus"][0]["gpm"]:
            # An A100 MIG device reports no SM activity at all: said so, not a zero.
            assert entry["smActivitySource"] == "unavailable"
            assert "smActivityPercent" not in entry
        else:
            assert entry["smActivityPercent"] == pytest.approx(65.0, abs=1.0)

        series = metrics_text(port)
        labels = (
            ("GPU_I_ID", "9" if gpu["migProfile"] else ""),
            ("GPU_I_PROFILE", gpu["migProfile"] or ""),
            ("UUID", device),
            ("dljob", "profiled"),
            ("modelName", scenario["gpus"][0]["name"]),
            ("namespace", namespace),
            ("pod", pod_name),
        )
        assert series[("kubeseer_profiler_pod_memory_bytes", labels)] == 3 * GIB
        assert series[("kubeseer_profiler_pod_memory_peak_bytes", labels)] == int(3.5 * GIB)
        assert series[("kubeseer_profiler_unattributed_processes", ())] == 1
        assert not any(dict(k[1]).get("pod") == "stranger" for k in series)
        assert series[("kubeseer_profiler_reports_total", (("outcome", "patched"),))] >= 1

        # The pod ends: the profiler's last report says so.
        finish(core.api_client, namespace, pod_name)

        def final() -> dict[str, Any] | None:
            got = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "profiled")
            entry = got["status"]["observed"]["pods"][pod_name]
            return got if entry["final"] else None

        done = wait_for("the final report", final, 30)
        assert set(done["status"]["observed"]["pods"]) == {pod_name}  # not the stranger
        assert ("kubeseer_profiler_pod_memory_bytes", labels) not in metrics_text(port)

    # The operator recorded the attempt with what the profiler saw, and the record outlives
    # the DLJob.
    records = store.open_store(str(tmp_path / "observations"))

    def recorded() -> record.Observation | None:
        found = records.read().observations
        return found[0] if found and found[0].observed_peak_memory_bytes else None

    observation = wait_for("the observation record", recorded, 30)
    assert observation.outcome is record.Outcome.SUCCEEDED
    assert observation.observed_peak_memory_bytes == int(3.5 * GIB)
    assert (observation.family, observation.observed_source) == ("mlp", "nvml-standin")
    assert (
        observation.predicted_memory_upper_bytes
        == placed["status"]["prediction"]["memoryUpperBytes"]
    )
    assert observation.perfgraph_ref is not None
    assert records.get_graph(observation.perfgraph_ref) is not None
    operator_series = metrics_text(operator.config.metrics_port)
    assert (
        operator_series[("kubeseer_feedback_observations_total", (("outcome", "succeeded"),))] == 1
    )
    profile = f"{observation.gpu_product}/{observation.mig_profile or 'whole'}"
    error_labels = (
        ("family", "mlp"),
        ("gpu_product", observation.gpu_product),
        ("profile", profile),
        ("quantity", "memory"),
    )
    assert (
        operator_series[("kubeseer_feedback_prediction_absolute_error_ratio_count", error_labels)]
        == 1
    )
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "profiled")
    wait_for(
        "the DLJob gone",
        lambda: (
            not custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
        ),
        30,
    )
    assert [o.dljob for o in records.read().observations] == ["profiled"]

    # The profiler's identity writes DLJob status and nothing else.
    limited = config.new_client_from_config(config_file=str(kubeconfig))
    with pytest.raises(ApiException) as refused:
        client.CustomObjectsApi(limited).patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "profiled", {"metadata": {"labels": {"x": "y"}}}
        )
    assert refused.value.status == 403
    with pytest.raises(ApiException) as refused:
        client.CoreV1Api(limited).list_namespaced_secret(namespace)
    assert refused.value.status == 403

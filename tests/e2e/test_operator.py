"""The DLJob operator end to end on the local control plane.

A real kube-apiserver validates the CRD, the real operator (kopf, the predictor, placement) runs
with the least-privilege identity of deploy/rbac/, kube-scheduler binds its pods to the fake GPU
nodes and KWOK runs them. Models come from ConfigMaps or from an HTTP server on 127.0.0.1 that
the operator's configuration allow-lists.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import gc
import http.server
import json
import socket
import threading
import time
import urllib.request
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from onnx import TensorProto, helper

from kubeseer.devcluster import cluster
from kubeseer.operator import local, main
from kubeseer.operator.config import OperatorConfig

pytestmark = pytest.mark.e2e

GROUP, VERSION, PLURAL = "kubeseer.io", "v1alpha1", "dljobs"
DEPLOYMENT = Path(__file__).resolve().parents[2] / "deploy" / "operator" / "deployment.yaml"


def mlp(width: int, layers: int, features: int = 256) -> bytes:
    """A Gemm/Relu MLP with a symbolic batch; weights are external data (never read)."""
    nodes, inits, offset, prev, fan_in = [], [], 0, "x", features
    for i in range(layers):
        for name, dims in ((f"w{i}", [fan_in, width]), (f"b{i}", [width])):
            t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=dims)
            t.data_location = TensorProto.EXTERNAL
            length = 4 * (dims[0] * (dims[1] if len(dims) > 1 else 1))
            for k, v in (("location", "w.bin"), ("offset", offset), ("length", length)):
                e = t.external_data.add()
                e.key, e.value = k, str(v)
            offset += length
            inits.append(t)
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [f"g{i}"]))
        nodes.append(helper.make_node("Relu", [f"g{i}"], [f"r{i}"]))
        prev, fan_in = f"r{i}", width
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", features])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["batch", width])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return bytes(model.SerializeToString())


SMALL = mlp(width=1024, layers=2)
# 8 layers of 65536 x 65536: 34G parameters, far beyond any GPU when trained with Adam.
HUGE = mlp(width=65536, layers=8, features=65536)
CORRUPT = b"\x08\x07this is not a protobuf of an ONNX model\xff\xfe"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Keep the test output clean."""


@pytest.fixture(scope="module")
def model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Serve the test models on 127.0.0.1 (the operator's config allow-lists that host)."""
    root = tmp_path_factory.mktemp("models")
    (root / "small.onnx").write_bytes(SMALL)
    (root / "corrupt.onnx").write_bytes(CORRUPT)
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def operator_config(tmp: Path, **overrides: Any) -> OperatorConfig:
    """Fast retries, loopback models allowed, no fixed ports."""
    values: dict[str, Any] = {
        "retry_delay_s": 0.5,
        "max_retries": 1,
        "metrics_port": free_port(),
        "health_port": free_port(),
        "fetch_allowed_hosts": ("127.0.0.1",),
        "fetch_connect_timeout_s": 1.0,
        "fetch_read_timeout_s": 5.0,
        "fetch_cache_dir": tmp / "models",
        **overrides,
    }
    return OperatorConfig(**values)


@contextlib.contextmanager
def operator_thread(built: main.Operator, namespaces: tuple[str, ...] = ()) -> Iterator[None]:
    """`local.OperatorThread`, and once it has stopped, the sockets its event loop left behind
    collected here rather than in whichever later test the garbage collector happens to run.

    kopf closes its aiohttp sessions on the way out, but a transport is only released on a
    later iteration of a loop that by then has closed with the thread; the garbage collector
    then warns about each socket, and pytest reports that against an unrelated test (a CI run
    failed that way at the setup of a measurement unit test). In a deployed operator the loop
    lives as long as the process, so this is a property of running kopf in a test's thread.
    """
    try:
        with local.OperatorThread(built, namespaces=namespaces):
            yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()


@pytest.fixture
def operator(
    devcluster: cluster.LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[main.Operator]:
    """The operator in a thread, as the operator service account; one per test, so that none
    runs beside the child-process operator of the restart test."""
    config = operator_config(tmp_path_factory.mktemp("operator"))
    built = main.build(config, kubeconfig=str(devcluster.operator_kubeconfig))
    with operator_thread(built):
        yield built


def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def dljob(
    name: str, model: Mapping[str, Any], *, mode: str = "infer", batch: int = 8, **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DLJob",
        "metadata": {"name": name},
        "spec": {
            "model": dict(model),
            "mode": mode,
            "batchSize": batch,
            "template": {"spec": {"containers": [{"name": "main", "image": "example/job:1"}]}},
            **spec,
        },
    }


def submit(api: client.ApiClient, namespace: str, body: Mapping[str, Any]) -> None:
    custom(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, dict(body))


def get(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return dict(custom(api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))


def configmap(api: client.ApiClient, namespace: str, name: str, data: bytes) -> dict[str, str]:
    client.CoreV1Api(api).create_namespaced_config_map(
        namespace,
        {"metadata": {"name": name}, "binaryData": {"model.onnx": base64.b64encode(data).decode()}},
    )
    return {"name": name, "key": "model.onnx"}


def phase_is(api: client.ApiClient, namespace: str, name: str, *phases: str) -> Any:
    def probe() -> dict[str, Any] | None:
        body = get(api, namespace, name)
        return body if body.get("status", {}).get("phase") in phases else None

    return probe


def condition(body: Mapping[str, Any], kind: str) -> dict[str, Any]:
    found = [c for c in body["status"].get("conditions", []) if c["type"] == kind]
    assert found, f"no {kind} condition in {body['status']}"
    return dict(found[0])


def pods_of(api: client.ApiClient, namespace: str, name: str) -> list[Any]:
    return list(
        client.CoreV1Api(api)
        .list_namespaced_pod(namespace, label_selector=f"kubeseer.io/dljob={name}")
        .items
    )


def table(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    """`kubectl get dlj` as the API server renders it (printer columns)."""
    response = api.call_api(
        "GET",
        f"{api.configuration.host}/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}",
        header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
    )
    response.read()
    return dict(json.loads(response.data))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model": {}}, "exactly one of model.url and model.configMapRef"),
        (
            {"model": {"url": "https://x/m.onnx", "configMapRef": {"name": "a", "key": "b"}}},
            "exactly one of model.url and model.configMapRef",
        ),
        ({"mode": "serve"}, "spec.mode"),
        ({"batchSize": 0}, "spec.batchSize"),
        ({"precision": "int4"}, "spec.precision"),
        ({"placement": {"policy": "fixed"}}, "placement.profile is required with policy fixed"),
        ({"placement": {"coverage": 1.5}}, "spec.placement.coverage"),
        ({"placement": {"maxSlowdown": 0.5}}, "spec.placement.maxSlowdown"),
        ({"template": {"spec": {"containers": []}}}, "spec.template.spec.containers"),
    ],
)
def test_the_api_server_rejects_an_invalid_dljob(
    admin_api: client.ApiClient, namespace: str, change: dict[str, Any], message: str
) -> None:
    body = dljob("bad", {"url": "https://models.example/m.onnx"})
    body["spec"].update(change)
    with pytest.raises(ApiException) as raised:
        submit(admin_api, namespace, body)
    assert raised.value.status == 422
    assert message in json.loads(raised.value.body)["message"]


def test_the_operator_deployment_manifests_are_accepted(admin_api: client.ApiClient) -> None:
    """Server-side dry run of deploy/operator/ (schema and admission, nothing persisted)."""
    for document in yaml.safe_load_all(DEPLOYMENT.read_text()):
        if document["kind"] == "Deployment":
            client.AppsV1Api(admin_api).create_namespaced_deployment(
                "kubeseer-system", document, dry_run="All"
            )
        else:
            client.CoreV1Api(admin_api).create_namespaced_service(
                "kubeseer-system", document, dry_run="All"
            )


def test_the_spec_cannot_change_after_creation(admin_api: client.ApiClient, namespace: str) -> None:
    submit(admin_api, namespace, dljob("frozen", {"url": "https://models.example/m.onnx"}))
    with pytest.raises(ApiException, match="spec is immutable"):
        custom(admin_api).patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "frozen", {"spec": {"batchSize": 16}}
        )


def test_a_dljob_becomes_a_running_pod_on_a_mig_slice(
    operator: main.Operator,
    admin_api: client.ApiClient,
    namespace: str,
    wait_for: Any,
) -> None:
    ref = configmap(admin_api, namespace, "small", SMALL)
    # The shipped checkpoint learned no SM utilisation (CPU labels), so it assumes a busy GPU;
    # a job that accepts running a few times slower may then share one.
    placement = {"maxSlowdown": 8.0}
    submit(admin_api, namespace, dljob("small", {"configMapRef": ref}, placement=placement))
    body = wait_for("DLJob small Running", phase_is(admin_api, namespace, "small", "Running"), 90)

    status = body["status"]
    resource = status["placement"]["resource"]
    assert resource.startswith("nvidia.com/mig-")
    assert status["prediction"]["modelDigest"]
    point, upper = (int(x) for x in status["prediction"]["memoryMiB"].split("/"))
    assert 0 < point <= upper <= status["placement"]["usableMemoryMiB"]
    for kind in ("Accepted", "ModelReady", "Predicted", "Placed", "WorkloadReady"):
        assert condition(body, kind)["status"] == "True"

    (pod,) = pods_of(admin_api, namespace, "small")
    assert pod.metadata.name == "small-0"
    assert pod.spec.node_name
    assert pod.status.phase == "Running"
    assert pod.spec.containers[0].resources.limits == {resource: "1"}
    assert pod.metadata.owner_references[0].uid == body["metadata"]["uid"]
    assert pod.metadata.annotations["kubeseer.io/predicted-memory-bytes"] == str(
        status["prediction"]["memoryUpperBytes"]
    )

    port = operator.config.metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        exposition = response.read().decode()
    profile = status["placement"]["profile"]
    placed = f'kubeseer_operator_placements_total{{outcome="placed",profile="{profile}"}}'
    assert any(
        line.startswith(placed) and float(line.split()[-1]) >= 1 for line in exposition.splitlines()
    ), exposition
    health = operator.config.health_port
    with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=5) as response:
        assert response.status == 200

    rendered = table(admin_api, namespace)
    columns = [c["name"] for c in rendered["columnDefinitions"]]
    assert columns == [
        "Name", "Model", "Mode", "Batch", "Mem-MiB", "Resource", "Phase", "Age",
    ]  # fmt: skip
    (row,) = rendered["rows"]
    assert row["cells"][:7] == [
        "small", "small/model.onnx", "infer", 8, status["prediction"]["memoryMiB"], resource,
        "Running",
    ]  # fmt: skip


def test_bad_dljobs_fail_with_clear_conditions_while_a_good_one_runs(
    operator: main.Operator,
    admin_api: client.ApiClient,
    namespace: str,
    model_server: str,
    wait_for: Any,
) -> None:
    closed = free_port()
    submit(admin_api, namespace, dljob("corrupt", {"url": f"{model_server}/corrupt.onnx"}))
    submit(admin_api, namespace, dljob("unreachable", {"url": f"http://127.0.0.1:{closed}/m.onnx"}))
    huge = configmap(admin_api, namespace, "huge", HUGE)
    submit(admin_api, namespace, dljob("huge", {"configMapRef": huge}, mode="train", batch=4096))
    small = configmap(admin_api, namespace, "small", SMALL)
    absent = {"gpuProducts": ["H200-141GB"]}  # a product the dev cluster does not have
    submit(admin_api, namespace, dljob("absent", {"configMapRef": small}, placement=absent))
    submit(admin_api, namespace, dljob("good", {"url": f"{model_server}/small.onnx"}))

    settled = {
        name: wait_for(
            f"{name} to settle",
            phase_is(admin_api, namespace, name, "Failed", "Placed", "Running"),
            60,
        )
        for name in ("corrupt", "unreachable", "huge", "absent")
    }
    for name, body in settled.items():
        assert body["status"]["phase"] == "Failed", (
            f"{name} was not failed: predicted {body['status'].get('prediction', {})}, "
            f"placed {body['status'].get('placement', {}).get('resource')}"
        )
    assert condition(settled["corrupt"], "Predicted")["reason"] == "CorruptModel"
    unreachable = condition(settled["unreachable"], "ModelReady")
    assert unreachable["reason"] == "ModelUnreachable"
    assert str(closed) in unreachable["message"]
    for name in ("huge", "absent"):
        no_fit = condition(settled[name], "Placed")
        assert no_fit["reason"] == "NoFit"
        assert "predicted need" in no_fit["message"]
    assert "largest free" in condition(settled["huge"], "Placed")["message"]
    assert "among H200-141GB" in condition(settled["absent"], "Placed")["message"]
    for name in settled:
        assert pods_of(admin_api, namespace, name) == []
    wait_for("good Running", phase_is(admin_api, namespace, "good", "Running"), 60)


def test_replicas_run_as_a_job_that_finishes_the_dljob(
    operator: main.Operator,
    admin_api: client.ApiClient,
    namespace: str,
    wait_for: Any,
) -> None:
    ref = configmap(admin_api, namespace, "pair", SMALL)
    submit(admin_api, namespace, dljob("pair", {"configMapRef": ref}, mode="train", replicas=2))
    body = wait_for("pair Succeeded", phase_is(admin_api, namespace, "pair", "Succeeded"), 90)
    job = client.BatchV1Api(admin_api).read_namespaced_job("pair-0", namespace)
    assert (job.spec.parallelism, job.spec.completions, job.spec.backoff_limit) == (2, 2, 0)
    assert job.metadata.owner_references[0].uid == body["metadata"]["uid"]
    resource = body["status"]["placement"]["resource"]
    job_pods = pods_of(admin_api, namespace, "pair")
    assert len(job_pods) == 2
    assert all(p.spec.containers[0].resources.limits == {resource: "1"} for p in job_pods)
    assert [a["outcome"] for a in body["status"]["attempts"]] == ["Succeeded"]


def test_an_oom_killed_pod_is_placed_again_on_a_larger_slice(
    operator: main.Operator,
    admin_api: client.ApiClient,
    namespace: str,
    wait_for: Any,
) -> None:
    ref = configmap(admin_api, namespace, "oom", SMALL)
    submit(admin_api, namespace, dljob("oom", {"configMapRef": ref}))
    first = wait_for("oom Running", phase_is(admin_api, namespace, "oom", "Running"), 90)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    client.CoreV1Api(admin_api).patch_namespaced_pod_status(
        "oom-0",
        namespace,
        {
            "status": {
                "phase": "Failed",
                "containerStatuses": [
                    {
                        "name": "main",
                        "image": "example/job:1",
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {
                            "terminated": {
                                "exitCode": 137,
                                "reason": "OOMKilled",
                                "startedAt": now,
                                "finishedAt": now,
                            }
                        },
                    }
                ],
            }
        },
    )

    def escalated() -> dict[str, Any] | None:
        body = get(admin_api, namespace, "oom")
        return body if body["status"].get("placement", {}).get("attempt") == 1 else None

    second = wait_for("the OOM escalation", escalated, 60)
    before = first["status"]["placement"]
    after = second["status"]["placement"]
    assert after["usableMemoryBytes"] > before["usableMemoryBytes"]
    (attempt,) = second["status"]["attempts"]
    assert attempt["outcome"] == "OOMKilled"
    assert attempt["observation"] == {
        "memoryBytesAtLeast": before["usableMemoryBytes"],
        "censored": True,
        "source": "oom",
    }
    wait_for("oom Running again", phase_is(admin_api, namespace, "oom", "Running"), 60)
    new_pod = client.CoreV1Api(admin_api).read_namespaced_pod("oom-1", namespace)
    assert new_pod.spec.containers[0].resources.limits == {after["resource"]: "1"}
    events = client.CoreV1Api(admin_api).list_namespaced_event(
        namespace, field_selector="involvedObject.name=oom"
    )
    assert "OOMEscalated" in {e.reason for e in events.items}


def test_a_namespaced_operator_serves_only_its_namespaces(
    devcluster: cluster.LocalCluster,
    admin_api: client.ApiClient,
    namespace: str,
    tmp_path: Path,
    wait_for: Any,
) -> None:
    core = client.CoreV1Api(admin_api)
    other = f"{namespace}-other"
    core.create_namespace({"metadata": {"name": other}})
    try:
        for ns in (namespace, other):
            ref = configmap(admin_api, ns, "small", SMALL)
            submit(admin_api, ns, dljob("small", {"configMapRef": ref}))
        built = main.build(
            operator_config(tmp_path), kubeconfig=str(devcluster.operator_kubeconfig)
        )
        with operator_thread(built, namespaces=(namespace,)):
            wait_for("the served DLJob Running", phase_is(admin_api, namespace, "small", "Running"))
            assert "status" not in get(admin_api, other, "small")
            assert pods_of(admin_api, other, "small") == []
    finally:
        core.delete_namespace(other)


def test_a_killed_and_restarted_operator_creates_no_duplicate_pods(
    devcluster: cluster.LocalCluster,
    admin_api: client.ApiClient,
    namespace: str,
    tmp_path: Path,
    wait_for: Any,
) -> None:
    ref = configmap(admin_api, namespace, "many", SMALL)
    names = [f"job-{i}" for i in range(60)]
    env = {
        "KUBESEER_HEALTH_PORT": str(free_port()),
        "KUBESEER_METRICS_PORT": "0",
        "KUBESEER_FETCH_CACHE_DIR": str(tmp_path / "models"),
    }
    core = client.CoreV1Api(admin_api)
    proc = local.OperatorProcess(devcluster.operator_kubeconfig, env, tmp_path / "operator.log")
    # Every DLJob waits before the operator starts, so the kill at the first pod lands while
    # most are still unplaced, however fast the machine.
    for name in names:
        submit(admin_api, namespace, dljob(name, {"configMapRef": ref}))
    proc.start()
    try:
        wait_for(
            "the first pods", lambda: core.list_namespaced_pod(namespace).items, 60, interval=0.01
        )
        proc.kill()
        created_before_the_kill = len(core.list_namespaced_pod(namespace).items)
        proc.start()

        def all_placed() -> bool:
            phases = [get(admin_api, namespace, n).get("status", {}).get("phase") for n in names]
            return all(p in ("Placed", "Running") for p in phases)

        wait_for("every DLJob placed after the restart", all_placed, 90)
    finally:
        proc.stop()
    # The kill really came half-way: some DLJobs were left for the restarted operator.
    assert 0 < created_before_the_kill < len(names)
    pods = client.CoreV1Api(admin_api).list_namespaced_pod(namespace).items
    assert sorted(p.metadata.name for p in pods) == sorted(f"{n}-0" for n in names)

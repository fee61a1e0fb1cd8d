"""The DLJob operator end to end on the local control plane.

A real kube-apiserver validates the CRD, the real operator (kopf, the predictor, placement) runs
with the least-privilege identity of deploy/rbac/, the Job controller makes the pods of each
attempt's Job, kube-scheduler binds them to the fake GPU nodes and KWOK runs them. The nodes
offer GPUs through a device plugin, so the operator (GPU backend `auto`) uses extended
resources; tests/e2e/test_operator_dra.py runs it on DRA. Models come from ConfigMaps or from an
HTTP server on 127.0.0.1 that the operator's configuration allow-lists.
"""

from __future__ import annotations

import functools
import http.server
import json
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from operator_support import (
    CORRUPT,
    GROUP,
    HUGE,
    PLURAL,
    SMALL,
    VERSION,
    condition,
    configmap,
    custom,
    dljob,
    free_port,
    get,
    jobs_of,
    oom_kill,
    operator_config,
    operator_thread,
    phase_is,
    pods_of,
    submit,
    table,
)

from kubeseer import resources
from kubeseer.devcluster import cluster
from kubeseer.operator import local, main

pytestmark = pytest.mark.e2e

DEPLOYMENT = resources.path("deploy", "operator", "deployment.yaml")


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
        ({"attention": "paged"}, "spec.attention"),
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


def test_a_dljob_becomes_a_running_job_on_a_mig_slice(
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

    assert operator.backend.value == "extended"  # auto-detected: GPUs of a device plugin
    (job,) = jobs_of(admin_api, namespace)
    assert job.metadata.name == "small-0"
    assert job.metadata.owner_references[0].uid == body["metadata"]["uid"]
    # Created suspended without its GPU, given it while suspended (KEP-5440), then resumed.
    assert job.spec.suspend is False
    assert job.spec.template.spec.containers[0].resources.limits == {resource: "1"}
    (pod,) = pods_of(admin_api, namespace, "small")
    assert pod.metadata.name.startswith("small-0-")
    assert pod.metadata.owner_references[0].uid == job.metadata.uid
    assert pod.spec.node_name
    assert pod.status.phase == "Running"
    assert pod.spec.containers[0].resources.limits == {resource: "1"}
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
    shown = [  # what `kubectl get dlj` prints; priority 1 columns are for `-o wide`
        (i, c["name"]) for i, c in enumerate(rendered["columnDefinitions"]) if not c["priority"]
    ]
    assert [name for _, name in shown] == [
        "Name", "Model", "Mode", "Batch", "Mem-MiB", "Resource", "Phase", "Reason", "Age",
    ]  # fmt: skip
    (row,) = rendered["rows"]
    assert [row["cells"][i] for i, _ in shown[:8]] == [
        "small", "small/model.onnx", "infer", 8, status["prediction"]["memoryMiB"], resource,
        "Running", None,
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
    no_fit = condition(settled["huge"], "Placed")
    assert no_fit["reason"] == "NoFit"
    assert "predicted need" in no_fit["message"] and "largest free" in no_fit["message"]
    absent = condition(settled["absent"], "Placed")
    assert absent["reason"] == "GPUProductNotInCluster"
    assert "the cluster has no H200-141GB at all" in absent["message"]
    assert {body["status"]["reason"] for body in settled.values()} == {
        "CorruptModel", "ModelUnreachable", "NoFit", "GPUProductNotInCluster",
    }  # fmt: skip
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
    pair = dljob("pair", {"configMapRef": ref}, mode="train", replicas=2, runs_for=None)
    submit(admin_api, namespace, pair)
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
    (pod,) = pods_of(admin_api, namespace, "oom", attempt=0)
    oom_kill(admin_api, namespace, pod.metadata.name)

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
    (new_pod,) = pods_of(admin_api, namespace, "oom", attempt=1)
    assert new_pod.metadata.name.startswith("oom-1-")
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
            # The operator starts here, its predictor loading first: allow for a busy machine.
            served = phase_is(admin_api, namespace, "small", "Running")
            wait_for("the served DLJob Running", served, 90)
            assert "status" not in get(admin_api, other, "small")
            assert pods_of(admin_api, other, "small") == []
    finally:
        core.delete_namespace(other)


def test_a_killed_and_restarted_operator_creates_no_duplicate_jobs(
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
        # The killed operator's Lease is taken over once it has not been renewed for this long.
        "KUBESEER_LEASE_DURATION_S": "5",
    }
    proc = local.OperatorProcess(devcluster.operator_kubeconfig, env, tmp_path / "operator.log")
    # Every DLJob waits before the operator starts, so the kill at the first Job lands while
    # most are still unplaced, however fast the machine.
    for name in names:
        submit(admin_api, namespace, dljob(name, {"configMapRef": ref}))
    proc.start()
    try:
        wait_for("the first Jobs", lambda: jobs_of(admin_api, namespace), 60, interval=0.01)
        proc.kill()
        created_before_the_kill = len(jobs_of(admin_api, namespace))
        proc.start()

        def all_placed() -> bool:
            phases = [get(admin_api, namespace, n).get("status", {}).get("phase") for n in names]
            return all(p in ("Placed", "Running") for p in phases)

        wait_for("every DLJob placed after the restart", all_placed, 90)
    finally:
        proc.stop()
    # The kill really came half-way: some DLJobs were left for the restarted operator.
    assert 0 < created_before_the_kill < len(names)
    jobs = jobs_of(admin_api, namespace)
    assert sorted(j.metadata.name for j in jobs) == sorted(f"{n}-0" for n in names)
    # A Job left suspended by the kill was given its GPU and resumed by the restarted operator.
    assert not any(j.spec.suspend for j in jobs)
    wait_for(
        "one pod per Job",
        lambda: len(client.CoreV1Api(admin_api).list_namespaced_pod(namespace).items) == len(names),
        30,
    )

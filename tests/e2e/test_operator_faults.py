"""The operator under hostile input, slow sources and faults, on the local control plane (issue 17).

Each test is a case that ended badly before: a DLJob wedged, starved or fooled, a status that
did not say what happened, or two operators acting at once. The cluster, the operator and its
least-privilege identity are real; model servers are HTTP servers on 127.0.0.1 (allow-listed).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_support import (
    GROUP,
    PLURAL,
    RUNS_FOR,
    SMALL,
    VERSION,
    condition,
    configmap,
    custom,
    dljob,
    events_of,
    free_port,
    get,
    jobs_of,
    kwok_runs_for,
    operator_config,
    operator_thread,
    phase_is,
    pods_of,
    submit,
    table,
)

from kubeseer.devcluster import cluster
from kubeseer.operator import local, main

pytestmark = pytest.mark.e2e


class _Sources(http.server.BaseHTTPRequestHandler):
    """`/small.onnx` at once; `/trickle/*` one byte every 2 s (the issue's slow server),
    counting the connections still open; anything else 404."""

    protocol_version = "HTTP/1.1"
    lock = threading.Lock()
    open_trickles = 0
    stop = threading.Event()

    def log_message(self, format: str, *args: Any) -> None:
        """Keep the test output clean."""

    def do_GET(self) -> None:
        if self.path == "/small.onnx":
            self.send_response(200)
            self.send_header("Content-Length", str(len(SMALL)))
            self.end_headers()
            self.wfile.write(SMALL)
            return
        if not self.path.startswith("/trickle/"):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(SMALL)))
        self.end_headers()
        with _Sources.lock:
            _Sources.open_trickles += 1
        try:
            for byte in SMALL:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                if _Sources.stop.wait(2.0):
                    break
        except OSError:
            pass  # the operator hung up: what cancelling a fetch does
        finally:
            with _Sources.lock:
                _Sources.open_trickles -= 1


@pytest.fixture
def sources() -> Iterator[str]:
    _Sources.stop.clear()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sources)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    _Sources.stop.set()
    server.shutdown()
    server.server_close()


@pytest.fixture
def operator(
    devcluster: cluster.LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[main.Operator]:
    """The operator in a thread, with two attempts per DLJob (the deleted-pod test uses both)."""
    config = operator_config(tmp_path_factory.mktemp("operator"), max_attempts=2)
    built = main.build(config, kubeconfig=str(devcluster.operator_kubeconfig))
    with operator_thread(built):
        yield built


def template(**container: Any) -> dict[str, Any]:
    return {
        "metadata": {"annotations": kwok_runs_for(RUNS_FOR)},
        "spec": {"containers": [{"name": "main", "image": "example/job:1", **container}]},
    }


def test_integers_in_the_template_run_or_fail_at_once_never_wedge(
    operator: main.Operator, admin_api: client.ApiClient, namespace: str, wait_for: Any
) -> None:
    """`cpu: 2` and the user's own `nvidia.com/gpu: 2` used to be refused by the client before
    the request was sent, retried every 60 s for ever with no condition; `value: 5` too."""
    ref = configmap(admin_api, namespace, "small", SMALL)
    plain = template(resources={"limits": {"cpu": 2, "memory": "1Gi"}, "requests": {"cpu": 0.5}})
    gpu = template(resources={"limits": {"nvidia.com/gpu": 2}})
    env = template(env=[{"name": "WORKERS", "value": 5}])
    for name, tpl in (("plain-yaml", plain), ("own-gpu", gpu), ("env-int", env)):
        submit(admin_api, namespace, dljob(name, {"configMapRef": ref}, template=tpl))

    for name in ("plain-yaml", "own-gpu"):
        wait_for(f"{name} Running", phase_is(admin_api, namespace, name, "Running"), 60)
    (pod,) = pods_of(admin_api, namespace, "plain-yaml")
    limits = pod.spec.containers[0].resources.limits
    assert limits["cpu"] == "2" and pod.spec.containers[0].resources.requests["cpu"] == "500m"
    (pod,) = pods_of(admin_api, namespace, "own-gpu")
    resource = get(admin_api, namespace, "own-gpu")["status"]["placement"]["resource"]
    assert pod.spec.containers[0].resources.limits == {resource: "1"}
    replaced = [
        e for e in events_of(admin_api, namespace, "own-gpu") if e.reason == "GPULimitReplaced"
    ]
    assert [e.type for e in replaced] == ["Warning"]
    assert "nvidia.com/gpu=2" in replaced[0].message

    failed = wait_for("env-int Failed", phase_is(admin_api, namespace, "env-int", "Failed"), 30)
    ready = condition(failed, "WorkloadReady")
    assert ready["reason"] == "InvalidTemplate"
    assert "spec.containers.env.value of type string" in ready["message"]


def test_slow_model_servers_starve_nobody_and_deleting_their_dljobs_frees_the_fetches(
    devcluster: cluster.LocalCluster,
    admin_api: client.ApiClient,
    namespace: str,
    sources: str,
    tmp_path: Path,
    wait_for: Any,
) -> None:
    """16 DLJobs on a server that sends a byte every 2 s took all 16 workers: an ordinary DLJob
    got no status for 240 s, and deleting the 16 did not free them. Here the minimum rate is off,
    so nothing but the pools and the cancellation stand between the slow DLJobs and the rest."""
    core = client.CoreV1Api(admin_api)
    other = f"{namespace}-other"
    core.create_namespace({"metadata": {"name": other}})
    config = operator_config(tmp_path, fetch_workers=16, fetch_min_rate_bytes_s=0)
    built = main.build(config, kubeconfig=str(devcluster.operator_kubeconfig))
    try:
        with operator_thread(built):
            slow = [f"slow-{i}" for i in range(16)]
            for name in slow:
                submit(admin_api, namespace, dljob(name, {"url": f"{sources}/trickle/{name}"}))
            # One namespace holds at most a quarter of the 16 fetch workers.
            wait_for("4 downloads under way", lambda: _Sources.open_trickles == 4, 60)
            wait_for(
                "every slow DLJob Fetching",
                lambda: all(
                    get(admin_api, namespace, n).get("status", {}).get("phase") == "Fetching"
                    for n in slow
                ),
                30,
            )
            rendered = table(admin_api, namespace)
            phase = [c["name"] for c in rendered["columnDefinitions"]].index("Phase")
            assert {row["cells"][phase] for row in rendered["rows"]} == {"Fetching"}

            ref = configmap(admin_api, namespace, "small", SMALL)
            start = time.monotonic()
            submit(admin_api, namespace, dljob("by-configmap", {"configMapRef": ref}))
            submit(admin_api, other, dljob("by-url", {"url": f"{sources}/small.onnx"}))
            for ns, name in ((namespace, "by-configmap"), (other, "by-url")):
                wait_for(f"{name} placed", phase_is(admin_api, ns, name, "Placed", "Running"), 30)
            assert time.monotonic() - start < 15
            assert _Sources.open_trickles == 4

            for name in slow:
                custom(admin_api).delete_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, name
                )
            wait_for("every slow fetch hung up", lambda: _Sources.open_trickles == 0, 15)
    finally:
        core.delete_namespace(other)


def test_a_trickling_source_fails_as_too_slow(
    devcluster: cluster.LocalCluster,
    admin_api: client.ApiClient,
    namespace: str,
    sources: str,
    tmp_path: Path,
    wait_for: Any,
) -> None:
    config = operator_config(tmp_path, fetch_min_rate_bytes_s=1024)
    built = main.build(config, kubeconfig=str(devcluster.operator_kubeconfig))
    with operator_thread(built):
        submit(admin_api, namespace, dljob("slow", {"url": f"{sources}/trickle/slow"}))
        failed = wait_for("slow Failed", phase_is(admin_api, namespace, "slow", "Failed"), 40)
    ready = condition(failed, "ModelReady")
    assert ready["reason"] == failed["status"]["reason"] == "ModelTooSlow"
    assert "under the minimum rate of 1 KiB/s" in ready["message"]


def test_a_digest_never_runs_a_dljob_on_bytes_its_own_source_did_not_serve(
    operator: main.Operator,
    admin_api: client.ApiClient,
    namespace: str,
    sources: str,
    wait_for: Any,
) -> None:
    """A 404 URL plus the digest of another namespace's ConfigMap model ran with that model's
    prediction; the digest of model A with the URL of model B ran with A's."""
    core = client.CoreV1Api(admin_api)
    other = f"{namespace}-tenant"
    core.create_namespace({"metadata": {"name": other}})
    try:
        a_model = SMALL + b"\x32\x01a"  # another model: a doc_string field, the same graph
        digest = hashlib.sha256(a_model).hexdigest()
        ref = configmap(admin_api, other, "a", a_model)
        submit(admin_api, other, dljob("tenant-a", {"configMapRef": ref, "sha256": digest}))
        wait_for("tenant A Running", phase_is(admin_api, other, "tenant-a", "Running"), 60)

        borrowed = {"url": f"{sources}/missing.onnx", "sha256": digest}
        submit(admin_api, namespace, dljob("borrowed", borrowed))
        swapped = {"url": f"{sources}/small.onnx", "sha256": digest}
        submit(admin_api, namespace, dljob("swapped", swapped))
        for name, reason in (("borrowed", "ModelNotFound"), ("swapped", "DigestMismatch")):
            body = wait_for(f"{name} Failed", phase_is(admin_api, namespace, name, "Failed"), 40)
            assert condition(body, "ModelReady")["reason"] == reason
            assert "prediction" not in body["status"]
            assert pods_of(admin_api, namespace, name) == []
    finally:
        core.delete_namespace(other)


def test_a_running_pod_deleted_by_hand_starts_the_next_attempt_then_fails_with_a_reason(
    operator: main.Operator, admin_api: client.ApiClient, namespace: str, wait_for: Any
) -> None:
    """The DLJob stayed Running for ever once its pod was deleted."""
    core = client.CoreV1Api(admin_api)
    ref = configmap(admin_api, namespace, "small", SMALL)
    submit(admin_api, namespace, dljob("gone", {"configMapRef": ref}))
    wait_for("gone Running", phase_is(admin_api, namespace, "gone", "Running"), 60)
    (pod,) = pods_of(admin_api, namespace, "gone", attempt=0)
    core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)

    def second_attempt_running() -> dict[str, Any] | None:
        body = get(admin_api, namespace, "gone")
        status = body["status"]
        attempt = status.get("placement", {}).get("attempt")
        return body if attempt == 1 and status["phase"] == "Running" else None

    body = wait_for("attempt 1 Running", second_attempt_running, 60)
    assert [a["outcome"] for a in body["status"]["attempts"]] == ["Deleted"]
    assert "WorkloadDeleted" in {e.reason for e in events_of(admin_api, namespace, "gone")}

    (pod,) = pods_of(admin_api, namespace, "gone", attempt=1)
    core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
    failed = wait_for("gone Failed", phase_is(admin_api, namespace, "gone", "Failed"), 60)
    assert failed["status"]["reason"] == "WorkloadDeleted"
    assert "2 of 2 attempts used" in condition(failed, "WorkloadReady")["message"]


def test_a_dljob_name_of_253_characters_runs(
    operator: main.Operator, admin_api: client.ApiClient, namespace: str, wait_for: Any
) -> None:
    """Names of 64-253 characters failed with InvalidTemplate: the name went into a label."""
    name = ("a" * 62 + ".") * 4 + "z"
    assert len(name) == 253
    ref = configmap(admin_api, namespace, "small", SMALL)
    submit(admin_api, namespace, dljob(name, {"configMapRef": ref}))
    wait_for("the long-named DLJob Running", phase_is(admin_api, namespace, name, "Running"), 60)
    (job,) = jobs_of(admin_api, namespace)
    assert job.metadata.owner_references[0].name == name
    (pod,) = client.CoreV1Api(admin_api).list_namespaced_pod(namespace).items
    assert pod.metadata.owner_references[0].name == job.metadata.name
    assert len(pod.metadata.labels["kubeseer.io/dljob"]) <= 63


@pytest.mark.parametrize(
    "hard",
    [
        pytest.param({"count/jobs.batch": "0"}, id="a quota on Jobs refuses the operator"),
        pytest.param({"pods": "0"}, id="a quota on pods refuses the Job controller"),
    ],
)
def test_a_namespace_quota_is_its_own_reason_and_clears(
    operator: main.Operator,
    admin_api: client.ApiClient,
    namespace: str,
    wait_for: Any,
    hard: dict[str, str],
) -> None:
    """A ResourceQuota rejection was reported as InvalidTemplate, which fails for good. Since
    each attempt is a Job, a quota on pods refuses the Job controller's pods, not the operator:
    the DLJob stayed Placed and only the Job's FailedCreate events said why."""
    core = client.CoreV1Api(admin_api)
    quota = {"metadata": {"name": "no-room"}, "spec": {"hard": hard}}
    core.create_namespaced_resource_quota(namespace, quota)
    wait_for(
        "the quota counted",
        lambda: core.read_namespaced_resource_quota("no-room", namespace).status.hard,
    )
    ref = configmap(admin_api, namespace, "small", SMALL)
    submit(admin_api, namespace, dljob("quota", {"configMapRef": ref}))

    def waiting_for_quota() -> dict[str, Any] | None:
        body = get(admin_api, namespace, "quota")
        return body if body.get("status", {}).get("reason") == "QuotaExceeded" else None

    body = wait_for("QuotaExceeded", waiting_for_quota, 60)
    assert body["status"]["phase"] == "Placed"
    assert "exceeded quota: no-room" in condition(body, "WorkloadReady")["message"]
    # kopf posts events in batches, after the status patch: wait for it.
    warned = wait_for(
        "a QuotaExceeded event",
        lambda: [
            e for e in events_of(admin_api, namespace, "quota") if e.reason == "QuotaExceeded"
        ],
        30,
    )
    assert warned[0].type == "Warning"
    core.delete_namespaced_resource_quota("no-room", namespace)
    # The Job controller retries a refused pod after up to 60 s (its longest backoff).
    body = wait_for("quota Running", phase_is(admin_api, namespace, "quota", "Running"), 120)
    assert "reason" not in body["status"]


def test_pods_that_admission_refuses_as_written_fail_with_the_refusal(
    operator: main.Operator, admin_api: client.ApiClient, namespace: str, wait_for: Any
) -> None:
    """Pod Security and a LimitRange judge the pods the Job controller creates, not the Job the
    operator creates: the DLJob stayed Placed for ever. Now it fails, quoting the refusal, and
    its Job is suspended so that the Job controller stops trying."""
    core = client.CoreV1Api(admin_api)
    restricted = f"{namespace}-restricted"
    labels = {"pod-security.kubernetes.io/enforce": "restricted"}
    core.create_namespace({"metadata": {"name": restricted, "labels": labels}})
    try:
        limits = {"type": "Container", "max": {"cpu": "1"}}
        core.create_namespaced_limit_range(
            namespace, {"metadata": {"name": "small"}, "spec": {"limits": [limits]}}
        )
        cases = (
            (restricted, "unprivileged", template(), 'violates PodSecurity "restricted:latest"'),
            (
                namespace,
                "too-big",
                template(resources={"limits": {"cpu": "2"}}),
                "maximum cpu usage per Container is 1, but limit is 2",
            ),
        )
        for ns, name, tpl, _ in cases:
            ref = configmap(admin_api, ns, "small", SMALL)
            submit(admin_api, ns, dljob(name, {"configMapRef": ref}, template=tpl))
        for ns, name, _, refusal in cases:
            failed = wait_for(f"{name} Failed", phase_is(admin_api, ns, name, "Failed"), 60)
            ready = condition(failed, "WorkloadReady")
            assert ready["reason"] == failed["status"]["reason"] == "PodsRefused"
            assert refusal in ready["message"]
            assert "PodsRefused" in {e.reason for e in events_of(admin_api, ns, name)}
            (job,) = jobs_of(admin_api, ns)
            assert job.spec.suspend is True
            assert pods_of(admin_api, ns, name) == []
    finally:
        core.delete_namespace(restricted)


def test_coverage_the_predictor_cannot_give_says_what_to_set(
    operator: main.Operator, admin_api: client.ApiClient, namespace: str, wait_for: Any
) -> None:
    ref = configmap(admin_api, namespace, "small", SMALL)
    placement = {"coverage": 0.999}
    submit(admin_api, namespace, dljob("strict", {"configMapRef": ref}, placement=placement))
    body = wait_for("strict Failed", phase_is(admin_api, namespace, "strict", "Failed"), 60)
    placed = condition(body, "Placed")
    assert placed["reason"] == "CoverageUnavailable"
    assert "set spec.placement.coverage to" in placed["message"]


def test_kubectl_explain_describes_every_placement_field(admin_api: client.ApiClient) -> None:
    """`kubectl explain dlj.spec.placement` reads the published OpenAPI schema."""
    response = admin_api.call_api(
        "GET",
        f"{admin_api.configuration.host}/openapi/v3/apis/{GROUP}/{VERSION}",
        header_params={"Accept": "application/json"},
    )
    response.read()
    schemas = json.loads(response.data)["components"]["schemas"]
    (dljob_schema,) = [s for k, s in schemas.items() if k.endswith(".DLJob")]
    spec = dljob_schema["properties"]["spec"]
    assert spec.get("description")
    undescribed = [
        f"spec.{name}" for name, field in spec["properties"].items() if not field.get("description")
    ]
    placement = spec["properties"]["placement"]["properties"]
    undescribed += [
        f"spec.placement.{name}"
        for name, field in placement.items()
        if not field.get("description")
    ]
    assert set(placement) >= {
        "policy",
        "profile",
        "coverage",
        "maxSlowdown",
        "gpuProducts",
        "allowWholeGPU",
    }
    assert undescribed == []


def test_two_operators_on_one_cluster_never_both_act(
    devcluster: cluster.LocalCluster,
    admin_api: client.ApiClient,
    namespace: str,
    tmp_path: Path,
    wait_for: Any,
) -> None:
    """A second operator acted on every DLJob too: 12 of 12 got two Placed events, statuses
    disagreed with pods. Now it waits for the Lease, and takes over when the holder dies."""

    def process(name: str) -> local.OperatorProcess:
        env = {
            "KUBESEER_HEALTH_PORT": str(free_port()),
            "KUBESEER_METRICS_PORT": str(free_port()),
            "KUBESEER_FETCH_CACHE_DIR": str(tmp_path / name / "models"),
            "KUBESEER_LEASE_DURATION_S": "5",
        }
        return local.OperatorProcess(devcluster.operator_kubeconfig, env, tmp_path / f"{name}.log")

    first, second = process("first"), process("second")
    first.start()
    try:
        second.start(standby=True)
        ref = configmap(admin_api, namespace, "small", SMALL)
        names = [f"pair-{i}" for i in range(12)]
        for name in names:
            submit(admin_api, namespace, dljob(name, {"configMapRef": ref}))
        for name in names:
            wait_for(f"{name} Running", phase_is(admin_api, namespace, name, "Running"), 90)
        assert not second.ready
        for name in names:
            placed = [e for e in events_of(admin_api, namespace, name) if e.reason == "Placed"]
            assert sum(e.count or 1 for e in placed) == 1, name
            (pod,) = pods_of(admin_api, namespace, name)
            status = get(admin_api, namespace, name)["status"]
            assert pod.spec.containers[0].resources.limits == {status["placement"]["resource"]: "1"}

        first.kill()
        wait_for("the standby to take over", lambda: second.ready, 30)
        submit(admin_api, namespace, dljob("after", {"configMapRef": ref}))
        wait_for("after Running", phase_is(admin_api, namespace, "after", "Running"), 60)
    finally:
        first.stop()
        second.stop()
